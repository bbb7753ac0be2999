"""Option ``prefetchRanges``: the driver reads each micro-batch's ranges as it plans them.

One job: shrink the time in which a partition leader's death can stall a whole micro-batch.
A batch's ranges are read by its tasks, which Spark starts some 0.3-1 s after planning;
a leader that dies in between leaves its task waiting for another (youzan lists none for up
to a minute with 2 replicas), and a micro-batch ends only when all its tasks do. A replica
cannot serve the range meanwhile: youzan's ``/message/get`` on a replica shows only what it
has flushed, which may be minutes behind, and its ``SUB`` answers E_FAILED_ON_NOT_LEADER.

So, with the option, the driver's source process starts reading every range the moment it
plans the batch (a few milliseconds for a second's messages), keeps the rows as Arrow IPC
streams and serves them to the read tasks over TCP (:class:`._rows.RowServer`,
``rowServerHost`` / ``rowServerPort``). A read task fetches its range from there and reads
it from the leader itself only when the driver could not (a restarted driver replaying a
batch, a read that failed): the same range either way, so exactly once holds as without it.
The price: every message passes through the driver's process on its way to the executors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from .._loop_thread import LoopThread
from ._range_read import read_range
from ._rows import RowHandle, RowServer
from .source import messages_to_batch

if TYPE_CHECKING:
    from ._offsets import RangePlan
    from ._options import SourceOptions

__all__ = ["RangePrefetcher"]

logger = logging.getLogger(__name__)


class RangePrefetcher:
    """Reads planned ranges on a loop thread of its own and serves their rows to the read tasks."""

    def __init__(self, options: SourceOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema
        self._server = RowServer(options.row_server_host, options.row_server_port)
        self._loop = LoopThread("fastnsq-spark-prefetch")
        self._next = 0
        logger.info("nsq offsets source on %s: prefetching planned ranges, serving them on %s:%d", options.topic,
                    self._server.host, self._server.port)

    def start(self, plans: Sequence[RangePlan]) -> list[RowHandle]:
        """Begin reading ``plans`` (one batch); the handles a read task fetches each range's rows with."""
        self._next += 1
        batch = self._next
        self._server.drop_through(batch - 2)  # keep the batch before: Spark may still be reading it
        handles = []
        for index, plan in enumerate(plans):
            self._server.reserve(batch, index)
            handles.append(RowHandle(self._server.host, self._server.port, self._server.token, batch, index, -1))
            asyncio.run_coroutine_threadsafe(self._read(batch, index, plan), self._loop.loop)
        return handles

    async def _read(self, batch: int, index: int, plan: RangePlan) -> None:
        try:
            messages = await read_range(self._options, plan)
            rows = messages_to_batch(messages, self._schema, self._options.topic, True)
        except Exception as exc:  # noqa: BLE001 - the read task reads the range itself, and meets it there
            logger.warning("nsq offsets source on %s: prefetching partition %d range %d..%d failed (its read task "
                           "reads it from the leader instead): %s", self._options.topic, plan.partition,
                           plan.start.offset, plan.end.offset, exc)
            self._server.fail(batch, index, f"{type(exc).__name__}: {exc}")
            return
        self._server.put_one(batch, index, rows)

    def wait_ready(self, timeout: float) -> bool:
        """Whether every range started so far is read (or failed) within ``timeout`` s."""
        return self._server.wait_ready(timeout)

    def close(self) -> None:
        self._server.close()
        self._loop.stop()
