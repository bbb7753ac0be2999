"""The HA producer's extras: background-retry publishing, the per-node figures, load-aware partitions.

youzan/go-nsq's PublishAndRetryBackground (PubMaxBackgroundRetry, PubBackgroundBuffer),
TopicProducerMgr.Stat and PubDynamicLoad; on the embedded HA cluster and a real one (the
stalled node of the load-aware test needs the embedded one's fault injection).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from fastnsq import Consumer, Producer, sync
from fastnsq.errors import InvalidValueError
from fastnsq.producer.background import BackgroundBufferFullError

from .helpers import eventually, skip_if_external, unique

pytestmark = pytest.mark.timeout(240)


def producer_on(cluster: Any, **options: Any) -> Producer:
    options.setdefault("lookupd_poll_interval", 0.5)
    return Producer(lookupd_http_addresses=cluster.lookupd_http_addresses, **options)


async def consume(cluster: Any, topic: str, count: int) -> list[Any]:
    got: list[Any] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=cluster.lookupd_http_addresses, handler=got.append,
                        max_in_flight=50, lookupd_poll_interval=0.5)
    await consumer.start()
    try:
        await eventually(lambda: len(got) >= count, timeout=60, what=f"{count} messages")
        await asyncio.sleep(0.3)
    finally:
        await consumer.stop()
    return got


async def test_a_publish_that_fails_is_retried_in_the_background(nsq_cluster_ha: Any) -> None:
    topic = unique("bg")  # not created yet: the first attempt fails (E_TOPIC_NOT_EXIST)
    async with producer_on(nsq_cluster_ha, max_retries=1, retry_delay=0.01) as producer:
        assert await producer.publish_and_retry_background(topic, b"late but sure", ext=None) is False
        assert producer._ha.background.waiting == 1
        await nsq_cluster_ha.create_topic(topic, partitions=2, channels=["ch"])
        await eventually(lambda: producer._ha.background.recovered == 1, timeout=60, what="the retry to go out")
        assert await producer.publish_and_retry_background(topic, b"at once") is True
        report = await producer.close()
    assert report.unsent == ()
    assert sorted(m.body for m in await consume(nsq_cluster_ha, topic, 2)) == [b"at once", b"late but sure"]


async def test_a_full_buffer_is_an_error_and_close_reports_the_unsent(nsq_cluster_ha: Any) -> None:
    topic = unique("bgfull")
    producer = producer_on(nsq_cluster_ha, max_retries=0, pub_background_buffer=10, pub_max_background_retry=100)
    await producer.start()
    outcomes = [await producer.publish_and_retry_background(topic, b"m%d" % i) for i in range(10)]
    assert outcomes == [False] * 10
    with pytest.raises(BackgroundBufferFullError, match="pub_background_buffer=10 publishes already wait"):
        await producer.publish_and_retry_background(topic, b"one too many")
    report = await producer.close()
    assert sorted(u.body for u in report.unsent) == sorted(b"m%d" % i for i in range(10))
    assert {u.topic for u in report.unsent} == {topic} and all(u.error is not None for u in report.unsent)


async def test_a_publish_out_of_retries_goes_to_the_failure_handler(nsq_cluster_ha: Any) -> None:
    topic = unique("bgfail")
    failed: list[tuple[str, bytes, BaseException]] = []
    async with producer_on(nsq_cluster_ha, max_retries=0, pub_max_background_retry=2,
                           background_failure_handler=lambda *args: failed.append(args)) as producer:
        assert await producer.publish_and_retry_background(topic, b"never") is False
        await eventually(lambda: failed, timeout=30)
        assert producer._ha.background.given_up == 1 and producer._ha.background.waiting == 0
    assert failed[0][:2] == (topic, b"never") and "E_TOPIC_NOT_EXIST" in repr(failed[0][2])


async def test_node_stats_count_round_trips_per_node(nsq_cluster_ha: Any) -> None:
    topic = unique("stat")
    leaders = await nsq_cluster_ha.create_topic(topic, partitions=3, channels=["ch"])
    async with producer_on(nsq_cluster_ha) as producer:
        await asyncio.gather(*(producer.publish(topic, b"x%d" % i) for i in range(300)))
        for i in range(30):
            await producer.publish(topic, b"y%d" % i, partition=i % 3)
        stats = producer.node_stats()
    addresses = {nsq_cluster_ha.tcp_addresses[v] if isinstance(v, int) else v for v in leaders.values()}
    assert addresses <= set(stats)
    for address in addresses:
        node = stats[address]
        assert node.answered >= 10 and 0 < node.avg_rt < 5 and node.pending == 0 and node.connections == 1


async def test_dynamic_load_spreads_over_every_partition_when_nothing_is_slow(nsq_cluster_ha: Any) -> None:
    topic = unique("dyn")
    await nsq_cluster_ha.create_topic(topic, partitions=3, channels=["ch"])
    async with producer_on(nsq_cluster_ha, pub_strategy="dynamic_load") as producer:
        for i in range(60):
            await producer.publish(topic, b"d%d" % i)
    counts = Counter(m.partition for m in await consume(nsq_cluster_ha, topic, 60))
    assert set(counts) == {0, 1, 2} and sum(counts.values()) == 60


async def test_dynamic_load_keeps_away_from_a_node_that_does_not_answer(nsq_cluster_ha: Any) -> None:
    skip_if_external(nsq_cluster_ha, "stalls a node")
    topic = unique("slow")
    leaders = await nsq_cluster_ha.create_topic(topic, partitions=3, channels=["ch"])
    slow_partition = 1
    slow = nsq_cluster_ha.nsqds[leaders[slow_partition]]
    async with producer_on(nsq_cluster_ha, pub_strategy="dynamic_load") as producer:
        await producer.publish(topic, b"warm-up", partition=slow_partition)
        slow.faults.stall(None)  # it reads but answers nothing
        stuck = asyncio.ensure_future(producer.publish(topic, b"stuck", partition=slow_partition))
        await eventually(lambda: producer.node_stats()[slow.tcp_address].pending == 1)
        for i in range(30):  # sequential: each would wait on the slow node if it went there
            await asyncio.wait_for(producer.publish(topic, b"free-%d" % i), 5)
        slow.faults.resume()
        await stuck
    partitions = {m.body: m.partition for m in await consume(nsq_cluster_ha, topic, 32)}
    assert {partitions[b"free-%d" % i] for i in range(30)} == {0, 2}


def test_bad_producer_options_name_the_option() -> None:
    with pytest.raises(InvalidValueError, match="pub_strategy must be one of"):
        Producer(["127.0.0.1:4150"], pub_strategy="fastest")
    with pytest.raises(InvalidValueError, match="pub_background_buffer=5 is outside the accepted range 10..10000"):
        Producer(["127.0.0.1:4150"], pub_background_buffer=5)
    with pytest.raises(InvalidValueError, match="pub_max_background_retry=0 is outside"):
        Producer(["127.0.0.1:4150"], pub_max_background_retry=0)
    assert Producer(["127.0.0.1:4150"], pub_strategy=1)._ha.strategy == "dynamic_load"  # go-nsq's number


async def test_the_blocking_facade_retries_in_the_background(nsq_cluster_ha: Any) -> None:
    topic = unique("bgsync")
    lookupd = nsq_cluster_ha.lookupd_http_addresses

    def first() -> tuple[Any, bool]:
        producer = sync.Producer(lookupd_http_addresses=lookupd, max_retries=0)
        return producer, producer.publish_and_retry_background(topic, b"from a thread")

    producer, published = await asyncio.get_running_loop().run_in_executor(None, first)
    assert published is False
    await nsq_cluster_ha.create_topic(topic, partitions=1, channels=["ch"])
    got = await consume(nsq_cluster_ha, topic, 1)
    report = await asyncio.get_running_loop().run_in_executor(None, producer.close)
    assert [m.body for m in got] == [b"from a thread"] and report.unsent == ()
