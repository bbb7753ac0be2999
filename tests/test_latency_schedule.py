"""bench/latency.py's schedule counts from the due time: a stalled consumer shows the stall.

The open-loop benchmark plans every send time in advance and each body carries its
due time, so a message that could not be handled while the consumer was stuck counts
the whole wait, not just the time after it went out (no coordinated omission). Here
the consumer's handler blocks the loop for 0.4 s once, in the measuring window, while
a publisher process keeps to its schedule: the messages due during the stall must
report a latency of at least what was left of the stall when they were due.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import unique

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
driver = pytest.importorskip("latency_driver")

RATE = 200.0
WARMUP, WINDOW = 0.3, 1.5
STALL_AT, STALL = 0.8, 0.4  # seconds after message 0 was due: inside the window


async def _run(nsqd, stall: tuple[float, float] | None) -> dict:
    topic = unique("sched")
    start_ns = time.monotonic_ns() + 1_500_000_000  # time for the publisher process to start
    schedule = driver.Schedule(RATE, start_ns, WARMUP, WINDOW, 0.3)
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "latency_driver.py"), "--mode", "pub",
        "--nsqd-tcp-address", nsqd.tcp_address, "--topic", topic, "--rate", str(RATE),
        "--start-ns", str(start_ns), "--warmup", str(WARMUP), "--window", str(WINDOW), "--cooldown", "0.3",
        "--callers", "10", stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )
    try:
        result = await driver.consume_open_loop(
            nsqd.tcp_address, topic, "ch", schedule, options={"output_buffer_size": -1}, drain=5.0, stall=stall,
            keep_samples=True,
        )
    finally:
        out, err = await publisher.communicate()
    assert publisher.returncode == 0, err.decode()[-500:]
    assert b"RESULT" in out
    return {"schedule": schedule, **result}


async def test_a_stalled_consumer_raises_the_latency_of_every_message_due_during_the_stall(nsqd) -> None:
    result = await _run(nsqd, (STALL_AT, STALL))
    schedule = result["schedule"]
    assert result["done"] == schedule.count
    stall_start = schedule.start_ns + int(STALL_AT * 1e9)
    stall_end = stall_start + int(STALL * 1e9)
    during = [(due, latency) for due, latency in result["samples"] if stall_start <= due < stall_end]
    assert len(during) >= 0.9 * RATE * STALL
    # Counted from when each was due: what was left of the stall when it was due, at least.
    short = [(due, latency) for due, latency in during if latency < stall_end - due - 20_000_000]
    assert not short, f"{len(short)} messages due during the stall report less than the rest of it"
    # The summary the benchmark reports shows it: max at least the stall, p50 far below it.
    assert result["latency_ms"]["max"] >= STALL * 1000 - 20
    assert result["latency_ms"]["p50"] < STALL * 1000 / 4


async def test_without_the_stall_no_message_waits_that_long(nsqd) -> None:
    result = await _run(nsqd, None)
    assert result["done"] == result["schedule"].count
    assert result["in_window"] == result["schedule"].expected_in_window()
    assert result["latency_ms"]["max"] < STALL * 1000
