"""Adversity: servers die, networks stall, handlers run late; nothing acknowledged is lost.

Each scenario keeps a ledger: publishes attempted, acknowledged and raised; messages
consumed (unique) and duplicated. The invariant, asserted with those counts:
every publish is acknowledged or raised (none silently dropped), every acknowledged
message is consumed at least once (lost == 0), the client recovers without a restart,
and its bookkeeping drains back to empty.

Loopback only; faults come from the embedded servers and fastnsq.testing.FaultProxy.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

import pytest

from fastnsq import Consumer, Producer
from fastnsq.errors import ConnectionClosedError, NoConnectionError, PublishTimeoutError
from fastnsq.testing import NSQD, NSQCluster
from fastnsq.testing.proxy import FaultProxy

from .helpers import eventually, unique

logger = logging.getLogger(__name__)


@dataclass
class Ledger:
    published: int = 0
    acknowledged: set[bytes] = field(default_factory=set)
    raised: int = 0
    deliveries: Counter[bytes] = field(default_factory=Counter)

    @property
    def consumed(self) -> int:
        return len(self.deliveries)

    @property
    def duplicated(self) -> int:
        return sum(self.deliveries.values()) - len(self.deliveries)

    @property
    def lost(self) -> int:
        return len(self.acknowledged - set(self.deliveries))

    def counts(self) -> dict[str, int]:
        return {
            "published": self.published,
            "acknowledged": len(self.acknowledged),
            "raised": self.raised,
            "consumed": self.consumed,
            "duplicated": self.duplicated,
            "lost": self.lost,
        }

    def handler(self, message) -> None:
        self.deliveries[message.body] += 1

    def check(self, scenario: str) -> None:
        counts = self.counts()
        print(f"\n{scenario}: {counts}")
        assert counts["acknowledged"] + counts["raised"] == counts["published"], "a publish was dropped silently"
        assert counts["lost"] == 0, f"{counts['lost']} acknowledged messages were never consumed"
        assert counts["acknowledged"] > 0


async def publish_many(producer: Producer, topic: str, ledger: Ledger, count: int, *, concurrency: int = 20,
                       pause: float = 0.001) -> None:
    """``count`` unique messages, ``concurrency`` publishers, each acknowledged or raised."""
    bodies = iter(range(count))

    async def worker() -> None:
        for _ in bodies:
            body = b"%s-%06d" % (topic.encode(), ledger.published)  # unique across calls
            ledger.published += 1
            try:
                await producer.publish(topic, body)
                ledger.acknowledged.add(body)
            except (ConnectionClosedError, NoConnectionError, PublishTimeoutError) as exc:
                logger.debug("publish raised: %s", exc)
                ledger.raised += 1
            await asyncio.sleep(pause)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def all_consumed(ledger: Ledger, timeout: float = 20.0) -> None:
    await eventually(lambda: ledger.acknowledged <= set(ledger.deliveries), timeout=timeout,
                     what="every acknowledged message to be consumed")


def assert_drained(consumer: Consumer, producer: Producer | None = None) -> None:
    """Nothing grows without bound: in-flight bookkeeping and tasks are back to empty."""
    assert all(not link.in_flight for link in consumer._all_links())
    assert not consumer._dispatch.tasks
    assert consumer.snapshot().in_flight == 0
    if producer is not None:
        assert producer.snapshot().waiting == 0
        # When commands went out is kept per write, and only until they are answered.
        assert all(len(conn._write_marks) <= 1000 for conn in producer.connections)


async def test_nsqd_restarted_mid_stream():
    """nsqd goes down and comes back (its queue kept, as a disk-backed nsqd keeps it)."""
    ledger = Ledger()
    async with NSQD() as nsqd:
        topic = unique("restart")
        producer = Producer([nsqd.tcp_address], reconnect_delay=0.05, publish_timeout=5.0)
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=ledger.handler,
                            max_in_flight=50, reconnect_delay=0.05)
        await producer.start()
        await consumer.start()
        publishing = asyncio.create_task(publish_many(producer, topic, ledger, 3000))
        await eventually(lambda: ledger.consumed > 300, what="traffic before the restart")
        await nsqd.stop(keep_messages=True)
        await asyncio.sleep(0.5)
        await nsqd.start()
        await publishing
        await all_consumed(ledger)
        assert len(consumer.connections) == 1 and len(producer.connections) == 1  # recovered by itself
        await consumer.stop()
        assert_drained(consumer, producer)
        await producer.close()
    ledger.check("nsqd restarted mid-stream")


async def test_lookupd_down_for_a_while():
    """Consumption goes on through the connections already open; discovery resumes after."""
    ledger = Ledger()
    async with NSQCluster(nodes=2) as cluster:
        topic = unique("lookupd")
        async with Producer(cluster.tcp_addresses) as producer:
            await publish_many(producer, topic, ledger, 100)
            consumer = Consumer(topic, "ch", lookupd_http_addresses=cluster.lookupd_http_addresses,
                                handler=ledger.handler, max_in_flight=50, lookupd_poll_interval=0.3)
            await consumer.start()
            await all_consumed(ledger)
            await cluster.lookupd.stop()
            await publish_many(producer, topic, ledger, 500)
            await all_consumed(ledger)  # lookupd is down: the open connections carry on
            await cluster.lookupd.start()
            node = await cluster.add_node()
        async with Producer([node.tcp_address]) as producer:
            await publish_many(producer, topic, ledger, 100)
        await all_consumed(ledger)  # the new node, found once lookupd is back
        assert len(consumer.connections) == 3
        await consumer.stop()
        assert_drained(consumer)
    ledger.check("lookupd down for a while")


async def test_network_stall_longer_than_the_heartbeat_deadline():
    """Both directions stall for 3 s with heartbeats every 1 s: the link is declared dead on
    both sides, the client reconnects, and what was in flight comes back from nsqd."""
    ledger = Ledger()
    async with NSQD() as nsqd, FaultProxy(nsqd.tcp_address) as to_consumer, FaultProxy(nsqd.tcp_address) as to_producer:
        topic = unique("stall")
        producer = Producer([to_producer.address], heartbeat_interval=1.0, reconnect_delay=0.05, publish_timeout=4.0)
        # Messages nsqd wrote into the stalled link stay in flight on nsqd until msg_timeout
        # (as with a real nsqd): keep it short so they come back within the test.
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[to_consumer.address], handler=ledger.handler,
                            heartbeat_interval=1.0, msg_timeout=2.0, max_in_flight=50, reconnect_delay=0.05)
        await producer.start()
        await consumer.start()
        publishing = asyncio.create_task(publish_many(producer, topic, ledger, 2000, pause=0.002))
        await eventually(lambda: ledger.consumed > 200, what="traffic before the stall")
        await asyncio.gather(to_consumer.stall(3.0), to_producer.stall(3.0))
        await publishing
        await all_consumed(ledger)
        assert consumer.connections and producer.connections
        assert to_consumer.accepted >= 2 and to_producer.accepted >= 2  # they reconnected
        await consumer.stop()
        assert_drained(consumer, producer)
        await producer.close()
    ledger.check("network stall > heartbeat deadline")


async def test_a_server_that_stops_reading():
    """nsqd stops reading the producer's bytes: nothing is acknowledged, nsqd's read deadline
    closes the link, and every publish is retried or raised, never dropped."""
    ledger = Ledger()
    async with NSQD() as nsqd, FaultProxy(nsqd.tcp_address) as proxy:
        topic = unique("deaf")
        producer = Producer([proxy.address], heartbeat_interval=1.0, reconnect_delay=0.05, publish_timeout=4.0)
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=ledger.handler,
                            max_in_flight=50)
        await producer.start()
        await consumer.start()
        publishing = asyncio.create_task(publish_many(producer, topic, ledger, 1500, pause=0.002))
        await eventually(lambda: ledger.consumed > 100, what="traffic before the server goes deaf")
        await proxy.stall(3.0, direction="up")
        await publishing
        await all_consumed(ledger)
        assert producer.snapshot().retried + ledger.raised > 0  # the fault was felt, and handled
        await consumer.stop()
        assert_drained(consumer, producer)
        await producer.close()
    ledger.check("server stops reading")


@pytest.mark.parametrize("touch", [False, True], ids=["without_touch", "with_auto_touch"])
async def test_slow_handler_past_msg_timeout(touch):
    """A handler running 1.6 s with msg_timeout 1 s: without TOUCH nsqd redelivers (duplicates,
    no loss); with auto_touch it does not."""
    ledger = Ledger()
    async with NSQD() as nsqd:
        topic = unique("slow")
        async with Producer([nsqd.tcp_address]) as producer:
            await publish_many(producer, topic, ledger, 5)

        async def slow(message):
            ledger.deliveries[message.body] += 1
            if message.attempts == 1:
                await asyncio.sleep(1.6)

        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=slow, max_in_flight=10,
                            msg_timeout=1.0, auto_touch=touch, max_attempts=0)
        await consumer.start()
        await all_consumed(ledger)
        await asyncio.sleep(2.0)  # let any redelivery happen
        await consumer.stop()
        assert_drained(consumer)
    ledger.check(f"slow handler, auto_touch={touch}")
    if touch:
        assert ledger.duplicated == 0
    else:
        assert ledger.duplicated == 5
