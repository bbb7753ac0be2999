"""``readMode=offsets`` with Spark's Kafka source's everyday options (issue 37).

Batch reads (``spark.read``) of an offset window, ``endingOffsets`` for batch and streaming
reads, positions by time (``startingTimestamp``, ``startingOffsetsByTimestamp``,
``endingTimestamp``, ``endingOffsetsByTimestamp``), ``failOnDataLoss``, ``minPartitions`` and
the lag in the query progress. On the embedded HA cluster, or the real youzan one with
``dev.py test --real-ha``; Spark in ``local[2]``. Rows are identified by (partition, offset).
The data-loss tests remove a range under the reader with the embedded cluster's retention
hook (``NSQCluster.remove_before``); youzan's own retention cannot be forced on a test's topic:
even ``POST /topic/greedyclean`` keeps 16 GiB / 16 x the retention days (at least 1 GiB) of
each partition (consistence/nsqd_coordinator.go GreedyCleanTopicOldData), so they skip there.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from .helpers import unique
from .spark_ha import ThreadedHACluster
from .test_spark import spark, spark_test, stop_query  # noqa: F401 - a fixture
from .test_spark_offsets import (  # noqa: F401 - a fixture
    PARTITIONS,
    assert_exactly,
    ha,
    needs_available_now,
    offsets_stream,
    published,
    run_available_now,
    stored,
)

Row = tuple[int, int, bytes]


def batch_read(session: Any, ha: ThreadedHACluster, topic: str, **options: Any) -> Any:  # noqa: F811
    reader = (session.read.format("nsq").option("lookupd", ha.lookupd_http).option("topic", topic)
              .option("channel", "spkb").option("readMode", "offsets"))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def rows_of(df: Any) -> list[Row]:
    return [(r.partition, r.offset, bytes(r.body)) for r in df.select("partition", "offset", "body").collect()]


def offsets_by_partition(rows: list[Row]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for partition, offset, _ in rows:
        found.setdefault(partition, []).append(offset)
    return {p: sorted(o) for p, o in found.items()}


def failure_of(run: Any) -> str:
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - what Spark raises wraps the source's error
        return str(exc)
    raise AssertionError("expected the read to fail")


# ---- options (no server) ------------------------------------------------------------------


def test_kafka_named_options_are_checked_naming_option_value_and_limit() -> None:
    pytest.importorskip("pyspark")
    from fastnsq.errors import InvalidValueError
    from fastnsq.spark._options import parse_source

    base = {"lookupd": "127.0.0.1:4161", "topic": "t", "channel": "c", "readMode": "offsets"}
    opts = parse_source({**base, "endingOffsets": '{"0": 96, "1": -1}', "startingTimestamp": "1700000000000",
                         "failOnDataLoss": "false", "minPartitions": "16", "maxOffsetsPerTrigger": "500"})
    assert (opts.starting_timestamp, opts.fail_on_data_loss, opts.min_partitions) == (1_700_000_000_000, False, 16)
    assert opts.max_records_per_batch == 500 and opts.has_ending
    cases: dict[str, dict[str, str]] = {
        r"'minPartitions'=0 is outside the accepted range 1..100000": {**base, "minPartitions": "0"},
        r"'minPartitions' must be an integer in 1..100000, got 'many'": {**base, "minPartitions": "many"},
        r"'failOnDataLoss' must be true or false, got 'maybe'": {**base, "failOnDataLoss": "maybe"},
        r"'startingTimestamp'=-5 is outside the accepted range 0..253402300799999": {**base,
                                                                                     "startingTimestamp": "-5"},
        r"'endingOffsets'='earliest' is not latest or JSON": {**base, "endingOffsets": "earliest"},
        r"'endingOffsets': partition 1 offset -2 must be": {**base, "endingOffsets": '{"0": 1, "1": -2}'},
        r"'endingOffsetsByTimestamp': partition 0 timestamp -1 must be": {**base,
                                                                          "endingOffsetsByTimestamp": '{"0": -1}'},
        r"'startingOffsetsByTimestamp'='\[1\]' is not JSON": {**base, "startingOffsetsByTimestamp": "[1]"},
        r"'maxRecordsPerBatch' and 'maxOffsetsPerTrigger' are the same limit": {
            **base, "maxRecordsPerBatch": "5", "maxOffsetsPerTrigger": "5"},
        r"'minPartitions'.* apply only with option 'readMode'=offsets": {
            "nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c", "minPartitions": "4"},
    }
    for expected, options in cases.items():
        with pytest.raises(InvalidValueError, match=expected):
            parse_source(options)


# ---- batch reads, endingOffsets, minPartitions ----------------------------------------------


@spark_test
def test_a_batch_read_equals_the_streaming_read_of_the_same_window(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811 - the fixtures
) -> None:
    needs_available_now()
    topic = unique("spk_win")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, "w", per_partition=2_000)
    everything = rows_of(batch_read(spark, ha, topic))  # earliest .. latest
    assert_exactly(everything, sent)
    offsets = offsets_by_partition(everything)
    starting = {str(p): o[300] for p, o in offsets.items()}
    ending = {str(p): o[1_700] for p, o in offsets.items()}
    window = {"startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending)}
    expected = sorted(r for r in everything if int(starting[str(r[0])]) <= r[1] < int(ending[str(r[0])]))
    assert len(expected) == PARTITIONS * 1_400

    df = batch_read(spark, ha, topic, **window)
    assert df.rdd.getNumPartitions() == PARTITIONS
    assert sorted(rows_of(df)) == expected

    split = batch_read(spark, ha, topic, minPartitions=16, **window)
    assert split.rdd.getNumPartitions() == 16, "minPartitions=16 on 4 partitions: 16 read tasks"
    assert sorted(rows_of(split)) == expected, "the same rows as 4 tasks, each once"

    more = published(ha, topic, "after", per_partition=100)  # past the window's end: never read
    run_available_now(offsets_stream(spark, ha, topic, maxRecordsPerBatch=1_000, **window), tmp_path / "out",
                      tmp_path / "cp")
    streamed = stored(spark, tmp_path / "out")
    assert sorted(streamed) == expected, "the streaming read of the window stops at endingOffsets"
    assert not {b for _, _, b in streamed} & more


@spark_test
def test_batch_read_refusals_name_the_option(spark: Any, ha: ThreadedHACluster) -> None:  # noqa: F811
    topic = unique("spk_bref")
    ha.create_topic(topic, 2)
    for partition in range(2):
        ha.publish(topic, partition, [b"y" * 20] * 10)
    assert "'startingOffsets'=latest is not allowed in a batch read" in failure_of(
        lambda: batch_read(spark, ha, topic, startingOffsets="latest").collect())
    error = failure_of(lambda: batch_read(spark, ha, topic, endingOffsets='{"0": 7, "1": -1}').collect())
    assert "option 'endingOffsets': partition 0 offset 7 is not where a message begins" in error, error
    error = failure_of(lambda: batch_read(spark, ha, topic, endingOffsets='{"0": -1}').collect())
    assert "option 'endingOffsets' must give every partition" in error and "missing [1]" in error, error
    plain = (spark.read.format("nsq").option("nsqd", "127.0.0.1:4150").option("topic", topic)
             .option("channel", "c"))
    assert "option('readMode', 'offsets') for a batch read" in failure_of(lambda: plain.load().collect())


# ---- positions by time ---------------------------------------------------------------------


def _publish_timed(ha: ThreadedHACluster, topic: str, tag: str,  # noqa: F811
                   per_partition: int) -> tuple[set[bytes], int, int]:
    """Publish, and the wall-clock milliseconds just before the first and just after the last."""
    time.sleep(0.005)
    before = int(time.time() * 1000)  # the earliest a message of this lot can be written
    time.sleep(0.002)
    sent = published(ha, topic, tag, per_partition=per_partition)
    time.sleep(0.002)
    after = int(time.time() * 1000) + 1  # later than every message of this lot, to the ms
    time.sleep(0.005)
    return sent, before, after


@spark_test
def test_a_time_window_returns_exactly_the_messages_published_in_it(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811
) -> None:
    needs_available_now()
    topic = unique("spk_time")
    ha.create_topic(topic, PARTITIONS)
    early, _, _ = _publish_timed(ha, topic, "early", 300)
    middle, t1, t2 = _publish_timed(ha, topic, "middle", 400)
    late, _, _ = _publish_timed(ha, topic, "late", 300)
    rows = rows_of(batch_read(spark, ha, topic, startingTimestamp=t1, endingTimestamp=t2))
    assert_exactly(rows, middle)
    by_partition = json.dumps({str(p): t1 for p in range(PARTITIONS)})
    rows = rows_of(batch_read(spark, ha, topic, startingOffsetsByTimestamp=by_partition,
                              endingOffsetsByTimestamp=json.dumps({str(p): t2 for p in range(PARTITIONS)})))
    assert_exactly(rows, middle)
    rows = rows_of(batch_read(spark, ha, topic, startingTimestamp=t1,  # the pair
                              endingOffsetsByTimestamp=json.dumps({str(p): t2 for p in range(PARTITIONS)})))
    assert_exactly(rows, middle)
    assert_exactly(rows_of(batch_read(spark, ha, topic, startingTimestamp=t1)), middle | late)
    assert_exactly(rows_of(batch_read(spark, ha, topic, endingTimestamp=t1)), early)
    assert rows_of(batch_read(spark, ha, topic, startingTimestamp=int(time.time() * 1000) + 60_000)) == []
    # streaming: from a time, to a time (Trigger.AvailableNow stops there)
    run_available_now(offsets_stream(spark, ha, topic, startingOffsetsByTimestamp=by_partition, endingTimestamp=t2),
                      tmp_path / "out", tmp_path / "cp")
    assert_exactly(stored(spark, tmp_path / "out"), middle)


# ---- failOnDataLoss ------------------------------------------------------------------------


def _embedded(ha: ThreadedHACluster) -> Any:  # noqa: F811
    if ha.external:
        pytest.skip("removing a range on demand needs the embedded HA cluster (youzan's retention keeps days)")
    return ha.cluster


@spark_test
def test_a_batch_read_of_a_removed_range_fails_naming_it_or_skips_it_counted(
    spark: Any, ha: ThreadedHACluster,  # noqa: F811
) -> None:
    cluster = _embedded(ha)
    topic = unique("spk_lossb")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, "l", per_partition=1_000)
    everything = rows_of(batch_read(spark, ha, topic))
    offsets = offsets_by_partition(everything)
    starting = json.dumps({str(p): o[0] for p, o in offsets.items()})
    cut = offsets[1][250]
    assert cluster.remove_before(topic, 1, cut) == 250
    error = failure_of(lambda: batch_read(spark, ha, topic, startingOffsets=starting).collect())
    assert f"partition 1: offsets {offsets[1][0]}..{cut}" in error and "failOnDataLoss" in error, error
    rows = rows_of(batch_read(spark, ha, topic, startingOffsets=starting, failOnDataLoss="false"))
    gone = {r for r in everything if r[0] == 1 and r[1] < cut}
    assert len(gone) == 250
    assert_exactly(rows, sent - {b for _, _, b in gone})


@spark_test
def test_a_query_restarted_after_retention_removed_its_next_range(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811
) -> None:
    needs_available_now()
    cluster = _embedded(ha)
    topic = unique("spk_losss")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, "s", per_partition=1_000)
    offsets = offsets_by_partition(rows_of(batch_read(spark, ha, topic)))
    half = json.dumps({str(p): o[500] for p, o in offsets.items()})
    runs: dict[str, set[bytes]] = {}
    for policy in ("true", "false"):
        folder = tmp_path / policy
        run_available_now(offsets_stream(spark, ha, topic, endingOffsets=half), folder / "out", folder / "cp")
        runs[policy] = {b for _, _, b in stored(spark, folder / "out")}
        assert len(runs[policy]) == PARTITIONS * 500
    cut = offsets[2][700]
    assert cluster.remove_before(topic, 2, cut) == 700
    stream = offsets_stream(spark, ha, topic)  # on from the checkpoint: partition 2's 500..699 are gone
    folder = tmp_path / "true"
    query = (stream.select("partition", "offset", "body", "id").writeStream.format("parquet")
             .option("path", str(folder / "out")).option("checkpointLocation", str(folder / "cp"))
             .trigger(availableNow=True).start())
    try:
        error = failure_of(lambda: query.awaitTermination(120))
    finally:
        stop_query(query)
    assert f"partition 2: offsets {offsets[2][500]}..{cut}" in error, error

    folder = tmp_path / "false"
    query = run_available_now(offsets_stream(spark, ha, topic, failOnDataLoss="false"), folder / "out", folder / "cp")
    rows = stored(spark, folder / "out")
    lost = {f"s-2-{i:06d}".encode() for i in range(500, 700)}
    assert_exactly(rows, sent - lost)
    reports = [_latest_offset(p) for p in query.recentProgress]
    assert any(r.get("dataLossMessages") == 200 and [2, offsets[2][500], cut] in r.get("dataLossRanges", [])
               for r in reports if r), reports


async def test_a_read_task_whose_range_is_removed_after_planning(nsq_cluster_ha: Any) -> None:
    pytest.importorskip("pyspark")
    if not hasattr(nsq_cluster_ha, "remove_before"):
        pytest.skip("removing a range on demand needs the embedded HA cluster")
    from fastnsq import Producer
    from fastnsq.spark._offsets import DataLossError, OffsetPlanner
    from fastnsq.spark._options import parse_source
    from fastnsq.spark._range_read import read_range

    topic = unique("spk_lossr")
    await nsq_cluster_ha.create_topic(topic, partitions=1, channels=["keep"])
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await producer.mpublish(topic, [b"r%04d" % i for i in range(1_000)], partition=0)
    base = {"lookupd": nsq_cluster_ha.lookupd_http_addresses[0], "topic": topic, "channel": "spk",
            "readMode": "offsets", "readStallTimeoutMs": "2000"}
    plans = {}
    for policy in ("true", "false"):
        options = parse_source({**base, "failOnDataLoss": policy})
        planner = OffsetPlanner(options)
        try:
            start = await planner.initial()
            end, state = await planner.latest(start, None)
            plans[policy] = (options, (await planner.ranges(start, end, state))[0][0])
            cut, _ = await planner._http.message_at(state.leaders[0].http, topic, 0, count=301)
        finally:
            await planner.close()
    assert nsq_cluster_ha.remove_before(topic, 0, cut) == 300  # after planning, before the tasks read
    options, plan = plans["true"]
    with pytest.raises(DataLossError, match=f"partition 0: offsets {plan.start.offset}..{cut}"):
        await asyncio.wait_for(read_range(options, plan), 30)
    options, plan = plans["false"]
    messages = await asyncio.wait_for(read_range(options, plan), 30)
    assert [bytes(m.body) for m in messages] == [b"r%04d" % i for i in range(300, 1_000)]


# ---- lag -----------------------------------------------------------------------------------


def _latest_offset(progress: Any) -> dict[str, Any]:
    sources = progress["sources"] if isinstance(progress, dict) else json.loads(progress.json)["sources"]
    latest = sources[0].get("latestOffset")
    return json.loads(latest) if isinstance(latest, str) else dict(latest or {})


@spark_test
def test_the_progress_shows_the_lag_falling_to_zero(
    spark: Any, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811
) -> None:
    needs_available_now()
    topic = unique("spk_lag")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, "g", per_partition=2_000)
    query = run_available_now(offsets_stream(spark, ha, topic, maxOffsetsPerTrigger=2_000), tmp_path / "out",
                              tmp_path / "cp")
    assert_exactly(stored(spark, tmp_path / "out"), sent)
    lags = [r["maxOffsetsBehindLatest"] for r in map(_latest_offset, query.recentProgress) if r]
    totals = [sum(r["offsetsBehindLatest"].values()) for r in map(_latest_offset, query.recentProgress) if r]
    assert totals[:4] == [6_000, 4_000, 2_000, 0], (totals, lags)
    assert lags[-1] == 0 and lags[0] == 1_500
