"""``fastnsq pub``: publish a body, a file or stdin lines, at a rate if asked."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from ._common import (
    CommandError,
    check_lookupd,
    client_settings,
    delimiter_arg,
    int_at_least,
    passthrough_options,
    positive_float,
    require_tls,
    resolve_topic,
    run_async,
    servers_of,
    subparser_of,
    topic_arg,
)


def _build_pub(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "pub", parents=[common, client], help="publish a message, or stdin lines (like to_nsq)",
        usage="fastnsq pub [options] TOPIC [BODY | -]",
        description="Publish BODY to TOPIC, or one message per line of stdin when BODY is '-' or missing "
        "(empty lines are skipped, as to_nsq does). Lines are sent in MPUB batches.",
        epilog="Examples: fastnsq pub events hello;  seq 1000 | fastnsq pub events --rate 100",
    )
    sub.add_argument("topic", nargs="?", metavar="TOPIC", help="topic to publish to")
    sub.add_argument("body", nargs="?", metavar="BODY", help="message body; '-' or absent: read stdin lines")
    sub.add_argument("--topic", dest="topic_option", type=topic_arg, metavar="TOPIC", help="the topic, as to_nsq takes it")
    sub.add_argument("--count", type=int_at_least(1), metavar="N",
                     help="publish BODY N times, or at most N stdin lines")
    sub.add_argument("--rate", type=positive_float, metavar="MSG/S", help="publish at most this many messages per second")
    sub.add_argument("--delimiter", type=delimiter_arg, default=b"\n", metavar="CHAR",
                     help="byte that separates stdin messages (default newline)")
    sub.add_argument("-q", "--quiet", action="store_true", help="do not print the summary")
    sub.add_argument("--producer-opt", action="append", default=[], metavar="NAME=VALUE",
                     help="any Producer option, go-nsq's names (pool_size=2, publish_timeout=5s...; "
                          "may be given multiple times; go's NAME,VALUE works too)")
    sub.set_defaults(run=_run_pub)


# ---- pub --------------------------------------------------------------------------------------


def _run_pub(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    resolve_topic(parser, args, takes_body=True)
    if args.body is not None and args.body != "-" and not args.body:
        subparser_of(parser, "pub").error("BODY is empty: nsqd rejects empty messages")
    settings = {**client_settings(args),
                **passthrough_options(args.producer_opt, for_="producer", flag="--producer-opt")}
    started = time.perf_counter()
    published = run_async(_publish(args, settings))
    elapsed = time.perf_counter() - started
    if not args.quiet:
        noun = "message" if published == 1 else "messages"
        rate = f" ({published / elapsed:,.0f} msg/s)" if published >= 100 and elapsed > 0 else ""
        print(f"published {published:,} {noun} to {args.topic} in {elapsed:.2f} s{rate}")
    return 0


async def _publish(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from ..producer import Producer

    nsqd, lookupd = servers_of(args)
    for address in lookupd:
        await check_lookupd(address, None, settings["auth_secret"])
    # One command: an nsqd it cannot reach at the start is its error; a restart later is waited
    # out within the publish timeout. --producer-opt may say otherwise.
    producer = Producer(nsqd, lookupd_http_addresses=lookupd, **{"lazy_connect": False, "fail_fast": False,
                                                                  **settings})
    await producer.start()
    try:
        if not producer.connections:
            raise CommandError("no nsqd to publish to: the lookupd lists none (publish to --nsqd-tcp-address first)")
        for conn in producer.connections:
            require_tls(conn, settings)
        pacer = _Pacer(args.rate)
        if args.body is not None and args.body != "-":
            chunks = _repeat(args.body.encode(), args.count or 1)
        else:
            chunks = _stdin_chunks(args.delimiter, args.count)
        return await _send_chunks(producer, args.topic, chunks, pacer)
    finally:
        await producer.close()


_BATCH = 1000  # messages per MPUB: large enough to amortise, small enough to pace smoothly


async def _repeat(body: bytes, count: int) -> AsyncIterator[list[bytes]]:
    while count > 0:
        take = min(count, _BATCH)
        yield [body] * take
        count -= take


async def _stdin_chunks(delimiter: bytes, limit: int | None) -> AsyncIterator[list[bytes]]:
    """stdin split on ``delimiter`` (empty messages skipped), read by a daemon thread.

    A daemon thread, not the loop's executor: a read blocked on a terminal must not
    keep the process alive after Ctrl-C.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)  # bounded: a fast file waits for nsqd
    stream: Any = sys.stdin.buffer  # a BufferedReader: read1 returns what is there, without waiting for more

    def read() -> None:
        try:
            while True:
                data = stream.read1(65536)
                asyncio.run_coroutine_threadsafe(queue.put(data or None), loop).result()
                if not data:
                    return
        except (RuntimeError, OSError, ValueError):  # the loop is gone or stdin closed: stop reading
            return

    threading.Thread(target=read, name="fastnsq-stdin", daemon=True).start()
    rest = b""
    sent = 0
    while limit is None or sent < limit:
        data = await queue.get()
        if data is None:
            parts, rest = [rest], b""
        else:
            parts = (rest + data).split(delimiter)
            rest = parts.pop()
        lines = [line for line in parts if line]
        if limit is not None:
            lines = lines[: limit - sent]
        for start in range(0, len(lines), _BATCH):
            yield lines[start : start + _BATCH]
        sent += len(lines)
        if data is None:
            return


class _Pacer:
    """How many messages may go now to keep at most ``rate`` per second (None: no limit)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.sent = 0
        self.start = time.monotonic()

    async def allowance(self, wanted: int) -> int:
        if self.rate is None:
            return wanted
        while True:
            due = int((time.monotonic() - self.start) * self.rate) + 1 - self.sent
            if due > 0:
                return min(due, wanted)
            await asyncio.sleep((self.sent + 1 - (time.monotonic() - self.start) * self.rate) / self.rate)


async def _send_chunks(producer: Any, topic: str, chunks: AsyncIterator[list[bytes]], pacer: _Pacer) -> int:
    """Publish every chunk (MPUB, or PUB for one message), a few commands in flight at once."""
    in_flight: set[asyncio.Task[Any]] = set()
    published = 0

    async def settle(limit: int) -> None:
        nonlocal in_flight
        while len(in_flight) > limit:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises the publish's error

    async for chunk in chunks:
        offset = 0
        while offset < len(chunk):
            take = await pacer.allowance(len(chunk) - offset)
            part = chunk[offset : offset + take]
            offset += take
            pacer.sent += take
            send = producer.publish(topic, part[0]) if take == 1 else producer.mpublish(topic, part)
            in_flight.add(asyncio.ensure_future(send))
            published += take
            await settle(4)
    await settle(0)
    return published
