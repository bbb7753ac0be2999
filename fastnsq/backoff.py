"""Backoff as the NSQ client guide defines it: levels, waits and the probe, per scope.

One job: decide, for one *scope* (a whole consumer as in go-nsq, or one partition as in
youzan's ``RequeueBackoffSingleConn``), whether it is consuming normally, waiting out a
backoff, or probing with a single message, from the results of its messages. A failure
starts a wait; when it ends one message is let through one connection (the probe); only
the probe's result moves the level: a success lowers it, a failure raises it and waits
longer. :class:`fastnsq.rdy.RdyController` turns the phases into RDY counts; this module
knows nothing of RDY or connections beyond the probe's identity.

>>> policy = BackoffPolicy("exponential", max_backoff_duration=120.0, multiplier=1.0)
>>> scope = BackoffState()
>>> scope.count("conn-a", b"id-1", Outcome.FAILURE, now=0.0, policy=policy)
True
>>> scope.phase, scope.level, scope.wait_until
(<Phase.WAITING: 'waiting'>, 1, 2.0)
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Hashable
from typing import Any, Literal

__all__ = ["MAX_BACKOFF_LEVEL", "STRATEGIES", "BackoffPolicy", "BackoffState", "BackoffStrategy", "Outcome", "Phase"]

#: ``"exponential"`` (go-nsq: multiplier x 2^level), ``"full_jitter"`` (a random part of that),
#: ``"linear"`` (multiplier x level: the small steps of pynsq's timer) or a callable mapping a
#: backoff level (1, 2, ...) to seconds.
BackoffStrategy = Literal["exponential", "full_jitter", "linear"] | Callable[[int], float]
#: The strategies named by a string.
STRATEGIES = ("exponential", "full_jitter", "linear")

#: Absolute cap on the backoff level, for strategies that never reach max_backoff_duration.
MAX_BACKOFF_LEVEL = 64


class Outcome(enum.Enum):
    """What became of a message, as far as backoff is concerned."""

    #: FIN: the handler succeeded.
    SUCCESS = "success"
    #: REQ with backoff: the handler failed; the consumer should slow down.
    FAILURE = "failure"
    #: REQ without backoff (``requeue(backoff=False)``), or no verdict: never counted.
    NEUTRAL = "neutral"


class Phase(enum.Enum):
    NORMAL = "normal"  # backoff level 0: consuming normally
    WAITING = "waiting"  # backoff: nothing is delivered until the wait ends
    PROBING = "probing"  # backoff: one message through the probe connection, waiting for its result


_NO_MSG = object()  # the probe message has not arrived yet


class BackoffPolicy:
    """How long each backoff level waits (the same for every scope of a consumer)."""

    def __init__(
        self,
        strategy: BackoffStrategy,
        *,
        max_backoff_duration: float,
        multiplier: float,
        rng: random.Random | None = None,
    ) -> None:
        self.strategy = strategy
        self.max_backoff_duration = max_backoff_duration
        self.multiplier = multiplier
        self.rng = rng if rng is not None else random.Random()

    @property
    def enabled(self) -> bool:
        """``max_backoff_duration`` 0 disables backoff."""
        return self.max_backoff_duration > 0

    def duration(self, level: int) -> float:
        """The wait at ``level`` (full jitter draws it anew each time)."""
        if self.strategy == "exponential":
            return min(self.multiplier * 2.0**level, self.max_backoff_duration)
        if self.strategy == "full_jitter":
            return self.rng.uniform(0.0, min(self.multiplier * 2.0**level, self.max_backoff_duration))
        if self.strategy == "linear":
            return min(self.multiplier * level, self.max_backoff_duration)
        return self._clamp(self.strategy(level))

    def can_deepen(self, level: int) -> bool:
        """Stop deepening once the wait has reached max_backoff_duration: one success then shortens it."""
        return level < MAX_BACKOFF_LEVEL and self._ceiling(level) < self.max_backoff_duration

    def _ceiling(self, level: int) -> float:
        if callable(self.strategy):
            return self._clamp(self.strategy(level))
        if self.strategy == "linear":
            return self.multiplier * level
        return self.multiplier * 2.0**level

    def _clamp(self, seconds: float) -> float:
        seconds = float(seconds)
        if math.isnan(seconds):
            return self.max_backoff_duration
        return min(max(seconds, 0.0), self.max_backoff_duration)


class BackoffState:
    """The backoff of one scope: its phase and level, the wait, the probe.

    ``probe`` is the connection record chosen to carry the probe message (its
    ``conn_id`` identifies it); the controller chooses it, this state forgets it
    when the phase changes.
    """

    __slots__ = ("level", "phase", "probe", "probe_msg", "wait_until")

    def __init__(self) -> None:
        self.phase = Phase.NORMAL
        self.level = 0
        self.wait_until: float | None = None
        self.probe: Any = None
        self.probe_msg: object = _NO_MSG

    @property
    def waiting_for_probe_message(self) -> bool:
        """Probing, with the probe message not arrived yet."""
        return self.phase is Phase.PROBING and self.probe_msg is _NO_MSG

    def on_message(self, record: Any, msg_id: Hashable) -> None:
        """A message arrived on ``record``: the probe message, if the probe was waiting for one."""
        if record is self.probe and self.probe_msg is _NO_MSG and self.phase is Phase.PROBING:
            self.probe_msg = msg_id

    def drop_probe(self, record: Any) -> None:
        """``record``'s connection is gone: if it was the probe, another will be chosen."""
        if record is self.probe:
            self.probe = None
            self.probe_msg = _NO_MSG

    def reset(self) -> None:
        """Back to normal consumption at once (a ready check passed: the cause is gone)."""
        self.phase, self.level, self.wait_until = Phase.NORMAL, 0, None
        self.probe, self.probe_msg = None, _NO_MSG

    def set_probe(self, record: Any) -> None:
        self.probe = record
        self.probe_msg = _NO_MSG

    def count(self, conn_id: Hashable, msg_id: Hashable, outcome: Outcome, now: float, policy: BackoffPolicy) -> bool:
        """Apply one message's result; True if the phase or level changed what may be delivered."""
        if not policy.enabled:
            return False
        if self.phase is Phase.NORMAL:
            if outcome is Outcome.FAILURE:
                self.level = 1
                self._start_wait(now, policy)
                return True
            return False
        if self.phase is Phase.WAITING:
            return False  # results that arrive while waiting belong to no window
        # PROBING: only the probe message's own result counts.
        probe = self.probe
        if probe is None or probe.conn_id != conn_id or self.probe_msg is _NO_MSG or msg_id != self.probe_msg:
            return False
        self.probe_msg = _NO_MSG
        if outcome is Outcome.NEUTRAL:
            return True  # no verdict: the next message on the probe connection is the new probe
        if outcome is Outcome.SUCCESS:
            self.level -= 1
            if self.level == 0:
                self.phase = Phase.NORMAL
                self.probe = None
                return True
        elif policy.can_deepen(self.level):
            self.level += 1
        self._start_wait(now, policy)
        return True

    def wait_left(self, now: float) -> float | None:
        """Seconds until the wait ends (None: not waiting)."""
        return None if self.wait_until is None else self.wait_until - now

    def tick(self, now: float) -> None:
        """End the wait if it is over: probing starts."""
        if self.phase is Phase.WAITING and self.wait_until is not None and now >= self.wait_until:
            self.phase = Phase.PROBING
            self.wait_until = None

    def _start_wait(self, now: float, policy: BackoffPolicy) -> None:
        self.phase = Phase.WAITING
        self.probe = None
        self.probe_msg = _NO_MSG
        self.wait_until = now + policy.duration(self.level)
