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
import concurrent.futures
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
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    pytest.mark.skipif(not HAVE_PYSPARK, reason="pyspark is not installed (pip install 'fastnsq-client[spark]')"),
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

    def __init__(self, *, with_lookupd: bool = False, **options: Any) -> None:
        from fastnsq.testing import NSQD, NSQLookupd

        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-nsqd", daemon=True)
        self._thread.start()
        self.lookupd = NSQLookupd() if with_lookupd else None
        if self.lookupd is not None:
            self.run(self.lookupd.start())
            options["lookupd_tcp_addresses"] = [self.lookupd.tcp_address]
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
        if self.lookupd is not None:
            self.run(self.lookupd.stop())
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
            last = [time.monotonic()]

            def handle(message: Any) -> None:  # returning FINs the message
                got.append((message.id, message.body))
                last[0] = time.monotonic()

            async with Consumer(topic, channel, nsqd_tcp_addresses=[self.tcp_address], handler=handle,
                                max_in_flight=2500):
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    if len(got) >= expect and time.monotonic() - last[0] > settle:
                        break
                    await asyncio.sleep(0.05)
            return got

        return self.run(consume(), timeout + 30)


class ExternalSparkNSQD(ThreadedNSQD):
    """The nsqd (and lookupd) of FASTNSQ_TEST_NSQD / _HTTP / FASTNSQ_TEST_LOOKUPD_HTTP: a real
    server the tests reach as Spark does, over TCP and HTTP; what it says comes from /stats."""

    def __init__(self, env: dict[str, str], *, with_lookupd: bool = False) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-client", daemon=True)
        self._thread.start()
        self._tcp, self._http = env["FASTNSQ_TEST_NSQD"], env["FASTNSQ_TEST_NSQD_HTTP"]
        self.lookupd = _Address(env["FASTNSQ_TEST_LOOKUPD_HTTP"]) if with_lookupd else None

    @property
    def tcp_address(self) -> str:
        return self._tcp

    @property
    def http_address(self) -> str:
        return self._http

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def _stats(self, query: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self._http}/stats?format=json&{query}", timeout=10) as response:
            return dict(json.loads(response.read()))

    def channel(self, topic: str, channel: str) -> dict[str, Any]:
        topics = self._stats(f"topic={topic}&channel={channel}")["topics"] or []
        return topics[0]["channels"][0] if topics and topics[0]["channels"] else {}

    def topic(self, topic: str) -> dict[str, Any]:
        topics = self._stats(f"topic={topic}")["topics"] or []
        return topics[0] if topics else {}


class _Address:
    def __init__(self, http_address: str) -> None:
        self.http_address = http_address


def spark_nsqd(*, with_lookupd: bool = False) -> ThreadedNSQD:
    """The real nsqd the environment names (dev.py test --real), else an embedded one."""
    env = os.environ
    needed = ["FASTNSQ_TEST_NSQD", "FASTNSQ_TEST_NSQD_HTTP"] + (["FASTNSQ_TEST_LOOKUPD_HTTP"] if with_lookupd else [])
    if all(env.get(name) for name in needed):
        return ExternalSparkNSQD(dict(env), with_lookupd=with_lookupd)
    return ThreadedNSQD(with_lookupd=with_lookupd)


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
    server = spark_nsqd()
    try:
        yield server
    finally:
        server.close()


def _has_available_now() -> bool:
    """PySpark >= 4.2: Python sources can support Trigger.AvailableNow."""
    try:
        from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: F401
    except ImportError:
        return False
    return True


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
        "rowTransport": {**base, "rowTransport": "udp"},
        "rowServerPort": {**base, "rowTransport": "tcp", "rowServerPort": "70000"},
        "rowServerHost": {**base, "rowServerHost": "10.0.0.1"},  # without rowTransport=tcp
        "maxInFlgiht": {**base, "maxInFlgiht": "1"},
        "snappy": {**base, "snappy": "true", "deflate": "true"},
        "deferMs": {**base, "deferMs": "10"},
    }
    for name, options in cases.items():
        with pytest.raises(InvalidValueError, match=name if name != "snappy" else "snappy and deflate"):
            parse_source(options)
    with pytest.raises(InvalidValueError, match="'nsqd'.*or 'lookupd'"):
        parse_source({"topic": "t", "channel": "c"})
    with pytest.raises(InvalidValueError, match="'rowTransport'=tcp needs option 'readMode'=partitioned"):
        parse_source({**base, "rowTransport": "tcp", "readMode": "simple"})
    tcp = parse_source({**base, "rowTransport": "TCP", "rowServerPort": "0"})
    assert (tcp.row_transport, tcp.row_server_host, tcp.row_server_port) == ("tcp", "127.0.0.1", 0)
    assert parse_source(base).row_transport == "plan"
    with pytest.raises(InvalidValueError, match="topic"):
        parse_sink({"nsqd": "127.0.0.1:4150"}, has_topic_column=False)
    assert parse_sink({"nsqd": "127.0.0.1:4150"}, has_topic_column=True).topic is None
    sink = parse_sink({"nsqd": "127.0.0.1:4150", "topic": "o", "authSecret": "s3cret"}, has_topic_column=False)
    assert sink.producer_kwargs()["auth_secret"] == "s3cret"
    assert "s3cret" not in repr(sink.common)


def test_row_server_answers_a_reserved_slice_when_its_rows_or_failure_come() -> None:
    """prefetchRanges: a slice announced before it is read makes a request wait for its rows,
    or tells why they will not come; a slice dropped while being read keeps nothing."""
    pa = pytest.importorskip("pyarrow")
    from fastnsq.errors import NSQError
    from fastnsq.spark._rows import RowHandle, RowServer, fetch_rows

    server = RowServer("127.0.0.1", 0)
    try:
        for index in range(3):
            server.reserve(1, index)
        handles = [RowHandle(server.host, server.port, server.token, 1, index, -1) for index in range(3)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(fetch_rows, handles[0])
            assert not server.wait_ready(0.05) and not waiting.done()
            server.put_one(1, 0, pa.RecordBatch.from_pydict({"n": pa.array([7, 8], pa.int64())}))
            assert waiting.result(30).column("n").to_pylist() == [7, 8]
        server.fail(1, 1, "RangeReadError: no leader")
        with pytest.raises(NSQError, match="slice 1 could not be read: RangeReadError: no leader"):
            fetch_rows(handles[1])
        server.drop_through(1)
        assert server.wait_ready(0.05), "nothing dropped is waited for"
        server.put_one(1, 2, pa.RecordBatch.from_pydict({"n": pa.array([9], pa.int64())}))
        assert server.held() == 0, "rows read for a dropped batch are not kept"
    finally:
        server.close()


def test_row_server_serves_each_slice_until_its_batch_is_committed() -> None:
    """rowTransport=tcp without Spark: slices served as often as asked until dropped with their
    batch's FIN; a wrong token, an unknown slice and an unreachable server fail naming why."""
    pa = pytest.importorskip("pyarrow")
    from fastnsq.errors import NSQError
    from fastnsq.spark._rows import RowHandle, RowServer, fetch_rows

    def rows(*values: int) -> Any:
        return pa.RecordBatch.from_pydict({"n": pa.array(values, pa.int64())})

    server = RowServer("127.0.0.1", 0)
    try:
        first = server.put(10, [rows(1, 2), rows(3)])
        second = server.put(20, [rows(4, 5, 6)])
        assert [h.rows for h in first + second] == [2, 1, 3] and server.held() == 3
        assert fetch_rows(first[0]).column("n").to_pylist() == [1, 2]
        assert fetch_rows(first[0]).column("n").to_pylist() == [1, 2], "a retried task reads the same rows"
        assert fetch_rows(second[0]).column("n").to_pylist() == [4, 5, 6]
        server.drop_through(10)  # Spark committed the batch ending at seq 10: FINed, forgotten
        assert server.held() == 1
        with pytest.raises(NSQError, match="seq 10, slice 1 is not held: it was committed"):
            fetch_rows(first[1])
        forged = RowHandle(server.host, server.port, "0" * 64, 20, 0, 3)
        with pytest.raises(NSQError, match="wrong token"):
            fetch_rows(forged)
        assert fetch_rows(second[0]).num_rows == 3
    finally:
        server.close()
    with pytest.raises(NSQError, match="cannot reach the nsq source's row server at 127.0.0.1:.*rowServerHost"):
        fetch_rows(second[0])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(NSQError, match="cannot listen on 127.0.0.1:.*rowServerPort"):
            RowServer("127.0.0.1", busy.getsockname()[1])


def test_runtime_bookkeeping_is_session_aware_and_drops_redeliveries() -> None:
    """Seal/FIN/replay logic of the source runtime, with stand-in messages (no sockets)."""
    pytest.importorskip("pyspark")
    from fastnsq.spark._options import parse_source
    from fastnsq.spark._runtime import SourceRuntime

    class FakeMessage:
        def __init__(self, mid: bytes) -> None:
            self.id = mid
            self.partition = None  # upstream nsqd: the id alone is the key
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
        # Delivered together (the consumer's batches): rows in bulk; a held id, or an id twice
        # in one lot, is still no second row.
        lot = [FakeMessage(b"%016d" % i) for i in range(5, 9)]
        runtime._on_messages(lot)
        assert list(runtime.buffer) == lot and runtime.delivered == 9
        twice = FakeMessage(b"%016d" % 9)
        runtime._on_messages([twice, FakeMessage(lot[0].id), FakeMessage(twice.id)])
        assert list(runtime.buffer) == [*lot, twice] and runtime.redeliveries_dropped == 3
        end3 = runtime.seal_after(end2, None)
        assert runtime.seal_after(end3, None) == end3  # FINs them: each id's deliveries, newest first
        assert all(m.answers == ["FIN"] for m in [*lot, twice]) and runtime.held == {} == runtime.redelivered
    finally:
        runtime.loop.close()


def test_messages_become_arrow_rows_with_the_schema_spark_expects() -> None:
    """Message -> Arrow conversion (pure logic): upstream hex ids, HA binary ids and columns."""
    pytest.importorskip("pyspark")
    pa = pytest.importorskip("pyarrow")
    from pyspark.sql.types import StructType

    from fastnsq.codec import Message
    from fastnsq.spark.source import _arrow_schema, messages_to_batch, source_schema

    def schema(ha: bool) -> Any:
        fields = []
        for part in source_schema(ha).split(", "):
            name, kind = part.split(" ")
            fields.append({"name": name, "type": {"bigint": "long", "int": "integer"}.get(kind, kind),
                           "nullable": True, "metadata": {}})
        return StructType.fromJson({"type": "struct", "fields": fields})

    ts = 1_700_000_000_123_456_789
    upstream = [Message(ts, 2, b"0123456789abcdef", b"\x00body")]
    batch = messages_to_batch(upstream, _arrow_schema(schema(False)), "events", False)
    row = batch.to_pylist()[0]
    assert row["id"] == "0123456789abcdef" and row["body"] == b"\x00body" and row["attempts"] == 2
    assert row["topic"] == "events" and row["nsqd"] is None  # no connection behind a bare Message
    assert batch.column("timestamp").type == pa.timestamp("us", tz="UTC")
    assert batch.column("timestamp").cast(pa.int64())[0].as_py() == ts // 1000
    ha_id = (7).to_bytes(8, "big") + (99).to_bytes(8, "big")  # internal id + trace id
    ha = [Message(ts, 1, ha_id, b"x", ha=True, offset=4096, raw_size=1)]
    ha_batch = messages_to_batch(ha, _arrow_schema(schema(True)), "events", True)
    ha_row = ha_batch.to_pylist()[0]
    assert ha_row["id"] == ha_id.hex() and ha_row["trace_id"] == 99 and ha_row["offset"] == 4096


# ---- the source ------------------------------------------------------------------------


@spark_test
@pytest.mark.parametrize("mode", ["partitioned", "simple", "partitioned-tcp"])
def test_happy_path_every_message_once_nothing_in_flight_while_idle(spark: Any, nsqd: ThreadedNSQD, mode: str) -> None:
    topic, channel, count = unique("sp_happy"), "spark", 3000
    nsqd.publish(topic, bodies("happy", count))
    sink = Collector()
    read_mode, _, transport = mode.partition("-")
    stream = read_stream(spark, nsqd, topic, channel, readMode=read_mode, numPartitions=2, maxInFlight=1000,
                         rowTransport=transport or "plan")
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



@spark_test
def test_batch_slower_than_msg_timeout_causes_no_redelivery(spark: Any, nsqd: ThreadedNSQD) -> None:
    """msg_timeout 2 s, the first batch takes 6 s: TOUCH keeps its messages (and the
    ones buffered meanwhile) in flight, nothing times out, nothing comes twice."""
    topic, channel, count = unique("sp_slow"), "spark", 400
    nsqd.publish(topic, bodies("slow", count))
    collected = Collector()

    def slow(batch_df: Any, batch_id: int) -> None:
        collected(batch_df, batch_id)
        if len(collected.batches) == 1:
            time.sleep(6.0)

    stream = read_stream(spark, nsqd, topic, channel, msgTimeoutMs=2000, maxRecordsPerBatch=150, maxInFlight=300)
    query = stream.writeStream.foreachBatch(slow).trigger(processingTime="100 milliseconds").start()
    try:
        wait_until(lambda: len(collected.ids()) >= count, 90, what=f"{count} rows")
        wait_until(lambda: nsqd.channel(topic, channel).get("in_flight_count") == 0, 20, what="nothing in flight")
        stats = nsqd.channel(topic, channel)
    finally:
        stop_query(query)
    assert stats["timeout_count"] == 0, "a held message timed out at nsqd"
    assert stats["requeue_count"] == 0
    ids = collected.ids()
    assert len(ids) == count and len(set(ids)) == count
    assert all(attempts == 1 for _, _, attempts, _ in collected.rows)


def _source_runner_pids() -> list[int]:
    """Spark's driver-side streaming-source processes started by this test process."""
    return [
        pid for pid in _descendants(os.getpid())
        if "python_streaming_source_runner" in _cmdline(pid)
    ]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@spark_test
def test_stop_and_sigterm_requeue_what_is_held_at_once(spark: Any, nsqd: ThreadedNSQD) -> None:
    """msg_timeout is nsqd's 60 s here: only REQ can bring the held messages back within seconds."""
    topic, channel, count = unique("sp_term"), "spark", 2000
    nsqd.publish(topic, bodies("term", count))
    collected = Collector()

    def slow(batch_df: Any, batch_id: int) -> None:
        collected(batch_df, batch_id)
        time.sleep(1.0)

    def held() -> int:
        return nsqd.channel(topic, channel).get("in_flight_count", 0)

    # 1. query.stop(): the source process requeues everything it holds and closes.
    stream = read_stream(spark, nsqd, topic, channel, maxRecordsPerBatch=300, maxInFlight=600)
    query = stream.writeStream.foreachBatch(slow).trigger(processingTime="100 milliseconds").start()
    try:
        wait_until(lambda: collected.batches and held() > 0, 60, what="a batch in flight")
    finally:
        before = held()
        stop_query(query)
    wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 10, what="disconnect after stop")
    stats = nsqd.channel(topic, channel)
    assert stats["in_flight_count"] == 0 and stats["timeout_count"] == 0
    assert stats["requeue_count"] >= before > 0
    # 2. SIGTERM to the source process (what Spark's shutdown sends): RDY 0, CLS, REQ, exit.
    requeued = stats["requeue_count"]
    query = stream.writeStream.foreachBatch(slow).trigger(processingTime="100 milliseconds").start()
    try:
        wait_until(lambda: held() > 0, 60, what="messages held again")
        runners = wait_until(_source_runner_pids, 10, what="the streaming-source process")
        before = held()
        for pid in runners:
            os.kill(pid, signal.SIGTERM)
        wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 10, what="CLS and close")
        stats = nsqd.channel(topic, channel)
        assert stats["in_flight_count"] == 0 and stats["timeout_count"] == 0
        assert stats["requeue_count"] - requeued >= before > 0
        wait_until(lambda: not any(_cmdline(pid) for pid in runners), 10, what="the source process to exit")
    finally:
        stop_query(query)
    # Nothing was lost on the way: what was not processed is back in the channel.
    processed = {body for _, body, _, _ in collected.rows}
    rest = nsqd.drain(topic, channel, count - len(processed))
    assert processed | {body for _, body in rest} == set(bodies("term", count))


@spark_test
@pytest.mark.parametrize("transport", ["plan", "tcp"])
def test_failure_in_a_batch_after_a_shuffle_loses_nothing(
    spark: Any, nsqd: ThreadedNSQD, tmp_path: Path, transport: str
) -> None:
    """The batch's job fails after a shuffle: the query dies, its held messages go back to
    nsqd, the restarted query (same checkpoint) replays the dead batch as empty and
    receives every message again. Each batch is read several times (isEmpty, the shuffle,
    the collect): with rowTransport=tcp each read fetches the same rows again."""
    topic, channel, count = unique("sp_fail"), "spark", 600
    nsqd.publish(topic, bodies("fail", count))
    checkpoint = str(tmp_path / "checkpoint")
    collected = Collector()
    failures = []

    def failing(batch_df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        shuffled = batch_df.repartition(3, "id").groupBy((F.crc32("id") % 7).alias("bucket")).count()
        if not failures and not batch_df.isEmpty():
            failures.append(batch_id)
            bad = shuffled.select(F.raise_error(F.lit("injected failure after a shuffle")).alias("x"))
            bad.collect()
        shuffled.collect()
        collected(batch_df, batch_id)

    def start() -> Any:
        stream = read_stream(spark, nsqd, topic, channel, msgTimeoutMs=3000, maxInFlight=1000,
                             rowTransport=transport)
        return (
            stream.writeStream.foreachBatch(failing)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    query = start()
    try:
        with pytest.raises(Exception, match="injected failure after a shuffle"):
            query.awaitTermination(60)
    finally:
        stop_query(query)
    assert failures and not collected.rows
    query = start()
    try:
        wait_until(lambda: collected.distinct() >= count, 60, what=f"{count} distinct rows after the restart")
        wait_until(lambda: nsqd.channel(topic, channel).get("in_flight_count") == 0, 20, what="nothing in flight")
    finally:
        stop_query(query)
    ids = collected.ids()
    assert {body for _, body, _, _ in collected.rows} == set(bodies("fail", count)), "nothing lost"
    print(f"\nfailure after shuffle: {len(ids)} rows, {len(ids) - len(set(ids))} duplicates")
    assert all(attempts >= 2 for _, _, attempts, _ in collected.rows), "all came back from nsqd"


@spark_test
@pytest.mark.parametrize("channel_first", [False, True], ids=["backlog-in-topic", "channel-exists"])
def test_trigger_available_now_drains_the_topic_and_stops(spark: Any, nsqd: ThreadedNSQD, channel_first: bool) -> None:
    """Reads every message published before the query (in the topic, with no channel yet, or
    in the channel), stops by itself, and hands nothing back: the source takes no more than
    the target (a real nsqd 1.3.0 without that requeued up to 150,000 of 500,000)."""
    if not _has_available_now():
        pytest.skip("this PySpark has no Trigger.AvailableNow for Python sources (PySpark < 4.2)")
    topic, channel, count = unique("sp_now"), "spark", 20_000
    if channel_first:
        http_post(nsqd.http_address, f"/topic/create?topic={topic}")
        http_post(nsqd.http_address, f"/channel/create?topic={topic}&channel={channel}")
    nsqd.publish(topic, bodies("now", count))
    collected = Collector()
    stream = read_stream(
        spark, nsqd, topic, channel, nsqdHttp=nsqd.http_address, maxInFlight=6000, maxRecordsPerBatch=2500
    )
    query = stream.writeStream.foreachBatch(collected).trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(120), "the AvailableNow query did not stop by itself"
    finally:
        stop_query(query)
    ids = collected.ids()
    assert len(set(ids)) == count and len(ids) == count
    assert all(rows <= 2500 for _, rows in collected.batches), "maxRecordsPerBatch caps each batch"
    wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 30, what="disconnect")
    stats = nsqd.channel(topic, channel)
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"], stats["timeout_count"]) == (0, 0, 0, 0)
    assert stats["message_count"] == count


def http_post(http_address: str, path: str) -> None:
    request = urllib.request.Request(f"http://{http_address}{path}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200, response.read()


@spark_test
def test_lookupd_discovery_and_available_now(spark: Any) -> None:
    """Through nsqlookupd (AvailableNow reads nsqd's HTTP address from /lookup); the
    connection options pass through (snappy on the source's connections, deflate on the sink's)."""
    import urllib.request

    server = spark_nsqd(with_lookupd=True)
    try:
        assert server.lookupd is not None
        lookupd = server.lookupd.http_address
        topic, count = unique("sp_lookup"), 1500
        df = spark.createDataFrame([(b,) for b in bodies("lookup", count)], "body binary")
        df.write.format("nsq").mode("append").option("lookupd", lookupd).option("nsqd", server.tcp_address) \
            .option("topic", topic).option("deflate", "true").save()

        def producers() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"http://{lookupd}/lookup?topic={topic}", timeout=5) as response:
                return list(json.loads(response.read()).get("producers") or [])

        def published() -> int:  # the sink may spread over every nsqd the lookupd knows (a real cluster)
            total = 0
            for node in producers():
                url = f"http://{node['broadcast_address']}:{node['http_port']}/stats?format=json&topic={topic}"
                with urllib.request.urlopen(url, timeout=5) as response:
                    total += sum(t["message_count"] for t in json.loads(response.read())["topics"] or [])
            return total

        wait_until(lambda: published() == count, 20, what=f"the lookupd's nsqds to hold {count} messages")
        collected = Collector()
        stream = (
            spark.readStream.format("nsq").option("lookupd", lookupd).option("topic", topic)
            .option("channel", "spark").option("snappy", "true").option("maxInFlight", "800").load()
        )
        if _has_available_now():
            query = stream.writeStream.foreachBatch(collected).trigger(availableNow=True).start()
            try:
                assert query.awaitTermination(90), "the AvailableNow query did not stop by itself"
            finally:
                stop_query(query)
        else:  # PySpark < 4.2: no AvailableNow for Python sources; read until all arrived
            query = stream.writeStream.foreachBatch(collected).start()
            try:
                wait_until(lambda: collected.distinct() >= count, 60, what=f"{count} rows")
            finally:
                stop_query(query)
        ids = collected.ids()
        assert len(ids) == count and len(set(ids)) == count
        assert {body for _, body, _, _ in collected.rows} == set(bodies("lookup", count))

        def clients() -> int:
            total = 0
            for node in producers():
                url = (f"http://{node['broadcast_address']}:{node['http_port']}/stats?format=json"
                       f"&topic={topic}&channel=spark")
                with urllib.request.urlopen(url, timeout=5) as response:
                    for entry in json.loads(response.read())["topics"] or []:
                        total += sum(c["client_count"] for c in entry["channels"] or [])
            return total

        wait_until(lambda: clients() == 0, 30, what="the source to disconnect from every nsqd")
    finally:
        server.close()


@spark_test
def test_bad_options_fail_on_the_driver_naming_the_option(spark: Any, nsqd: ThreadedNSQD) -> None:
    cases = [
        ({"maxInFlight": "lots"}, "maxInFlight"),
        ({"msgTimeoutMs": "5"}, "msgTimeoutMs"),
        ({"connectionsPerNsqd": "0"}, "connectionsPerNsqd"),
        ({"readMode": "turbo"}, "readMode"),
        ({"maxRecordsPerBatch": "-1"}, "maxRecordsPerBatch"),
        ({"tlsCert": "/nonexistent.pem"}, "tls_cert and tls_key go together"),
    ]
    for options, expected in cases:
        with pytest.raises(Exception, match=expected):
            stream = read_stream(spark, nsqd, "t_bad", "c", **options)
            query = stream.writeStream.format("memory").queryName(unique("bad")).start()
            stop_query(query)
    with pytest.raises(Exception, match="channel"):
        spark.readStream.format("nsq").option("nsqd", nsqd.tcp_address).option("topic", "t").load()
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match="publishWindow"):
        df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp_address).option("topic", "t") \
            .option("publishWindow", "0").save()
    with pytest.raises(Exception, match="column 'body'"):
        spark.createDataFrame([(1,)], "n int").write.format("nsq").mode("append") \
            .option("nsqd", nsqd.tcp_address).option("topic", "t").save()


# ---- the sink --------------------------------------------------------------------------


@spark_test
def test_sink_publishes_exactly_the_rows_of_a_dataframe(spark: Any, nsqd: ThreadedNSQD) -> None:
    topic, count = unique("sp_sink"), 20_000
    expected = bodies("sink", count)
    df = spark.createDataFrame([(b,) for b in expected], "body binary").repartition(4)
    df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp_address).option("topic", topic).save()
    assert nsqd.topic(topic)["message_count"] == count, "every row once, none twice"
    got = nsqd.drain(topic, "check", count)
    assert sorted(body for _, body in got) == expected
    # string bodies and per-row routing by a `topic` column
    left, right = unique("sp_left"), unique("sp_right")
    rows = [(f"text-{i}", left if i % 3 else right) for i in range(300)]
    spark.createDataFrame(rows, "body string, topic string").write.format("nsq").mode("append") \
        .option("nsqd", nsqd.tcp_address).save()
    assert nsqd.topic(left)["message_count"] == 200 and nsqd.topic(right)["message_count"] == 100
    got_right = sorted(body.decode() for _, body in nsqd.drain(right, "check", 100))
    assert got_right == sorted(body for body, t in rows if t == right)
    # deferMs: one DPUB per row; nsqd holds them deferred (the channel exists beforehand)
    later = unique("sp_defer")
    nsqd.drain(later, "check", 0, timeout=0.3, settle=0.1)  # SUB creates the channel
    spark.createDataFrame([(b"later-%d" % i,) for i in range(20)], "body binary").write.format("nsq") \
        .mode("append").option("nsqd", nsqd.tcp_address).option("topic", later).option("deferMs", "4000").save()
    stats = nsqd.channel(later, "check")
    assert stats["deferred_count"] == 20 and stats["depth"] == 0
    assert sorted(body for _, body in nsqd.drain(later, "check", 20, timeout=20)) == sorted(
        b"later-%d" % i for i in range(20)
    )


@spark_test
def test_sink_raises_clearly_when_nsqd_is_down_or_a_message_is_too_large(spark: Any, nsqd: ThreadedNSQD) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    df = spark.createDataFrame([(b"x",), (b"y",)], "body binary")
    with pytest.raises(Exception, match="no nsqd could be reached"):
        df.write.format("nsq").mode("append").option("nsqd", dead).option("topic", "t") \
            .option("dialTimeoutMs", "500").save()
    topic = unique("sp_big")
    big = spark.createDataFrame([(b"ok",), (b"z" * 2000,)], "body binary").coalesce(1)
    with pytest.raises(Exception, match=r"2000 bytes exceeds the max message size of 1024"):
        big.write.format("nsq").mode("append").option("nsqd", nsqd.tcp_address).option("topic", topic) \
            .option("maxMsgSize", "1024").save()
    # Checked per Arrow batch before publishing it: the task's one batch published nothing.
    assert not nsqd.topic(topic), "nothing of the failed task was published"
    # nsqd's own limit, stricter than what the client was told: nsqd refuses, the task fails.
    strict = ThreadedNSQD(max_msg_size=1000)
    try:
        with pytest.raises(Exception, match="E_BAD_MESSAGE"):
            big.write.format("nsq").mode("append").option("nsqd", strict.tcp_address).option("topic", topic).save()
    finally:
        strict.close()
    with pytest.raises(Exception, match="only append"):
        df.write.format("nsq").mode("overwrite").option("nsqd", nsqd.tcp_address).option("topic", "t").save()


@spark_test
def test_nsq_to_spark_to_nsq_keeps_every_id(spark: Any, nsqd: ThreadedNSQD, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source, target, count = unique("sp_in"), unique("sp_out"), 3000
    nsqd.publish(source, bodies("pipe", count))
    stream = read_stream(spark, nsqd, source, "spark", maxInFlight=1000, numPartitions=2)
    out = stream.select(F.concat(F.col("id").cast("binary"), F.lit(b"|"), F.col("body")).alias("body"))
    query = (
        out.writeStream.format("nsq")
        .option("nsqd", nsqd.tcp_address)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: nsqd.topic(target).get("message_count", 0) >= count, 90, what="the pipeline")
        wait_until(lambda: nsqd.channel(source, "spark").get("in_flight_count") == 0, 20, what="source FINed")
    finally:
        stop_query(query)
    published = nsqd.topic(target)["message_count"]
    got = nsqd.drain(target, "check", published)
    ids = [body.split(b"|", 1)[0] for _, body in got]
    payloads = sorted(body.split(b"|", 1)[1] for _, body in got)
    assert len(set(ids)) == count, "every source id arrived in the target topic"
    assert sorted(set(payloads)) == bodies("pipe", count)
    assert published == count, f"{published - count} duplicates on the happy path"


# ---- SIGKILL of the driver process tree ------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc), parents first."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def _kill_tree(pid: int) -> list[int]:
    """Freeze the whole tree first (nobody gets to clean up), then SIGKILL every process."""
    tree = _descendants(pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for member in tree:
            try:
                os.kill(member, sig)
            except ProcessLookupError:
                pass
    return tree


class JobProcess:
    """tests/spark_jobs/stream_to_parquet.py in its own session, its stdout lines in a queue."""

    def __init__(self, args: list[str], log: Path) -> None:
        import queue

        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self._stderr = open(log, "ab")  # noqa: SIM115 - the job's stderr for its lifetime; closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(JOBS / "stream_to_parquet.py"), *args],
            stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True, start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, predicate: Any, timeout: float) -> str:
        import queue

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"job output so far: {self.seen[-20:]} (exit code {self.proc.poll()})")

    def close(self) -> None:
        if self.proc.poll() is None:
            _kill_tree(self.proc.pid)
            self.proc.wait(10)
        self._stderr.close()


@spark_test
def test_sigkill_of_the_driver_mid_batch_then_restart_loses_nothing(nsqd: ThreadedNSQD, tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    topic, channel, count = unique("sp_kill"), "spark", 1200
    expected = bodies("kill", count)
    nsqd.publish(topic, expected)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    common = [
        "--nsqd", nsqd.tcp_address, "--topic", topic, "--channel", channel, "--checkpoint", str(checkpoint),
        "--out", str(out), "--expect", str(count), "--max-batch", "300", "--msg-timeout-ms", "3000",
    ]
    first = JobProcess([*common, "--batch-sleep", "2.0"], tmp_path / "job1.log")
    try:
        first.wait_for(lambda line: line.startswith("BATCH_DONE") and int(line.split()[2]) > 0, 120)
        # Inside the next batch: its rows are in parquet, Spark has not committed it.
        started = first.wait_for(lambda line: line.startswith("BATCH_WRITTEN") and int(line.split()[2]) > 0, 60)
        time.sleep(0.3)
        held = nsqd.channel(topic, channel)["in_flight_count"]
        tree = _kill_tree(first.proc.pid)
        first.proc.wait(10)
    finally:
        first.close()
    assert held > 0, "the kill should land while the source holds a batch in flight"
    assert len(tree) >= 3, f"driver, JVM and the source process were killed, got {tree}"
    killed_batch = int(started.split()[1])
    # The kernel closed the connections; nsqd gets the held messages back at msg_timeout.
    wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 20, what="the dead runner's connection")

    second = JobProcess([*common, "--batch-sleep", "0"], tmp_path / "job2.log")
    try:
        done = second.wait_for(lambda line: line.startswith("DONE"), 150)
        assert second.proc.wait(60) == 0
    finally:
        second.close()
    replay = [line for line in second.seen if line.startswith(f"BATCH_START {killed_batch} ")]
    assert replay == [f"BATCH_START {killed_batch} 0"], "the killed batch (a dead session's) replays as empty"
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["id", "body"])
    ids = table.column("id").to_pylist()
    assert sorted(set(table.column("body").to_pylist())) == expected, "nothing lost"
    assert len(set(ids)) == count and done == f"DONE {count}"
    duplicates = len(ids) - len(set(ids))
    killed = ds.dataset(str(out / f"batch={killed_batch}"), format="parquet").to_table(columns=["body"])
    killed_bodies = set(killed.column("body").to_pylist())
    assert len(killed_bodies) == int(started.split()[2]), "the killed batch's rows reached parquet"
    print(f"\nSIGKILL mid-batch {killed_batch}: {held} in flight at the kill, {len(ids)} rows written, "
          f"{duplicates} duplicates (the killed batch's rows, delivered again)")
    # The stop requeued what the second run still held: its last batch (Spark commits a
    # batch to the source only when it plans the next one) and any buffered redeliveries.
    # All of them are rows already written: duplicates to come, never loss.
    wait_until(lambda: nsqd.channel(topic, channel).get("client_count") == 0, 20, what="the job to disconnect")
    left = nsqd.channel(topic, channel)
    assert left["in_flight_count"] == 0
    leftovers = nsqd.drain(topic, channel, left["depth"]) if left["depth"] else []
    assert {body for _, body in leftovers} <= set(expected) and len(leftovers) == left["depth"]
    print(f"requeued at the final stop (already written, delivered again later): {len(leftovers)}")
    # The killed batch was written but never committed: nsqd delivered its messages again,
    # into a later batch (a duplicate row) or, if the job stopped first, back to the channel.
    written = collections.Counter(table.column("body").to_pylist())
    again = {body for body in killed_bodies if written[body] > 1} | {body for _, body in leftovers}
    assert killed_bodies <= again, "every message of the killed batch came back from nsqd"
