"""What must type-check under ``mypy --strict`` and pyright: the clients as an editor sees them.

tests/test_typing.py checks this file; ``assert_type`` fails the check where a type is not the one
written (publish's answer, what ``async for`` and ``batches()`` yield, the handlers).
"""

from __future__ import annotations

import asyncio
import logging

from typing_extensions import assert_type

import fastnsq
import fastnsq.sync
from fastnsq import Batch, Message, TracedResponse
from fastnsq.typed_options import ConsumerOptions, Handler, ProducerOptions


def plain(message: Message) -> None:
    assert_type(message.body, bytes)
    assert_type(message.attempts, int)
    if message.attempts > 2:
        message.requeue(delay=1.0, backoff=False)  # requeues without a traceback


async def coroutine(message: Message) -> None:
    await asyncio.sleep(0)
    message.finish()


def gave_up(message: Message) -> None:
    logging.getLogger("app").warning("gave up on %s", message.id)


async def consumers() -> None:
    options: ConsumerOptions = {"max_in_flight": 20, "max_attempts": 3, "default_requeue_delay": 1.0,
                                "max_backoff_duration": 8.0, "backoff_strategy": "linear",
                                "backoff_multiplier": 0.224, "give_up_handler": gave_up}
    handler: Handler = plain
    async with fastnsq.Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"], handler=handler,
                                **options):
        pass
    fastnsq.Consumer("events", "archive", lookupd_http_addresses="127.0.0.1:4161", handler=coroutine,
                     msg_timeout=30.0, heartbeat_interval=10, backoff_strategy=lambda level: 0.5 * level,
                     logger=logging.getLogger("app"), discovery_filter=lambda nsqd: nsqd[:1])
    iterated = fastnsq.Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"])
    async for message in iterated:
        assert_type(message, Message)
        message.finish()
    async for batch in iterated.batches(max_size=100, max_wait=0.5):
        assert_type(batch, Batch)
        for each in batch:
            assert_type(each, Message)
        assert_type(batch[0], Message)
        batch.finish()
    report = await iterated.stop(timeout=5.0)
    assert_type(report.finished, int)


async def producers() -> None:
    options: ProducerOptions = {"pool_size": 2, "publish_timeout": 5.0, "lazy_connect": False}
    async with fastnsq.Producer(["127.0.0.1:4150"], **options) as producer:
        assert_type(await producer.publish("events", b"hello"), bytes)
        assert_type(await producer.publish("events", "text", defer=1.5), bytes)
        assert_type(await producer.publish("events", b"x", trace_id=7), TracedResponse)
        assert_type(await producer.publish("events", b"x", ext={"k": "v"}), bytes | TracedResponse)
        assert_type(await producer.mpublish("events", [b"a", bytearray(b"b"), "c"]), bytes)
        assert_type(await producer.mpublish("events", [b"a"], trace_ids=[1]), TracedResponse)


def blocking() -> None:
    with fastnsq.sync.Producer(["127.0.0.1:4150"], lazy_connect=False, thread_connections=8,
                               snappy=True) as producer:
        assert_type(producer.publish("events", b"hello"), bytes)
        assert_type(producer.mpublish("events", [b"a", b"b"]), bytes)
        assert_type(producer.publish_async("events", b"x").result(), bytes | TracedResponse)
    consumer = fastnsq.sync.Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"], handler=plain,
                                     workers=4, max_in_flight=8)
    consumer.stop()
    batching = fastnsq.sync.Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"])
    for batch in batching.batches(max_size=10):
        assert_type(batch, fastnsq.sync.Batch)
        for message in batch:
            assert_type(message, Message)
        batch.finish()
