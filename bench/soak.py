"""Soak: sustained publish + consume with memory, descriptors and tasks sampled; then reconnects.

    python bench/soak.py --minutes 10 --rate 20000 --reconnects 1000

The embedded nsqd runs in its own process, so the numbers are the client's alone.
Phase 1 publishes at ``--rate`` msg/s (100-byte bodies) and consumes everything with a
batch consumer for ``--minutes``, sampling resident memory (VmRSS), open descriptors,
asyncio tasks and gc-tracked objects every ``--every`` seconds. Phase 2 cuts every
connection ``--reconnects`` times through a FaultProxy and checks that descriptors and
tasks come back to where they were. Writes bench/results/soak-<date>.json and prints a
summary: memory growth after warm-up (first and last minute compared, and a least-squares
slope), descriptor and task counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastnsq
from fastnsq.testing.proxy import FaultProxy


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    tcp, http = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastnsq.testing", "--tcp-port", str(tcp), "--http-port", str(http)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", tcp), timeout=0.2).close()
            return proc, f"127.0.0.1:{tcp}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the embedded nsqd did not start")


def slope_per_minute(samples: list[dict]) -> float:
    """Least-squares slope of RSS (KiB) against time, per minute."""
    xs = [s["t"] for s in samples]
    ys = [s["rss_kib"] for s in samples]
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


async def sustained(address: str, minutes: float, rate: int, every: float) -> dict:
    topic = "soak"
    body = b"s" * 100
    consumed = 0
    samples: list[dict] = []
    stop = asyncio.Event()
    async with fastnsq.Producer([address]) as producer:
        consumer = fastnsq.Consumer(topic, "soak", nsqd_tcp_addresses=[address], max_in_flight=2500)
        await consumer.start()

        async def consume() -> None:
            nonlocal consumed
            async for batch in consumer.batches(max_size=500, max_wait=0.2):
                consumed += len(batch)
                batch.finish()
                if stop.is_set() and consumed >= published:
                    return

        published = 0

        async def publish() -> None:
            nonlocal published
            tick = 0.05
            per_tick = max(1, int(rate * tick))
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            while not stop.is_set():
                await producer.mpublish(topic, [body] * per_tick)
                published += per_tick
                next_at += tick
                await asyncio.sleep(max(0.0, next_at - loop.time()))

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = [asyncio.create_task(consume()), asyncio.create_task(publish())]
        while loop.time() - start < minutes * 60:
            await asyncio.sleep(every)
            sample = {
                "t": round(loop.time() - start, 1),
                "rss_kib": rss_kib(),
                "fds": open_fds(),
                "tasks": len(asyncio.all_tasks()),
                "gc_objects": len(gc.get_objects()),
                "published": published,
                "consumed": consumed,
            }
            samples.append(sample)
            print(json.dumps(sample), flush=True)
        stop.set()
        await tasks[1]
        await asyncio.wait_for(tasks[0], 60)
        await consumer.stop()
    warm = [s for s in samples if s["t"] >= 60] or samples
    first = [s["rss_kib"] for s in warm if s["t"] < warm[0]["t"] + 60]
    last = [s["rss_kib"] for s in warm if s["t"] > warm[-1]["t"] - 60]
    return {
        "minutes": minutes,
        "rate": rate,
        "published": published,
        "consumed": consumed,
        "samples": samples,
        "rss_first_minute_after_warmup_kib": round(sum(first) / len(first)),
        "rss_last_minute_kib": round(sum(last) / len(last)),
        "rss_growth_kib": round(sum(last) / len(last) - sum(first) / len(first)),
        "rss_slope_kib_per_minute": round(slope_per_minute(warm), 1),
        "fds_min_max": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
        "tasks_min_max": [min(s["tasks"] for s in samples), max(s["tasks"] for s in samples)],
    }


async def reconnects(address: str, count: int) -> dict:
    """Cut every connection ``count`` times; descriptors and tasks must come back to baseline."""
    topic = "soak_reconnect"
    async with FaultProxy(address) as proxy:
        producer = fastnsq.Producer([proxy.address], reconnect_delay=0.005, max_reconnect_delay=0.05)
        consumer = fastnsq.Consumer(topic, "ch", nsqd_tcp_addresses=[proxy.address], handler=lambda m: None,
                                    max_in_flight=10, reconnect_delay=0.005, max_reconnect_delay=0.05)
        await producer.start()
        await consumer.start()
        await producer.publish(topic, b"warm")
        await asyncio.sleep(0.2)
        gc.collect()
        before = {"fds": open_fds(), "tasks": len(asyncio.all_tasks()), "rss_kib": rss_kib()}
        peak_fds = peak_tasks = 0
        for i in range(count):
            proxy.cut()
            await asyncio.sleep(0.005)
            while not (producer.connections and consumer.connections):
                await asyncio.sleep(0.005)
            peak_fds = max(peak_fds, open_fds())
            peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))
        await producer.publish(topic, b"after")
        await asyncio.sleep(0.3)
        gc.collect()
        after = {"fds": open_fds(), "tasks": len(asyncio.all_tasks()), "rss_kib": rss_kib()}
        result = {
            "reconnects": count,
            "proxy_accepted": proxy.accepted,
            "before": before,
            "after": after,
            "peak_fds": peak_fds,
            "peak_tasks": peak_tasks,
            "producer_reconnects": producer.snapshot().reconnects,
        }
        await consumer.stop()
        await producer.close()
    return result


async def main(args: argparse.Namespace) -> dict:
    proc, address = start_server()
    try:
        soak = await sustained(address, args.minutes, args.rate, args.every)
        churn = await reconnects(address, args.reconnects)
    finally:
        proc.terminate()
        proc.wait(10)
    return {"soak": soak, "reconnect": churn}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=20000, help="messages per second published")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--reconnects", type=int, default=1000)
    args = parser.parse_args()
    import logging

    logging.getLogger("fastnsq").setLevel(logging.ERROR)  # 1000 reconnects log 1000 warnings otherwise
    result = fastnsq.run(main(args))
    result.update(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        machine=f"{platform.machine()} {os.cpu_count()} cores",
        codec=fastnsq.CODEC_IMPLEMENTATION,
    )
    out = ROOT / "bench" / "results" / f"soak-{datetime.now():%Y%m%d-%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    s, r = result["soak"], result["reconnect"]
    print(f"\nsoak {s['minutes']} min at {s['rate']} msg/s: published {s['published']}, consumed {s['consumed']}")
    print(f"RSS after warm-up {s['rss_first_minute_after_warmup_kib']} KiB -> last minute {s['rss_last_minute_kib']} KiB "
          f"(growth {s['rss_growth_kib']} KiB, slope {s['rss_slope_kib_per_minute']} KiB/min); "
          f"fds {s['fds_min_max']}, tasks {s['tasks_min_max']}")
    print(f"{r['reconnects']} reconnects: fds {r['before']['fds']} -> {r['after']['fds']} (peak {r['peak_fds']}), "
          f"tasks {r['before']['tasks']} -> {r['after']['tasks']} (peak {r['peak_tasks']}), "
          f"RSS {r['before']['rss_kib']} -> {r['after']['rss_kib']} KiB")
    print(f"written to {out}")
