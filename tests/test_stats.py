"""Consumer.snapshot() and Producer.snapshot(): typed figures equal to what happened.

Runs against the nsqd the suite uses (embedded, or real with FASTNSQ_TEST_*): publishes,
requeues and finishes a known number of messages and compares.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from fastnsq import Consumer, Producer, ServerError
from fastnsq.stats import ConnectionStats, ConsumerStats, ProducerStats
from fastnsq.sync import Consumer as BlockingConsumer
from fastnsq.sync import Producer as BlockingProducer
from fastnsq.testing.proxy import FaultProxy

from .helpers import eventually, unique


async def test_snapshots_count_what_happened(nsqd) -> None:
    topic = unique("snap")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b"%d" % i for i in range(30)])
        for i in range(5):
            await producer.publish(topic, b"single %d" % i)
        produced = producer.snapshot()
    assert isinstance(produced, ProducerStats)
    assert (produced.published, produced.failed, produced.waiting) == (35, 0, 0)  # messages
    assert produced.connections == 1

    seen: set[bytes] = set()

    def handle(message):  # every body's first delivery is requeued once, then finished
        if message.body not in seen:
            seen.add(message.body)
            message.requeue(0, backoff=False)

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=10)
    await consumer.start()
    try:
        await eventually(lambda: consumer.snapshot().finished == 35, timeout=30, what="35 finished")
        stats = consumer.snapshot()
    finally:
        await consumer.stop()
    assert isinstance(stats, ConsumerStats)
    assert (stats.topic, stats.channel) == (topic, "ch")
    assert (stats.received, stats.finished, stats.requeued) == (70, 35, 35)
    assert stats.in_flight == 0 and stats.given_up == 0 and stats.max_in_flight == 10
    (conn,) = stats.connections
    assert isinstance(conn, ConnectionStats)
    assert conn.address == nsqd.tcp_address and conn.partition is None and conn.rdy == 10
    assert (conn.received, conn.finished, conn.requeued) == (70, 35, 35)


async def test_totals_keep_closed_connections(nsqd) -> None:
    topic = unique("snapclosed")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b"x"] * 10)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: None,
                        max_in_flight=10)
    await consumer.start()
    await eventually(lambda: consumer.snapshot().finished == 10, what="10 finished")
    await consumer.stop()
    stats = consumer.snapshot()
    assert stats.connections == () and (stats.received, stats.finished) == (10, 10)


def test_a_snapshot_is_a_frozen_copy() -> None:
    stats = ProducerStats(published=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.published = 2  # type: ignore[misc]
    assert stats.as_dict() == {"published": 1, "failed": 0, "retried": 0, "reconnects": 0, "waiting": 0,
                               "connections": 0, "rerouted": 0, "errors": {}}


async def test_the_old_spellings_warn_and_give_the_same_figures(nsqd) -> None:
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(unique("old"), b"x")
        with pytest.deprecated_call(match=r"Producer.snapshot\(\)"):
            old = producer.stats
        assert old == producer.snapshot().as_dict()
    consumer = Consumer(unique("old"), "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: None)
    await consumer.start()
    try:
        with pytest.deprecated_call(match=r"Consumer.snapshot\(\)"):
            old_figures = consumer.stats()
        assert old_figures["connections"] == list(consumer.snapshot().connections)
        assert {k: v for k, v in old_figures.items() if k != "connections"} == {
            k: v for k, v in consumer.snapshot().as_dict().items() if k != "connections"
        }
    finally:
        await consumer.stop()


async def test_the_blocking_facade_takes_snapshots_too(nsqd) -> None:
    topic = unique("blocking")

    def blocking() -> None:
        with BlockingProducer([nsqd.tcp_address]) as producer:
            producer.publish(topic, b"x")
            assert producer.snapshot().published == 1
        consumer = BlockingConsumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: None)
        with consumer:
            deadline = time.monotonic() + 15
            while consumer.snapshot().finished < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert consumer.snapshot().finished == 1
            with pytest.deprecated_call():
                assert consumer.stats()["finished"] == 1

    await asyncio.get_running_loop().run_in_executor(None, blocking)


async def test_errors_are_counted_by_code(nsqd) -> None:
    """A publish nsqd refuses (a body over its max-msg-size, 1 MiB by default: E_BAD_MESSAGE) and a
    FIN nsqd refuses (of a message it has timed out and sent again: E_FIN_FAILED)."""
    topic = unique("errors")
    async with Producer([nsqd.tcp_address], max_msg_size=2 * 1024 * 1024, max_retries=0) as producer:
        with pytest.raises(ServerError, match="E_BAD_MESSAGE"):
            await producer.publish(topic, b"x" * (1024 * 1024 + 1), timeout=10)
        assert producer.snapshot().errors == {"E_BAD_MESSAGE": 1}
        assert producer.snapshot().failed == 1
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"late")
    redelivered = asyncio.Event()
    first: list = []

    async def handle(message):
        if message.attempts == 1:
            first.append(message)
            message.disable_auto_response()
            return
        redelivered.set()  # the first delivery timed out: nsqd gave it out again

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=2,
                        msg_timeout=1.0)
    await consumer.start()
    try:
        await asyncio.wait_for(redelivered.wait(), 30)
        first[0].finish()  # no longer in flight at nsqd
        await eventually(lambda: consumer.snapshot().errors.get("E_FIN_FAILED") == 1, what="E_FIN_FAILED counted")
    finally:
        await consumer.stop()


async def test_reconnects_are_counted(nsqd) -> None:
    async with FaultProxy(nsqd.tcp_address) as proxy:
        consumer = Consumer(unique("reconnect"), "ch", nsqd_tcp_addresses=[proxy.address], handler=lambda m: None,
                            reconnect_delay=0.05)
        await consumer.start()
        try:
            assert consumer.snapshot().reconnects == 0
            proxy.cut()
            await eventually(lambda: consumer.snapshot().reconnects == 1 and consumer.snapshot().connections,
                             what="one reconnect")
        finally:
            await consumer.stop()
