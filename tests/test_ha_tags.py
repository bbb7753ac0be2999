"""Tag dispatch on an ext topic: a consumer with ``desired_tag`` gets its tag's messages and nothing else.

A message whose ext header has ``##client_dispatch_tag`` X goes to the consumers tagged X
while one is subscribed, otherwise to the untagged ones, and the same again when it is
requeued (youzan/nsq nsqd/channel.go keeps a message channel per tag). On the embedded HA
cluster and a real youzan cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fastnsq import Consumer, Producer
from fastnsq.ext import msg_ext

from .helpers import eventually, unique

pytestmark = pytest.mark.timeout(120)

TAG_KEY = "##client_dispatch_tag"


async def test_tagged_and_untagged_consumers_each_get_their_own(nsq_cluster_ha: Any) -> None:
    topic = unique("tag")
    await nsq_cluster_ha.create_topic(topic, partitions=1, ext=True, channels=["ch"])
    seen: dict[str, list[tuple[bytes, int]]] = {"red": [], "plain": []}

    def handler(name: str) -> Any:
        def handle(message: Any) -> None:
            seen[name].append((message.body, message.attempts))
            if message.attempts == 1 and message.body.endswith(b"-0"):
                raise RuntimeError("requeue the first of each kind once: it must come back to the same side")
        return handle

    consumers = [
        Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses, handler=handler(name),
                 max_in_flight=10, lookupd_poll_interval=0.5, default_requeue_delay=0, max_backoff_duration=0,
                 hold_failed=False,  # each failure a REQ: the redelivery must come back to the same side
                 **({"desired_tag": "red"} if name == "red" else {}))
        for name in ("red", "plain")
    ]
    for consumer in consumers:
        await consumer.start()
    await eventually(lambda: all(c.connections for c in consumers), timeout=20)
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        for i in range(5):
            await producer.publish(topic, b"red-%d" % i, ext=msg_ext(dispatch_tag="red"), partition=0)
            await producer.publish(topic, b"blue-%d" % i, ext={TAG_KEY: "blue"}, partition=0)  # nobody tagged blue
            await producer.publish(topic, b"none-%d" % i, ext={"k": "v"}, partition=0)
    await eventually(lambda: len(seen["red"]) >= 6 and len(seen["plain"]) >= 12, timeout=30)
    await asyncio.sleep(0.5)
    for consumer in consumers:
        await consumer.stop()
    assert sorted(seen["red"]) == sorted([(b"red-%d" % i, 1) for i in range(5)] + [(b"red-0", 2)])
    expected_plain = [(b"%s-%d" % (k, i), 1) for k in (b"blue", b"none") for i in range(5)]
    assert sorted(seen["plain"]) == sorted(expected_plain + [(b"blue-0", 2), (b"none-0", 2)])


async def test_a_tag_without_its_consumer_goes_to_the_untagged(nsq_cluster_ha: Any) -> None:
    topic = unique("tagless")
    await nsq_cluster_ha.create_topic(topic, partitions=1, ext=True, channels=["ch"])
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await producer.publish(topic, b"for green", ext={TAG_KEY: "green"}, partition=0)
    got: list[bytes] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        handler=lambda m: got.append(m.body), lookupd_poll_interval=0.5)
    await consumer.start()
    await eventually(lambda: got == [b"for green"], timeout=20)
    await consumer.stop()


def test_the_ext_helpers_build_and_read_go_nsqs_header() -> None:
    from fastnsq import codec
    from fastnsq.errors import InvalidValueError
    from fastnsq.ext import dispatch_tag, msg_ext

    header = msg_ext({"k": "v"}, dispatch_tag="red", trace_id=7)
    assert header == {"k": "v", TAG_KEY: "red", "##trace_id": "7"}
    message = codec.Message(1, 1, bytes(16), b"x", ha=True, ext_version=4,
                            ext_bytes=b'{"##client_dispatch_tag":"red"}')
    assert dispatch_tag(message) == "red"
    assert dispatch_tag(codec.Message(1, 1, bytes(16), b"x", ha=True)) is None
    with pytest.raises(InvalidValueError, match="dispatch_tag must be a string of 1..100 bytes"):
        msg_ext(dispatch_tag="x" * 101)
