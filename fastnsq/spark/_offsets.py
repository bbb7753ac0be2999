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
import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import DataLossError, InvalidValueError, NSQError
from ..nsqd_http import NsqdHTTP, PartitionEnds
from ._committed import committed_ends
from ._options import parse_ending_offsets, parse_starting_offsets

if TYPE_CHECKING:
    from ._options import SourceOptions

__all__ = ["NEW_PARTITION_START", "DataLoss", "DataLossError", "Leader", "OffsetPlanner", "Position", "RangePlan",
           "TopicState", "plan_ranges", "positions_from_json", "positions_to_json"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Position:
    """Where a message begins in one partition, and how many were written before it."""

    offset: int
    count: int


@dataclass(frozen=True)
class DataLoss:
    """Messages skipped with ``failOnDataLoss=false``: offsets ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int
    messages: int


@dataclass(frozen=True)
class At:
    """A position asked for by time: the first message nsqd wrote at or after ``ms`` (milliseconds)."""

    ms: int


@dataclass(frozen=True)
class Leader:
    """The nsqd leading a partition: its TCP and HTTP addresses."""

    tcp: str
    http: str


@dataclass(frozen=True)
class TopicState:
    """Every available partition's leader and committed ends, whether the topic is an ext
    topic, and the partitions without a leader that answers now (with why)."""

    leaders: dict[int, Leader]
    ends: dict[int, PartitionEnds]
    ext: bool
    unavailable: dict[int, str] = field(default_factory=dict)


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
        """Leaders from the lookupd's write lookup (it names leaders only), each partition's
        committed end from its leader (:mod:`._committed`: never a write it may roll back).

        A partition is left out, in ``unavailable`` with the reason, while the lookupd names
        no leader of it (youzan's lookupd lists none from a leader's death until another node
        of its ISR leads it), while the node it names does not answer or does not (yet) lead
        it: the planner carries its position unchanged, it does not fail the query.
        """
        leaders, ext, partition_num = await self._lookup()
        unavailable = {p: "the lookupd lists no leader of it" for p in range(partition_num) if p not in leaders}
        ends: dict[int, PartitionEnds] = {}
        for http in sorted({leader.http for leader in leaders.values()}):
            mine = {p for p, leader in leaders.items() if leader.http == http}
            try:
                held = await self._http.partition_ends(http, self._options.topic)
                led = {p: e for p, e in held.items() if p in mine and e.leader}
                committed = await committed_ends(self._http, http, self._options.topic, led)
            except NSQError as exc:
                unavailable.update({p: f"its leader {http} does not answer ({exc})" for p in mine})
                continue
            for p in sorted(mine):
                if committed.get(p) is not None:
                    ends[p] = committed[p]  # type: ignore[assignment]
                elif p in led:
                    unavailable[p] = f"its leader {http} shows no committed message of it"
                else:
                    unavailable[p] = f"the node the lookupd names, {http}, does not lead it (yet)"
        if unavailable:
            logger.info("topic %s: partition(s) %s not advanced this batch: %s", self._options.topic,
                        sorted(unavailable), "; ".join(f"{p}: {why}" for p, why in sorted(unavailable.items())))
        return TopicState({p: leaders[p] for p in ends}, ends, ext, unavailable)

    async def leader(self, partition: int) -> Leader:
        """The leader of one partition now (a read task whose leader stopped answering asks this)."""
        leaders, _, _ = await self._lookup()
        if partition not in leaders:
            raise NSQError(f"topic {self._options.topic!r}: the lookupd lists no leader of partition {partition}")
        return leaders[partition]

    async def _lookup(self) -> tuple[dict[int, Leader], bool, int]:
        """(leaders by partition, ext topic, the topic's partition count from its meta)."""
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
                partition_num = result.meta.partition_num if result.meta is not None else 0
                if not result.is_ha or not (result.partitions or partition_num):
                    raise InvalidValueError(self._not_ha(address, result.is_ha))
                leaders = {p: Leader(node.address, node.http_address) for p, node in result.partitions.items()}
                return leaders, bool(result.meta and result.meta.extend_support), partition_num
        raise NSQError(f"no lookupd answered for topic {self._options.topic!r}: {'; '.join(errors)}")

    def _not_ha(self, address: str, is_ha: bool) -> str:
        """Why the lookupd's answer cannot be read by offsets: the topic is missing, or not HA."""
        topic = self._options.topic
        if is_ha:
            return (f"readMode=offsets: topic {topic!r} does not exist on lookupd {address} (it lists no partition "
                    "of it and has no meta for it): create it on the lookupd first (POST /topic/create)")
        return (f"readMode=offsets: lookupd {address} is not youzan's HA nsqlookupd (topic {topic!r}): upstream "
                "nsqd has no queue offsets; use readMode=partitioned or simple")

    # -- positions ----------------------------------------------------------------------

    async def initial(self, state: TopicState | None = None) -> dict[int, Position]:
        """The starting options as a position in every partition (``startingTimestamp`` first,
        then ``startingOffsetsByTimestamp``, then ``startingOffsets``: Spark's Kafka source's order)."""
        state = state or await self.complete_state()
        option, wanted = self._wanted(state, ending=False)
        return {p: await self._position(state, p, spec, option) for p, spec in sorted(wanted.items())}

    async def complete_state(self) -> TopicState:
        """The topic's state once every partition has a leader that answers (the starting and
        ending options are resolved once, for every partition): asked every second, for up to
        ``leaderWaitTimeoutMs``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.leader_wait_timeout
        while True:
            state = await self.topic_state()
            if not state.unavailable:
                return state
            if loop.time() >= deadline:
                raise NSQError(f"topic {self._options.topic!r}: partition(s) {sorted(state.unavailable)} had no "
                               f"leader that answers for {self._options.leader_wait_timeout:.0f} s (option "
                               f"'leaderWaitTimeoutMs'): " + "; ".join(f"{p}: {why}" for p, why in
                                                                       sorted(state.unavailable.items())))
            await asyncio.sleep(1.0)

    async def ending(self, state: TopicState | None = None, default: str | None = None) -> dict[int, Position] | None:
        """The ending options as a position in every partition (the first message not read), or
        None when none is given and no ``default``: ``endingTimestamp``, then
        ``endingOffsetsByTimestamp``, then ``endingOffsets``."""
        if not self._options.has_ending and default is None:
            return None
        state = state or await self.complete_state()
        option, wanted = self._wanted(state, ending=True, default=default)
        return {p: await self._position(state, p, spec, option) for p, spec in sorted(wanted.items())}

    def _wanted(self, state: TopicState, *, ending: bool,
                default: str | None = None) -> tuple[str, dict[int, int | At]]:
        """(the option that decides, {partition: offset, -2 / -1, or a time})."""
        o = self._options
        prefix = "ending" if ending else "starting"
        every = o.ending_timestamp if ending else o.starting_timestamp
        if every is not None:
            return f"{prefix}Timestamp", {p: At(every) for p in state.ends}
        by_time = o.ending_by_timestamp if ending else o.starting_by_timestamp
        if by_time is not None:
            option = f"{prefix}OffsetsByTimestamp"
            self._check_partitions(option, by_time, state)
            return option, {p: At(ms) for p, ms in by_time.items()}
        option = f"{prefix}Offsets"
        text = (o.ending_offsets or default or "latest") if ending else o.starting_offsets
        wanted = parse_ending_offsets(text) if ending else parse_starting_offsets(text)
        if isinstance(wanted, dict):
            self._check_partitions(option, wanted, state)
            return option, dict(wanted)
        return option, {p: -2 if wanted == "earliest" else -1 for p in state.ends}

    def _check_partitions(self, option: str, wanted: Mapping[int, Any], state: TopicState) -> None:
        unknown = sorted(set(wanted) - set(state.ends))
        if unknown:
            raise InvalidValueError(f"option {option!r} names partition(s) {unknown} that topic "
                                    f"{self._options.topic!r} does not have (it has {sorted(state.ends)})")
        missing = sorted(set(state.ends) - set(wanted))
        if missing:
            raise InvalidValueError(f"option {option!r} must give every partition of topic "
                                    f"{self._options.topic!r}: missing {missing}")

    async def _position(self, state: TopicState, partition: int, spec: int | At, option: str) -> Position:
        ends, leader = state.ends[partition], state.leaders[partition]
        if isinstance(spec, At):
            return await self._at_time(leader, ends, spec.ms)
        if spec == -1:
            return Position(ends.end, ends.count)
        if spec == -2:
            return await self._earliest(leader, ends)
        if spec < ends.start and option == "startingOffsets":
            return await self._before_start(leader, ends, spec)
        return await self._at_offset(leader, ends, spec, option)

    async def _before_start(self, leader: Leader, ends: PartitionEnds, offset: int) -> Position:
        """A starting offset that retention removed: DataLossError (failOnDataLoss=true), else the
        position planning then moves past what is gone, warning of it (as Spark's Kafka source
        does). The count before ``offset`` is known only at 0; elsewhere the skipped messages are
        not counted."""
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"topic {self._options.topic!r} partition {ends.partition}: offsets {offset}..{ends.start} are gone, "
                "removed by retention before they were read (option 'startingOffsets' names the first; option "
                "'failOnDataLoss'=true: set it to false to skip what is gone and read the rest)")
        earliest = await self._earliest(leader, ends)
        return Position(offset, 0 if offset == 0 else earliest.count)

    async def _at_time(self, leader: Leader, ends: PartitionEnds, ms: int) -> Position:
        """The first message written at or after ``ms`` (the partition's end if none): a binary
        search by count with ``GET /message/get``, whose answer has the message's timestamp
        (nanoseconds). nsqd's own search by time (``timestamp:<s>``) has whole seconds only."""
        first = await self._earliest(leader, ends)
        target = ms * 1_000_000
        low, high = first.count + 1, ends.count  # counts from 1
        found = Position(ends.end, ends.count)
        while low <= high:
            middle = (low + high) // 2
            offset, before, written = await self._http.message_record(
                leader.http, self._options.topic, ends.partition, count=middle)
            if written >= target:
                found, high = Position(offset, before), middle - 1
            else:
                low = middle + 1
        return found

    async def _earliest(self, leader: Leader, ends: PartitionEnds) -> Position:
        if ends.start >= ends.end:
            return Position(ends.end, ends.count)
        offset, before = await self._http.message_at(leader.http, self._options.topic, ends.partition,
                                                     count=0, offset=ends.start)
        return Position(offset, before)

    async def _at_offset(self, leader: Leader, ends: PartitionEnds, offset: int,
                         option: str = "startingOffsets") -> Position:
        if offset == ends.end:
            return Position(ends.end, ends.count)
        if not ends.start <= offset < ends.end:
            raise InvalidValueError(f"option {option!r}: partition {ends.partition} offset {offset} is outside "
                                    f"what the partition holds, {ends.start} to {ends.end}")
        found, before = await self._http.message_at(leader.http, self._options.topic, ends.partition,
                                                    count=0, offset=offset)
        if found != offset:
            raise InvalidValueError(f"option {option!r}: partition {ends.partition} offset {offset} is not "
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
        for partition in sorted(p for p in ends if ends[p].offset < origin[p].offset):
            logger.warning("topic %s partition %d: its leader's committed end %s is before where the query has "
                           "read to, %s (the leader lost messages it had committed?): not moved back",
                           self._options.topic, partition, ends[partition], origin[partition])
        backlog = {p: max(0, ends[p].count - origin[p].count) for p in ends if ends[p].offset > origin[p].offset}
        # A partition read before and without a leader now keeps its position: carried in every
        # batch's end offsets, it is read on from there when a leader is listed again.
        carried = {p: pos for p, pos in start.items() if p not in ends}
        total = sum(backlog.values())
        if max_rows is None or total <= max_rows:
            return {**carried, **{p: ends[p] if p in backlog else origin[p] for p in ends}}, state
        planned = dict(carried)
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


    # -- ranges ---------------------------------------------------------------------------

    async def replay(self, start: Mapping[int, Position],
                     end: Mapping[int, Position]) -> tuple[list[RangePlan], list[DataLoss], TopicState]:
        """The read tasks of a batch planned by an earlier run of the query, and the topic now."""
        state = await self.topic_state()
        plans, losses = await self.ranges(start, end, state)
        return plans, losses, state

    async def ranges(self, start: Mapping[int, Position], end: Mapping[int, Position],
                     state: TopicState | None) -> tuple[list[RangePlan], list[DataLoss]]:
        """The read tasks of ``start .. end``: one per partition with messages, moved past what
        retention removed (``failOnDataLoss``), then split to at least ``minPartitions``."""
        state = state or await self.topic_state()
        plans, losses = [], []
        for plan in plan_ranges(start, end, state):
            kept, loss = await self._after_retention(state, plan)
            if loss is not None:
                losses.append(loss)
            if kept is not None:
                plans.append(kept)
        if self._options.min_partitions is not None:
            plans = await self._split(state, plans, self._options.min_partitions)
        return plans, losses

    async def _after_retention(self, state: TopicState, plan: RangePlan) -> tuple[RangePlan | None, DataLoss | None]:
        ends = state.ends.get(plan.partition)
        if ends is None or ends.start <= plan.start.offset:
            return plan, None
        return await self.skip_lost(plan, ends)

    async def retained_rest(self, plan: RangePlan) -> RangePlan | None:
        """``plan`` as its leader holds it now (a read task asks this before each read): the
        same, or with failOnDataLoss=false what retention left of it (None: nothing)."""
        held = await self._http.partition_ends(plan.leader.http, self._options.topic)
        ends = held.get(plan.partition)
        if ends is None or ends.start <= plan.start.offset:
            return plan
        rest, _ = await self.skip_lost(plan, ends)
        return rest

    async def skip_lost(self, plan: RangePlan, ends: PartitionEnds) -> tuple[RangePlan | None, DataLoss]:
        """``plan`` without what the partition no longer holds (``ends.start`` is past its start):
        DataLossError with failOnDataLoss=true, else the rest of the range and what was skipped."""
        gone_to = min(ends.start, plan.end.offset)
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"topic {self._options.topic!r} partition {plan.partition}: offsets {plan.start.offset}..{gone_to} "
                f"(messages {plan.start.count + 1}..) are gone, removed by retention before they were read; the "
                f"partition now starts at offset {ends.start} (option 'failOnDataLoss'=true: set it to false to "
                "skip what is gone and read the rest)")
        if ends.start >= plan.end.offset:
            rest = None
            loss = DataLoss(plan.partition, plan.start.offset, plan.end.offset, plan.rows)
        else:
            offset, before = await self._http.message_at(plan.leader.http, self._options.topic, plan.partition,
                                                         count=0, offset=ends.start)
            rest = replace(plan, start=Position(offset, before))
            loss = DataLoss(plan.partition, plan.start.offset, offset, before - plan.start.count)
        logger.warning("topic %s partition %d: offsets %d..%d (%d messages) were removed by retention before they "
                       "were read; skipped (failOnDataLoss=false)", self._options.topic, loss.partition, loss.start,
                       loss.end, loss.messages)
        return rest, loss

    async def _split(self, state: TopicState, plans: list[RangePlan], wanted: int) -> list[RangePlan]:
        """Each range cut into parts in proportion to its rows (Spark's Kafka source's rule),
        every cut a message boundary (``GET /message/get`` by count)."""
        total = sum(plan.rows for plan in plans)
        if len(plans) >= wanted or total <= 0:
            return plans
        split: list[RangePlan] = []
        for plan in plans:
            parts = min(max(1, round(plan.rows / total * wanted)), max(plan.rows, 1))
            cuts = [plan.start]
            for k in range(1, parts):
                cut = await self._cut(state, plan.partition, plan.start, plan.end, k * plan.rows // parts)
                if cuts[-1].offset < cut.offset < plan.end.offset:
                    cuts.append(cut)
            cuts.append(plan.end)
            split.extend(replace(plan, start=a, end=b) for a, b in itertools.pairwise(cuts))
        return split


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
