"""When a connection's commands went out: one mark per write, for ``publish_timeout`` and round trips.

nsqd answers in command order, so a write is known by how many commands were expected up to it
(answered + unanswered then): the commands of one write are answered together, and those written
before a moment are the oldest unanswered ones. One entry per write rather than per command, and
nothing kept once answered. The clock is ``time.perf_counter()``, not the loop's: uvloop's is in ms,
cached per pass.
"""

from __future__ import annotations

import time
from collections import deque


class WriteMarks:
    """The marks of one connection; ``answered`` is always the connection's count of answers so far."""

    __slots__ = ("_expired_upto", "_marks", "marked")

    def __init__(self) -> None:
        self.marked = 0  # commands expected up to the last mark (callers skip mark() when none is new)
        self._marks: deque[tuple[int, float]] = deque()
        self._expired_upto = 0  # commands up to here were already failed by expired()

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, expected: int, answered: int) -> None:
        """A write went out carrying the commands up to ``expected``."""
        self.marked = expected
        marks = self._marks
        while marks and marks[0][0] <= answered:
            marks.popleft()  # everything written up to it has been answered
        marks.append((expected, time.perf_counter()))

    def answered_write(self, answered: int) -> float | None:
        """The seconds since the oldest write whose commands are now all answered (taken), else None."""
        marks = self._marks
        if marks and marks[0][0] <= answered:
            return time.perf_counter() - marks.popleft()[1]
        return None

    def unanswered_since(self, answered: int) -> float | None:
        """When the oldest write with a command still unanswered went out; None: none is."""
        for expected, written in self._marks:
            if expected > answered:
                return written
        return None

    def expired(self, written_before: float, answered: int) -> tuple[int, int]:
        """The commands written before ``written_before`` and not failed by an earlier call, as
        (first, end) counts of commands: the caller fails those of them still unanswered."""
        upto = self._expired_upto
        marks = self._marks
        while marks and marks[0][1] < written_before:
            upto = max(upto, marks.popleft()[0])
        start = max(self._expired_upto, answered)
        self._expired_upto = upto
        return start, upto

    def clear(self) -> None:
        self._marks.clear()
