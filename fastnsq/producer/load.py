"""Per-node producer figures, and the load-aware choice of a partition that uses them.

One job: youzan/go-nsq's ``producerLoadComputer`` and ``PubDynamicLoad`` (``producer.go``
getProducer, producerPool.IsLessLoad, TopicProducerMgr.Stat):

* per nsqd, the publishes waiting for an answer (``pending``: commands written and not yet
  answered on its connections, an MPUB counting once) and the average round trip of the
  publishes it answered (``avg_rt``: each new one weighs a fifth, as go-nsq's);
* ``pub_strategy="dynamic_load"``: a publish that names no partition and no sharding key
  looks at the next two partitions in turn and takes the one whose leader has fewer
  publishes pending, then the lower average round trip. The default stays
  ``"round_robin"`` (fastnsq's, and go-nsq's PubRR; go-nsq v1.7.2 defaults to dynamic load).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidValueError

__all__ = ["PUB_STRATEGIES", "LoadAware", "NodeLoads", "NodeStats", "pub_strategy"]

#: The strategies, with go-nsq's numbers (``PubStrategy``: 0 PubRR, 1 PubDynamicLoad).
PUB_STRATEGIES = {"round_robin": 0, "dynamic_load": 1}


def pub_strategy(value: Any) -> str:
    """The ``pub_strategy`` option: a name, or go-nsq's number."""
    for name, number in PUB_STRATEGIES.items():
        if value == name or (isinstance(value, int) and not isinstance(value, bool) and value == number):
            return name
    raise InvalidValueError(f"pub_strategy must be one of {sorted(PUB_STRATEGIES)} (or go-nsq's 0/1), got {value!r}")


@dataclass(frozen=True)
class NodeStats:
    """One nsqd as the producer sees it (go-nsq's ``ProducerStat``, and what fastnsq adds)."""

    address: str
    pending: int  # commands written and not answered yet
    avg_rt: float  # seconds, the running average of the answered ones (0.0: none yet)
    answered: int  # publish commands answered (an MPUB counts once)
    connections: int


class NodeLoads:
    """Round trips per nsqd; ``pending_of(address)`` reads the pending commands from the pool."""

    def __init__(self, pending_of: Callable[[str], int]) -> None:
        self._pending_of = pending_of
        self._avg: dict[str, float] = {}
        self._answered: dict[str, int] = {}

    def record(self, address: str, seconds: float) -> None:
        last = self._avg.get(address)
        self._avg[address] = seconds if last is None else (last * 4 + seconds) / 5
        self._answered[address] = self._answered.get(address, 0) + 1

    def count(self, address: str) -> None:
        """One more command answered at ``address``, not timed (the producer's fast paths)."""
        self._answered[address] = self._answered.get(address, 0) + 1

    def pending(self, address: str) -> int:
        return self._pending_of(address)

    def avg_rt(self, address: str) -> float:
        return self._avg.get(address, 0.0)

    def answered(self, address: str) -> int:
        return self._answered.get(address, 0)

    def less_loaded(self, a: str, b: str) -> bool:
        """go-nsq's IsLessLoad: fewer pending, then the lower average round trip."""
        pa, pb = self.pending(a), self.pending(b)
        if pa != pb:
            return pa < pb
        return self.avg_rt(a) < self.avg_rt(b)


class LoadAware:
    """Takes turns over a topic's partitions two at a time and keeps the less loaded leader's.

    >>> loads = NodeLoads(lambda address: {"a": 3, "b": 0}[address])
    >>> choose = LoadAware(loads)
    >>> choose.next_of((0, 1), {0: "a", 1: "b"})
    1
    """

    __slots__ = ("_loads", "_turn")

    def __init__(self, loads: NodeLoads) -> None:
        self._loads = loads
        self._turn = -1

    def next_of(self, pids: Sequence[int], leaders: Any) -> int:
        self._turn = (self._turn + 1) % len(pids)
        first = pids[self._turn]
        if len(pids) < 2:
            return first
        second = pids[(self._turn + 1) % len(pids)]
        a, b = leaders[first], leaders[second]
        return second if a != b and self._loads.less_loaded(b, a) else first
