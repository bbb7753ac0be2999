"""``fastnsq tail``: print a topic's messages from an ephemeral (or given) channel."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ._common import (
    channel_arg,
    check_lookupd,
    check_nsqd,
    client_settings,
    install_stop_signals,
    int_at_least,
    passthrough_options,
    resolve_topic,
    run_async,
    servers_of,
    topic_arg,
)


def _build_tail(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "tail", parents=[common, client], help="print a topic's messages (like nsq_tail)",
        usage="fastnsq tail [options] TOPIC",
        description="Subscribe to TOPIC on an ephemeral channel (tail<random>#ephemeral) and print each "
        "message: the body and a newline (raw), or one JSON object per line.",
        epilog="JSON lines carry id, attempts, timestamp (ns since the epoch) and body (text) or "
        "body_base64 (when the body is not UTF-8).",
    )
    sub.add_argument("topic", nargs="?", metavar="TOPIC", help="topic to read")
    sub.add_argument("--topic", dest="topic_option", type=topic_arg, metavar="TOPIC", help="the topic, as nsq_tail takes it")
    sub.add_argument("--channel", type=channel_arg, metavar="CHANNEL",
                     help="channel to read (default: a new tail<random>#ephemeral)")
    sub.add_argument("-n", type=int_at_least(0), default=0, metavar="N", dest="total",
                     help="exit after N messages (0: run until Ctrl-C; waits if the topic is quiet)")
    sub.add_argument("--format", choices=("raw", "json"), default="raw", help="output format (default raw)")
    sub.add_argument("--max-in-flight", type=int_at_least(1), default=200, metavar="N",
                     help="messages nsqd may send before they are answered (default %(default)s)")
    sub.add_argument("--consumer-opt", action="append", default=[], metavar="NAME=VALUE",
                     help="any Consumer option, go-nsq's names (msg_timeout=2m, backoff_strategy=full_jitter...; "
                          "may be given multiple times; go's NAME,VALUE works too)")
    sub.set_defaults(run=_run_tail)


# ---- tail -------------------------------------------------------------------------------------


def _run_tail(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    resolve_topic(parser, args, takes_body=False)
    settings = {**client_settings(args),
                **passthrough_options(args.consumer_opt, for_="consumer", flag="--consumer-opt")}
    channel = args.channel or f"tail{random.randrange(1_000_000):06d}#ephemeral"
    run_async(_tail(args, channel, settings))
    return 0


async def _tail(args: argparse.Namespace, channel: str, settings: dict[str, Any]) -> None:
    from ..consumer import Consumer

    nsqd, lookupd = servers_of(args)
    for address in nsqd:
        await check_nsqd(address, settings)
    for address in lookupd:
        await check_lookupd(address, args.topic, settings["auth_secret"])
    max_in_flight = min(args.max_in_flight, args.total) if args.total else args.max_in_flight
    options = {"max_in_flight": max_in_flight, "lookupd_poll_interval": 15.0, **settings}
    consumer = Consumer(args.topic, channel, nsqd_tcp_addresses=nsqd, lookupd_http_addresses=lookupd, **options)
    write = _json_writer(sys.stdout) if args.format == "json" else _raw_writer(sys.stdout)
    await consumer.start()
    stopping: list[asyncio.Future[Any]] = []  # Ctrl-C / SIGTERM: stop (drain) once, then exit 0

    def on_signal() -> None:
        if not stopping:
            stopping.append(asyncio.ensure_future(consumer.stop(timeout=2.0)))

    install_stop_signals(on_signal)
    shown = 0
    try:
        async for batch in consumer.batches(max_size=max_in_flight, max_wait=0.05):
            wanted = len(batch) if not args.total else min(len(batch), args.total - shown)
            for message in batch.messages[:wanted]:
                write(message)
                message.finish()
            for message in batch.messages[wanted:]:
                message.requeue(0, backoff=False)  # past -n: leave it for the next reader
            sys.stdout.flush()
            shown += wanted
            if args.total and shown >= args.total:
                break
    finally:
        await (stopping[0] if stopping else consumer.stop(timeout=2.0))


def _raw_writer(stream: TextIO) -> Callable[[Any], None]:
    out = stream.buffer

    def write(message: Any) -> None:
        out.write(message.body)
        out.write(b"\n")

    return write


def _json_writer(stream: TextIO) -> Callable[[Any], None]:
    def write(message: Any) -> None:
        stream.write(json.dumps(message_record(message), ensure_ascii=False) + "\n")

    return write


def message_record(message: Any) -> dict[str, Any]:
    """A message as JSON-ready values: id, attempts, timestamp and the body as text or base64.

    >>> from fastnsq.codec import Message
    >>> message_record(Message(1700000000000000000, 1, b"0123456789abcdef", b"hi"))
    {'id': '0123456789abcdef', 'attempts': 1, 'timestamp': 1700000000000000000, 'body': 'hi'}
    """
    raw_id = bytes(message.id)
    try:
        text_id = raw_id.decode("ascii")
        if not text_id.isalnum():
            raise ValueError
    except ValueError:
        text_id = raw_id.hex()  # HA: a binary id
    record: dict[str, Any] = {"id": text_id, "attempts": message.attempts, "timestamp": message.timestamp}
    body = bytes(message.body)
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    return record
