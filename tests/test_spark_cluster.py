"""The `nsq` data source on a real Spark standalone cluster, with an executor SIGKILLed mid-task.

Issue 22, acceptance 2. A master and two 1-core workers from pyspark's jars on loopback
(:mod:`tests.spark_cluster`); the driver is this process, each executor a JVM of its own
with its own Python workers. Against the embedded nsqd, or the real one of
``dev.py test --real`` (the same tests, unchanged).

* The source (``rowTransport=plan`` and ``tcp``), Trigger.AvailableNow into Spark's
  parquet file sink: one executor is SIGKILLed while its task holds a slice of a
  micro-batch. Spark runs the task again on the other executor, and it reads exactly the
  same rows (inside the plan, or from the source process, which keeps them until the batch
  is committed); the file sink commits one attempt per task. The source process (on the
  driver) lives on, so nothing goes back to nsqd: exactly N rows, N distinct ids, no
  duplicate, and ``requeue_count`` / ``timeout_count`` 0 at nsqd. (Duplicates are allowed
  only where nsqd redelivers: the driver or its source process dying, a failed batch.)
* The sink, N rows from the executors: one executor is SIGKILLed after its task has
  published part of its partition. Spark runs the task again, which publishes the whole
  partition again: nsqd holds all N distinct bodies (0 lost) and at most one partition's
  rows twice (at-least-once; the count is reported).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import unique
from .spark_cluster import HOST, SparkStandalone, executor_of, spark_standalone  # noqa: F401 - a fixture
from .test_spark import (
    ThreadedNSQD,
    _has_available_now,
    _spark_env,
    bodies,
    read_stream,
    spark_nsqd,
    spark_test,
    stop_query,
    wait_until,
)

SOURCE_MESSAGES = 30_000
SINK_ROWS = 30_000
SINK_PARTITIONS = 4
SINK_BODY = 256


@pytest.fixture(scope="module")
def nsqd() -> Iterator[ThreadedNSQD]:
    server = spark_nsqd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def cluster_spark(spark_standalone: SparkStandalone) -> Iterator[Any]:  # noqa: F811 - the fixture
    """A SparkSession whose executors run on the standalone cluster: 2 executors, 1 core, 512m each."""
    _spark_env()
    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    session = (
        SparkSession.builder.master(spark_standalone.master_url)
        .appName("fastnsq-cluster-tests")
        .config("spark.driver.host", HOST)
        .config("spark.driver.bindAddress", HOST)
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    assert session.sparkContext.master == spark_standalone.master_url, "another SparkSession was still active"
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    spark_standalone.wait_for_executors(2)
    try:
        yield session
    finally:
        session.stop()


# ---- killing an executor in the middle of a task ------------------------------------------


def _marking(marks: str, pause: float, slice_rows: int = 0) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapInArrow function that records where each task attempt is and slows it down.

    Each attempt writes ``<marks>/<stage>-<partition>-<attempt>-<pid>``: "<rows received>
    <rows passed on>", then "done", so the test can find the executor that runs it (the
    pid is the Python worker's, a descendant of the executor JVM) and kill it mid-task. The
    attempt sleeps ``pause`` s before each slice of ``slice_rows`` rows (the whole batch
    when 0) it passes on. A closure, so that cloudpickle ships it by value to the executors.
    """

    def slow(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        mark = os.path.join(marks, f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.attemptNumber()}-{os.getpid()}")
        received = passed = 0

        def note(text: str) -> None:
            with open(mark + ".tmp", "w") as f:
                f.write(text)
            os.replace(mark + ".tmp", mark)

        note("0 0")
        for batch in batches:
            received += batch.num_rows
            note(f"{received} {passed}")
            step = slice_rows or max(1, batch.num_rows)
            for at in range(0, batch.num_rows, step):
                time.sleep(pause)
                piece = batch.slice(at, step)
                yield piece
                passed += piece.num_rows
                note(f"{received} {passed}")
        note("done")

    return slow


def _marks(folder: Path) -> list[tuple[int, int, int, int, str]]:
    """(stage, partition, attempt, pid, state) of every task attempt recorded so far."""
    found = []
    for path in folder.iterdir():
        if path.name.endswith(".tmp"):
            continue
        stage, partition, attempt, pid = (int(part) for part in path.name.split("-"))
        try:
            state = path.read_text()
        except FileNotFoundError:
            continue
        found.append((stage, partition, attempt, pid, state))
    return found


def _kill_executor_mid_task(
    cluster: SparkStandalone, folder: Path, ready: Callable[[list[tuple[int, int, int, int, str]]], bool],
    eligible: Callable[[str], bool], running: Callable[[], bool], timeout: float = 120.0,
) -> tuple[int, tuple[int, int, int, int, str]]:
    """Once ``ready(marks)``, SIGKILL the executor JVM running a first attempt whose state is ``eligible``.

    Returns the executor's pid and the mark of the attempt it was running. Gives up when
    the job is no longer ``running``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running():
        marks = _marks(folder)
        if ready(marks):
            executors = set(cluster.executor_pids())
            for mark in sorted(marks, reverse=True):  # the newest stage first
                if mark[2] == 0 and eligible(mark[4]):
                    executor = executor_of(mark[3])
                    if executor in executors:
                        os.kill(executor, signal.SIGKILL)
                        return executor, mark
        time.sleep(0.05)
    raise AssertionError(f"no task attempt to kill an executor under (job running: {running()}): {_marks(folder)}")


def _progress(state: str) -> tuple[int, int]:
    """(rows received, rows passed on) of an attempt's state; (-1, -1) once it is done."""
    if state == "done":
        return -1, -1
    received, passed = state.split()
    return int(received), int(passed)


def _retried(folder: Path, killed: tuple[int, int, int, int, str]) -> list[tuple[int, int, int, int, str]]:
    """The later attempts of the killed task."""
    return [m for m in _marks(folder) if m[:2] == killed[:2] and m[2] > 0]


# ---- the source -------------------------------------------------------------------------


@spark_test
@pytest.mark.parametrize("transport", ["plan", "tcp"])
def test_source_on_a_standalone_cluster_loses_nothing_when_an_executor_is_killed(
    cluster_spark: Any, spark_standalone: SparkStandalone, nsqd: ThreadedNSQD,  # noqa: F811 - the fixture
    tmp_path: Path, transport: str,
) -> None:
    if not _has_available_now():
        pytest.skip("this PySpark has no Trigger.AvailableNow for Python sources (PySpark < 4.2)")
    topic, channel, count = unique("spc_src"), "spark", SOURCE_MESSAGES
    expected = bodies(f"cluster-{transport}", count)
    nsqd.publish(topic, expected)
    folder = tmp_path / "marks"
    folder.mkdir()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    spark_standalone.wait_for_executors(2)
    # 2 input partitions per micro-batch (one per executor), at most 5,000 rows per batch;
    # 4 connections so that a real nsqd's max RDY (2,500 each) lets 10,000 be in flight.
    stream = read_stream(cluster_spark, nsqd, topic, channel, nsqdHttp=nsqd.http_address, rowTransport=transport,
                         numPartitions=2, maxInFlight=10_000, connectionsPerNsqd=4, maxRecordsPerBatch=5_000)
    rows = stream.select("id", "body", "attempts").mapInArrow(_marking(str(folder), 0.8),
                                                              "id string, body binary, attempts int")
    started = time.monotonic()
    query = (
        rows.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start()
    )
    try:
        # Mid-stream: once a later micro-batch than the first has started, kill the executor
        # of a task that has its slice and has not passed it on yet.
        executor, killed = _kill_executor_mid_task(
            spark_standalone, folder, ready=lambda marks: len({m[0] for m in marks}) >= 2,
            eligible=lambda state: _progress(state)[0] > 0 and _progress(state)[1] == 0,
            running=lambda: bool(query.isActive),
        )
        killed_at = time.monotonic() - started
        assert query.awaitTermination(180), "the AvailableNow query did not stop by itself"
    finally:
        stop_query(query)
    took = time.monotonic() - started
    assert query.exception() is None
    assert _retried(folder, killed), f"the killed task {killed[:2]} was never run again"
    stored = cluster_spark.read.parquet(str(out))  # what the file sink committed (its _spark_metadata log)
    ids = [r.id for r in stored.select("id").collect()]
    written = {bytes(r.body) for r in stored.select("body").collect()}
    files = {p.name for p in out.glob("*.parquet")}
    committed = {Path(f).name for f in stored.inputFiles()}
    print(f"\ncluster source ({transport}): {count} messages, executor {executor} SIGKILLed at {killed_at:.1f} s "
          f"in stage {killed[0]} partition {killed[1]} holding {_progress(killed[4])[0]} rows; {len(ids)} rows, "
          f"{len(set(ids))} distinct; {len(files - committed)} parquet files on disk not in the sink's log "
          f"(the killed attempt's); {took:.1f} s")
    assert written == set(expected), "0 lost"
    assert len(set(ids)) == count and len(ids) == count, "the file sink committed each task once: no duplicates"
    wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 30, what="the source to disconnect")
    stats = nsqd.channel(topic, channel)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"], stats["timeout_count"]) == (0, 0, 0, 0)
    assert stats["message_count"] == count


# ---- the sink -----------------------------------------------------------------------------


@spark_test
def test_sink_on_a_standalone_cluster_loses_nothing_when_an_executor_is_killed(
    cluster_spark: Any, spark_standalone: SparkStandalone, nsqd: ThreadedNSQD,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    from pyspark.sql import functions as F

    topic, count = unique("spc_sink"), SINK_ROWS
    per_partition = count // SINK_PARTITIONS
    folder = tmp_path / "marks"
    folder.mkdir()
    spark_standalone.wait_for_executors(2)
    # No shuffle (a lost executor's shuffle files would fail other tasks too): rows made
    # where they are written, 4 partitions over the 2 executors, passed on 500 at a time,
    # and the writer fed 500-row Arrow batches, so a task publishes as it goes.
    # 256-byte bodies: each 500-row slice outgrows the 64 KiB stream buffers between the
    # Python workers and the JVM, so it travels on at once instead of waiting for the next.
    df = cluster_spark.range(0, count, numPartitions=SINK_PARTITIONS).select(
        F.rpad(F.concat(F.lit("sink-"), F.lpad(F.col("id").cast("string"), 6, "0")), SINK_BODY, ".")
        .cast("binary").alias("body")
    )
    rows = df.mapInArrow(_marking(str(folder), 0.1, slice_rows=500), "body binary")
    previous = cluster_spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    cluster_spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    # The write runs on this thread (a data source registered with the session is found from
    # the thread that registered it); a helper thread kills the executor meanwhile.
    writing = threading.Event()
    writing.set()
    kills: list[Any] = []

    def kill() -> None:
        try:
            # A task that has passed on at least 3,000 of its rows (published in part), not done.
            executor, killed = _kill_executor_mid_task(
                spark_standalone, folder, ready=lambda marks: True,
                eligible=lambda state: 3_000 <= _progress(state)[1] < per_partition,
                running=writing.is_set,
            )
            kills.append((executor, killed, time.monotonic() - started, nsqd.topic(topic).get("message_count", 0)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            kills.append(exc)

    started = time.monotonic()
    killer = threading.Thread(target=kill, name="cluster-sink-killer", daemon=True)
    killer.start()
    try:
        rows.write.format("nsq").mode("append").option("nsqd", nsqd.tcp_address).option("topic", topic).save()
    finally:
        writing.clear()
        killer.join(30)
        cluster_spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    took = time.monotonic() - started
    assert kills, "the killer thread did not finish"
    if isinstance(kills[0], BaseException):
        raise kills[0]
    executor, killed, killed_at, published_at_kill = kills[0]
    assert _retried(folder, killed), f"the killed task {killed[:2]} was never run again"
    published = nsqd.topic(topic)["message_count"]
    got = nsqd.drain(topic, "check", published, timeout=60)
    received = [body for _, body in got]
    duplicates = len(received) - len(set(received))
    print(f"\ncluster sink: {count} rows, executor {executor} SIGKILLed at {killed_at:.1f} s in partition "
          f"{killed[1]} after it passed on {_progress(killed[4])[1]} rows ({published_at_kill} published by then); "
          f"nsqd got {published} messages, {len(set(received))} distinct, {duplicates} duplicates; {took:.1f} s")
    assert len(received) == published
    assert set(received) == {(b"sink-%06d" % i).ljust(SINK_BODY, b".") for i in range(count)}, "0 lost"
    # At-least-once: the killed attempt's rows were published again by its retry; nothing
    # else ran twice (1 core per executor: one task attempt was lost).
    assert 0 <= duplicates <= per_partition
