"""The end of what an HA partition's leader has committed: the end it is safe to plan a batch to.

One job: turn a leader's ``/stats`` (its write end) into the committed end. youzan's leader
writes a publish to its disk queue, replicates it to the ISR, and only then commits it
(``UpdateCommittedOffset``, and the commit log); when replication fails it rolls the write
back (``failed write begin rollback``, ``ResetBackendEndNoLock``) and the next publish takes
the same offsets. ``/stats``' ``backend_depth`` and ``message_count`` are the write end
(``TotalDataSize``, ``TotalMessageCnt``: ``GetQueueWriteEnd``), so they may count writes that
are then rolled back. Readers never see those: channels end at the committed end, and
``GET /message/get`` searches the commit log and reads a snapshot that stops at the
committed end (``GetDiskQueueSnapshot(true)``). So:

* ``GET /message/get?search_mode=count&search_pos=C`` for the last message ``/stats`` counts:
  an answer means message ``C`` is committed, so everything before it is; ``(its offset,
  C - 1)`` is then a committed message boundary. If a second ``/stats`` shows the same write
  end, nothing was written in between and ``(backend_depth, C)`` is committed too.
* No answer: message ``C`` is not committed (or not yet): the last committed message is found
  by galloping down the counts (a publish in flight is one batch), then a binary search.

Nothing found (the partition holds no committed message this node can show): None, and the
partition is not advanced by this batch.
"""

from __future__ import annotations

import logging

from ..errors import NSQError
from ..nsqd_http import NsqdHTTP, PartitionEnds

__all__ = ["committed_ends"]

logger = logging.getLogger(__name__)


async def committed_ends(http: NsqdHTTP, address: str, topic: str,
                         held: dict[int, PartitionEnds]) -> dict[int, PartitionEnds | None]:
    """Each partition of ``held`` (one leader's ``/stats``) as far as the leader has committed it."""
    found: dict[int, PartitionEnds | None] = {}
    unsure: list[int] = []
    for partition, ends in held.items():
        if ends.count <= 0 or ends.end <= ends.start:
            found[partition] = ends  # nothing on disk past the start: nothing to roll back
            continue
        last = await _probe(http, address, topic, partition, ends.count)
        if last is not None and last[0] < ends.end:
            found[partition] = _at(ends, *last)
            unsure.append(partition)
        else:
            found[partition] = await _last_committed(http, address, topic, ends)
    if unsure:
        again = await http.partition_ends(address, topic)
        for partition in unsure:
            now, before = again.get(partition), held[partition]
            if now is not None and (now.end, now.count) == (before.end, before.count):
                found[partition] = before  # no write since: the last message ends at the write end
    return found


def _at(ends: PartitionEnds, offset: int, before: int) -> PartitionEnds:
    """The committed end as the start of the first message not known committed."""
    return PartitionEnds(ends.partition, ends.start, offset, before, ends.leader, ends.ext)


async def _probe(http: NsqdHTTP, address: str, topic: str, partition: int, count: int) -> tuple[int, int] | None:
    """Where committed message ``count`` begins and how many come before it; None if not readable."""
    try:
        return await http.message_at(address, topic, partition, count=count)
    except NSQError:
        return None


async def _last_committed(http: NsqdHTTP, address: str, topic: str, ends: PartitionEnds) -> PartitionEnds | None:
    """The start of the last committed message (galloping down from the write end's count)."""
    high, step = ends.count, 1  # message ``high`` is not committed
    low: tuple[int, int, int] | None = None  # (count, offset, before) of a committed message
    while low is None:
        count = max(1, high - step)
        probe = await _probe(http, address, topic, ends.partition, count)
        if probe is not None:
            low = (count, *probe)
        elif count == 1:
            logger.info("topic %s partition %d: no committed message found on %s (write end %d, %d messages)",
                        topic, ends.partition, address, ends.end, ends.count)
            return None
        else:
            high, step = count, step * 2
    count, offset, before = low
    while high - count > 1:  # message ``count`` committed, ``high`` not
        middle = (count + high) // 2
        probe = await _probe(http, address, topic, ends.partition, middle)
        if probe is None:
            high = middle
        else:
            count, (offset, before) = middle, probe
    logger.info("topic %s partition %d: %s has written %d messages and committed %d: planning to the committed end",
                topic, ends.partition, address, ends.count, count)
    return _at(ends, offset, before)
