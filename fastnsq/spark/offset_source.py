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
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..errors import NSQError
from ..loop import run
from ._offsets import (
    NEW_PARTITION_START,
    DataLoss,
    OffsetPlanner,
    Position,
    RangePlan,
    TopicState,
    positions_from_json,
    positions_to_json,
)
from ._options import SourceOptions
from ._prefetch import RangePrefetcher
from ._range_read import read_range
from ._rows import RowHandle, fetch_rows
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

__all__ = ["NSQOffsetStreamReader", "OffsetRangePartition", "lag_report", "read_partition"]

logger = logging.getLogger(__name__)


class OffsetRangePartition(InputPartition):
    """One topic partition's offset range of one micro-batch (plain data: Spark pickles it), and
    with ``prefetchRanges`` where the driver serves the rows it read."""

    def __init__(self, plan: RangePlan, index: int, prefetched: RowHandle | None = None) -> None:
        super().__init__(index)
        self.plan = plan
        self.prefetched = prefetched

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
        self._ending: dict[int, Position] | None = None  # the ending options, resolved once
        self._ending_resolved = False
        self._report: dict[str, Any] | None = None  # reportLatestOffset: the ends and the lag behind them
        self._losses: list[DataLoss] = []  # failOnDataLoss=false: what planning skipped
        self._planned: tuple[str, str, list[RangePlan]] | None = None  # (start, end, ranges) of the last batch
        self._outages: dict[int, float] = {}  # partition -> since when it has had no leader that answers
        self._prefetcher: RangePrefetcher | None = None  # prefetchRanges: reads each batch as it is planned
        self._prefetched: list[RowHandle] | None = None  # where the last planned batch's rows are served

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_prefetcher"] = None  # a thread and a server socket stay in the process that made them
        return state

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

    def _stop_at(self) -> dict[int, Position] | None:
        """Where reading stops: the ending options (resolved on first use), Trigger.AvailableNow's
        ends, or the sooner of both per partition."""
        if not self._ending_resolved:
            self._ending = self._call("ending")
            self._ending_resolved = True
            if self._ending is not None:
                logger.info("nsq offsets source on %s stops at %s", self._options.topic, positions_to_json(self._ending))
        if self._ending is None or self._cap is None:
            return self._ending if self._ending is not None else self._cap
        return {p: min(end, self._ending.get(p, end), key=lambda pos: pos.offset) for p, end in self._cap.items()}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        if start is None:
            start = self._last_end if self._last_end is not None else self.initialOffset()
        max_rows = getattr(limit, "max_rows", None) if limit is not None else self._options.max_records_per_batch
        end, state = self._call("latest", positions_from_json(start), max_rows, self._stop_at())
        self._check_outages(state)
        encoded = positions_to_json(end)
        self._last_end = encoded
        self._state = (repr(encoded), state)
        # Planned now, not in partitions(): what retention removed fails the query here, at once,
        # and what was skipped is in this batch's progress (Spark asks reportLatestOffset next).
        plans, losses = self._call("ranges", positions_from_json(start), end, state)
        self._planned = (repr(start), repr(encoded), plans)
        self._prefetched = self._prefetch(plans)
        self._losses.extend(losses)
        self._report = lag_report(end, state, self._ending, self._losses)
        behind = sum(self._report["offsetsBehindLatest"].values())
        if behind:
            logger.info("nsq offsets source on %s: %d messages behind the partitions' ends after this batch (%s)",
                        self._options.topic, behind, self._report["offsetsBehindLatest"])
        return encoded

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The partitions' ends when the last batch was planned, with the lag behind them (Spark
        shows this as the source's ``latestOffset`` in the query progress: PySpark's Python data
        source API has no source metrics, where Spark's Kafka source puts ``maxOffsetsBehindLatest``)."""
        return self._report

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if self._planned is not None and self._planned[:2] == (repr(start), repr(end)):
            plans = self._planned[2]
            if self._prefetched is not None:
                return [OffsetRangePartition(plan, i, handle)
                        for i, (plan, handle) in enumerate(zip(plans, self._prefetched, strict=True))]
        else:  # a batch planned by an earlier run of the query (replayed from the checkpoint)
            plans, losses, state = self._call("replay", positions_from_json(start), positions_from_json(end))
            self._losses.extend(losses)
            # Spark asks reportLatestOffset only after latestOffset, which a replayed batch skips
            # (its progress shows "latestOffset": null, as for Kafka's source): the lag goes to the log.
            report = lag_report(positions_from_json(end), state, self._ending, self._losses)
            logger.info("nsq offsets source on %s: replaying a batch from the checkpoint, to %s; the partitions' "
                        "ends now: %s", self._options.topic, end, report)
        return [OffsetRangePartition(plan, i) for i, plan in enumerate(plans)]

    def _check_outages(self, state: TopicState) -> None:
        """A partition without a leader stalls (its position is carried), the query goes on; for
        longer than ``leaderWaitTimeoutMs`` it fails the query, naming the partition and why."""
        now = time.monotonic()
        for partition in list(self._outages):
            if partition not in state.unavailable:
                logger.info("topic %s partition %d has a leader again after %.1f s: read on", self._options.topic,
                            partition, now - self._outages.pop(partition))
        for partition, why in sorted(state.unavailable.items()):
            since = self._outages.setdefault(partition, now)
            if now - since > self._options.leader_wait_timeout:
                raise NSQError(f"topic {self._options.topic!r} partition {partition}: no leader that answers for "
                               f"{now - since:.0f} s (option 'leaderWaitTimeoutMs' = "
                               f"{self._options.leader_wait_timeout * 1000:.0f}): {why}")

    def _prefetch(self, plans: list[RangePlan]) -> list[RowHandle] | None:
        """With ``prefetchRanges``, start reading the batch's ranges now (:mod:`._prefetch`)."""
        if not self._options.prefetch_ranges or not plans:
            return None
        if self._prefetcher is None:
            self._prefetcher = RangePrefetcher(self._options, self._arrow())
        return self._prefetcher.start(plans)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self._options, self._arrow(), partition.plan,  # type: ignore[attr-defined]
                              getattr(partition, "prefetched", None))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: no message is held between batches (the ranges stay on nsqd's disk)."""

    def stop(self) -> None:
        """Every planning call opens and closes its own connections; the prefetcher has a thread."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

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


def read_partition(options: SourceOptions, schema: pa.Schema, plan: RangePlan,
                   prefetched: RowHandle | None = None) -> Iterator[Any]:
    """One read task: the range's messages as one Arrow batch (or rows, on a PySpark without Arrow
    reads), from the driver when it prefetched them, else from the partition's leader."""
    if prefetched is not None:
        try:
            batch = fetch_rows(prefetched)
        except (NSQError, OSError, pa.ArrowException) as exc:
            logger.warning("partition %d range %d..%d: the driver did not serve it (%s): reading it from the leader",
                           plan.partition, plan.start.offset, plan.end.offset, exc)
        else:
            if batch.num_rows == 0:
                return iter(())
            return iter([batch]) if _arrow_reads_supported() else _batch_rows(batch)
    messages = run(read_range(options, plan))
    if len(messages) != plan.rows:
        logger.info("partition %d range %d..%d: %d messages where the counts said %d", plan.partition,
                    plan.start.offset, plan.end.offset, len(messages), plan.rows)
    if not messages:
        return iter(())
    batch = messages_to_batch(messages, schema, options.topic, True)
    return iter([batch]) if _arrow_reads_supported() else _batch_rows(batch)


def lag_report(end: dict[int, Position], state: TopicState, ending: dict[int, Position] | None,
               losses: list[DataLoss]) -> dict[str, Any]:
    """The partitions' ends and how many messages each is behind them after the batch ending at
    ``end`` (Spark's Kafka source's names; an ending option caps the ends it counts to).

    >>> from fastnsq.nsqd_http import PartitionEnds
    >>> state = TopicState({}, {0: PartitionEnds(0, 0, 900, 9, True, False)}, False)
    >>> lag_report({0: Position(500, 5)}, state, None, [])["offsetsBehindLatest"]
    {'0': 4}
    """
    latest = {p: Position(e.end, e.count) for p, e in state.ends.items()}
    if ending is not None:
        latest = {p: min(pos, ending.get(p, pos), key=lambda x: x.offset) for p, pos in latest.items()}
    behind = {str(p): max(0, pos.count - end.get(p, NEW_PARTITION_START).count) for p, pos in sorted(latest.items())}
    lags = list(behind.values()) or [0]
    # A partition without a leader now: its end is not known, the batch carried its position.
    stalled = {p: end[p] for p in end if p not in latest}
    report = {**positions_to_json({**stalled, **latest}), "offsetsBehindLatest": behind,
              "maxOffsetsBehindLatest": max(lags), "avgOffsetsBehindLatest": f"{sum(lags) / len(lags):.1f}",
              **_loss_report(losses)}
    if state.unavailable:
        report["partitionsWithoutLeader"] = {str(p): why for p, why in sorted(state.unavailable.items())}
    return report


def _loss_report(losses: list[DataLoss]) -> dict[str, Any]:
    return {"dataLossMessages": sum(loss.messages for loss in losses),
            "dataLossRanges": [[loss.partition, loss.start, loss.end] for loss in losses[-20:]]}
