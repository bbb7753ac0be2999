"""The demo: an embedded nsqd, then a real publish/consume run with throughput and latency.

One job: show on a fresh machine, in seconds, what fastnsq does. ``python -m
fastnsq.demo`` (what ``python3 dev.py demo`` runs):

1. starts the embedded nsqd (``fastnsq nsqd``) in a child process, so the server
   and the client each get a core of their own;
2. **publish**: sends ``--count`` messages of ``--size`` bytes with
   ``Producer.mpublish`` into a channel whose consumer is paused
   (``max_in_flight`` 0): publish throughput;
3. **consume**: drains that backlog with ``Consumer.batches()``, checking that
   every message arrives exactly once: consume throughput;
4. **end to end**: publishes at a steady rate while consuming and measures, per
   message, the time from the timestamp written into its body at publish time to
   the moment the batch handler sees it: latency percentiles.

Every body starts with that timestamp (8 bytes) and a sequence number (8 bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import CODEC_IMPLEMENTATION, Consumer, Producer, __version__
from .cli import CommandError
from .errors import NSQError
from .testing.process import NSQDProcess

__all__ = ["DemoSettings", "main", "percentile"]

_HEADER = struct.Struct("<qq")  # publish time (perf_counter ns), sequence number
_TOPIC = f"fastnsq_demo_{os.getpid()}"  # a fresh topic: a real nsqd may keep an earlier run's messages
_CHANNEL = "demo"


@dataclass
class DemoSettings:
    """What the demo runs (the command line's options)."""

    count: int = 500_000
    size: int = 100
    batch: int = 500  # messages per MPUB
    in_flight: int = 4  # MPUBs awaiting their OK at once
    max_in_flight: int = 2500  # the consumer's; nsqd's default max RDY
    batch_max_size: int = 1000
    backlog_max_wait: float = 0.05  # draining a backlog: batches fill up, the wait hardly matters
    steady_max_wait: float = 0.005  # at a steady rate: the longest a message waits for its batch
    steady_seconds: float = 3.0
    steady_rate: float | None = None  # None: half the slower of publish and consume
    nsqd_tcp_address: str | None = None  # None: start the embedded nsqd
    in_process: bool = False


@dataclass
class _Receiver:
    """What the batch handler saw: counts, exactly-once bookkeeping, latencies."""

    expected: int
    seen: bytearray = field(init=False)
    received: int = 0
    duplicates: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    record_latency: bool = False

    def __post_init__(self) -> None:
        self.seen = bytearray(self.expected)

    def reset(self, expected: int, *, record_latency: bool) -> None:
        self.expected = expected
        self.seen = bytearray(expected)
        self.received = self.duplicates = 0
        self.latencies_ns = []
        self.record_latency = record_latency

    @property
    def complete(self) -> bool:
        return self.received - self.duplicates >= self.expected


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The value below which ``fraction`` of the sorted values fall (nearest rank).

    >>> percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.5), percentile([1, 2, 3], 0.99)
    (5, 3)
    """
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, -(-int(fraction * 1_000_000) * len(sorted_values) // 1_000_000))  # ceil, exact for ints
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _say(text: str = "") -> None:
    print(text, flush=True)


# ---- the phases ---------------------------------------------------------------------------------


def _bodies(start: int, count: int, padding: bytes) -> list[bytes]:
    now = time.perf_counter_ns()
    pack = _HEADER.pack
    return [pack(now, seq) + padding for seq in range(start, start + count)]


async def _publish_all(producer: Producer, settings: DemoSettings, padding: bytes) -> float:
    """Publish ``count`` messages as fast as nsqd acknowledges them; returns the seconds taken."""
    next_seq = 0

    async def sender() -> None:
        nonlocal next_seq
        while next_seq < settings.count:
            start = next_seq
            n = min(settings.batch, settings.count - start)
            next_seq += n
            await producer.mpublish(_TOPIC, _bodies(start, n, padding))

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(settings.in_flight)))
    return time.perf_counter() - started


async def _publish_steady(producer: Producer, rate: float, seconds: float, padding: bytes) -> int:
    """Publish ``rate`` messages a second for ``seconds``, one MPUB per 10 ms tick; returns the count."""
    tick = 0.01
    total = int(rate * seconds)
    sent = 0
    started = time.perf_counter()
    pending: set[asyncio.Task[object]] = set()
    while sent < total:
        due = min(total, int((time.perf_counter() - started) * rate)) - sent
        if due > 0:
            task = asyncio.ensure_future(producer.mpublish(_TOPIC, _bodies(sent, due, padding)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += due
        await asyncio.sleep(tick)
    if pending:
        await asyncio.gather(*pending)
    return sent


async def _consume(consumer: Consumer, receiver: _Receiver, done: asyncio.Event, max_size: int, max_wait: float) -> None:
    """The batch handler: record each message, then FIN the batch in one write."""
    unpack_from = _HEADER.unpack_from
    async for batch in consumer.batches(max_size=max_size, max_wait=max_wait):
        now_ns = time.perf_counter_ns()
        latencies = receiver.latencies_ns if receiver.record_latency else None
        seen = receiver.seen
        for message in batch:
            stamp, seq = unpack_from(message.body)
            if seq < len(seen):
                if seen[seq]:
                    receiver.duplicates += 1
                seen[seq] = 1
            if latencies is not None:
                latencies.append(now_ns - stamp)
        batch.finish()
        receiver.received += len(batch)
        if receiver.complete:
            done.set()


async def _wait(done: asyncio.Event, receiver: _Receiver, what: str, timeout: float) -> None:
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except asyncio.TimeoutError:
        raise RuntimeError(
            f"{what}: only {receiver.received - receiver.duplicates:,} of {receiver.expected:,} messages "
            f"arrived within {timeout:.0f} s"
        ) from None


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f} msg/s" if seconds > 0 else "           - msg/s"


def _latency_line(latencies_ns: list[int]) -> str:
    values = sorted(latencies_ns)
    parts = [f"{name} {percentile(values, q) / 1e6:.2f} ms" for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))]
    return "   ".join(parts) + f"   max {values[-1] / 1e6:.2f} ms"


async def run_demo(settings: DemoSettings) -> None:
    """The three phases against the nsqd at ``settings.nsqd_tcp_address``."""
    address = settings.nsqd_tcp_address
    assert address is not None
    padding = b"x" * (settings.size - _HEADER.size)
    receiver = _Receiver(settings.count)
    done = asyncio.Event()
    async with Producer([address], publish_timeout=60.0) as producer:
        # The channel exists before anything is published, so the backlog queues in it.
        consumer = Consumer(_TOPIC, _CHANNEL, nsqd_tcp_addresses=[address], max_in_flight=0)
        await consumer.start()
        if not consumer.connections:
            raise RuntimeError(f"cannot consume from nsqd {address}")
        reader = asyncio.create_task(
            _consume(consumer, receiver, done, settings.batch_max_size, settings.backlog_max_wait)
        )
        try:
            _say(f"\n1) publish {settings.count:,} messages of {settings.size} bytes: Producer.mpublish(), "
                 f"batches of {settings.batch}, {settings.in_flight} in flight")
            publish_seconds = await _publish_all(producer, settings, padding)
            _say(f"   published {settings.count:>10,} in {publish_seconds:6.2f} s {_rate(settings.count, publish_seconds)}")

            _say(f"2) consume them: Consumer.batches(max_size={settings.batch_max_size}, "
                 f"max_wait={settings.backlog_max_wait}), max_in_flight {settings.max_in_flight}, batch.finish()")
            consume_started = time.perf_counter()
            consumer.set_max_in_flight(settings.max_in_flight)
            await _wait(done, receiver, "consume", 60.0)
            consume_seconds = time.perf_counter() - consume_started
            missing = settings.count - sum(receiver.seen)
            _say(f"   consumed  {receiver.received:>10,} in {consume_seconds:6.2f} s "
                 f"{_rate(receiver.received, consume_seconds)}   (exactly once: {missing:,} missing, "
                 f"{receiver.duplicates:,} twice)")
            if missing:
                raise RuntimeError(f"{missing:,} messages never arrived")

            if settings.steady_seconds > 0:
                fastest = min(settings.count / publish_seconds, receiver.received / consume_seconds)
                rate = settings.steady_rate or max(1000.0, round(fastest / 2, -3))
                expected = int(rate * settings.steady_seconds)
                why = "" if settings.steady_rate else " (half the slower rate above)"
                _say(f"3) end to end: publish {rate:,.0f} msg/s for {settings.steady_seconds:g} s{why} while "
                     f"consuming with")
                _say(f"   Consumer.batches(max_size={settings.batch_max_size}, max_wait={settings.steady_max_wait}); "
                     "latency = batch handler's time - publish time in the body")
                reader.cancel()
                done.clear()
                receiver.reset(expected, record_latency=True)
                reader = asyncio.create_task(
                    _consume(consumer, receiver, done, settings.batch_max_size, settings.steady_max_wait)
                )
                sent = await _publish_steady(producer, rate, settings.steady_seconds, padding)
                await _wait(done, receiver, "end to end", 30.0)
                _say(f"   delivered {receiver.received:>10,} of {sent:,}")
                _say(f"   latency   {_latency_line(receiver.latencies_ns)}")
        finally:
            await consumer.stop(timeout=5.0)
            reader.cancel()


async def _run_with_embedded(settings: DemoSettings) -> None:
    from .testing.nsqd import NSQD

    async with NSQD(msg_timeout=600.0) as nsqd:
        _say(f"embedded nsqd in this process: tcp {nsqd.tcp_address}  http {nsqd.http_address}")
        settings.nsqd_tcp_address = nsqd.tcp_address
        await run_demo(settings)


def _header() -> str:
    codec = "C extension" if CODEC_IMPLEMENTATION == "c" else f"{CODEC_IMPLEMENTATION} (pure Python)"
    from .loop import uvloop_enabled

    loop = "uvloop" if uvloop_enabled() else "asyncio"
    return (f"fastnsq {__version__} demo: codec {codec}, loop {loop}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs")


def build_parser() -> argparse.ArgumentParser:
    defaults = DemoSettings()
    parser = argparse.ArgumentParser(
        prog="python -m fastnsq.demo",
        description="Start the embedded nsqd, publish and consume with fastnsq, print throughput and latency.",
    )
    parser.add_argument("--count", type=int, default=defaults.count, help="messages to publish and consume (default %(default)s)")
    parser.add_argument("--size", type=int, default=defaults.size, help="bytes per message, at least 16 (default %(default)s)")
    parser.add_argument("--steady-seconds", type=float, default=defaults.steady_seconds,
                        help="length of the end-to-end latency run, 0 to skip (default %(default)s)")
    parser.add_argument("--steady-rate", type=float, default=None,
                        help="messages/s of the latency run (default: half the measured throughput)")
    parser.add_argument("--nsqd-tcp-address", default=None, help="use this nsqd instead of starting the embedded one")
    parser.add_argument("--in-process", action="store_true",
                        help="run the embedded nsqd in this process (shares the client's core: slower)")
    return parser


def _settings(argv: Sequence[str] | None) -> DemoSettings:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    if args.size < _HEADER.size:
        parser.error(f"--size must be at least {_HEADER.size} (timestamp and sequence number), got {args.size}")
    if args.steady_seconds < 0 or (args.steady_rate is not None and args.steady_rate <= 0):
        parser.error("--steady-seconds must be >= 0 and --steady-rate > 0")
    return DemoSettings(count=args.count, size=args.size, steady_seconds=args.steady_seconds,
                        steady_rate=args.steady_rate, nsqd_tcp_address=args.nsqd_tcp_address,
                        in_process=args.in_process)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit status."""
    from .loop import run

    settings = _settings(argv)
    # Errors are reported once, below; the library's warnings (a refused connection) would repeat them.
    logging.basicConfig(level=logging.ERROR, format="demo: %(name)s: %(message)s")
    started = time.perf_counter()
    _say(_header())
    child: NSQDProcess | None = None
    try:
        if settings.nsqd_tcp_address is None and settings.in_process:
            run(_run_with_embedded(settings))
        else:
            if settings.nsqd_tcp_address is None:
                child = NSQDProcess("--msg-timeout", "600")
                child.start()
                settings.nsqd_tcp_address = child.tcp_address
                _say(f"embedded nsqd in a child process (pid {child.pid}): "
                     f"tcp {child.tcp_address}  http {child.http_address}")
            else:
                _say(f"nsqd at {settings.nsqd_tcp_address} (topic {_TOPIC}, channel {_CHANNEL})")
            run(run_demo(settings))
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    except (NSQError, CommandError, OSError, RuntimeError, asyncio.TimeoutError) as exc:
        print(f"demo: error: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    finally:
        if child is not None:
            child.stop()
    _say(f"done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
