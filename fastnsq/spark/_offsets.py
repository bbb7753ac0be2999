"""Offset ranges of an HA topic: where each partition starts and ends, and what one micro-batch reads.

One job: the planning ``readMode=offsets`` does on the driver, with nothing held between
calls. A position in a partition is ``(offset, count)``: the queue offset where a message
begins (youzan's virtual-queue offset, the ``offset`` column) and the messages written before
it. Offsets are what a read task moves its channel to; counts are what admission control
(``maxRecordsPerBatch``) divides, and a cut by count is turned into the offset of the message
there with the leader's ``GET /message/get?search_mode=count``, so that every planned end is
a message boundary.

The source's offsets, as Spark checkpoints them: ``{"partitions": {"0": [offset, count], ...}}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidValueError, NSQError
from ..nsqd_http import NsqdHTTP, PartitionEnds
from ._options import parse_starting_offsets

if TYPE_CHECKING:
    from ._options import SourceOptions

__all__ = ["NEW_PARTITION_START", "Leader", "OffsetPlanner", "Position", "RangePlan", "TopicState", "plan_ranges",
           "positions_from_json", "positions_to_json"]

logger = logging.getLogger(__name__)

#: How long the driver retries a topic whose leaders are moving before it gives up.
_LEADER_SETTLE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Position:
    """Where a message begins in one partition, and how many were written before it."""

    offset: int
    count: int


@dataclass(frozen=True)
class Leader:
    """The nsqd leading a partition: its TCP and HTTP addresses."""

    tcp: str
    http: str


@dataclass(frozen=True)
class TopicState:
    """Every partition's leader and ends, and whether the topic is an ext topic."""

    leaders: dict[int, Leader]
    ends: dict[int, PartitionEnds]
    ext: bool


@dataclass(frozen=True)
class RangePlan:
    """One partition's messages for one micro-batch: those beginning in ``[start, end)``."""

    partition: int
    start: Position
    end: Position
    leader: Leader
    ext: bool

    @property
    def rows(self) -> int:
        return self.end.count - self.start.count


#: A partition the topic gained after the query started is read from its very beginning (a
#: replayed batch must read the same range, so not from "its earliest now").
NEW_PARTITION_START = Position(0, 0)


def positions_to_json(positions: Mapping[int, Position]) -> dict[str, Any]:
    return {"partitions": {str(p): [pos.offset, pos.count] for p, pos in sorted(positions.items())}}


def positions_from_json(offset: Mapping[str, Any]) -> dict[int, Position]:
    try:
        return {int(p): Position(int(o), int(c)) for p, (o, c) in offset["partitions"].items()}
    except (KeyError, TypeError, ValueError):
        raise InvalidValueError(
            f"format 'nsq' readMode=offsets cannot read the checkpointed offset {dict(offset)!r}: it was "
            "written by another readMode (start the query with a new checkpointLocation)"
        ) from None


class OffsetPlanner:
    """Asks the HA lookupd and the partitions' leaders; one instance per call site, closed after."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._http = NsqdHTTP(timeout=10.0)

    async def close(self) -> None:
        await self._http.close()

    async def topic_state(self) -> TopicState:
        """Leaders from the lookupd's write lookup (it names leaders only), ends from each leader.

        A node that the lookupd names but that does not (yet) lead the partition is asked
        again after a lookup, for up to 30 s: leadership moves take a few seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _LEADER_SETTLE_TIMEOUT
        while True:
            leaders, ext = await self._lookup()
            ends: dict[int, PartitionEnds] = {}
            for http in sorted({leader.http for leader in leaders.values()}):
                held = await self._http.partition_ends(http, self._options.topic)
                ends.update({p: e for p, e in held.items() if e.leader and leaders.get(p, None) is not None
                             and leaders[p].http == http})
            missing = sorted(set(leaders) - set(ends))
            if not missing:
                return TopicState(leaders, ends, ext)
            if loop.time() > deadline:
                raise NSQError(f"topic {self._options.topic!r}: the nodes the lookupd names as leaders of "
                               f"partition(s) {missing} do not lead them (after {_LEADER_SETTLE_TIMEOUT:.0f} s)")
            await asyncio.sleep(1.0)

    async def leader(self, partition: int) -> Leader:
        """The leader of one partition now (a read task whose leader stopped answering asks this)."""
        leaders, _ = await self._lookup()
        if partition not in leaders:
            raise NSQError(f"topic {self._options.topic!r}: the lookupd lists no leader of partition {partition}")
        return leaders[partition]

    async def _lookup(self) -> tuple[dict[int, Leader], bool]:
        from ..lookupd import LookupdClient

        errors = []
        async with LookupdClient(timeout=10.0) as client:
            for address in self._options.common.lookupd:
                try:
                    result = await client.lookup(address, self._options.topic, access="w", metainfo=True)
                    if not result.partitions:  # a lookupd that hides a topic without channels from writers
                        result = await client.lookup(address, self._options.topic, access="r", metainfo=True)
                except NSQError as exc:
                    errors.append(f"{address}: {exc}")
                    continue
                if not result.is_ha or not result.partitions:
                    raise InvalidValueError(
                        f"readMode=offsets: lookupd {address} lists no partition of topic {self._options.topic!r} "
                        "(an HA topic on youzan's nsqlookupd is needed; upstream nsqd has no queue offsets)"
                    )
                leaders = {p: Leader(node.address, node.http_address) for p, node in result.partitions.items()}
                return leaders, bool(result.meta and result.meta.extend_support)
        raise NSQError(f"no lookupd answered for topic {self._options.topic!r}: {'; '.join(errors)}")

    # -- positions ----------------------------------------------------------------------

    async def initial(self) -> dict[int, Position]:
        """Option ``startingOffsets`` as a position in every partition."""
        state = await self.topic_state()
        wanted = parse_starting_offsets(self._options.starting_offsets)
        if isinstance(wanted, dict):
            unknown = sorted(set(wanted) - set(state.ends))
            if unknown:
                raise InvalidValueError(f"option 'startingOffsets' names partition(s) {unknown} that topic "
                                        f"{self._options.topic!r} does not have (it has {sorted(state.ends)})")
            missing = sorted(set(state.ends) - set(wanted))
            if missing:
                raise InvalidValueError(f"option 'startingOffsets' must give every partition of topic "
                                        f"{self._options.topic!r}: missing {missing} (use -2 for earliest, -1 for latest)")
        positions = {}
        for partition, ends in state.ends.items():
            offset: int = wanted[partition] if isinstance(wanted, dict) else -2 if wanted == "earliest" else -1
            leader = state.leaders[partition]
            if offset == -1:
                positions[partition] = Position(ends.end, ends.count)
            elif offset == -2:
                positions[partition] = await self._earliest(leader, ends)
            else:
                positions[partition] = await self._at_offset(leader, ends, offset)
        return positions

    async def _earliest(self, leader: Leader, ends: PartitionEnds) -> Position:
        if ends.start >= ends.end:
            return Position(ends.end, ends.count)
        offset, before = await self._http.message_at(leader.http, self._options.topic, ends.partition,
                                                     count=0, offset=ends.start)
        return Position(offset, before)

    async def _at_offset(self, leader: Leader, ends: PartitionEnds, offset: int) -> Position:
        if offset == ends.end:
            return Position(ends.end, ends.count)
        if not ends.start <= offset < ends.end:
            raise InvalidValueError(f"option 'startingOffsets': partition {ends.partition} offset {offset} is outside "
                                    f"what the partition holds, {ends.start} to {ends.end}")
        found, before = await self._http.message_at(leader.http, self._options.topic, ends.partition,
                                                    count=0, offset=offset)
        if found != offset:
            raise InvalidValueError(f"option 'startingOffsets': partition {ends.partition} offset {offset} is not "
                                    f"where a message begins (the next one begins at {found})")
        return Position(offset, before)

    async def latest(self, start: Mapping[int, Position], max_rows: int | None,
                     cap: Mapping[int, Position] | None = None) -> tuple[dict[int, Position], TopicState]:
        """The end of the next micro-batch: every partition's end (no further than ``cap``),
        with at most ``max_rows`` messages in all, shared by partition in proportion to backlog."""
        state = await self.topic_state()
        ends = {p: Position(e.end, e.count) for p, e in state.ends.items()}
        if cap is not None:
            ends = {p: min(end, cap.get(p, end), key=lambda pos: pos.offset) for p, end in ends.items()}
        for partition in sorted(set(ends) - set(start)):
            logger.info("topic %s has a new partition %d: read from its beginning", self._options.topic, partition)
        origin = {p: start.get(p, NEW_PARTITION_START) for p in ends}
        backlog = {p: max(0, ends[p].count - origin[p].count) for p in ends if ends[p].offset > origin[p].offset}
        total = sum(backlog.values())
        if max_rows is None or total <= max_rows:
            return {p: ends[p] if p in backlog else origin[p] for p in ends}, state
        planned = {}
        for partition, end in ends.items():
            share = backlog.get(partition, 0) * max_rows // total
            planned[partition] = await self._cut(state, partition, origin[partition], end, share)
        return planned, state

    async def _cut(self, state: TopicState, partition: int, start: Position, end: Position, share: int) -> Position:
        """Where ``share`` messages after ``start`` end (a boundary), or ``end`` if that is sooner."""
        if share <= 0 or start.offset >= end.offset:
            return start
        if start.count + share >= end.count:
            return end
        offset, before = await self._http.message_at(state.leaders[partition].http, self._options.topic, partition,
                                                     count=start.count + share + 1)
        if not start.offset < offset < end.offset:  # counts read next to a write may be one off
            return end
        return Position(offset, before)


def plan_ranges(start: Mapping[int, Position], end: Mapping[int, Position],
                state: TopicState | None) -> list[RangePlan]:
    """One range per partition that has messages between ``start`` and ``end`` (asks no server:
    the leaders come from ``state``, the planning call's, when the batch is the one just planned)."""
    plans = []
    for partition, stop in sorted(end.items()):
        begin = start.get(partition, NEW_PARTITION_START)
        if begin.offset >= stop.offset:
            continue
        leader = state.leaders.get(partition) if state is not None else None
        plans.append(RangePlan(partition, begin, stop, leader or Leader("", ""), bool(state and state.ext)))
    return plans
