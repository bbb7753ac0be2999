"""What a consumer knows of each partition it reads: position, order, repeats, backoff, pause.

One :class:`PartitionState` per partition subscribed (``None``: the connections without a
partition, i.e. an upstream nsqd's topic), owned by the consumer. The backoff figures are
read from the RDY controller (:mod:`fastnsq.rdy`), which keys its connections by partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..rdy import RdyController

__all__ = ["PartitionState", "Partitions"]

@dataclass(eq=False)
class PartitionState:
    """One partition of the consumer's topic (or, as ``partition=None``, the whole upstream topic).

    ``last_id`` / ``last_offset``: the highest internal id and queue offset delivered for the
    first time (HA, ordered or traced subscriptions carry them); ``ordering_errors``: every
    regression seen (ordered consumption); ``duplicates_dropped``: repeated deliveries of the
    head of an ordered channel that were not handed out again.

    HA starts (``consume_offset``, :mod:`.positions`): ``start`` is the position asked for,
    ``start_applied`` whether nsqd took it (False: the channel had clients already, so the
    server ignored it; None: not known, a direct endpoint), ``start_skipped`` the messages
    held from before the start that were finished unseen. ``decompress_errors``: bodies
    marked as compressed that could not be decompressed (requeued).
    """

    partition: int | None
    _rdy: RdyController = field(repr=False)
    last_id: int | None = None
    last_offset: int | None = None
    ordering_errors: list[str] = field(default_factory=list)
    duplicates_dropped: int = 0
    start: Any = None
    start_applied: bool | None = None
    start_skipped: int = 0
    decompress_errors: int = 0
    # Ordered: the last message delivered, and whether it was finished (Dispatcher.repeated).
    last_delivered: Any = field(default=None, repr=False)
    last_finished: bool = field(default=False, repr=False)
    # Ordered: the id of a repeated head finished twice, whose one E_FIN_FAILED is expected.
    finished_twice: bytes | None = field(default=None, repr=False)

    @property
    def backoff_level(self) -> int:
        """The backoff level in force for this partition (consumer-wide unless backoff_scope="partition")."""
        return self._rdy.backoff_level_of(self.partition)

    @property
    def backoff_until(self) -> float | None:
        """When this partition's backoff wait ends (``time.monotonic()`` clock), or None."""
        return self._rdy.backoff_until_of(self.partition)

    @property
    def paused(self) -> bool:
        return self._rdy.is_paused(self.partition)

    def check_order(self, message: Any) -> str | None:
        """Ordered consumption: internal ids and offsets only grow within a partition.

        Records the message's position; returns (and keeps) a description of a regression.
        A redelivery (attempts > 1) may go back and is no regression.
        """
        current = (message.internal_id or 0, message.offset or 0)
        last = None if self.last_id is None else (self.last_id, self.last_offset or 0)
        problem = None
        if last is not None and message.attempts == 1 and (current[0] < last[0] or current[1] < last[1]):
            problem = (
                f"partition {self.partition}: message id {current[0]} offset {current[1]} arrived after "
                f"id {last[0]} offset {last[1]}"
            )
            self.ordering_errors.append(problem)
        if last is None or current > last:
            self.last_id, self.last_offset = current
        return problem


class Partitions(Mapping[int | None, PartitionState]):
    """The consumer's :class:`PartitionState` objects, one per partition subscribed so far: a
    read-only mapping of partition (None: an upstream nsqd's topic) to its state.

    ``consumer.partitions[3].backoff_level``; ``.items()`` / ``.values()`` for all of them.
    """

    def __init__(self, rdy: RdyController) -> None:
        self._rdy = rdy
        self._states: dict[int | None, PartitionState] = {}

    def state(self, partition: int | None) -> PartitionState:
        """The state of ``partition``, made on first use (the consumer's own access)."""
        state = self._states.get(partition)
        if state is None:
            state = self._states[partition] = PartitionState(partition, self._rdy)
        return state

    def __getitem__(self, partition: int | None) -> PartitionState:
        """KeyError for a partition never subscribed."""
        return self._states[partition]

    def __iter__(self) -> Iterator[int | None]:
        return iter(list(self._states))  # a copy: a partition subscribed meanwhile is no error

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, partition: object) -> bool:
        return partition in self._states

    @property
    def ordering_errors(self) -> list[str]:
        return [problem for state in self.values() for problem in state.ordering_errors]

    @property
    def duplicates_dropped(self) -> int:
        return sum(state.duplicates_dropped for state in self.values())
