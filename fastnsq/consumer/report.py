"""What ``Consumer.stop()`` reports."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StopReport"]


@dataclass
class StopReport:
    """What ``Consumer.stop()`` did."""

    finished: int = 0  # messages finished while draining
    requeued: int = 0  # messages requeued while draining (by handlers, or by stop at the deadline)
    abandoned: int = 0  # messages unanswered at the deadline (by handlers or in batches): stop requeued them
    timed_out: bool = False  # the deadline passed with messages still unanswered
    duration: float = 0.0
