"""The streaming read side of the `nsq` data source: offsets, batches and rows.

Two flavours share one behaviour (see :mod:`fastnsq.spark._runtime` for how the
messages are held):

* :class:`NSQStreamReader` (``readMode=partitioned``, the default): each
  micro-batch is planned in Spark's driver-side source process and its rows
  travel inside ``numPartitions`` input partitions (Arrow record batches), so
  task retries and stage retries re-read exactly the same rows.
* :class:`NSQSimpleStreamReader` (``readMode=simple``): Spark's
  ``SimpleDataSourceStreamReader``: one partition, prefetched by Spark itself.

Every delivered message stays in flight at nsqd (TOUCHed) until Spark has
committed the batch holding it; then it is FINed. Offsets are
``{"session": ..., "seq": n}``; a batch from another (dead) session replays as
empty, because nsqd delivers its messages again.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import time
from array import array
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition, SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from ..codec import message_columns
from ..errors import InvalidValueError
from ._options import SourceOptions
from ._rows import RowHandle, RowServer, fetch_rows
from ._runtime import SourceRuntime, available_now_backlog

try:  # PySpark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # PySpark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in on PySpark < 4.2, where Python sources cannot support Trigger.AvailableNow."""


__all__ = [
    "HA_COLUMNS",
    "SOURCE_SCHEMA",
    "NSQInputPartition",
    "NSQSimpleStreamReader",
    "NSQStreamReader",
    "source_schema",
]

logger = logging.getLogger(__name__)

#: The columns of a streaming read (DDL).
SOURCE_SCHEMA = "id string, body binary, attempts int, timestamp timestamp, nsqd string, topic string"
#: Added with option ``ha=true`` (the partitioned HA nsqd).
HA_COLUMNS = "partition int, offset bigint, trace_id bigint"
_COLUMNS = ("id", "body", "attempts", "timestamp", "nsqd", "topic", "partition", "offset", "trace_id")
_INITIAL_OFFSET: dict[str, Any] = {"session": "", "seq": 0}


def source_schema(ha: bool) -> str:
    """The DDL schema of a read, with the HA columns when ``ha``."""
    return f"{SOURCE_SCHEMA}, {HA_COLUMNS}" if ha else SOURCE_SCHEMA


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema PySpark expects for ``schema`` (it compares record batches against it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")  # PySpark >= 4.1
    except TypeError:
        return to_arrow_schema(schema)


@functools.lru_cache(maxsize=1)
def _arrow_reads_supported() -> bool:
    """Whether this PySpark accepts ``pyarrow.RecordBatch`` from a reader's ``read`` (else tuples)."""
    try:
        from pyspark.sql.worker import plan_data_source_read
    except ImportError:
        return False
    convert = getattr(plan_data_source_read, "records_to_arrow_batches", None)
    if convert is None:
        return False
    try:
        return "RecordBatch" in inspect.getsource(convert)
    except (OSError, TypeError):
        return False


def _check_columns(schema: StructType, ha: bool) -> None:
    allowed = set(_COLUMNS if ha else _COLUMNS[:6])
    unknown = [f.name for f in schema.fields if f.name not in allowed]
    if unknown:
        raise InvalidValueError(
            f"format 'nsq' has no column(s) {', '.join(unknown)}; its columns are: {source_schema(ha)}"
        )


_PARTITIONS, _OFFSETS, _TRACE_IDS = (attrgetter(n) for n in ("partition", "offset", "trace_id"))
_TIMESTAMP = pa.timestamp("us", tz="UTC")


def _packed(kind: pa.DataType, n: int, *buffers: bytes | None) -> pa.Array:
    """An Arrow array over buffers ``codec.message_columns`` filled (no validity bitmap: no nulls)."""
    return pa.Array.from_buffers(kind, n, [None, *(pa.py_buffer(b) for b in buffers)])


def _repeated(text: str, n: int) -> pa.Array:
    """``text`` ``n`` times as a string array (``pa.repeat`` loads Arrow's compute module: 0.2 s)."""
    data = text.encode()
    offsets = array("i", range(0, (n + 1) * len(data), len(data))) if data else array("i", bytes(4 * (n + 1)))
    return _packed(pa.string(), n, offsets.tobytes(), data * n)


def messages_to_batch(messages: Sequence[Any], schema: pa.Schema, topic: str, ha: bool) -> pa.RecordBatch:
    """One Arrow record batch of ``messages`` with exactly ``schema`` (names, types, order).

    The fields every message has come from one C pass over the messages
    (``codec.message_columns``), not a Python call per message: the columns are built
    in Spark's source process, whose GIL the consumer's loop thread shares.
    """
    n = len(messages)
    try:
        (id_offsets, ids, timestamps, attempts, body_offsets, bodies,
         address_offsets, addresses) = message_columns(messages, ha)
    except InvalidValueError as exc:
        raise InvalidValueError(f"format 'nsq': a micro-batch slice of {exc}; raise option 'numPartitions'") from None
    columns: dict[str, Any] = {
        # nsqd's ids are 16 hex digits; HA ids are binary and their hex form is the dedupe key
        "id": lambda: _packed(pa.string(), n, id_offsets, ids),
        "body": lambda: _packed(pa.binary(), n, body_offsets, bodies),
        "attempts": lambda: _packed(pa.int32(), n, attempts),
        "timestamp": lambda: _packed(_TIMESTAMP, n, timestamps),
        # the address of the connection that received it (None for a message without one)
        "nsqd": lambda: (_packed(pa.string(), n, address_offsets, addresses) if addresses is not None
                         else pa.array([m.address for m in messages], pa.string())),
        "topic": lambda: _repeated(topic, n),
        # stamped by the codec from the connection (HA)
        "partition": lambda: pa.array(list(map(_PARTITIONS, messages)), pa.int32()),
        "offset": lambda: pa.array(list(map(_OFFSETS, messages)), pa.int64()),
        "trace_id": lambda: pa.array(list(map(_TRACE_IDS, messages)), pa.int64()),
    }
    arrays = []
    for field in schema:
        make = columns.get(field.name)
        if make is None:
            raise InvalidValueError(f"format 'nsq' has no column {field.name!r}")
        array = make()
        if array.type != field.type:
            array = array.cast(field.type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _key(offset: dict[str, Any]) -> str:
    return json.dumps(offset, sort_keys=True)


def _batch_rows(batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
    """Tuples for a PySpark that cannot take record batches from a reader."""
    return zip(*(column.to_pylist() for column in batch.columns))


class NSQInputPartition(InputPartition):
    """One slice of a micro-batch: its rows as an Arrow record batch, or where to fetch them.

    With ``rowTransport=plan`` the rows ride inside the partition (planned once, on the
    driver); with ``rowTransport=tcp`` it carries a :class:`RowHandle` and the read task
    fetches the rows from the source process, which keeps them until the batch is
    committed. Either way a retried task or stage reads exactly what the first attempt read.
    """

    def __init__(self, rows: pa.RecordBatch | RowHandle, session: str, index: int) -> None:
        super().__init__(index)
        self.rows = rows
        self.session = session
        self.index = index

    def record_batch(self) -> pa.RecordBatch:
        return fetch_rows(self.rows) if isinstance(self.rows, RowHandle) else self.rows

    def __repr__(self) -> str:
        rows = self.rows.rows if isinstance(self.rows, RowHandle) else self.rows.num_rows
        return f"NSQInputPartition(session={self.session}, index={self.index}, rows={rows})"


class _NSQReaderBase(SupportsTriggerAvailableNow):
    """What both flavours share: the runtime, offsets, FIN on commit, Trigger.AvailableNow."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        _check_columns(schema, options.ha)
        # Plain data only: this object is pickled (and built twice) by Spark.
        self._options = options
        self._schema = schema
        self._runtime: SourceRuntime | None = None
        self._row_server: RowServer | None = None  # rowTransport=tcp: serves the read tasks
        self._last_end: dict[str, Any] | None = None  # PySpark < 4.2 calls latestOffset() without start
        self._planned: tuple[str, str, list[Any]] | None = None  # the last latestOffset's batch
        self._arrow: pa.Schema | None = None
        self._target: tuple[int, int] | None = None  # AvailableNow: (messages to seal, next_seq when prepared)
        self._target_done = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None  # threads and sockets stay in the process that made them
        state["_row_server"] = None
        state["_planned"] = None
        return state

    def _ensure_runtime(self, delivery_cap: int | None = None) -> SourceRuntime:
        if self._runtime is None:
            runtime = SourceRuntime(self._options)
            runtime.start(delivery_cap)
            self._runtime = runtime
            logger.info(
                "nsq source session %s consuming %s/%s", runtime.session, self._options.topic, self._options.channel
            )
            if self._options.row_transport == "tcp":
                self._row_server = RowServer(self._options.row_server_host, self._options.row_server_port)
                logger.info("nsq source session %s serves its rows on %s:%d", runtime.session,
                            self._row_server.host, self._row_server.port)
        return self._runtime

    # ---- offsets ----------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return dict(_INITIAL_OFFSET)

    def _max_rows(self, limit: Any) -> int:
        """Rows the next batch may take: Spark's limit (or maxRecordsPerBatch on PySpark < 4.2),
        and never more than half of maxInFlight.

        The half is flow control, not a user limit: the batch being planned stays in flight
        while it runs, and only what is left of maxInFlight can arrive meanwhile. A batch
        that took the whole window would leave the next one nearly empty (measured: 160,000
        then 123 rows), each paying Spark's fixed cost per micro-batch.
        """
        half = max(1, self._options.max_in_flight // 2)
        if limit is None:  # PySpark < 4.2: apply maxRecordsPerBatch here
            max_rows = self._options.max_records_per_batch
        else:
            max_rows = getattr(limit, "max_rows", None)
        return half if max_rows is None else min(int(max_rows), half)

    def _latest(self, start: dict[str, Any] | None, limit: Any) -> dict[str, Any]:
        runtime = self._ensure_runtime()
        if start is None:
            start = self._last_end if self._last_end is not None else self.initialOffset()
        max_rows = self._max_rows(limit)
        if self._target is None:
            end, messages = runtime.call(runtime.plan, start, max_rows)
        else:
            end, messages = self._latest_available_now(runtime, start, max_rows)
        self._last_end = end
        if self._row_server is not None and start.get("session") == runtime.session:
            self._row_server.drop_through(int(start["seq"]))  # FINed by plan() just now
        # partitions(start, end) follows at once: it takes these without another hop
        # to the loop thread (which is busy FINing the previous batch meanwhile).
        self._planned = (_key(start), _key(end), messages)
        return end

    def _latest_available_now(
        self, runtime: SourceRuntime, start: dict[str, Any], max_rows: int
    ) -> tuple[dict[str, Any], list[Any]]:
        """Trigger.AvailableNow: seal until the target prepared from /stats is reached.

        An empty buffer does not mean the channel is drained (messages may be on their
        way, or held by RDY until the last batch is FINed), so wait for arrivals; stop
        early only after ``availableNowTimeoutMs`` without a message.
        """
        assert self._target is not None
        target, origin = self._target
        deadline = time.monotonic() + self._options.available_now_timeout
        while True:
            remaining = 0 if self._target_done else target - (runtime.call(lambda: runtime.next_seq) - origin)
            cap = min(max_rows, remaining)
            end, messages = runtime.call(runtime.plan, start, max(cap, 0))
            if end != start or remaining <= 0:
                return end, messages
            left = deadline - time.monotonic()
            if left <= 0 or not runtime.arrived.wait(left):
                logger.warning(
                    "Trigger.AvailableNow: %d of %d messages were not delivered within %.1f s "
                    "(another consumer of channel %s may hold them); ending the run",
                    remaining, target, self._options.available_now_timeout, self._options.channel,
                )
                self._target_done = True
                return runtime.call(runtime.plan, start, 0)

    def prepareForTriggerAvailableNow(self) -> None:
        if self._runtime is None:  # Spark's usual order: the target is read before consuming
            target = available_now_backlog(self._options)
            runtime = self._ensure_runtime(delivery_cap=target)
        else:
            runtime = self._runtime
            target = runtime.available_now_target()
            runtime.call(runtime.cap_deliveries, target)
        origin = runtime.call(lambda: runtime.next_seq)
        self._target = (target, origin)
        self._target_done = False
        logger.info("Trigger.AvailableNow: %d messages to deliver from %s/%s", target, self._options.topic,
                    self._options.channel)

    def _batch_messages(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any] | None:
        if end == start:
            return []
        planned = self._planned
        if planned is not None and planned[0] == _key(start) and planned[1] == _key(end):
            return planned[2]
        runtime = self._runtime
        messages = runtime.call(runtime.batch, start, end) if runtime is not None else None
        if messages is None:
            logger.info(
                "batch %s .. %s belongs to session %r, which is gone: it replays as empty "
                "(nsqd delivers its messages again)", start, end, end.get("session"),
            )
        return messages

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed everything up to ``end``: FIN it."""
        runtime = self._runtime
        if runtime is not None and end.get("session") == runtime.session:
            runtime.post(runtime.finish_before, int(end["seq"]))  # no need to wait: FIN is fire-and-forget
            if self._row_server is not None:
                self._row_server.drop_through(int(end["seq"]))

    def stop(self) -> None:
        if self._row_server is not None:
            self._row_server.close()
        if self._runtime is not None:
            self._runtime.stop()

    def _record_batches(self, messages: Sequence[Any], slices: int) -> list[pa.RecordBatch]:
        if self._arrow is None:
            self._arrow = _arrow_schema(self._schema)  # once: the first call imports pandas
        arrow_schema = self._arrow
        count = len(messages)
        slices = max(1, min(slices, count))
        bounds = [count * i // slices for i in range(slices + 1)]
        return [
            messages_to_batch(messages[bounds[i]:bounds[i + 1]], arrow_schema, self._options.topic, self._options.ha)
            for i in range(slices)
        ]


class NSQStreamReader(_NSQReaderBase, DataSourceStreamReader):
    """``readMode=partitioned``: rows spread over ``numPartitions`` input partitions."""

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """Plan the next batch: FIN what is committed (everything before ``start``), seal
        what has arrived (at most ``maxRecordsPerBatch``) and return its end."""
        return self._latest(start, limit)

    def getDefaultReadLimit(self) -> Any:
        if self._options.max_records_per_batch is not None and ReadMaxRows is not None:
            return ReadMaxRows(self._options.max_records_per_batch)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        messages = self._batch_messages(start, end)
        if not messages:
            return []
        session = str(end.get("session"))
        batches = self._record_batches(messages, self._options.num_partitions)
        if self._row_server is None:
            return [NSQInputPartition(batch, session, i) for i, batch in enumerate(batches)]
        handles = self._row_server.put(int(end["seq"]), batches)
        return [NSQInputPartition(handle, session, i) for i, handle in enumerate(handles)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        batch = partition.record_batch()  # type: ignore[attr-defined]
        if batch.num_rows == 0:
            return iter(())
        if _arrow_reads_supported():
            return iter([batch])
        return _batch_rows(batch)


class NSQSimpleStreamReader(_NSQReaderBase, SimpleDataSourceStreamReader):
    """``readMode=simple``: one partition, read and planned in one call by Spark's simple-reader path."""

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Any], dict[str, Any]]:
        end = self._latest(start, None)
        return self._rows(start, end), end

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any]:
        return self._rows(start, end)

    def _rows(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any]:
        messages = self._batch_messages(start, end)
        if not messages:
            return iter(())
        batch = self._record_batches(messages, 1)[0]
        if _arrow_reads_supported():
            return iter([batch])  # a list iterator: Spark copies it to replay a batch
        return iter(list(_batch_rows(batch)))

