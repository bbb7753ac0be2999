"""The write side of the `nsq` data source: every row of a DataFrame becomes one NSQ message.

Per Spark task, one fastnsq :class:`~fastnsq.Producer` on its own event loop (a
daemon thread) publishes the task's rows with MPUB, chunked under nsqd's max
body and message sizes, keeping ``publishWindow`` MPUBs in flight. ``write``
returns its commit message only after nsqd answered OK to every one of them;
any error is raised, so Spark fails (and may retry) the task. A retried task
publishes its rows again: the guarantee is at-least-once.

Columns: ``body`` (binary or string, required), ``topic`` (string, routes each
row when option ``topic`` is not given); other columns are ignored, so a
DataFrame read from nsq can be written back as it is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import datasource as _ds
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from ..errors import InvalidValueError
from ..loop import new_event_loop
from ..producer import Producer
from ._options import SinkOptions

__all__ = ["NSQCommitMessage", "make_stream_writer", "make_writer", "publish_batches"]

logger = logging.getLogger(__name__)

_ROWS_PER_CHUNK = 10_000  # Row writers (PySpark 4.0) group rows into Arrow batches of this size
_RESULT_MARGIN = 5.0

#: Arrow writers where PySpark has them (feature detection, not version numbers).
_ArrowWriter: Any = getattr(_ds, "DataSourceArrowWriter", None)
_StreamArrowWriter: Any = getattr(_ds, "DataSourceStreamArrowWriter", None)


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task published: every row was acknowledged by nsqd."""

    rows: int = 0
    commands: int = 0  # MPUB (or DPUB) commands answered OK


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """``body`` must be binary or string; with per-row routing ``topic`` must be a string."""
    fields = {f.name: f for f in schema.fields}
    body = fields.get("body")
    if body is None:
        raise InvalidValueError(
            f"write.format('nsq') needs a column 'body' (binary or string); the DataFrame has: "
            f"{', '.join(fields) or 'no columns'}"
        )
    if not isinstance(body.dataType, (BinaryType, StringType)):
        raise InvalidValueError(f"column 'body' must be binary or string, not {body.dataType.simpleString()}")
    if options.topic is None and not isinstance(fields["topic"].dataType, StringType):
        raise InvalidValueError(
            f"column 'topic' routes rows and must be a string, not {fields['topic'].dataType.simpleString()}"
        )


class _Publisher:
    """A fastnsq Producer on its own event loop in a daemon thread, for one Spark task."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.commands = 0
        self.producer = Producer(**options.producer_kwargs())  # bad options raise before a thread starts
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fastnsq-spark-sink", daemon=True)
        self._thread.start()
        try:
            self._wait(asyncio.run_coroutine_threadsafe(self.producer.start(), self.loop))
        except BaseException:
            self._stop_loop()
            raise

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _wait(self, future: concurrent.futures.Future[Any]) -> Any:
        producer = self.producer
        return future.result(producer.publish_timeout * (1 + producer.max_retries) + _RESULT_MARGIN)

    def submit(self, topic: str, bodies: list[Any]) -> concurrent.futures.Future[Any]:
        """Publish ``bodies`` to ``topic``; the future resolves when nsqd acknowledged all of them."""
        return asyncio.run_coroutine_threadsafe(self._publish(topic, bodies), self.loop)

    async def _publish(self, topic: str, bodies: list[Any]) -> int:
        defer_ms = self.options.defer_ms
        if defer_ms:  # nsqd has no deferred MPUB: one DPUB per message, pipelined
            await asyncio.gather(*(self.producer.publish(topic, body, defer=defer_ms / 1000) for body in bodies))
            self.commands += len(bodies)
        else:
            await self.producer.mpublish(topic, bodies)  # chunked under nsqd's max body size
            self.commands += 1
        return len(bodies)

    def wait(self, future: concurrent.futures.Future[Any]) -> Any:
        return self._wait(future)

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.producer.close(), self.loop).result(15)
        except Exception as exc:  # noqa: BLE001 - closing after a failure must not hide it
            logger.debug("closing the producer: %r", exc)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return batch.column(index) if index >= 0 else None


def _bodies(batch: pa.RecordBatch, options: SinkOptions) -> list[Any]:
    body = _column(batch, "body")
    if body is None:
        raise InvalidValueError("the rows to publish have no column 'body'")
    if body.null_count:
        raise InvalidValueError(f"column 'body' has {body.null_count} null value(s): NSQ messages cannot be null")
    if len(body):
        lengths = pc.binary_length(body)
        longest = pc.max(lengths).as_py()
        if longest > options.max_msg_size:
            raise InvalidValueError(
                f"a row's body of {longest} bytes exceeds the max message size of {options.max_msg_size} "
                "bytes (nsqd --max-msg-size; option 'maxMsgSize')"
            )
        if pc.min(lengths).as_py() == 0:
            raise InvalidValueError("column 'body' has empty value(s): nsqd rejects empty messages")
    return body.to_pylist()


def _routes(batch: pa.RecordBatch, options: SinkOptions) -> list[tuple[str, list[Any]]]:
    """(topic, bodies) pairs of one record batch."""
    bodies = _bodies(batch, options)
    if options.topic is not None:
        return [(options.topic, bodies)]
    topics = _column(batch, "topic")
    if topics is None:
        raise InvalidValueError("without option 'topic' the rows need a string column 'topic'")
    if topics.null_count:
        raise InvalidValueError(f"column 'topic' has {topics.null_count} null value(s) and no option 'topic' is set")
    groups: dict[str, list[Any]] = {}
    for topic, body in zip(topics.to_pylist(), bodies):
        group = groups.get(topic)
        if group is None:
            groups[topic] = group = []
        group.append(body)
    return list(groups.items())


def publish_batches(batches: Iterator[pa.RecordBatch], options: SinkOptions) -> NSQCommitMessage:
    """Publish every row of ``batches``; return only when nsqd acknowledged all of them (else raise)."""
    publisher = _Publisher(options)
    pending: deque[concurrent.futures.Future[Any]] = deque()
    rows = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for topic, bodies in _routes(batch, options):
                pending.append(publisher.submit(topic, bodies))
                rows += len(bodies)
                while len(pending) >= options.publish_window:
                    publisher.wait(pending.popleft())
        while pending:
            publisher.wait(pending.popleft())
        return NSQCommitMessage(rows=rows, commands=publisher.commands)
    finally:
        for future in pending:
            future.cancel()
        publisher.close()


def _rows_to_batches(rows: Iterator[Any], fields: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """Row writers (PySpark without Arrow writers): the same path, in chunks of rows."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= _ROWS_PER_CHUNK:
            yield _chunk_batch(chunk, fields)
            chunk = []
    if chunk:
        yield _chunk_batch(chunk, fields)


def _chunk_batch(chunk: list[Any], fields: Sequence[str]) -> pa.RecordBatch:
    arrays = [pa.array([row[name] for row in chunk]) for name in fields]
    return pa.RecordBatch.from_arrays(arrays, names=list(fields))


def _log_commit(messages: Sequence[Any], what: str) -> None:
    done = [m for m in messages if isinstance(m, NSQCommitMessage)]
    logger.info("%s: %d rows published by %d task(s)", what, sum(m.rows for m in done), len(done))


def _log_abort(messages: Sequence[Any], what: str) -> None:
    done = [m for m in messages if isinstance(m, NSQCommitMessage)]
    logger.warning(
        "%s aborted: %d rows from %d successful task(s) are in nsqd already (a retry publishes them again)",
        what, sum(m.rows for m in done), len(done),
    )


class _WriterBase:
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._options = options  # plain data: the writer is pickled to the executors
        self._fields = [f for f in ("body", "topic") if f in schema.fieldNames()]

    def _write_rows(self, rows: Iterator[Any]) -> NSQCommitMessage:
        return publish_batches(_rows_to_batches(rows, self._fields), self._options)


class NSQRowWriter(_WriterBase, DataSourceWriter):
    """Batch writes on a PySpark without ``DataSourceArrowWriter``."""

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return self._write_rows(iterator)

    def commit(self, messages: list[Any]) -> None:
        _log_commit(messages, "write to nsq")

    def abort(self, messages: list[Any]) -> None:
        _log_abort(messages, "write to nsq")


class NSQStreamRowWriter(_WriterBase, DataSourceStreamWriter):
    """Streaming writes on a PySpark without ``DataSourceStreamArrowWriter``."""

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return self._write_rows(iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        _log_commit(messages, f"micro-batch {batchId} to nsq")

    def abort(self, messages: list[Any], batchId: int) -> None:
        _log_abort(messages, f"micro-batch {batchId} to nsq")


if _ArrowWriter is not None:

    class NSQArrowWriter(_WriterBase, _ArrowWriter):
        """Batch writes from Arrow record batches (no per-row Python objects but the bodies)."""

        def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
            return publish_batches(iterator, self._options)

        def commit(self, messages: list[Any]) -> None:
            _log_commit(messages, "write to nsq")

        def abort(self, messages: list[Any]) -> None:
            _log_abort(messages, "write to nsq")

else:
    NSQArrowWriter = None  # type: ignore[assignment,misc]


if _StreamArrowWriter is not None:

    class NSQStreamArrowWriter(_WriterBase, _StreamArrowWriter):
        """Streaming writes from Arrow record batches."""

        def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
            return publish_batches(iterator, self._options)

        def commit(self, messages: list[Any], batchId: int) -> None:
            _log_commit(messages, f"micro-batch {batchId} to nsq")

        def abort(self, messages: list[Any], batchId: int) -> None:
            _log_abort(messages, f"micro-batch {batchId} to nsq")

else:
    NSQStreamArrowWriter = None  # type: ignore[assignment,misc]


def make_writer(options: SinkOptions, schema: StructType) -> DataSourceWriter:
    """The batch writer: Arrow where this PySpark has it, Rows otherwise."""
    check_schema(schema, options)
    if NSQArrowWriter is not None:
        return NSQArrowWriter(options, schema)
    return NSQRowWriter(options, schema)


def make_stream_writer(options: SinkOptions, schema: StructType) -> DataSourceStreamWriter:
    """The streaming writer: Arrow where this PySpark has it, Rows otherwise."""
    check_schema(schema, options)
    if NSQStreamArrowWriter is not None:
        return NSQStreamArrowWriter(options, schema)
    return NSQStreamRowWriter(options, schema)
