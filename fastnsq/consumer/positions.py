"""Where a consumer starts reading an HA partition: a time, a queue offset, a message count or the end.

One job: apply the ``consume_offset`` option once per partition, as youzan/go-nsq's
``Consumer.SetConsumeOffset`` does, and make what the server does with it visible.

How youzan's nsqd takes a start (youzan/nsq ``nsqdserver/protocol_v2.go`` internalSUB,
``nsqdserver/context.go`` SetChannelOffset; measured on 0.3.7-HA.1.13.0):

* ``SUB_ADVANCED <topic> <channel> <partition> <type>:<value>`` moves the channel there,
  but only when the subscriber is the channel's **first client**; otherwise it is
  ignored without a word. So before subscribing the consumer asks the partition's
  leader (its ``/stats``) how many clients the channel has, and records the answer in
  ``consumer.partitions[p].start_applied`` (and logs a warning when the start is ignored).
* With a start, the server does not read the partition argument (5 words instead of 4)
  and subscribes a partition of its own choosing among those the node leads. When the
  node leads several partitions of the topic the consumer therefore moves the channel
  with the leader's ``POST /channel/setoffset`` instead, then subscribes as usual.
* A channel that already had a backlog delivers the message its reader held before the
  move first. The consumer finishes such a message without handing it out when it
  precedes the start (an earlier offset or time, or, for the end, an offset before the
  partition's end at subscribe time) and counts it in ``partitions[p].start_skipped``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import InvalidValueError
from ..nsqd_http import NsqdHTTP, NsqdHTTPError

if TYPE_CHECKING:
    from ..topology import TopicRoute
    from .partitions import PartitionState

__all__ = ["ConsumeOffset", "StartPositions", "SubscribePlan", "parse_consume_offset"]

logger = logging.getLogger(__name__)

_MAX_I64 = 2**63 - 1


@dataclass(frozen=True)
class ConsumeOffset:
    """A start position for an HA partition (youzan/go-nsq ``ConsumeOffset``).

    >>> ConsumeOffset.timestamp(1700000000).wire, ConsumeOffset.end().wire
    ('timestamp:1700000000', 'special:-1')
    >>> ConsumeOffset.parse("virtual_queue:4096")
    ConsumeOffset(kind='virtual_queue', value=4096)
    """

    kind: str
    value: int

    KINDS: ClassVar[tuple[str, ...]] = ("timestamp", "virtual_queue", "msgcount", "special")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise InvalidValueError(f"consume_offset type {self.kind!r} is not one of {self.KINDS}")
        low = -1 if self.kind == "special" else 0
        if isinstance(self.value, bool) or not isinstance(self.value, int) or not low <= self.value <= _MAX_I64:
            raise InvalidValueError(f"consume_offset {self.kind} value must be an int in {low}..{_MAX_I64}, "
                                    f"got {self.value!r}")
        if self.kind == "special" and self.value != -1:
            raise InvalidValueError(f"consume_offset special value must be -1 (the end), got {self.value}")

    @classmethod
    def timestamp(cls, when: float | datetime) -> ConsumeOffset:
        """Messages published at or after the start of second ``when`` (seconds since the epoch,
        or an aware datetime); go-nsq's ``SetTime``. The server counts in whole seconds."""
        seconds = when.timestamp() if isinstance(when, datetime) else when
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise InvalidValueError(f"consume_offset timestamp must be seconds since the epoch, got {when!r}")
        return cls("timestamp", math.floor(seconds))

    @classmethod
    def virtual_queue(cls, offset: int) -> ConsumeOffset:
        """The first message at or after disk-queue ``offset`` of the partition (``message.offset``);
        go-nsq's ``SetVirtualQueueOffset``."""
        return cls("virtual_queue", offset)

    @classmethod
    def msg_count(cls, count: int) -> ConsumeOffset:
        """The ``count``-th message of the partition (1-based: 0 and 1 both mean its first retained)."""
        return cls("msgcount", count)

    @classmethod
    def end(cls) -> ConsumeOffset:
        """Only what is published from now on; go-nsq's ``SetToEnd``."""
        return cls("special", -1)

    @classmethod
    def parse(cls, text: str) -> ConsumeOffset:
        """``"<type>:<value>"`` as the server reads it (``timestamp:1700000000``, ``special:-1``)."""
        kind, sep, value = str(text).partition(":")
        try:
            number = int(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise InvalidValueError(f"consume_offset {text!r} is not '<type>:<integer>' with a type of {cls.KINDS}")
        return cls(kind, number)

    @property
    def wire(self) -> str:
        return f"{self.kind}:{self.value}"

    def precedes(self, message: Any, end_offset: int | None) -> bool:
        """Whether ``message`` comes before this start (the reader's held message, see the module)."""
        offset = message.offset
        if self.kind == "virtual_queue":
            return offset is not None and offset < self.value
        if self.kind == "timestamp":
            return bool(message.timestamp < self.value * 1_000_000_000)
        if self.kind == "special":
            return offset is not None and end_offset is not None and offset < end_offset
        return False  # msgcount: the message carries no count to compare


#: The key of a start given for every partition.
ALL_PARTITIONS = -1


def parse_consume_offset(option: Any) -> dict[int, ConsumeOffset]:
    """The ``consume_offset`` option: a start for every partition, or ``{partition: start}``.

    A start may be a :class:`ConsumeOffset` or its text (``"timestamp:1700000000"``).
    """
    if option is None:
        return {}
    if isinstance(option, Mapping):
        starts = {}
        for partition, start in option.items():
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise InvalidValueError(f"consume_offset keys are partitions (ints >= 0), got {partition!r}")
            starts[partition] = _one(start)
        return starts
    return {ALL_PARTITIONS: _one(option)}


def _one(start: Any) -> ConsumeOffset:
    if isinstance(start, ConsumeOffset):
        return start
    if isinstance(start, str):
        return ConsumeOffset.parse(start)
    raise InvalidValueError(f"consume_offset must be a ConsumeOffset or 'type:value' text, got {start!r}")


@dataclass(frozen=True)
class SubscribePlan:
    """How to subscribe one connection: SUB_ADVANCED, with which start position."""

    advanced: bool = False
    position: str | None = None


class StartPositions:
    """The starts still to apply, one per partition, and the check of each held message.

    ``nsqd_http`` asks the partitions' leaders; ``trace``: subscribe with SUB_ADVANCED anyway.
    """

    def __init__(
        self, starts: dict[int, ConsumeOffset], topic: str, channel: str, *, ordered: bool, trace: bool
    ) -> None:
        self._starts = starts
        self._default = starts.pop(ALL_PARTITIONS, None)
        self._done: set[int] = set()
        self.topic = topic
        self.channel = channel
        self.ordered = ordered
        self.trace = trace
        self._http: NsqdHTTP | None = None
        #: Partitions whose held messages are still checked against their start.
        self.checking: dict[int, tuple[ConsumeOffset, int | None]] = {}

    @property
    def wanted(self) -> bool:
        return bool(self._starts) or self._default is not None

    def start_of(self, partition: int | None) -> ConsumeOffset | None:
        """The start still to apply to ``partition`` (None: none, or it was applied)."""
        if partition is None or partition in self._done:
            return None
        return self._starts.get(partition, self._default)

    async def plan(
        self, partition: int | None, node_http: str | None, route: TopicRoute | None, state: PartitionState
    ) -> SubscribePlan:
        """Decide (and, for a node leading several partitions, do) the start of ``partition``."""
        start = self.start_of(partition)
        if start is None or partition is None:
            return SubscribePlan(advanced=self.trace)
        state.start = start
        if node_http is None:  # a direct endpoint: only the server knows if it takes the start
            state.start_applied = None
            return SubscribePlan(advanced=True, position=start.wire)
        http = self._http or NsqdHTTP()
        self._http = http
        channel = await http.channel_state(node_http, self.topic, partition, self.channel)
        if channel.clients:
            state.start_applied = False
            logger.warning(
                "%s/%s partition %d: the channel has %d client(s) already, so nsqd ignores the start %s "
                "(it takes only the channel's first client's)", self.topic, self.channel, partition,
                channel.clients, start.wire)
            return SubscribePlan(advanced=self.trace)
        state.start_applied = True
        self.checking[partition] = (start, channel.end_offset)
        if not self.ordered and _leads_only(route, partition):
            return SubscribePlan(advanced=True, position=start.wire)
        # SUB_ADVANCED with a start would land on another partition of this node (module docstring).
        await http.create_channel(node_http, self.topic, partition, self.channel)
        await http.set_channel_offset(node_http, self.topic, partition, self.channel, start.wire)
        # SUB_ADVANCED without a start (4 words: the partition is read) for the offsets the
        # held message is checked by, as the SUB_ADVANCED with a start would give.
        return SubscribePlan(advanced=True)

    def subscribed(self, partition: int | None) -> None:
        """The SUB went through: this partition's start is not sent again (reconnects go on from
        where the channel is, as go-nsq's)."""
        if partition is not None and self.start_of(partition) is not None:
            self._done.add(partition)

    def failed(self, partition: int | None) -> None:
        """The SUB failed: the start is tried again with the next connection."""
        if partition is not None:
            self.checking.pop(partition, None)

    def held_before_start(self, partition: int | None, message: Any) -> bool:
        """Whether ``message`` is the reader's held message from before the start (finish it unseen).

        Checking stops at the first message that does not precede the start."""
        check = self.checking.get(partition)  # type: ignore[arg-type]
        if check is None:
            return False
        start, end_offset = check
        if start.precedes(message, end_offset):
            return True
        del self.checking[partition]  # type: ignore[arg-type]
        return False

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def _leads_only(route: TopicRoute | None, partition: int) -> bool:
    """Whether the leader of ``partition`` leads no other partition of the topic."""
    if route is None:
        return True
    leader = route.partitions.get(partition)
    return sum(1 for address in route.partitions.values() if address == leader) <= 1


__all__ += ["ALL_PARTITIONS", "NsqdHTTPError"]
