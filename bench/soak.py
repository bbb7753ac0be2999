"""Soak: a steady publish + consume rate with periodic faults; memory, descriptors, tasks and
in-flight bookkeeping sampled; every message accounted for; then a burst of reconnects.

    python bench/soak.py --real ~/nsq-real/bin --minutes 30 --rate 5000 --fault-every 60
    python bench/soak.py --minutes 0.75 --rate 1000 --fault-every 6 --reconnects 50   # the CI-sized run

nsqd runs in its own process (a real one from ``--real``, else fastnsq's embedded one), so
the numbers are the client's alone. The producer and the consumer each reach it through a
FaultProxy. Phase 1 publishes ``--rate`` msg/s (unique 100-byte bodies, one MPUB per 50 ms
tick) and consumes with a batch consumer for ``--minutes``; every ``--fault-every`` seconds
the next fault of FAULTS strikes (a cut, resets mid-frame, a blackhole and a stall past the
heartbeat deadline, half-open links, a throttled and a slow link, nsqd restarted with
SIGTERM). Every ``--every`` seconds it samples the client's resident memory (VmRSS), open
descriptors, asyncio tasks, gc-tracked objects and its bookkeeping (messages in flight,
handler tasks, publishes awaiting an answer), and nsqd's memory. At the end: published =
acknowledged + raised, and every acknowledged message consumed (lost 0), duplicates
counted. Phase 2 cuts every connection ``--reconnects`` times and checks that descriptors
and tasks come back. Writes bench/results/soak-<date>.json (or ``--json PATH``), prints a
summary, exits 1 if a message was lost or something did not come back.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import struct
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastnsq
from fastnsq.errors import NSQError
from fastnsq.testing.process import NSQDProcess
from fastnsq.testing.proxy import FaultProxy

HEARTBEAT = 1.0
BODY = struct.Struct(">Q")  # the sequence number, then padding to --size
ACKED, RAISED = 1, 2


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def footprint() -> dict[str, int]:
    """This process's open descriptors, the loop's tasks and the RSS, now."""
    return {"fds": open_fds(), "tasks": len(asyncio.all_tasks()), "rss_kib": rss_kib()}


class Ledger:
    """One byte per sequence number, allocated up front (so that it does not grow the RSS it measures)."""

    def __init__(self, capacity: int) -> None:
        self.state = bytearray(capacity)  # 0 unpublished, ACKED, RAISED
        self.deliveries = bytearray(capacity)  # saturating count
        self.published = self.acknowledged = self.raised = self.consumed = self.duplicated = 0

    def publishing(self, count: int) -> range:
        first = self.published
        if first + count > len(self.state):
            raise RuntimeError("the ledger is full: raise --capacity")
        self.published += count
        return range(first, first + count)

    def settle(self, seqs: range, ok: bool) -> None:
        mark = ACKED if ok else RAISED
        self.state[seqs.start : seqs.stop] = bytes([mark]) * len(seqs)
        if ok:
            self.acknowledged += len(seqs)
        else:
            self.raised += len(seqs)

    def deliver(self, seq: int) -> None:
        seen = self.deliveries[seq]
        if seen:
            self.duplicated += 1
        else:
            self.consumed += 1
        self.deliveries[seq] = min(255, seen + 1)

    def lost(self) -> int:
        return sum(1 for seq in range(self.published) if self.state[seq] == ACKED and not self.deliveries[seq])

    def counts(self) -> dict[str, int]:
        return {"published": self.published, "acknowledged": self.acknowledged, "raised": self.raised,
                "consumed": self.consumed, "duplicated": self.duplicated, "lost": self.lost()}


class Soak:
    def __init__(self, nsqd: NSQDProcess, to_producer: FaultProxy, to_consumer: FaultProxy, ledger: Ledger) -> None:
        self.nsqd, self.to_producer, self.to_consumer, self.ledger = nsqd, to_producer, to_consumer, ledger
        self.proxies = (to_producer, to_consumer)
        self.faults: list[dict[str, Any]] = []
        self.publishing: set[asyncio.Task[None]] = set()  # the harness's own MPUB tasks, not counted as the client's

    # -- the faults, each returning once it is over --------------------------------------------

    async def cut(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    async def reset_down(self) -> None:
        await self.to_consumer.reset_mid_frame("down")

    async def reset_up(self) -> None:
        await self.to_producer.reset_mid_frame("up")

    async def blackhole(self) -> None:
        await asyncio.gather(*(p.blackhole(3 * HEARTBEAT) for p in self.proxies))

    async def half_open_server(self) -> None:
        for proxy in self.proxies:
            proxy.half_open("server")

    async def half_open_client(self) -> None:
        for proxy in self.proxies:
            proxy.half_open("client")

    async def stall_up(self) -> None:
        await self.to_producer.stall(3 * HEARTBEAT, "up")

    async def throttle(self) -> None:
        await self._for_a_while(bandwidth=20_000)

    async def latency(self) -> None:
        await self._for_a_while(delay=0.05, jitter=0.1)

    async def restart_nsqd(self) -> None:
        await asyncio.to_thread(self.nsqd.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(self.nsqd.start)

    async def _for_a_while(self, **knobs: Any) -> None:
        for proxy in self.proxies:
            for name, value in knobs.items():
                setattr(proxy, name, value)
        await asyncio.sleep(3.0)
        for proxy in self.proxies:
            proxy.heal()

    def cycle(self) -> list[Callable[[], Awaitable[None]]]:
        faults = [self.cut, self.reset_down, self.reset_up, self.blackhole, self.half_open_server,
                  self.half_open_client, self.stall_up, self.throttle, self.latency]
        # The embedded nsqd keeps messages in memory only: a restarted process starts empty.
        return [*faults, self.restart_nsqd] if self.nsqd.real else faults

    async def strike(self, fault: Callable[[], Awaitable[None]], started: float) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time()
        try:
            await fault()
            outcome = "ok"
        except Exception as exc:  # noqa: BLE001 - a fault that could not be applied is reported, not fatal
            outcome = f"{type(exc).__name__}: {exc}"
        self.faults.append({"t": round(at - started, 1), "fault": fault.__name__, "seconds": round(loop.time() - at, 2),
                            "outcome": outcome})
        print(json.dumps({"fault": self.faults[-1]}), flush=True)


async def sustained(soak: Soak, args: argparse.Namespace) -> dict[str, Any]:
    topic, ledger = f"soak_{os.getpid()}", soak.ledger
    padding = b"s" * max(0, args.size - BODY.size)
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    producer = fastnsq.Producer([soak.to_producer.address], heartbeat_interval=HEARTBEAT, reconnect_delay=0.05,
                                max_reconnect_delay=1.0, publish_timeout=5.0)
    consumer = fastnsq.Consumer(topic, "soak", nsqd_tcp_addresses=[soak.to_consumer.address], max_in_flight=2500,
                                heartbeat_interval=HEARTBEAT, msg_timeout=5.0, reconnect_delay=0.05,
                                max_reconnect_delay=1.0)
    before_start = footprint()
    await producer.start()
    await consumer.start()

    async def consume() -> None:
        unpack = BODY.unpack_from
        async for batch in consumer.batches(max_size=500, max_wait=0.2):
            for message in batch:
                ledger.deliver(unpack(message.body)[0])
            batch.finish()

    async def publish() -> None:
        tick = 0.05
        per_tick = max(1, int(args.rate * tick))
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        pending = soak.publishing

        async def one(seqs: range) -> None:
            try:
                await producer.mpublish(topic, [BODY.pack(seq) + padding for seq in seqs])
                ledger.settle(seqs, True)
            except (NSQError, asyncio.TimeoutError, OSError):
                ledger.settle(seqs, False)

        while not stop.is_set():
            task = asyncio.create_task(one(ledger.publishing(per_tick)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - loop.time()))
        await asyncio.gather(*pending)

    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = [asyncio.create_task(consume()), asyncio.create_task(publish())]
    faults = soak.cycle()
    next_fault, next_sample, struck = start + args.fault_every, start + args.every, 0
    while loop.time() - start < args.minutes * 60:
        await asyncio.sleep(min(next_fault, next_sample) - loop.time())
        if loop.time() >= next_fault and loop.time() - start < args.minutes * 60 - args.fault_every / 2:
            await soak.strike(faults[struck % len(faults)], start)
            struck += 1
            next_fault = loop.time() + args.fault_every
        if loop.time() >= next_sample:
            samples.append(sample(loop.time() - start, soak, consumer, producer))
            print(json.dumps(samples[-1]), flush=True)
            next_sample += args.every
    stop.set()
    await tasks[1]
    drained = await wait_for_all(ledger, timeout=120)
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)
    end = sample(loop.time() - start, soak, consumer, producer)
    await consumer.stop()
    await producer.close()
    end_after_close = await settled(before_start["fds"])
    result = summarize(args, samples, end, end_after_close, ledger, soak.faults, drained)
    return {**result, "before_start": before_start}


async def settled(baseline_fds: int, timeout: float = 5.0) -> dict[str, Any]:
    """Descriptors and tasks once closed connections are gone: the proxies close their side a few loop turns later."""
    deadline = asyncio.get_running_loop().time() + timeout
    while open_fds() > baseline_fds and asyncio.get_running_loop().time() < deadline:
        gc.collect()
        await asyncio.sleep(0.1)
    return footprint()


def sample(t: float, soak: Soak, consumer: fastnsq.Consumer, producer: fastnsq.Producer) -> dict[str, Any]:
    """One sample; ``tasks`` are the loop's tasks less the harness's MPUBs still waiting."""
    ledger, nsqd = soak.ledger, soak.nsqd
    return {
        "t": round(t, 1), "rss_kib": rss_kib(), "fds": open_fds(),
        "tasks": len(asyncio.all_tasks()) - len(soak.publishing), "harness_publishes": len(soak.publishing),
        "gc_objects": len(gc.get_objects()), "in_flight": consumer.snapshot().in_flight,
        "handler_tasks": len(consumer._dispatch.tasks), "publishes_waiting": producer.snapshot().waiting,
        "connections": len(consumer.connections) + len(producer.connections),
        "nsqd_rss_kib": rss_kib(nsqd.pid) if nsqd.running and nsqd.pid else None,
        "published": ledger.published, "consumed": ledger.consumed,
    }


async def wait_for_all(ledger: Ledger, timeout: float) -> bool:
    """Until every acknowledged message was consumed at least once (True), or ``timeout`` (False)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if ledger.consumed >= ledger.acknowledged and ledger.lost() == 0:
            return True
        await asyncio.sleep(0.5)
    return False


def window(samples: list[dict[str, Any]], key: str, first: bool, seconds: float) -> float:
    """The median of ``key`` over the first (after a minute's warm-up) or the last ``seconds``."""
    warm = [s for s in samples if s["t"] >= min(60.0, samples[-1]["t"] / 4)] or samples
    edge = warm[0]["t"] + seconds if first else warm[-1]["t"] - seconds
    values = sorted(s[key] for s in warm if (s["t"] <= edge if first else s["t"] >= edge))
    return values[len(values) // 2]


def summarize(args: argparse.Namespace, samples: list[dict[str, Any]], end: dict[str, Any],
              after_close: dict[str, Any], ledger: Ledger, faults: list[dict[str, Any]], drained: bool) -> dict[str, Any]:
    span = min(300.0, max(args.every, samples[-1]["t"] / 5))  # five minutes, or a fifth of a short run
    flat = {key: {"start": window(samples, key, True, span), "end": window(samples, key, False, span)}
            for key in ("rss_kib", "fds", "tasks", "in_flight", "handler_tasks", "publishes_waiting", "gc_objects")}
    return {
        "minutes": args.minutes, "rate": args.rate, "size": args.size, "fault_every_s": args.fault_every,
        "ledger": ledger.counts(), "all_consumed": drained, "faults": faults,
        "first_sample": samples[0], "last_sample": samples[-1], "after_drain": end, "after_close": after_close,
        "medians_first_and_last_window": flat, "window_s": span,
        "fds_min_max": [min(s["fds"] for s in samples), max(s["fds"] for s in samples)],
        "tasks_min_max": [min(s["tasks"] for s in samples), max(s["tasks"] for s in samples)],
        "samples": samples,
    }


async def reconnects(address: str, count: int) -> dict[str, Any]:
    """Cut every connection ``count`` times; descriptors and tasks must come back to baseline."""
    topic = f"soak_reconnect_{os.getpid()}"
    async with FaultProxy(address) as proxy:
        producer = fastnsq.Producer([proxy.address], reconnect_delay=0.005, max_reconnect_delay=0.05)
        consumer = fastnsq.Consumer(topic, "ch", nsqd_tcp_addresses=[proxy.address], handler=lambda m: None,
                                    max_in_flight=10, reconnect_delay=0.005, max_reconnect_delay=0.05)
        await producer.start()
        await consumer.start()
        await producer.publish(topic, b"warm")
        await asyncio.sleep(0.2)
        gc.collect()
        before = footprint()
        peak_fds = peak_tasks = 0
        for _ in range(count):
            proxy.cut()
            await asyncio.sleep(0.005)
            while not (producer.connections and consumer.connections):
                await asyncio.sleep(0.005)
            peak_fds = max(peak_fds, open_fds())
            peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))
        await producer.publish(topic, b"after")
        await asyncio.sleep(0.3)
        gc.collect()
        after = footprint()
        result = {"reconnects": count, "proxy_accepted": proxy.accepted, "before": before, "after": after,
                  "peak_fds": peak_fds, "peak_tasks": peak_tasks, "producer_reconnects": producer.snapshot().reconnects}
        await consumer.stop()
        await producer.close()
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    nsqd = NSQDProcess(binary=args.real / "nsqd") if args.real else NSQDProcess("--msg-timeout", "60")
    await asyncio.to_thread(nsqd.start)
    capacity = args.capacity or int(args.rate * args.minutes * 60 * 1.2) + 10_000
    try:
        async with FaultProxy(nsqd.tcp_address) as to_producer, FaultProxy(nsqd.tcp_address) as to_consumer:
            soak = Soak(nsqd, to_producer, to_consumer, Ledger(capacity))
            result = {"server": nsqd.describe(), "soak": await sustained(soak, args)}
        if args.reconnects:
            result["reconnect"] = await reconnects(nsqd.tcp_address, args.reconnects)
    finally:
        await asyncio.to_thread(nsqd.close)
    return result


def failures(result: dict[str, Any]) -> list[str]:
    """What did not hold: a loss, a message not consumed, descriptors or tasks that did not come back."""
    s = result["soak"]
    found = []
    if s["ledger"]["lost"] or not s["all_consumed"]:
        found.append(f"lost {s['ledger']['lost']} acknowledged messages")
    if s["ledger"]["acknowledged"] + s["ledger"]["raised"] != s["ledger"]["published"]:
        found.append("a publish was neither acknowledged nor raised")
    if s["after_drain"]["in_flight"] or s["after_drain"]["publishes_waiting"]:
        found.append(f"bookkeeping not drained: {s['after_drain']}")
    if s["after_close"]["fds"] > s["before_start"]["fds"]:
        found.append(f"descriptors leaked: {s['before_start']['fds']} before the clients started, "
                     f"{s['after_close']['fds']} after they closed")
    r = result.get("reconnect")
    if r and (r["after"]["fds"] > r["before"]["fds"] or r["after"]["tasks"] > r["before"]["tasks"]):
        found.append(f"reconnects leaked: {r['before']} -> {r['after']}")
    return found


def print_summary(result: dict[str, Any]) -> None:
    s = result["soak"]
    flat = s["medians_first_and_last_window"]
    print(f"\nsoak {s['minutes']} min at {s['rate']} msg/s against {result['server']}, a fault every {s['fault_every_s']} s "
          f"({len(s['faults'])} faults): {s['ledger']}")
    print(f"medians over the first and the last {s['window_s']:.0f} s: " +
          ", ".join(f"{k} {v['start']} -> {v['end']}" for k, v in flat.items()))
    print(f"fds {s['fds_min_max']}, tasks {s['tasks_min_max']}; after the drain {s['after_drain']}")
    r = result.get("reconnect")
    if r:
        print(f"{r['reconnects']} reconnects: fds {r['before']['fds']} -> {r['after']['fds']} (peak {r['peak_fds']}), "
              f"tasks {r['before']['tasks']} -> {r['after']['tasks']} (peak {r['peak_tasks']}), "
              f"RSS {r['before']['rss_kib']} -> {r['after']['rss_kib']} KiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=lambda p: Path(p).expanduser(), help="folder with a real nsqd (default: embedded)")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=5000, help="messages per second published")
    parser.add_argument("--size", type=int, default=100, help="body size in bytes (at least 8)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--reconnects", type=int, default=1000)
    parser.add_argument("--capacity", type=int, default=0, help="messages the ledger can hold (default: from the rate)")
    parser.add_argument("--json", type=Path, help="write the result here (default: bench/results/soak-<date>.json)")
    args = parser.parse_args()
    if args.size < BODY.size or args.rate < 1 or args.minutes <= 0 or args.every <= 0 or args.fault_every <= 0:
        parser.error("--size >= 8, --rate >= 1, --minutes, --every and --fault-every > 0")
    logging.getLogger("fastnsq").setLevel(logging.ERROR)  # every fault logs a warning otherwise
    outcome = fastnsq.run(main(args))
    outcome.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), python=platform.python_version(),
                   machine=f"{platform.machine()} {os.cpu_count()} cores", codec=fastnsq.CODEC_IMPLEMENTATION,
                   command=" ".join(["bench/soak.py", *sys.argv[1:]]))
    problems = failures(outcome)
    outcome["failures"] = problems
    out = args.json or ROOT / "bench" / "results" / f"soak-{datetime.now():%Y%m%d-%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(outcome, indent=1))
    print_summary(outcome)
    print(f"written to {out}")
    for problem in problems:
        print(f"FAILED: {problem}")
    sys.exit(1 if problems else 0)
