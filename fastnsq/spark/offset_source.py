"""``readMode=offsets``: a replayable, partition-parallel source for youzan's HA topics.

One job: Spark's ``DataSourceStreamReader`` over queue offsets, as Spark's Kafka source is
over Kafka's. The driver only plans: each micro-batch is, per topic partition, the messages
that begin between two queue offsets (:mod:`._offsets`); Spark checkpoints those offsets.
Each input partition is one topic partition's range, read on an executor straight from the
partition's leader (:mod:`._range_read`). Nothing is held in flight between batches, so a
retried task, a replayed batch or a query restarted from its checkpoint reads exactly the
same messages again: with Spark's file sink (or a ``foreachBatch`` keyed by batch id) each
message is written once; with other sinks, at least once.

What it needs from the cluster: a lookupd naming each partition's leader, the leaders' HTTP
APIs (``/stats``, ``/message/get``, ``/channel/create``, ``/channel/setoffset``), channel
auto-create on the topic, and the messages still on disk (youzan's retention cleans what
every channel has consumed and is old enough; the source's own channels are ephemeral and
never hold it back, so a query stopped for longer than the retention finds its next range
gone, and says so).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..loop import run
from ._offsets import (
    OffsetPlanner,
    Position,
    RangePlan,
    TopicState,
    plan_ranges,
    positions_from_json,
    positions_to_json,
)
from ._options import SourceOptions
from ._range_read import read_range
from .source import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    _arrow_reads_supported,
    _arrow_schema,
    _batch_rows,
    _check_columns,
    messages_to_batch,
)

__all__ = ["NSQOffsetStreamReader", "OffsetRangePartition"]

logger = logging.getLogger(__name__)


class OffsetRangePartition(InputPartition):
    """One topic partition's offset range of one micro-batch (plain data: Spark pickles it)."""

    def __init__(self, plan: RangePlan, index: int) -> None:
        super().__init__(index)
        self.plan = plan

    def __repr__(self) -> str:
        p = self.plan
        return f"OffsetRangePartition(partition={p.partition}, offsets={p.start.offset}..{p.end.offset}, rows={p.rows})"


class NSQOffsetStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver plans offset ranges; the executors read them from the partitions' leaders."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        _check_columns(schema, True)
        self._options = options
        self._schema = schema
        self._last_end: dict[str, Any] | None = None  # PySpark < 4.2 calls latestOffset() without start
        self._cap: dict[int, Position] | None = None  # Trigger.AvailableNow: the ends when it was prepared
        self._state: tuple[str, TopicState] | None = None  # leaders seen by the last latestOffset

    def initialOffset(self) -> dict[str, Any]:
        positions = self._call("initial")
        logger.info("nsq offsets source on %s starts at %s", self._options.topic, positions_to_json(positions))
        return positions_to_json(positions)

    def getDefaultReadLimit(self) -> Any:
        if self._options.max_records_per_batch is not None and ReadMaxRows is not None:
            return ReadMaxRows(self._options.max_records_per_batch)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        state: TopicState = self._call("topic_state")
        self._cap = {p: Position(e.end, e.count) for p, e in state.ends.items()}
        logger.info("Trigger.AvailableNow: reading %s up to %s", self._options.topic, positions_to_json(self._cap))

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        if start is None:
            start = self._last_end if self._last_end is not None else self.initialOffset()
        max_rows = getattr(limit, "max_rows", None) if limit is not None else self._options.max_records_per_batch
        end, state = self._call("latest", positions_from_json(start), max_rows, self._cap)
        encoded = positions_to_json(end)
        self._last_end = encoded
        self._state = (repr(encoded), state)
        return encoded

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        state = self._state[1] if self._state is not None and self._state[0] == repr(end) else None
        plans = plan_ranges(positions_from_json(start), positions_from_json(end), state)
        return [OffsetRangePartition(plan, i) for i, plan in enumerate(plans)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan: RangePlan = partition.plan  # type: ignore[attr-defined]
        messages = run(read_range(self._options, plan))
        if len(messages) != plan.rows:
            logger.info("partition %d range %d..%d: %d messages where the counts said %d", plan.partition,
                        plan.start.offset, plan.end.offset, len(messages), plan.rows)
        if not messages:
            return iter(())
        batch = messages_to_batch(messages, self._arrow(), self._options.topic, True)
        return iter([batch]) if _arrow_reads_supported() else _batch_rows(batch)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: no message is held between batches (the ranges stay on nsqd's disk)."""

    def stop(self) -> None:
        """Nothing to close: every planning call opens and closes its own connections."""

    def _arrow(self) -> pa.Schema:
        return _arrow_schema(self._schema)

    def _call(self, method: str, *args: Any) -> Any:
        """Run one planning call on a fresh loop (the driver's source process has none)."""

        async def call() -> Any:
            planner = OffsetPlanner(self._options)
            try:
                return await getattr(planner, method)(*args)
            finally:
                await planner.close()

        return run(call())
