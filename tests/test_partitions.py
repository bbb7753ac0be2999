"""Per-partition state of an HA consumer: positions, backoff per partition, pause and resume.

Against the embedded HA cluster or real HA servers through FASTNSQ_TEST_* (tests/test_ha.py's helpers).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping

import pytest

from fastnsq import Producer
from fastnsq.errors import InvalidValueError

from .helpers import eventually
from .test_ha import PARTITIONS, consumer_on, ha_topic


async def publish_per_partition(cluster, topic: str, count: int) -> None:
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await asyncio.gather(*(
            producer.publish(topic, b"%d:%04d" % (partition, seq), partition=partition)
            for partition in range(PARTITIONS) for seq in range(count)
        ))


async def test_backoff_per_partition_pauses_only_the_failing_partition(nsq_cluster_ha):
    topic = await ha_topic(nsq_cluster_ha)
    await publish_per_partition(nsq_cluster_ha, topic, 50)
    handled: Counter[int] = Counter()

    def handle(message):
        if message.partition == 0:
            raise RuntimeError("partition 0's messages always fail")
        handled[message.partition] += 1

    # A long first wait (2 × 30 s): with consumer-wide backoff nothing else would be consumed.
    consumer = consumer_on(nsq_cluster_ha, topic, handler=handle, backoff_scope="partition",
                           backoff_multiplier=30.0, max_in_flight=16, default_requeue_delay=0)
    await consumer.start()
    try:
        await eventually(lambda: all(handled[p] == 50 for p in range(1, PARTITIONS)), timeout=30,
                         what="partitions 1..3 consumed while partition 0 backs off")
        assert consumer.partitions[0].backoff_level == 1 and consumer.partitions[0].backoff_until is not None
        assert all(consumer.partitions[p].backoff_level == 0 for p in range(1, PARTITIONS))
        rdy = {c.partition: c.rdy for c in consumer.snapshot().connections}
        assert rdy[0] == 0 and all(rdy[p] > 0 for p in range(1, PARTITIONS))
    finally:
        await consumer.stop()


async def test_consumer_wide_backoff_stays_the_default(nsq_cluster_ha):
    topic = await ha_topic(nsq_cluster_ha)
    await publish_per_partition(nsq_cluster_ha, topic, 5)
    failed = asyncio.Event()

    def handle(message):
        failed.set()
        raise RuntimeError("fails")

    consumer = consumer_on(nsq_cluster_ha, topic, handler=handle, backoff_multiplier=30.0, max_in_flight=16,
                           default_requeue_delay=0, hold_failed=False)
    await consumer.start()
    try:
        await asyncio.wait_for(failed.wait(), 20)
        await eventually(lambda: all(c.rdy == 0 for c in consumer.snapshot().connections), timeout=5,
                         what="RDY 0 on every partition")
        assert {consumer.partitions[p].backoff_level for p in range(PARTITIONS)} == {1}
    finally:
        await consumer.stop()


async def test_pause_and_resume_a_partition(nsq_cluster_ha):
    topic = await ha_topic(nsq_cluster_ha)
    consumer = consumer_on(nsq_cluster_ha, topic, handler=lambda m: got.append(m.partition), max_in_flight=16)
    got: list[int] = []
    await consumer.start()
    try:
        await eventually(lambda: len(consumer.snapshot().connections) == PARTITIONS, what="every partition")
        consumer.pause_partition(2)
        assert consumer.partitions[2].paused
        await publish_per_partition(nsq_cluster_ha, topic, 20)
        await eventually(lambda: len(got) == 20 * (PARTITIONS - 1), timeout=20, what="the other partitions")
        await asyncio.sleep(0.5)
        assert 2 not in got
        consumer.resume_partition(2)
        await eventually(lambda: got.count(2) == 20, timeout=20, what="partition 2 after resume")
    finally:
        await consumer.stop()


async def test_ordered_positions_are_kept_per_partition(nsq_cluster_ha):
    topic = await ha_topic(nsq_cluster_ha)
    await publish_per_partition(nsq_cluster_ha, topic, 10)
    offsets: dict[int, int] = {}

    def handle(message):
        offsets[message.partition] = max(offsets.get(message.partition, -1), message.offset)

    consumer = consumer_on(nsq_cluster_ha, topic, handler=handle, ordered=True)
    await consumer.start()
    try:
        await eventually(lambda: sum(consumer.partitions[p].last_offset is not None
                                     for p in range(PARTITIONS) if p in consumer.partitions) == PARTITIONS
                         and len(offsets) == PARTITIONS, timeout=30, what="a position on every partition")
        await eventually(lambda: all(consumer.partitions[p].last_offset == offsets[p] for p in range(PARTITIONS)),
                         timeout=30, what="positions up to date")
        assert consumer.ordering_errors == []
    finally:
        await consumer.stop()


def test_backoff_scope_is_checked() -> None:
    with pytest.raises(InvalidValueError, match="backoff_scope must be one of .* got 'topic'"):
        consumer_on(type("C", (), {"lookupd_http_addresses": ["127.0.0.1:4161"]})(), "t", backoff_scope="topic")


async def test_partitions_is_a_read_only_mapping(nsq_cluster_ha):
    """Issue 36: the docs index ``consumer.partitions[p]``; it is a Mapping, ``.items()`` too."""
    topic = await ha_topic(nsq_cluster_ha)
    consumer = consumer_on(nsq_cluster_ha, topic, handler=lambda m: None)
    await consumer.start()
    try:
        await eventually(lambda: len(consumer.partitions) == PARTITIONS, timeout=20, what="every partition")
        partitions = consumer.partitions
        assert isinstance(partitions, Mapping)
        assert sorted(partitions) == list(range(PARTITIONS))
        assert {p: state.partition for p, state in partitions.items()} == {p: p for p in range(PARTITIONS)}
        assert partitions.get(PARTITIONS) is None and PARTITIONS not in partitions
        with pytest.raises(KeyError):
            partitions[PARTITIONS]
        with pytest.raises(TypeError):
            partitions[0] = partitions[1]  # type: ignore[index]
    finally:
        await consumer.stop()
