"""fastnsq's side of bench/latency.py: an open-loop publisher and a consumer that measures.

The schedule is planned before the first message: message ``i`` is due at
``start_ns + i / rate`` (``CLOCK_MONOTONIC``), whatever happened to the messages
before it, so a stall anywhere (publisher, nsqd, consumer) shows as latency of every
message due during it, counted from its due time (no coordinated omission). The
body carries the due time in its first 8 bytes and the message number in the next 8
(big-endian), as ``bench/go/src/gonsq_latency`` writes and reads them, so the two
clients' publishers and consumers can be paired either way.

* publisher: a ``timerfd`` (``CLOCK_MONOTONIC``, absolute) wakes the loop when the next
  message is due (the loop's own timers round to a millisecond); every message due by
  then is published fire-and-forget, a task per ``publish()``. Publish latency: due
  time to nsqd's answer.
* consumer: end-to-end latency = arrival in the handler (or in the ``batches()`` /
  ``async for`` loop) minus the due time in the body.

Each prints one ``RESULT {json}`` line: percentiles (p50, p99, p99.9, max, in ms) of
the messages due in the measuring window, the median of each third of the window (a
rising row is a backlog that grows), the achieved rate (messages published, or
received, during the window over its length) and the process's CPU.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import ctypes
import gc
import json
import logging
import math
import os
import resource
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastnsq

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC
CONSUMER_MODES = ("handler", "batches", "iter")
#: The publisher's shortest wake period (ns): a message is at most this late by the schedule.
PERIOD_NS = 100_000


@dataclass(frozen=True)
class Schedule:
    """Message ``i`` is due at ``start_ns + i / rate``; the window follows ``warmup`` seconds.

    ``cooldown`` seconds of messages follow the window, not measured: the window's last
    messages must not be the last ones, which nsqd would hold in a connection's output
    buffer until its ``output_buffer_timeout``.
    """

    rate: float
    start_ns: int
    warmup: float = 1.0
    window: float = 3.0
    cooldown: float = 0.5

    @property
    def count(self) -> int:
        return round(self.rate * (self.warmup + self.window + self.cooldown))

    def due(self, i: int) -> int:
        return self.start_ns + int(i * 1e9 / self.rate)

    @property
    def bounds(self) -> tuple[int, int]:
        low = self.start_ns + int(self.warmup * 1e9)
        return low, low + int(self.window * 1e9)

    def in_window(self, t: int) -> bool:
        low, high = self.bounds
        return low <= t < high

    def expected_in_window(self) -> int:
        return sum(1 for i in range(self.count) if self.in_window(self.due(i)))


def make_body(due_ns: int, number: int, size: int) -> bytes:
    return due_ns.to_bytes(8, "big") + number.to_bytes(8, "big") + b"x" * (size - 16)


def due_of(body: bytes) -> int:
    return int.from_bytes(body[:8], "big")


def percentiles(latencies_ns: Sequence[int]) -> dict[str, float]:
    """p50, p99, p99.9 (nearest rank) and max, in ms; {} without samples."""
    if not latencies_ns:
        return {}
    ordered = sorted(latencies_ns)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1e6

    return {"p50": rank(0.5), "p99": rank(0.99), "p999": rank(0.999), "max": ordered[-1] / 1e6}


def thirds_p50(schedule: Schedule, dues: Sequence[int], latencies: Sequence[int]) -> list[float]:
    """The median latency of each third of the window, by due time."""
    low, high = schedule.bounds
    parts: list[list[int]] = [[], [], []]
    for due, latency in zip(dues, latencies):
        parts[min(2, 3 * (due - low) // (high - low))].append(latency)
    return [percentiles(part).get("p50", float("nan")) for part in parts]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def runqueue_wait_seconds() -> float:
    """Time this process's threads were runnable but waiting for a core (``/proc/.../schedstat``):
    a single-threaded publisher's latency tail on a busy machine is its wait for the scheduler."""
    total = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


class GCPauses:
    """Python's cyclic collections while it runs (``gc.callbacks``): how many, the longest, the total.
    A task per message makes short-lived objects; a collection's pause would hold every message due
    meanwhile."""

    def __init__(self) -> None:
        self.count = 0
        self.longest_ns = 0
        self.total_ns = 0
        self._started = 0

    def start(self) -> None:
        gc.callbacks.append(self._note)

    def stop(self) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.monotonic_ns()
            return
        pause = time.monotonic_ns() - self._started
        self.count += 1
        self.total_ns += pause
        self.longest_ns = max(self.longest_ns, pause)

    def summary(self) -> dict[str, float]:
        return {"collections": self.count, "longest_ms": self.longest_ns / 1e6, "total_ms": self.total_ns / 1e6}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class MonotonicAlarm:
    """A timerfd the event loop watches: ``arm(t_ns, period_ns)`` calls ``callback`` at
    CLOCK_MONOTONIC ``t_ns``, then every ``period_ns`` (one ``timerfd_settime`` for the run: through
    ctypes, one per message took a third of the publisher's CPU at 50,000 msg/s).

    Why not ``loop.call_at``: uvloop's timers (libuv's) and asyncio's (epoll's timeout)
    have millisecond resolution, which would batch a 10,000 msg/s schedule into bursts
    of 10 and add up to a millisecond to every latency measured.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self._loop = loop
        self._callback = callback
        loop.add_reader(self._fd, self._fired)

    def arm(self, at_ns: int, period_ns: int = 0) -> None:
        spec = _Itimerspec(_Timespec(period_ns // 1_000_000_000, period_ns % 1_000_000_000),
                           _Timespec(at_ns // 1_000_000_000, at_ns % 1_000_000_000))
        if self._libc.timerfd_settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        self._callback()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


async def publish_open_loop(
    address: str, topic: str, schedule: Schedule, *, size: int = 100, options: dict[str, Any] | None = None,
    callers: int = 1000, period_ns: int = PERIOD_NS,
) -> dict[str, Any]:
    """Publish ``schedule.count`` messages, each when due; the summary of publish latency.

    ``callers`` tasks await ``producer.publish()`` in turn, each taking the next message
    due (how the throughput benchmark publishes: a task per message costs more than the
    publish itself); 0 starts a task per message instead.
    """
    loop = asyncio.get_running_loop()
    count = schedule.count
    sent = array.array("q", bytes(8 * count))
    acks = array.array("q", bytes(8 * count))
    state = {"errors": 0, "left": count, "next": 0}
    finished = loop.create_future()
    due: deque[int] = deque()  # due and not taken by a caller yet
    idle: list[asyncio.Future[None]] = []

    def answered(i: int, failed: bool) -> None:
        acks[i] = time.monotonic_ns()
        state["errors"] += failed
        state["left"] -= 1
        if not state["left"] and not finished.done():
            finished.set_result(None)

    async def publish_one(producer: Any, i: int) -> None:
        sent[i] = time.monotonic_ns()
        try:
            await producer.publish(topic, make_body(schedule.due(i), i, size))
        except fastnsq.NSQError:
            answered(i, True)
        else:
            answered(i, False)

    async def caller(producer: Any) -> None:
        while True:
            while not due:
                waiter = loop.create_future()
                idle.append(waiter)
                await waiter
            await publish_one(producer, due.popleft())

    async with fastnsq.Producer([address], **(options or {})) as producer:

        def publish_due() -> None:
            now = time.monotonic_ns()
            i = state["next"]
            while i < count and schedule.due(i) <= now:
                if callers:
                    due.append(i)
                else:
                    loop.create_task(publish_one(producer, i))
                i += 1
            state["next"] = i
            for _ in range(min(len(due), len(idle))):
                idle.pop().set_result(None)
            if i == count:
                alarm.arm(0)  # disarmed

        workers = [loop.create_task(caller(producer)) for _ in range(callers)]
        await asyncio.sleep(0)  # every caller waiting
        alarm = MonotonicAlarm(loop, publish_due)
        cpu0, wait0 = cpu_seconds(), runqueue_wait_seconds()
        collections = GCPauses()
        collections.start()
        # Every 1/rate, but at most every period_ns: above 10,000 msg/s a wake takes all that is due.
        alarm.arm(schedule.due(0), max(period_ns, round(1e9 / schedule.rate)))
        await finished
        collections.stop()
        cpu1, wait1 = cpu_seconds(), runqueue_wait_seconds()
        alarm.close()
        for worker in workers:
            worker.cancel()
    api = f"Producer.publish from {callers} tasks" if callers else "Producer.publish, a task each"
    return {**_publish_summary(schedule, sent, acks, cpu1 - cpu0, state["errors"], {"api": api, **(options or {})}),
            "runqueue_wait_s": wait1 - wait0, "gc": collections.summary()}


def publish_from_threads(
    address: str, topic: str, schedule: Schedule, *, threads: int, size: int = 100,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The blocking facade as a WSGI app or a thread pool uses it: ``threads`` threads share
    one ``fastnsq.sync.Producer``, each taking the next message of the schedule, sleeping
    until it is due and calling ``publish()``. Publish latency: due time to its return."""
    from fastnsq.sync import Producer as BlockingProducer

    count = schedule.count
    sent = array.array("q", bytes(8 * count))
    acks = array.array("q", bytes(8 * count))
    numbers = iter(range(count))  # next() on a range iterator is atomic under the GIL
    errors = [0]

    def publish_in_turn(producer: Any) -> None:
        for i in numbers:
            wait = schedule.due(i) - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            sent[i] = time.monotonic_ns()
            try:
                producer.publish(topic, make_body(schedule.due(i), i, size))
            except fastnsq.NSQError:
                errors[0] += 1
            acks[i] = time.monotonic_ns()

    with BlockingProducer([address], **(options or {})) as producer:
        workers = [threading.Thread(target=publish_in_turn, args=(producer,)) for _ in range(threads)]
        cpu0, wait0 = cpu_seconds(), runqueue_wait_seconds()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        cpu1, wait1 = cpu_seconds(), runqueue_wait_seconds()
    api = f"fastnsq.sync.Producer.publish from {threads} threads"
    return {**_publish_summary(schedule, sent, acks, cpu1 - cpu0, errors[0], {"api": api, **(options or {})}),
            "runqueue_wait_s": wait1 - wait0}


def _publish_summary(schedule: Schedule, sent: array.array[int], acks: array.array[int], cpu_s: float, errors: int,
                     config: dict[str, Any]) -> dict[str, Any]:
    count = schedule.count
    dues = [schedule.due(i) for i in range(count)]
    dump = os.environ.get("FASTNSQ_LATENCY_DUMP")
    if dump:  # for bench/latency_tail.py: due offset, then sent and answered after the due time (ms)
        Path(dump).write_text("".join(f"{(dues[i] - schedule.start_ns) / 1e6:.3f} {(sent[i] - dues[i]) / 1e6:.3f} "
                                      f"{(acks[i] - dues[i]) / 1e6:.3f}\n" for i in range(count)))
    window = [i for i in range(count) if schedule.in_window(dues[i])]
    latencies = [acks[i] - dues[i] for i in window]
    return {
        "mode": "pub", "client": "fastnsq", "rate": schedule.rate, "count": count, "done": count,
        "in_window": len(window),
        "achieved_rate": sum(1 for i in range(count) if schedule.in_window(sent[i])) / schedule.window,
        "latency_ms": percentiles(latencies),
        "thirds_p50_ms": thirds_p50(schedule, [dues[i] for i in window], latencies),
        "late_send_p99_ms": percentiles([sent[i] - dues[i] for i in window]).get("p99"), "cpu_s": cpu_s,
        "errors": errors, "config": config,
    }


class _Recorder:
    """Due times and latencies of the messages received, and when the last one arrived."""

    def __init__(self, schedule: Schedule, loop: asyncio.AbstractEventLoop) -> None:
        self.schedule = schedule
        self.dues = array.array("q")
        self.latencies = array.array("q")
        self.received_at = array.array("q")
        self.all_in = loop.create_future()

    def record(self, body: bytes) -> None:
        now = time.monotonic_ns()
        due = due_of(body)
        self.dues.append(due)
        self.latencies.append(now - due)
        self.received_at.append(now)
        if len(self.dues) >= self.schedule.count and not self.all_in.done():
            self.all_in.set_result(None)

    def summary(self) -> dict[str, Any]:
        s = self.schedule
        chosen = [k for k, due in enumerate(self.dues) if s.in_window(due)]
        latencies = [self.latencies[k] for k in chosen]
        return {
            "count": s.count, "done": len(self.dues), "in_window": len(chosen),
            "achieved_rate": sum(1 for t in self.received_at if s.in_window(t)) / s.window,
            "latency_ms": percentiles(latencies),
            "thirds_p50_ms": thirds_p50(s, [self.dues[k] for k in chosen], latencies),
            "errors": s.expected_in_window() - len(chosen),  # due in the window, never received
        }


async def consume_open_loop(
    address: str, topic: str, channel: str, schedule: Schedule, *, mode: str = "handler",
    options: dict[str, Any] | None = None, batch_size: int = 100, batch_wait: float = 0.001,
    drain: float = 10.0, stall: tuple[float, float] | None = None, ready: Callable[[], None] | None = None,
    keep_samples: bool = False,
) -> dict[str, Any]:
    """Consume until every scheduled message is in or ``drain`` s after the last was due.

    ``stall=(at, seconds)`` blocks the handler once, at ``at`` s after the start, for
    ``seconds`` (the test of the schedule: every message due meanwhile must show it).
    ``keep_samples`` adds every message's (due time, latency) in ns as ``samples``.
    """
    loop = asyncio.get_running_loop()
    recorder = _Recorder(schedule, loop)
    stalled = [stall is None]

    def handle(message: Any) -> None:
        if not stalled[0] and stall is not None and time.monotonic_ns() >= schedule.start_ns + stall[0] * 1e9:
            stalled[0] = True
            time.sleep(stall[1])  # the loop stops: nothing is received meanwhile
        recorder.record(message.body)

    opts = {"max_in_flight": 2500, **(options or {})}
    consumer = fastnsq.Consumer(topic, channel, nsqd_tcp_addresses=[address],
                                handler=handle if mode == "handler" else None, **opts)
    await consumer.start()
    if ready is not None:
        ready()
    cpu0 = cpu_seconds()
    runner = None
    if mode == "batches":
        runner = loop.create_task(_take_batches(consumer, handle, batch_size, batch_wait))
    elif mode == "iter":
        runner = loop.create_task(_take_each(consumer, handle))
    until = (schedule.due(schedule.count - 1) - time.monotonic_ns()) / 1e9 + drain
    try:
        await asyncio.wait_for(asyncio.shield(recorder.all_in), max(0.1, until))
    except asyncio.TimeoutError:
        pass
    cpu1 = cpu_seconds()
    dump = os.environ.get("FASTNSQ_LATENCY_DUMP")
    if dump:  # for looking into one point: due offsets (ms) and latencies (ms), one pair a line
        Path(dump).write_text("".join(f"{(d - schedule.start_ns) / 1e6:.3f} {v / 1e6:.3f}\n"
                                      for d, v in zip(recorder.dues, recorder.latencies)))
    await consumer.stop(timeout=5.0)
    if runner is not None:
        runner.cancel()
    samples = {"samples": list(zip(recorder.dues, recorder.latencies))} if keep_samples else {}
    return {**samples,
        "mode": "sub", "client": "fastnsq", "rate": schedule.rate, **recorder.summary(), "cpu_s": cpu1 - cpu0,
        "config": {"api": mode, **opts, **({"batch_size": batch_size, "batch_wait": batch_wait}
                                            if mode == "batches" else {})},
    }


async def _take_batches(consumer: Any, handle: Callable[[Any], None], size: int, wait: float) -> None:
    async for batch in consumer.batches(size, wait):
        for message in batch:
            handle(message)
        batch.finish()


async def _take_each(consumer: Any, handle: Callable[[Any], None]) -> None:
    async for message in consumer:
        handle(message)
        message.finish()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("pub", "sub"), required=True)
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="latency")
    parser.add_argument("--channel", default="ch")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--start-ns", type=int, required=True, help="CLOCK_MONOTONIC ns when message 0 is due")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--cooldown", type=float, default=0.5, help="published after the window, not measured")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--callers", type=int, default=1000, help="publishing tasks (0: a task per message)")
    parser.add_argument("--period-us", type=float, default=PERIOD_NS / 1000,
                        help="the publisher wakes at most this often and publishes what is due (1000: in bunches of "
                             "a millisecond, as a publisher woken by a millisecond timer does)")
    parser.add_argument("--threads", type=int, default=0,
                        help="publish through fastnsq.sync.Producer from this many threads instead of tasks")
    parser.add_argument("--consume", choices=CONSUMER_MODES, default="handler")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batch-wait", type=float, default=0.001)
    parser.add_argument("--drain", type=float, default=10.0)
    parser.add_argument("--options", default="{}", help="Producer or Consumer options as a JSON object")
    args = parser.parse_args(argv)
    if os.environ.get("FASTNSQ_LATENCY_DEBUG"):
        logging.basicConfig(level=logging.DEBUG, format="%(relativeCreated)8.0f %(name)s %(message)s")
    schedule = Schedule(args.rate, args.start_ns, args.warmup, args.window, args.cooldown)
    options = json.loads(args.options)
    if args.mode == "pub" and args.threads:
        result = publish_from_threads(args.nsqd_tcp_address, args.topic, schedule, threads=args.threads,
                                      size=args.size, options=options)
    elif args.mode == "pub":
        result = fastnsq.run(publish_open_loop(args.nsqd_tcp_address, args.topic, schedule,
                                               size=args.size, options=options, callers=args.callers,
                                               period_ns=round(args.period_us * 1000)))
    else:
        result = fastnsq.run(consume_open_loop(
            args.nsqd_tcp_address, args.topic, args.channel, schedule, mode=args.consume, options=options,
            batch_size=args.batch_size, batch_wait=args.batch_wait, drain=args.drain,
            ready=lambda: print("READY", flush=True),
        ))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
