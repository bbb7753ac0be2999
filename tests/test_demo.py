"""The demo (``python -m fastnsq.demo``, what the README's first command runs), with a small count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastnsq.demo import percentile

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def run_demo(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fastnsq.demo", *args], check=False, capture_output=True,
                          text=True, env=ENV, timeout=120, stdin=subprocess.DEVNULL)
    return done, time.monotonic() - started


def number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return float(found.group(1).replace(",", ""))


def test_demo_prints_throughput_and_latency_percentiles() -> None:
    done, seconds = run_demo("--count", "5000", "--steady-seconds", "0.5")
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "embedded nsqd in a child process" in out
    assert number(r"published\s+([\d,]+) in", out) == 5000
    assert number(r"published .* s\s+([\d,]+) msg/s", out) > 0
    assert number(r"consumed\s+([\d,]+) in", out) == 5000
    assert number(r"consumed .* s\s+([\d,]+) msg/s", out) > 0
    assert "exactly once: 0 missing, 0 twice" in out
    rate = number(r"end to end: publish ([\d,]+) msg/s", out)
    assert number(r"delivered\s+([\d,]+) of", out) == int(rate * 0.5)
    p50, p95, p99 = (number(rf"{p} ([\d.]+) ms", out) for p in ("p50", "p95", "p99"))
    assert 0 < p50 <= p95 <= p99 < 10_000
    assert number(r"done in ([\d.]+) s", out) < seconds + 0.5  # it reports its own run time
    assert "Producer.mpublish()" in out and "Consumer.batches(" in out  # says what it did


def test_demo_in_process_without_latency_run() -> None:
    done, _ = run_demo("--count", "2000", "--steady-seconds", "0", "--in-process")
    assert done.returncode == 0, done.stderr
    assert "embedded nsqd in this process" in done.stdout
    assert number(r"consumed\s+([\d,]+) in", done.stdout) == 2000
    assert "latency" not in done.stdout.split("consumed")[1]


def test_demo_reports_an_unreachable_nsqd_in_one_line() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done, _ = run_demo("--nsqd-tcp-address", f"127.0.0.1:{port}", "--count", "10")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("demo: error:") and str(port) in line


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [([5], 0.99, 5), (list(range(1, 101)), 0.50, 50), (list(range(1, 101)), 0.95, 95),
     (list(range(1, 101)), 0.99, 99), (list(range(1, 11)), 1.0, 10), ([1, 2, 3], 0.01, 1)],
)
def test_percentile_is_the_nearest_rank(values: list[int], fraction: float, expected: int) -> None:
    assert percentile(values, fraction) == expected


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        percentile([], 0.5)
