"""Which of a producer's connections take no new publishes: the suspect ones and those on probation.

One job: the rule of issue 57 (a hung nsqd, a black hole, a lossy link refuse nothing; their
publishes just go unanswered). Read by the pool at each of its ticks, never per publish:

* **suspect**: a connection whose oldest unanswered command went out ``suspect_after``
  seconds ago. It stays suspect until it has answered every command it held then (its
  answers still come in order; those the producer sent elsewhere are ignored).
* **on probation**: a connection that answered again, and a new connection to an nsqd suspect
  within ``RECALL`` seconds (a lossy link's connection may die of it). It takes no publish
  until ``PROBES_IN_A_ROW`` handshakes on connections of their own (:mod:`.probe`, one every
  ``PROBE_INTERVAL`` s, run by the pool) were each answered within a quarter of
  ``suspect_after``: a link that still loses segments fails them (a retransmission costs at
  least 200 ms), so a lossy nsqd takes, and holds, nothing more while it is lossy. Before,
  a lossy nsqd answering late was used again at once, then after rests of 1, 2, 4... s with a
  small share on trial, and each new share it held past ``SLOW_HOLD`` was re-sent: 63-102
  duplicates in the bench's minute of 30 % loss, where only its first spell's (about 50 at
  200 publishes a second) are unavoidable.
* **re-sent once**: what a suspect connection holds is failed for the producer to send
  elsewhere at once in the first spell of a run (a hung or black-holed nsqd never answers it).
  An nsqd whose spell then ended with every held publish answered was slow, not dead: what was
  re-sent is there twice. In its later spells of the run, a held publish is re-sent only once
  it is ``SLOW_HOLD`` s old (half the ``publish_timeout`` if that is less, so that it is still
  re-sent within it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from ..config import LoggerLike

__all__ = ["PROBES_IN_A_ROW", "PROBE_INTERVAL", "RECALL", "SLOW_HOLD", "Suspects"]

#: Seconds within which an nsqd's suspect spells count as one run of them.
RECALL = 60.0
#: Probes answered in time, one after another, that end a probation. With 30 % of the
#: packets lost both ways, 54 of 200 probes passed on loopback (SYN, SYN-ACK, IDENTIFY and its
#: answer must all get through at once), never more than 3 in a row: 8 in a row is about
#: once in 36,000 tries, two and a half hours of probing.
PROBES_IN_A_ROW = 8
#: Seconds between the starts of an nsqd's probes while it is on probation: a clean nsqd is
#: back about 2 s after its link is.
PROBE_INTERVAL = 0.25
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
        #: How soon a probe's handshake must be answered to pass (by the kernel's clock), and
        #: how long a probe of an nsqd that does not answer lasts.
        self.probe_bound = suspect_after / 4
        self.probe_timeout = max(1.0, 2 * suspect_after)
        self._log = log
        #: Suspect connections, each with the count of answers it must reach to be healthy again.
        self.suspect: dict[Watched, int] = {}
        #: Connections on probation: out until their nsqd passes its probes.
        self.probation: set[Watched] = set()
        #: Every connection out of the rotation now (suspect or on probation).
        self.out: set[Watched] = set()
        self._passes: dict[str, int] = {}  # address -> probes passed in a row
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
            since = conn.unanswered_since()  # on probation too, when every connection is out and used
            if since is not None and now - since >= self.suspect_after:
                self.probation.discard(conn)
                self.suspect[conn] = conn.answered + conn.pending
                self._last_suspect[conn.address] = now
                changed = True
                self._log.warning("nsqd %s has not answered for %.1f s (suspect_after=%s): publishes go to "
                                  "the other connections while one answers", conn.address, now - since,
                                  self.suspect_after)
        if changed:
            self._out_changed()
        return changed

    def _recovered(self, conn: Watched, now: float) -> None:
        """``conn`` answered all it held when it turned suspect: on probation."""
        spells, last = self._spells.get(conn.address, (0, float("-inf")))
        self._spells[conn.address] = (spells + 1 if now - last < RECALL else 1, now)
        self._slow.add(conn.address)
        self._on_probation(conn)
        self._log.info("nsqd %s answers again: it takes publishes again once %d handshakes in a row are "
                       "answered within %.3f s", conn.address, PROBES_IN_A_ROW, self.probe_bound)

    def _on_probation(self, conn: Watched) -> None:
        self.probation.add(conn)
        self._passes[conn.address] = 0

    def probing(self) -> set[str]:
        """The nsqd to probe: those with a connection on probation."""
        return {conn.address for conn in self.probation}

    def probed(self, address: str, passed: bool) -> bool:
        """A probe of ``address`` ended; True when its connections joined the rotation."""
        if not passed:
            self._passes[address] = 0
            return False
        passes = self._passes.get(address, 0) + 1
        self._passes[address] = passes
        if passes < PROBES_IN_A_ROW:
            return False
        released = {conn for conn in self.probation if conn.address == address}
        if not released:
            return False
        self.probation -= released
        self._out_changed()
        self._log.info("nsqd %s answered %d handshakes in a row within %.3f s: it takes publishes again",
                       address, passes, self.probe_bound)
        return True

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
        """``conn`` opened: on probation if its nsqd was suspect within RECALL or is on
        probation now (True: the rotation changed)."""
        recent = now - self._last_suspect.get(conn.address, float("-inf")) < RECALL
        if not recent and conn.address not in self.probing():
            return False
        self._on_probation(conn)
        self._out_changed()
        return True

    def forget(self, conn: Watched) -> None:
        """``conn`` closed."""
        if conn in self.out:
            self.suspect.pop(conn, None)
            self.probation.discard(conn)
            self._out_changed()

    def _out_changed(self) -> None:
        self.out = set(self.suspect) | self.probation
