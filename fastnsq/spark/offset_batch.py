"""``spark.read.format("nsq").option("readMode", "offsets")``: a batch read of an HA topic's offset window.

One job: the batch face of :mod:`.offset_source`, as Spark's Kafka source answers ``spark.read``
with ``startingOffsets`` / ``endingOffsets``. The window is planned once, in ``partitions()``
on the driver: every partition's start (``startingTimestamp``, ``startingOffsetsByTimestamp``
or ``startingOffsets``, default earliest) and end (``endingTimestamp``,
``endingOffsetsByTimestamp`` or ``endingOffsets``, default latest: the ends when the read is
planned), what retention removed (``failOnDataLoss``), and ``minPartitions``. Each read task
reads its range from the partition's leader exactly as a micro-batch's task does, so a batch
read and a streaming read of the same window give the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ..errors import InvalidValueError
from ..loop import run
from ._offsets import DataLoss, OffsetPlanner, Position, RangePlan
from ._options import SourceOptions
from .offset_source import OffsetRangePartition, read_partition
from .source import _arrow_schema, _check_columns

__all__ = ["NSQOffsetBatchReader"]

logger = logging.getLogger(__name__)


class NSQOffsetBatchReader(DataSourceReader):
    """Plans the window's ranges on the driver; the executors read them from the leaders."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        _check_columns(schema, True)
        if options.starting_offsets == "latest" and options.starting_timestamp is None \
                and options.starting_by_timestamp is None:
            raise InvalidValueError("option 'startingOffsets'=latest is not allowed in a batch read (it would read "
                                    "nothing; Spark's Kafka source refuses it too): give earliest, JSON offsets "
                                    "or a timestamp option")
        if options.prefetch_ranges:
            raise InvalidValueError("option 'prefetchRanges' applies to streaming queries (spark.readStream): a batch "
                                    "read plans once and its tasks read at once, so there is nothing to read ahead")
        self._options = options
        self._schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        plans, losses = run(self._plan())
        logger.info("batch read of %s: %d read task(s), %d messages, %d lost", self._options.topic, len(plans),
                    sum(p.rows for p in plans), sum(loss.messages for loss in losses))
        return [OffsetRangePartition(plan, i) for i, plan in enumerate(plans)]

    async def _plan(self) -> tuple[list[RangePlan], list[DataLoss]]:
        planner = OffsetPlanner(self._options)
        try:
            state = await planner.complete_state()  # a batch read reads every partition
            start = await planner.initial(state)
            end = await planner.ending(state, default="latest")
            assert end is not None
            _check_window(start, end)
            return await planner.ranges(start, end, state)
        finally:
            await planner.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        plan = getattr(partition, "plan", None)
        if plan is None:  # an empty window: PySpark reads one partition of its own (InputPartition(None))
            return iter(())
        return read_partition(self._options, _arrow_schema(self._schema), plan)


def _check_window(start: dict[int, Position], end: dict[int, Position]) -> None:
    for partition, stop in sorted(end.items()):
        begin = start.get(partition)
        if begin is not None and stop.offset < begin.offset:
            raise InvalidValueError(f"partition {partition}: the ending offset {stop.offset} is before the starting "
                                    f"offset {begin.offset} (options endingOffsets / endingTimestamp / "
                                    "endingOffsetsByTimestamp against the starting ones)")
