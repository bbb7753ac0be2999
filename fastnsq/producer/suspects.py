"""Which of a producer's connections take no new publishes: the suspect ones and those resting.

One job: the rule of issue 57 (a hung nsqd, a black hole, a lossy link refuse nothing; their
publishes just go unanswered). Read by the pool at each of its ticks, never per publish:

* **suspect**: a connection whose oldest unanswered command went out ``suspect_after``
  seconds ago. It stays suspect until it has answered every command it held then (its
  answers still come in order; those the producer sent elsewhere are ignored).
* **resting**: a connection that answered again, of an nsqd that was suspect before within
  ``RECALL`` seconds (a lossy link answers late over and over): it stays out 1 s, then 2, 4...
  up to ``MAX_REST`` s, so that such an nsqd does not get, and lose to a reroute, a new share
  of publishes every second. The first recovery of a while rests 0 s (a nsqd that hung once
  is used again as soon as it answers).
* **on trial**: after a rest, ``TRIAL`` seconds with a small share of the publishes (the pool
  gives each healthy connection ``TRIAL_WEIGHT`` turns for its one): if the link is still bad,
  the next suspect spell holds, and reroutes, few publishes. A new connection to an nsqd
  suspect within ``RECALL`` s starts on trial too (a lossy link's connection may die of it:
  its successor would otherwise take a full share and re-send it all at its first spell).
* **re-sent once**: what a suspect connection holds is failed for the producer to send
  elsewhere at once in the first spell of a run (a hung or black-holed nsqd never answers it).
  An nsqd whose spell then ended with every held publish answered was slow, not dead: what was
  re-sent is there twice. In its later spells of the run, a held publish is re-sent only once
  it is ``SLOW_HOLD`` s old (half the ``publish_timeout`` if that is less, so that it is still
  re-sent within it): a lossy link that turns suspect over and over no longer re-sends, and
  duplicates, what it holds each time (issue 57: 164 duplicates in a minute of 30 % loss;
  with a hold of twice the slowest answer, at most 2 s, still 119: TCP's retransmissions
  of a lossy link answer 1-3 s late). It holds little meanwhile: it rests, then is on trial.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from ..config import LoggerLike

__all__ = ["MAX_REST", "RECALL", "SLOW_HOLD", "TRIAL", "TRIAL_WEIGHT", "Suspects"]

#: Seconds within which an nsqd's suspect spells count as one run of them.
RECALL = 60.0
#: The longest rest (seconds) of an nsqd that keeps falling suspect.
MAX_REST = 30.0
#: Seconds a connection back from a rest is on trial.
TRIAL = 5.0
#: Turns of each healthy connection for one of a connection on trial.
TRIAL_WEIGHT = 9
#: An nsqd proven slow, not dead: a held publish is re-sent once it is this many seconds old
#: (well within publish_timeout; beyond TCP's third retransmission, 0.2 + 0.4 + 0.8 s on loopback).
SLOW_HOLD = 3.0


class Watched(Protocol):
    """What the rule reads of a connection (``fastnsq.conn.Connection`` has it)."""

    address: str
    is_ha: bool

    @property
    def answered(self) -> int: ...

    @property
    def pending(self) -> int: ...

    def unanswered_since(self) -> float | None: ...

    def expire_pending(self, written_before: float, error: Callable[[], BaseException]) -> int: ...


class Suspects:
    """The connections out of the rotation, on the clock of the connections' write marks."""

    def __init__(self, suspect_after: float, log: LoggerLike, publish_timeout: float = 10.0) -> None:
        self.suspect_after = suspect_after
        #: How old a slow nsqd's held publish gets before it is re-sent: SLOW_HOLD, or half the
        #: publish_timeout when that is shorter (else it would fail at its deadline instead).
        self.slow_hold = min(SLOW_HOLD, publish_timeout / 2)
        self._log = log
        #: Suspect connections, each with the count of answers it must reach to be healthy again.
        self.suspect: dict[Watched, int] = {}
        #: Resting connections, each with the time it takes publishes again.
        self.resting: dict[Watched, float] = {}
        #: Connections on trial, each with the time its trial ends.
        self.trial: dict[Watched, float] = {}
        #: Every connection out of the rotation now (suspect or resting).
        self.out: set[Watched] = set()
        self._spells: dict[str, tuple[int, float]] = {}  # address -> (spells in a row, when the last ended)
        #: The nsqd whose spell of this run ended with all it held answered: slow, not dead.
        self._slow: set[str] = set()
        self._last_suspect: dict[str, float] = {}  # address -> when a connection to it last turned suspect

    def check(self, conns: Iterable[Watched], now: float) -> bool:
        """Look at each open connection; True when a connection left or joined the rotation."""
        changed = False
        for conn in conns:
            awaited = self.suspect.get(conn)
            if awaited is not None:
                if conn.answered >= awaited:
                    del self.suspect[conn]
                    self._recovered(conn, now)
                    changed = True
                continue
            until = self.resting.get(conn)
            if until is not None:
                if now >= until:
                    del self.resting[conn]
                    self.trial[conn] = now + TRIAL
                    changed = True
                continue
            until = self.trial.get(conn)
            if until is not None and now >= until:
                del self.trial[conn]
                changed = True
            since = conn.unanswered_since()
            if since is not None and now - since >= self.suspect_after:
                self.trial.pop(conn, None)
                self.suspect[conn] = conn.answered + conn.pending
                self._last_suspect[conn.address] = now
                changed = True
                self._log.warning("nsqd %s has not answered for %.1f s (suspect_after=%s): publishes go to "
                                  "the other connections while one answers", conn.address, now - since,
                                  self.suspect_after)
        if changed:
            self.out = set(self.suspect) | set(self.resting)
        return changed

    def _recovered(self, conn: Watched, now: float) -> None:
        """``conn`` answered all it held when it turned suspect."""
        spells, last = self._spells.get(conn.address, (0, float("-inf")))
        spells = spells + 1 if now - last < RECALL else 1
        self._spells[conn.address] = (spells, now)
        self._slow.add(conn.address)
        rest = 0.0 if spells == 1 else min(MAX_REST, 2.0 ** (spells - 2))
        if rest:
            self.resting[conn] = now + rest
            self._log.info("nsqd %s answers again; suspect %d times within %.0f s: it rests %.0f s",
                           conn.address, spells, RECALL, rest)
        else:
            self._log.info("nsqd %s answers again: it takes publishes again", conn.address)

    def reroute(self, now: float, error: Callable[[], BaseException]) -> int:
        """Fail the commands the suspect connections hold (the producer sends them elsewhere):
        all of them, or of an nsqd proven slow, those :meth:`hold` old. Not an HA nsqd's:
        its publishes go to a partition's leader, which no other nsqd is."""
        return sum(conn.expire_pending(now - self.hold(conn.address, now), error)
                   for conn in self.suspect if not conn.is_ha)

    def hold(self, address: str, now: float) -> float:
        """How old a publish held by a suspect connection to ``address`` gets before it is re-sent:
        0, or ``slow_hold`` for an nsqd whose earlier spell of this run ended answered."""
        if address not in self._slow:
            return 0.0
        if now - self._spells[address][1] >= RECALL:  # a new run: it may be hung this time
            self._slow.discard(address)
            return 0.0
        return self.slow_hold

    def joined(self, conn: Watched, now: float) -> bool:
        """``conn`` opened: on trial if its nsqd was suspect within RECALL (True: the rotation changed)."""
        if now - self._last_suspect.get(conn.address, float("-inf")) >= RECALL:
            return False
        self.trial[conn] = now + TRIAL
        return True

    def forget(self, conn: Watched) -> None:
        """``conn`` closed."""
        self.trial.pop(conn, None)
        if conn in self.out:
            self.suspect.pop(conn, None)
            self.resting.pop(conn, None)
            self.out = set(self.suspect) | set(self.resting)
