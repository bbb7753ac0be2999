"""The default (driver-side) source on HA topics: ``ha=true``, a channel's semantics (issue 36).

On the embedded 3-node HA cluster, or the real youzan one with ``dev.py test --real-ha``.
A standalone HA nsqd and the embedded HA cluster number the messages of each partition from
1, so partitions share message ids (youzan's cluster puts the partition in the id's high
bits): the source must keep them apart (it once took partition 1's messages for
redeliveries of partition 0's, wrote 1,000 rows of 2,000 and FINed the rest). Asserted here: every message
exactly as published, each once, with its partition and queue offset, under
Trigger.AvailableNow and the default trigger, on 2 and 4 partitions; the AvailableNow target
counts each partition once (its leader's), and its last messages reach every partition; and a
channel the source would create (it starts at the partitions' end) is warned about.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import unique
from .spark_ha import NotHACluster, ThreadedHACluster
from .test_spark import _has_available_now, spark, spark_test, stop_query, wait_until  # noqa: F401 - a fixture

PER_PARTITION = 1_000


@pytest.fixture(scope="module")
def ha() -> Iterator[ThreadedHACluster]:
    pytest.importorskip("pyspark")
    try:
        cluster = ThreadedHACluster()
    except NotHACluster as exc:
        pytest.skip(f"these tests need youzan's HA cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


def ha_topic(ha: ThreadedHACluster, prefix: str, partitions: int, channel: str = "spark") -> tuple[str, set[bytes]]:
    """A topic of ``partitions`` partitions with ``channel`` created first, ``PER_PARTITION`` in each."""
    topic = unique(prefix)
    ha.run(ha.cluster.create_topic(topic, partitions=partitions, channels=[channel]))
    sent: set[bytes] = set()
    for partition in range(partitions):
        batch = [f"{topic}-{partition}-{i:05d}".encode() for i in range(PER_PARTITION)]
        ha.publish(topic, partition, batch)
        sent.update(batch)
    return topic, sent


def source_options(ha: ThreadedHACluster, topic: str, **extra: str) -> Any:
    from fastnsq.spark._options import parse_source

    return parse_source({"lookupd": ha.lookupd_http, "topic": topic, "channel": "spark", "ha": "true", **extra})


def assert_exactly(rows: list[tuple[int, int, bytes]], sent: set[bytes], partitions: int) -> None:
    """Each published body once, from the partition it was published to, with its queue offset."""
    bodies = [body for _, _, body in rows]
    assert len(bodies) == len(set(bodies)), f"{len(bodies) - len(set(bodies))} bodies written twice"
    per_partition = collections.Counter(partition for partition, _, _ in rows)
    assert per_partition == {p: PER_PARTITION for p in range(partitions)}, per_partition
    assert set(bodies) == sent
    assert all(body.split(b"-")[-2] == str(partition).encode() for partition, _, body in rows)
    positions = {(partition, offset) for partition, offset, _ in rows}
    assert None not in {offset for _, offset in positions}, "a row without its queue offset"
    assert len(positions) == len(rows), "two rows at one (partition, offset)"


# ---- the source's consumer, without Spark ---------------------------------------------------


@pytest.mark.parametrize("partitions", [2, 4])
def test_the_source_keeps_partitions_apart_though_they_share_message_ids(
    ha: ThreadedHACluster, partitions: int
) -> None:
    """Before the fix: 1,000 rows from partition 0, partition 1's 1,000 counted as redeliveries."""
    from fastnsq.spark._runtime import SourceRuntime

    topic, sent = ha_topic(ha, "spk_ids", partitions)
    runtime = SourceRuntime(source_options(ha, topic, maxInFlight=str(10 * PER_PARTITION)))
    runtime.start()
    try:
        def arrived() -> int:  # rows, and deliveries taken for redeliveries of a row
            return runtime.call(lambda: runtime.delivered + runtime.redeliveries_dropped)

        wait_until(lambda: arrived() >= len(sent), 60, what=f"{len(sent)} deliveries")
        time.sleep(0.5)  # nothing more may come
        _, messages = runtime.call(runtime.plan, {"session": "", "seq": 0}, None)
        counts = runtime.call(runtime.counts)
    finally:
        runtime.stop()
    if not ha.external:  # the embedded cluster numbers each partition from 1 (youzan's: partition << 50)
        internal_ids = collections.Counter(m.internal_id for m in messages)
        assert max(internal_ids.values()) > 1, "the partitions' ids do not collide: this test proves nothing here"
    assert counts["redeliveries_dropped"] == 0
    assert_exactly([(m.partition, m.offset, bytes(m.body)) for m in messages], sent, partitions)


def test_the_available_now_target_counts_each_partition_once(ha: ThreadedHACluster) -> None:
    """4 partitions on 3 nodes: one node leads two, every node holds replicas. Before the fix
    the last entry of the topic on each node won (a replica's 0, or one of two led)."""
    from fastnsq.spark._runtime import available_now_backlog

    topic, sent = ha_topic(ha, "spk_target", 4)
    assert available_now_backlog(source_options(ha, topic)) == len(sent)


def test_the_available_now_target_counts_messages_in_flight_once(ha: ThreadedHACluster) -> None:
    """Every message delivered to the running source and not yet committed: youzan's channel
    depth counts them (from the confirmed offset) as well as its in-flight count; before the
    fix the target was our buffer plus that depth, twice the backlog."""
    from fastnsq.spark._runtime import SourceRuntime

    topic, sent = ha_topic(ha, "spk_inflight", 2)
    runtime = SourceRuntime(source_options(ha, topic, maxInFlight=str(10 * PER_PARTITION)))
    runtime.start()
    try:
        wait_until(lambda: runtime.call(runtime.counts)["buffered"] >= len(sent), 60, what="the backlog")
        assert runtime.available_now_target() == len(sent)
    finally:
        runtime.stop()


def test_the_end_of_an_available_now_run_reaches_every_partition(ha: ThreadedHACluster) -> None:
    """One message left, on any one of 4 partitions: the in-flight window is 1 for 4
    connections, and the slot must reach that partition's. It moved on after 10 s idle
    (checked every 5 s): the message on the partition served last waited 25 s and more."""
    from fastnsq.spark._runtime import SourceRuntime, available_now_backlog

    for partition in range(4):
        topic = unique("spk_tail")
        ha.run(ha.cluster.create_topic(topic, partitions=4, channels=["spark"]))
        ha.publish(topic, partition, [b"the last one"])
        options = source_options(ha, topic)
        target = available_now_backlog(options)
        assert target == 1
        runtime = SourceRuntime(options)
        runtime.start(delivery_cap=target)
        try:
            assert runtime.arrived.wait(8.0), f"the message on partition {partition} did not arrive within 8 s"
        finally:
            runtime.stop()


def test_a_channel_the_source_would_create_is_warned_about(
    ha: ThreadedHACluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The HA nsqd starts a new channel at each partition's end: 0 rows, so say it."""
    from fastnsq.spark._runtime import SourceRuntime

    topic, _ = ha_topic(ha, "spk_newch", 2, channel="keep")
    for channel, warned in (("spark", [0, 1]), ("keep", [])):
        runtime = SourceRuntime(source_options(ha, topic, channel=channel))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fastnsq.spark._runtime"):
            runtime.start()
        try:
            if warned:
                time.sleep(1.0)  # what would come, comes within this
            else:
                wait_until(lambda rt=runtime: rt.call(rt.counts)["buffered"] >= 2 * PER_PARTITION, 30, what="the backlog")
            delivered = runtime.call(runtime.counts)["buffered"]
        finally:
            runtime.stop()
        warnings = [r.getMessage() for r in caplog.records if "does not exist on partition" in r.getMessage()]
        if warned:
            named = f"partition(s) {', '.join(map(str, warned))} of HA topic {topic!r}"
            assert len(warnings) == 1 and named in warnings[0], warnings
            assert delivered == 0, "a new HA channel starts at the end: nothing published before it is read"
        else:
            assert warnings == [] and delivered == 2 * PER_PARTITION


# ---- Spark: AvailableNow and the default trigger ---------------------------------------------


def ha_stream(session: Any, ha: ThreadedHACluster, topic: str) -> Any:
    return (session.readStream.format("nsq").option("lookupd", ha.lookupd_http).option("topic", topic)
            .option("channel", "spark").option("ha", "true").load())


def stored(session: Any, out: Path) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, bytes(r.body)) for r in session.read.parquet(str(out)).collect()]


@spark_test
@pytest.mark.parametrize("partitions", [2, 4])
def test_available_now_reads_every_partition_of_an_ha_topic(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path, partitions: int,  # noqa: F811 - the fixture
) -> None:
    if not _has_available_now():
        pytest.skip("this PySpark has no Trigger.AvailableNow for Python sources (PySpark < 4.2)")
    topic, sent = ha_topic(ha, "spk_ha_now", partitions)
    query = (ha_stream(spark, ha, topic).select("partition", "offset", "body").writeStream.format("parquet")
             .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the AvailableNow query did not stop by itself"
    finally:
        stop_query(query)
    assert query.exception() is None
    assert_exactly(stored(spark, tmp_path / "out"), sent, partitions)


class PositionCollector:
    """A foreachBatch sink keeping (partition, offset, body) of every row in this process."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        rows = [(r.partition, r.offset, bytes(r.body)) for r in batch_df.select("partition", "offset", "body").collect()]
        with self.lock:
            self.rows.extend(rows)

    def count(self) -> int:
        with self.lock:
            return len(self.rows)


@spark_test
@pytest.mark.parametrize("partitions", [2, 4])
def test_the_default_trigger_reads_every_partition_of_an_ha_topic(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path, partitions: int,  # noqa: F811 - the fixture
) -> None:
    topic, sent = ha_topic(ha, "spk_ha_run", partitions)
    collected = PositionCollector()
    query = (ha_stream(spark, ha, topic).writeStream.foreachBatch(collected)
             .option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        wait_until(lambda: collected.count() >= len(sent), 120, what=f"{len(sent)} rows")
        time.sleep(3)  # a few more micro-batches: nothing may be written twice
    finally:
        stop_query(query)
    assert_exactly(collected.rows, sent, partitions)


def driver_stderr(request: pytest.FixtureRequest) -> str | None:
    """What Spark's JVM (and the Python source process it runs) wrote to stderr so far, or None
    when pytest does not capture (-s). The JVM writes to the descriptor it was started with,
    pytest's session-wide capture, which capfd does not see; it is written back for the report."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is None or not capman.is_globally_capturing():
        return None
    captured = capman.read_global_capture()
    sys.stderr.write(captured.err)
    return str(captured.err)


@spark_test
def test_available_now_on_a_new_ha_channel_reads_nothing_and_says_why(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path, request: pytest.FixtureRequest,  # noqa: F811 - the fixture
) -> None:
    """The query's channel does not exist: the HA nsqd creates it at the end, so 0 rows; the
    warning reaches the driver's stderr (from Spark's Python source process)."""
    if not _has_available_now():
        pytest.skip("this PySpark has no Trigger.AvailableNow for Python sources (PySpark < 4.2)")
    topic, _ = ha_topic(ha, "spk_ha_new", 2, channel="keep")
    driver_stderr(request)  # what came before this query
    query = (ha_stream(spark, ha, topic).select("partition", "offset", "body").writeStream.format("parquet")
             .option("path", str(tmp_path / "out")).option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the AvailableNow query did not stop by itself"
    finally:
        stop_query(query)
    assert query.exception() is None
    assert spark.read.schema("partition int, offset bigint, body binary").parquet(str(tmp_path / "out")).count() == 0
    err = driver_stderr(request)
    if err is not None:
        assert f"channel 'spark' does not exist on partition(s) 0, 1 of HA topic '{topic}'" in err, err[-2000:]
