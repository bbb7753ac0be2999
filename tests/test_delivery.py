"""The consumer's per-message path (fastnsq/_delivery.pyx and its twin) against nsqd.

The C link handles the common case itself (RDY record, counters, the FIN) and hands
everything else to the consumer's Python methods; the twin hands over everything.
These tests drive both through a real Consumer and check what the fast lane must not
change: counts, in-flight bookkeeping, messages a handler keeps, TOUCH, backoff.
"""

from __future__ import annotations

import asyncio
import os

from fastnsq import Consumer, Producer, codec

from .helpers import eventually, unique

NO_EXTENSIONS = os.environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0")


def test_the_c_link_is_used_by_default() -> None:
    expected = "fastnsq._delivery_py" if NO_EXTENSIONS else "fastnsq._delivery"
    assert codec.Link.__module__ == expected
    assert codec.ConnRdy.__module__ == expected


async def publish(address: str, topic: str, count: int) -> None:
    async with Producer([address]) as producer:
        for start in range(0, count, 500):
            await producer.mpublish(topic, [b"m%06d" % i for i in range(start, min(count, start + 500))])


async def test_sync_handler_counts_every_message_once(nsqd) -> None:
    topic, count = unique("fast"), 5000
    seen: list[bytes] = []
    await publish(nsqd.tcp_address, topic, count)
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=200,
                        handler=lambda m: seen.append(m.body)) as consumer:
        await eventually(lambda: consumer.total_finished == count, timeout=20, what="every FIN")
        stats = consumer.snapshot()
        assert stats.received == stats.finished == count and stats.requeued == 0
        assert stats.in_flight == 0 and stats.connections[0].in_flight == 0
        link = consumer._all_links()[0]
        assert not link.in_flight and not link.touched  # answered inline: never registered
    assert sorted(seen) == [b"m%06d" % i for i in range(count)]


async def test_a_message_the_handler_keeps_is_in_flight_until_finished(nsqd) -> None:
    topic = unique("kept")
    kept: list = []

    def handler(message) -> None:
        if int(message.body[1:]) % 10 == 0:
            message.disable_auto_response()
            kept.append(message)

    await publish(nsqd.tcp_address, topic, 100)
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=50,
                        handler=handler) as consumer:
        await eventually(lambda: consumer.total_finished == 90 and len(kept) == 10, timeout=10)
        assert consumer.snapshot().in_flight == 10
        assert len(consumer._all_links()[0].in_flight) == 10  # stop() and auto_touch can see them
        for message in kept:
            message.finish()
        assert consumer.snapshot().in_flight == 0
        assert consumer.total_finished == 100


async def test_touch_and_requeue_from_inside_a_sync_handler(nsqd) -> None:
    topic = unique("touch")
    attempts: dict[bytes, int] = {}

    def handler(message) -> None:
        message.touch()  # goes out before the FIN, on the same write
        attempts[message.body] = message.attempts
        if message.attempts == 1 and message.body.endswith(b"7"):
            message.requeue(0, backoff=False)

    await publish(nsqd.tcp_address, topic, 20)
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=20,
                        handler=handler) as consumer:
        await eventually(lambda: consumer.total_finished == 20, timeout=15)
        assert consumer.total_requeued == 2  # m000007 and m000017, once each
        assert attempts[b"m000007"] == 2 and attempts[b"m000001"] == 1
        link = consumer._all_links()[0]
        assert not link.touched and not link.in_flight


async def test_the_fast_lane_closes_in_backoff_and_reopens_after(nsqd) -> None:
    topic = unique("lane")
    fail = {"on": True}

    def handler(message) -> None:
        if fail["on"]:
            raise RuntimeError("induced failure")

    await publish(nsqd.tcp_address, topic, 50)
    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10,
                        backoff_multiplier=0.05, max_backoff_duration=0.2, default_requeue_delay=0,
                        max_attempts=0, handler=handler, hold_failed=False) as consumer:
        link = consumer._all_links()[0]
        await eventually(lambda: consumer.backoff_level > 0, timeout=5, what="backoff")
        assert not link.rdy_state.fast  # every answer goes through the controller now
        fail["on"] = False
        await eventually(lambda: consumer.backoff_level == 0 and consumer.total_finished >= 50, timeout=15)
        await eventually(lambda: link.rdy_state.fast, timeout=5, what="the fast lane back")


async def test_async_for_messages_are_in_flight_until_answered(nsqd) -> None:
    topic = unique("iter")
    await publish(nsqd.tcp_address, topic, 30)
    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=30)
    await consumer.start()
    try:
        held = []
        async for message in consumer:
            held.append(message)
            if len(held) == 30:
                break
        assert consumer.snapshot().in_flight == 30
        codec.finish_all(held)
        assert consumer.snapshot().in_flight == 0 and consumer.total_finished == 30
        codec.finish_all(held)  # answered ones are skipped, not answered twice
        assert consumer.total_finished == 30
    finally:
        await asyncio.wait_for(consumer.stop(), 10)
