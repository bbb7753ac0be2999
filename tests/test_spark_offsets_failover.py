"""``readMode=offsets`` through an HA leader's outage and a rolled-back write (issue 61).

The driver's planner and the executors' range reads, without Spark, on the embedded HA cluster
(whose nodes can be stopped without a failover, and whose leaders can hold writes they have not
committed). Every message is identified by its (partition, offset); the batches are planned
one after the other from the previous end, as Spark's micro-batches are, and every range is
read: each message must come exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from .helpers import unique

pytest.importorskip("pyspark")

from fastnsq import Producer
from fastnsq.spark._offsets import OffsetPlanner, Position
from fastnsq.spark._options import SourceOptions, parse_source
from fastnsq.spark._range_read import read_range


def embedded_only(cluster: Any) -> None:
    if not hasattr(cluster, "write_uncommitted"):
        pytest.skip("stopping a leader without a failover and uncommitted writes need the embedded HA cluster")


def source_options(cluster: Any, topic: str, **more: str) -> SourceOptions:
    return parse_source({"lookupd": cluster.lookupd_http_addresses[0], "topic": topic, "channel": "spk",
                         "readMode": "offsets", "readStallTimeoutMs": "2000", **more})


async def one_batch(options: SourceOptions, start: dict[int, Position]) -> tuple[dict[int, Position], list[Any]]:
    """Plan the batch after ``start`` as the driver does, then read its ranges as the executors do."""
    planner = OffsetPlanner(options)
    try:
        end, state = await planner.latest(start, None)
        plans, _ = await planner.ranges(start, end, state)
    finally:
        await planner.close()
    messages = []
    for plan in plans:
        messages.extend((plan.partition, m.offset, bytes(m.body)) for m in await read_range(options, plan))
    return end, messages


async def first_position(options: SourceOptions) -> dict[int, Position]:
    planner = OffsetPlanner(options)
    try:
        return await planner.initial()
    finally:
        await planner.close()


async def test_a_partition_without_a_leader_for_several_batches_is_read_on_where_it_stopped(
    nsq_cluster_ha: Any,
) -> None:
    """It was left out of the batches' end offsets while the lookupd listed no leader of it, then
    read again from its beginning: every message read before came twice (issue 61: 106,000
    duplicates, all of the partition whose leader was killed)."""
    cluster = nsq_cluster_ha
    embedded_only(cluster)
    topic = unique("spk_outage")
    leaders = await cluster.create_topic(topic, partitions=3, replicas=1, channels=["keep"])
    down = leaders[1]
    alive = [p for p, node in leaders.items() if node != down]
    assert alive, f"every partition is led by node {down}: {leaders}"
    options = source_options(cluster, topic)
    sent: list[bytes] = []

    async def publish(producer: Producer, partitions: list[int], tag: str) -> None:
        for partition in partitions:
            bodies = [f"{tag}-{partition}-{i:04d}".encode() for i in range(300)]
            await producer.mpublish(topic, bodies, partition=partition)
            sent.extend(bodies)

    read: list[tuple[int, int, bytes]] = []
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await publish(producer, list(leaders), "before")
        position = await first_position(options)
        position, got = await one_batch(options, position)
        read += got
        await cluster.stop_node(down, fail_over=False)  # no leader of partition 1 until it is back
        for batch in range(3):
            await publish(producer, alive, f"during{batch}")
            before = position[1]
            position, got = await one_batch(options, position)
            read += got
            assert position.get(1) == before, f"batch {batch}: partition 1 moved to {position.get(1)} from {before}"
        await cluster.start_node(down)
        await cluster._wait_leaders(topic)
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await publish(producer, list(leaders), "after")
    position, got = await one_batch(options, position)
    read += got
    twice = {key: n for key, n in Counter((p, o) for p, o, _ in read).items() if n > 1}
    assert not twice, f"{len(twice)} messages read more than once, e.g. {sorted(twice)[:3]}"
    assert sorted(body for _, _, body in read) == sorted(sent)


async def test_a_batch_never_ends_past_what_the_leader_committed(nsq_cluster_ha: Any) -> None:
    """/stats' ends are the leader's write end: a batch planned to it read writes the leader then
    rolled back (issue 61: the range no longer existed, each task stalled readStallTimeoutMs
    three times and the query failed; replayed, it read messages published later at those
    offsets)."""
    cluster = nsq_cluster_ha
    embedded_only(cluster)
    topic = unique("spk_rollback")
    await cluster.create_topic(topic, partitions=1, channels=["keep"])
    options = source_options(cluster, topic)
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await producer.mpublish(topic, [b"c%03d" % i for i in range(100)], partition=0)
        position = await first_position(options)
        cluster.write_uncommitted(topic, 0, [b"rolled-back-%02d" % i for i in range(50)])
        position, first = await one_batch(options, position)
        assert position[0].count <= 100, f"planned to {position[0]}, past the 100 committed messages"
        assert cluster.rollback(topic, 0) == 50
        await producer.mpublish(topic, [b"n%03d" % i for i in range(30)], partition=0)
    position, second = await asyncio.wait_for(one_batch(options, position), 60)
    bodies = [body for _, _, body in first + second]
    assert bodies == [b"c%03d" % i for i in range(100)] + [b"n%03d" % i for i in range(30)]
    assert position[0].count == 130


async def test_uncommitted_writes_are_in_stats_and_not_read(nsq_cluster_ha: Any) -> None:
    """The embedded leader models youzan's: /stats counts the write end, /message/get and the
    channels only what is committed."""
    cluster = nsq_cluster_ha
    embedded_only(cluster)
    from fastnsq.nsqd_http import NsqdHTTP, NsqdHTTPError

    topic = unique("spk_commit")
    leaders = await cluster.create_topic(topic, partitions=1, channels=["keep"])
    address = cluster.nsqds[leaders[0]].http_address
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await producer.mpublish(topic, [b"x"] * 10, partition=0)
    cluster.write_uncommitted(topic, 0, [b"y"] * 5)
    http = NsqdHTTP()
    try:
        ends = (await http.partition_ends(address, topic))[0]
        assert ends.count == 15
        assert await http.message_at(address, topic, 0, count=10)
        with pytest.raises(NsqdHTTPError):
            await http.message_at(address, topic, 0, count=11)
        cluster.commit(topic, 0)
        offset, before = await http.message_at(address, topic, 0, count=15)
        assert before == 14 and offset < ends.end
    finally:
        await http.close()


async def test_a_read_task_waits_for_its_partitions_leader_to_come_back(
    nsq_cluster_ha: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """A task whose partition had no leader failed after 3 attempts (a few seconds: the issue's
    query ended about 50 s after a leader died); it now asks again until a leader answers,
    within leaderWaitTimeoutMs, and reads its range from it."""
    cluster = nsq_cluster_ha
    embedded_only(cluster)
    topic = unique("spk_wait")
    leaders = await cluster.create_topic(topic, partitions=1, replicas=1, channels=["keep"])
    options = source_options(cluster, topic)
    bodies = [b"w%04d" % i for i in range(500)]
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await producer.mpublish(topic, bodies, partition=0)
    planner = OffsetPlanner(options)
    try:
        start = await planner.initial()
        end, state = await planner.latest(start, None)
        [plan] = (await planner.ranges(start, end, state))[0]
    finally:
        await planner.close()
    await cluster.stop_node(leaders[0], fail_over=False)
    with caplog.at_level("WARNING", logger="fastnsq.spark._range_read"):
        reading = asyncio.create_task(read_range(options, plan))

        def attempts() -> int:
            return sum("failed on" in r.getMessage() for r in caplog.records)

        while attempts() < 5 and not reading.done():
            await asyncio.sleep(0.05)
        assert not reading.done(), f"the read gave up while the partition had no leader: {reading.exception()!r}"
        await cluster.start_node(leaders[0])
        messages = await asyncio.wait_for(reading, 120)
    assert [bytes(m.body) for m in messages] == bodies


def offsets_schema() -> Any:
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    kinds = {"id": StringType(), "body": BinaryType(), "attempts": IntegerType(), "timestamp": TimestampType(),
             "nsqd": StringType(), "topic": StringType(), "partition": IntegerType(), "offset": LongType(),
             "trace_id": LongType()}
    return StructType([StructField(name, kind) for name, kind in kinds.items()])


async def test_a_prefetched_batch_is_read_whole_though_its_leader_dies_before_the_tasks_run(
    nsq_cluster_ha: Any,
) -> None:
    """prefetchRanges=true: the driver reads a batch's ranges as it plans them, so a leader that
    dies between planning and the read tasks stalls nothing: each task gets its range's rows
    from the driver, every message once. Without the option the task of the dead leader's
    partition waits for a leader until leaderWaitTimeoutMs and fails (the control below)."""
    from fastnsq.errors import RangeReadError
    from fastnsq.spark.offset_source import NSQOffsetStreamReader

    cluster = nsq_cluster_ha
    embedded_only(cluster)
    topic = unique("spk_prefetch")
    leaders = await cluster.create_topic(topic, partitions=2, replicas=1, channels=["keep"])
    bodies = {p: [b"p%d-%04d" % (p, i) for i in range(400)] for p in (0, 1)}
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        for partition, some in bodies.items():
            await producer.mpublish(topic, some, partition=partition)

    async def plan_then_kill_the_leader_of_1(**more: str) -> tuple[Any, list[Any]]:
        reader = NSQOffsetStreamReader(source_options(cluster, topic, leaderWaitTimeoutMs="1000", **more),
                                       offsets_schema())
        start = await asyncio.to_thread(reader.initialOffset)
        end = await asyncio.to_thread(reader.latestOffset, start, None)
        if reader._prefetcher is not None:  # the driver's reads end within ms of planning: wait for them here
            assert await asyncio.to_thread(reader._prefetcher.wait_ready, 30.0)
        await cluster.stop_node(leaders[1], fail_over=False)
        return reader, list(await asyncio.to_thread(reader.partitions, start, end))

    reader, parts = await plan_then_kill_the_leader_of_1(prefetchRanges="true")
    try:
        assert sorted(part.plan.partition for part in parts) == [0, 1]
        read: dict[int, list[bytes]] = {}
        for part in parts:
            batches = await asyncio.to_thread(lambda p=part: list(reader.read(p)))
            read[part.plan.partition] = [row[1] for row in batches] if batches and isinstance(batches[0], tuple) else [
                body for batch in batches for body in batch.column("body").to_pylist()]
        assert read == bodies
    finally:
        reader.stop()
        await cluster.start_node(leaders[1])

    control, parts = await plan_then_kill_the_leader_of_1()
    try:
        [dead] = [part for part in parts if part.plan.partition == 1]
        assert dead.prefetched is None
        with pytest.raises(RangeReadError, match="leaderWaitTimeoutMs"):
            await asyncio.to_thread(lambda: list(control.read(dead)))
    finally:
        control.stop()
        await cluster.start_node(leaders[1])
