"""``readMode=offsets``: the replayable, partition-parallel source for HA topics (issue 22).

On the embedded HA cluster, or the real youzan one with ``dev.py test --real-ha``; Spark in
``local[2]`` here (the standalone cluster, with an executor killed, is in
``test_spark_cluster.py``). Every message is identified by (partition, offset): the tests
assert exactly the published bodies, each once, across micro-batches cut by
``maxRecordsPerBatch``, a query restarted from its checkpoint, and start positions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import unique
from .spark_ha import NotHACluster, ThreadedHACluster
from .test_spark import _has_available_now, spark, spark_test, stop_query  # noqa: F401 - a fixture

PARTITIONS = 4
PER_PARTITION = 2_500


@pytest.fixture(scope="module")
def ha() -> Iterator[ThreadedHACluster]:
    try:
        cluster = ThreadedHACluster()
    except NotHACluster as exc:
        pytest.skip(f"readMode=offsets needs youzan's HA cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


def published(ha: ThreadedHACluster, topic: str, tag: str, per_partition: int = PER_PARTITION) -> set[bytes]:
    sent: set[bytes] = set()
    for partition in range(PARTITIONS):
        batch = [f"{tag}-{partition}-{i:06d}".encode() for i in range(per_partition)]
        ha.publish(topic, partition, batch)
        sent.update(batch)
    return sent


def offsets_stream(session: Any, ha: ThreadedHACluster, topic: str, **options: Any) -> Any:
    reader = (session.readStream.format("nsq").option("lookupd", ha.lookupd_http).option("topic", topic)
              .option("channel", "spk").option("readMode", "offsets"))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def run_available_now(stream: Any, out: Path, checkpoint: Path) -> Any:
    query = (stream.select("partition", "offset", "body", "id").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(240), "the AvailableNow query did not stop by itself"
    finally:
        stop_query(query)
    assert query.exception() is None
    return query


def stored(session: Any, out: Path) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, bytes(r.body)) for r in session.read.parquet(str(out)).collect()]


def assert_exactly(rows: list[tuple[int, int, bytes]], sent: set[bytes]) -> None:
    keys = {(p, o) for p, o, _ in rows}
    assert len(keys) == len(rows), f"{len(rows) - len(keys)} (partition, offset) written twice"
    bodies = [b for _, _, b in rows]
    assert len(bodies) == len(set(bodies)) == len(sent), (len(bodies), len(set(bodies)), len(sent))
    assert set(bodies) == sent


def needs_available_now() -> None:
    if not _has_available_now():
        pytest.skip("this PySpark has no Trigger.AvailableNow for Python sources (PySpark < 4.2)")


# ---- options (no server) ------------------------------------------------------------------


def test_offsets_options_are_checked_naming_the_option() -> None:
    pytest.importorskip("pyspark")
    from fastnsq.errors import InvalidValueError
    from fastnsq.spark._options import parse_source

    base = {"lookupd": "127.0.0.1:4161", "topic": "t", "channel": "c", "readMode": "offsets"}
    assert parse_source(base).ha is True
    cases: dict[str, dict[str, Any]] = {
        "needs option 'lookupd'": {**base, "lookupd": None, "nsqd": "127.0.0.1:4150"},
        "'ha' cannot be false": {**base, "ha": "false"},
        "do not apply with option 'readMode'=offsets": {**base, "numPartitions": "4"},
        "may be at most 38": {**base, "channel": "c" * 39},
        "not earliest, latest or JSON": {**base, "startingOffsets": "yesterday"},
        "partition 1 offset -3": {**base, "startingOffsets": '{"0": 0, "1": -3}'},
        "apply only with option 'readMode'=offsets": {"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c",
                                                      "startingOffsets": "latest"},
        "'prefetchRanges' apply only with option 'readMode'=offsets": {
            "nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c", "prefetchRanges": "true"},
        "rowServerHost and rowServerPort apply with prefetchRanges=true": {**base, "rowServerHost": "0.0.0.0"},
        "option 'prefetchRanges' must be true or false": {**base, "prefetchRanges": "yes please"},
    }
    for expected, options in cases.items():
        with pytest.raises(InvalidValueError, match=expected):
            parse_source({k: v for k, v in options.items() if v is not None})
    served = parse_source({**base, "prefetchRanges": "true", "rowServerHost": "10.0.0.5", "rowServerPort": "7077"})
    assert (served.prefetch_ranges, served.row_server_host, served.row_server_port) == (True, "10.0.0.5", 7077)
    assert parse_source(base).prefetch_ranges is False
    from pyspark.sql.types import BinaryType, StructField, StructType

    from fastnsq.spark.offset_batch import NSQOffsetBatchReader

    with pytest.raises(InvalidValueError, match="'prefetchRanges' applies to streaming queries"):
        NSQOffsetBatchReader(served, StructType([StructField("body", BinaryType())]))


def test_offsets_round_trip_through_the_checkpoint_form() -> None:
    pytest.importorskip("pyspark")
    from fastnsq.errors import InvalidValueError
    from fastnsq.spark._offsets import Position, positions_from_json, positions_to_json

    positions = {0: Position(4096, 100), 3: Position(0, 0)}
    encoded = positions_to_json(positions)
    assert json.loads(json.dumps(encoded)) == {"partitions": {"0": [4096, 100], "3": [0, 0]}}
    assert positions_from_json(encoded) == positions
    with pytest.raises(InvalidValueError, match="another readMode"):
        positions_from_json({"session": "x", "seq": 3})


# ---- on the HA cluster --------------------------------------------------------------------


@spark_test
def test_every_message_once_across_cut_batches_and_a_restart_from_the_checkpoint(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811 - the fixture
) -> None:
    needs_available_now()
    topic = unique("spk_off")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, "first")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream = offsets_stream(spark, ha, topic, maxRecordsPerBatch=3_000)
    query = run_available_now(stream, out, checkpoint)
    batches = len([p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()])
    rows = stored(spark, out)
    assert_exactly(rows, sent)
    assert batches >= PARTITIONS * PER_PARTITION // 3_000, f"maxRecordsPerBatch=3000 cut {len(rows)} rows into {batches}"
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _ in rows:
        by_partition.setdefault(partition, []).append(offset)
    assert sorted(by_partition) == list(range(PARTITIONS))
    assert all(len(offsets) == PER_PARTITION for offsets in by_partition.values())
    assert query.lastProgress is not None

    more = published(ha, topic, "second", per_partition=1_000)  # then the query restarts from its checkpoint
    run_available_now(offsets_stream(spark, ha, topic, maxRecordsPerBatch=3_000), out, checkpoint)
    assert_exactly(stored(spark, out), sent | more)


@spark_test
def test_starting_offsets_latest_and_per_partition(spark: Any, ha: ThreadedHACluster, tmp_path: Path) -> None:  # noqa: F811
    needs_available_now()
    topic = unique("spk_start")
    ha.create_topic(topic, PARTITIONS)
    before = published(ha, topic, "before", per_partition=200)
    # where every partition's 101st message begins: read from there
    first = stored_first_run(spark, ha, topic, tmp_path / "all")
    starts = {p: sorted(o for q, o, _ in first if q == p)[100] for p in range(PARTITIONS)}
    out = tmp_path / "from-offsets"
    run_available_now(offsets_stream(spark, ha, topic, startingOffsets=json.dumps({str(p): o for p, o in starts.items()})),
                      out, tmp_path / "cp-offsets")
    rows = stored(spark, out)
    assert {(p, o) for p, o, _ in rows} == {(p, o) for p, o, _ in first if o >= starts[p]}
    assert len(rows) == PARTITIONS * 100

    latest_out, latest_cp = tmp_path / "latest", tmp_path / "cp-latest"
    run_available_now(offsets_stream(spark, ha, topic, startingOffsets="latest"), latest_out, latest_cp)
    assert not list(latest_out.glob("*.parquet")) or not stored(spark, latest_out), "latest: nothing of before"
    after = published(ha, topic, "after", per_partition=50)
    run_available_now(offsets_stream(spark, ha, topic, startingOffsets="latest"), latest_out, latest_cp)
    assert_exactly(stored(spark, latest_out), after)
    assert not {b for _, _, b in stored(spark, latest_out)} & before


def stored_first_run(session: Any, ha: ThreadedHACluster, topic: str, folder: Path) -> list[tuple[int, int, bytes]]:
    run_available_now(offsets_stream(session, ha, topic), folder / "out", folder / "cp")
    return stored(session, folder / "out")


@spark_test
def test_an_offset_that_is_not_a_message_boundary_is_refused_naming_it(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811
) -> None:
    needs_available_now()
    topic = unique("spk_bad")
    ha.create_topic(topic, 2)
    for partition in range(2):
        ha.publish(topic, partition, [b"x" * 20] * 10)
    stream = offsets_stream(spark, ha, topic, startingOffsets='{"0": 5, "1": -2}')
    query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "o"))
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except Exception as exc:  # noqa: BLE001 - what Spark raises wraps the source's error
        error = str(exc)
    else:
        error = str(query.exception())
    finally:
        stop_query(query)
    assert "partition 0 offset 5 is not where a message begins" in error, error


# ---- a range read whose leader moves (no Spark: the executor's read itself) ----------------


async def test_a_range_read_whose_leader_moves_is_read_again_from_the_new_leader(
    nsq_cluster_ha: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("pyspark")
    if not hasattr(nsq_cluster_ha, "move_leader"):
        pytest.skip("moving a leader on demand needs the embedded HA cluster")
    from fastnsq import Producer
    from fastnsq.spark._offsets import OffsetPlanner, plan_ranges
    from fastnsq.spark._options import parse_source
    from fastnsq.spark._range_read import read_range

    topic = unique("spk_move")
    leaders = await nsq_cluster_ha.create_topic(topic, partitions=1, channels=["keep"])
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        for at in range(0, 20_000, 1_000):
            await producer.mpublish(topic, [b"m%05d" % i for i in range(at, at + 1_000)], partition=0)
    options = parse_source({"lookupd": nsq_cluster_ha.lookupd_http_addresses[0], "topic": topic, "channel": "spk",
                            "readMode": "offsets", "maxInFlight": "20", "readStallTimeoutMs": "600000"})
    planner = OffsetPlanner(options)
    try:
        start = await planner.initial()
        end, state = await planner.latest(start, None)
    finally:
        await planner.close()
    [plan] = plan_ranges(start, end, state)
    reading = asyncio.create_task(read_range(options, plan))
    partition = nsq_cluster_ha.nsqds[leaders[0]].partitions[(topic, 0)]

    def delivered() -> int:
        return sum(c.delivery_count for name, c in partition.channels.items() if name.startswith("spk-"))

    while delivered() < 100 and not reading.done():  # the read is under way: 100 of 20,000 delivered
        await asyncio.sleep(0)
    assert not reading.done()
    await nsq_cluster_ha.move_leader(topic, 0, (leaders[0] + 1) % 3)
    with caplog.at_level("WARNING", logger="fastnsq.spark._range_read"):
        messages = await asyncio.wait_for(reading, 60)
    assert any("attempt 1 failed" in r.getMessage() for r in caplog.records), "the first leader's read did not fail"
    # Not after readStallTimeoutMs (10 minutes here): the old leader closed the connection and refused it again.
    assert any("did not come back within 1 s" in r.getMessage() for r in caplog.records)
    assert [bytes(m.body) for m in messages] == [b"m%05d" % i for i in range(20_000)]
    offsets = [m.offset for m in messages]
    assert offsets[0] == plan.start.offset and offsets[-1] + messages[-1].raw_size == plan.end.offset
