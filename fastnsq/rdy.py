"""RDY distribution and backoff for a consumer, as a pure state machine.

One job: decide which RDY count each nsqd connection of a consumer should hold.
:class:`RdyController` owns no sockets, tasks or timers. The consumer feeds it
events (a connection came or went, a message arrived, a message was finished or
requeued, ``max_in_flight`` changed), sends the :class:`RdyUpdate` commands each
call returns, and calls :meth:`RdyController.tick` at the time
:meth:`RdyController.next_deadline` names. Time comes from an injectable clock and
randomness from an injectable :class:`random.Random`, so every behaviour can be
tested with a fake clock and a seed.

How nsqd treats RDY (nsqd 1.x and the HA nsqd alike): ``RDY n`` is an absolute
value. The server sends a message on a connection while its own count of that
connection's in-flight messages is below ``n``; FIN, REQ and message timeouts
lower that count. The server applies a connection's commands in order but never
acknowledges a RDY. The controller therefore tracks, per connection:

``rdy``
    the last RDY value sent;
``in_flight``
    messages received and not yet finished or requeued (the consumer reports
    them with :meth:`~RdyController.on_message_done` when it sends FIN or REQ);
``pending``
    how many more messages may still arrive under RDY values that were replaced
    by a lower one before the server read the new one. Lowering ``r`` to ``w``
    with ``f`` in flight lets at most ``r - f`` more messages arrive: FINs sent
    after the new RDY are read after it, so they free nothing under the old
    value. ``pending`` shrinks by one per message received and is dropped after
    ``rdy_settle_time`` (the time the server is assumed to need to read a RDY;
    0 trusts it to be instant, as go-nsq and pynsq do).

and its *capacity*, the most messages it can hold without another RDY command::

    capacity = max(rdy, in_flight + pending)

**Invariant.** A RDY is only ever raised when the sum of all capacities (plus the
messages still in flight on connections already removed) stays within
``max_in_flight``. Lowering never frees capacity at once: it shrinks as
``pending`` is used up or expires and as messages finish. So, if every RDY is
read by nsqd within ``rdy_settle_time``, no delivery ever takes the consumer's
total in-flight count above the largest ``max_in_flight`` in force during the
last ``rdy_settle_time`` seconds, and the sum of the RDY values last sent never
exceeds the current ``max_in_flight``. When ``max_in_flight`` is lowered below
what is already in flight, every connection gets RDY 0 until enough messages
finish. (nsqd may still send more when it times a message out server-side: that
is a handler running past ``msg_timeout``; the controller notices the
unexplained message and stops granting until the excess drains.)

Distribution follows the NSQ client guide and go-nsq, fixed where go-nsq is
buggy: ``max_in_flight`` is split evenly (remainder included, go-nsq#378), never
above a connection's ``max_rdy_count``; when there is less than one message per
connection, the few "extra" slots rotate every ``rdy_redistribute_interval``
away from connections idle for ``low_rdy_idle_timeout`` or holding one for
``low_rdy_timeout``, to the connections that waited longest (go-nsq#179,
nsqjs#242). Each connection is added with a *key* (a partition, say). Backoff
(:mod:`fastnsq.backoff`) is consumer-wide by default, as in go-nsq (a failure
sends RDY 0 everywhere, waits, then lets one message through one connection,
the probe; only the probe's result moves the level), or per key with
``backoff_per_key`` (youzan's ``RequeueBackoffSingleConn``): then a failing key
waits and probes alone while the others share ``max_in_flight``. A key can be
paused (:meth:`RdyController.set_paused`): RDY 0 on its connections until resumed;
one connection can be held (:meth:`RdyController.set_held`, the consumer's express lane).

Example (a fake clock; the consumer would use the default ``time.monotonic``)::

    >>> now = [0.0]
    >>> rdy = RdyController(2, clock=lambda: now[0], rng=random.Random(1))
    >>> rdy.add_connection("nsqd-a:4150", max_rdy_count=2500)
    [RdyUpdate(conn_id='nsqd-a:4150', rdy=2)]
    >>> rdy.add_connection("nsqd-b:4150", max_rdy_count=2500)  # a may still deliver 2 for a moment
    [RdyUpdate(conn_id='nsqd-a:4150', rdy=1)]
    >>> rdy.next_deadline()
    0.5
    >>> now[0] = 0.5
    >>> rdy.tick()
    [RdyUpdate(conn_id='nsqd-b:4150', rdy=1)]
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastnsq.backoff import STRATEGIES, BackoffPolicy, BackoffState, BackoffStrategy, Outcome, Phase
from fastnsq.codec import ConnRdy as _Conn
from fastnsq.errors import InvalidValueError

__all__ = ["STARVED_RATIO", "BackoffStrategy", "ConnectionRdyStats", "Outcome", "RdyController", "RdyUpdate"]

#: is_starved() threshold: in-flight count over the RDY last sent (the client guide, go-nsq, pynsq).
STARVED_RATIO = 0.85

# go-nsq's bounds (go-nsq's ``config.go``), in seconds.
_BOUNDS: dict[str, tuple[float, float]] = {
    "low_rdy_idle_timeout": (1.0, 300.0),
    "low_rdy_timeout": (1.0, 300.0),
    "rdy_redistribute_interval": (0.001, 5.0),
    "max_backoff_duration": (0.0, 3600.0),
    "backoff_multiplier": (0.0, 3600.0),
    # Not a go-nsq option: how long nsqd may take to read a RDY (see the module docstring).
    "rdy_settle_time": (0.0, 60.0),
}


class RdyUpdate(NamedTuple):
    """Send ``RDY <rdy>`` on connection ``conn_id`` (the object given to ``add_connection``)."""

    conn_id: Any
    rdy: int


@dataclass(frozen=True)
class ConnectionRdyStats:
    """A snapshot of one connection's RDY state (for metrics and logs)."""

    #: The last RDY value sent (0 before the first).
    rdy: int
    #: ``rdy`` minus the messages received since it was sent (the client guide's counter).
    rdy_remaining: int
    #: What the controller wants this connection to hold now.
    target: int
    #: Messages received and not yet reported done.
    in_flight: int
    #: The connection's ``max_rdy_count`` from its IDENTIFY response.
    max_rdy_count: int
    #: Clock time of the last message received, or None.
    last_message_at: float | None
    #: Clock time of the last RDY sent, or None.
    last_rdy_at: float | None


_NO_UPDATES: list[RdyUpdate] = []  # returned by hot paths with nothing to send; never mutated


class RdyController:
    """RDY counts and backoff for one consumer's connections (see the module docstring).

    All durations are seconds. ``max_in_flight`` is the consumer-wide limit of
    messages in flight (0 pauses). The other options are go-nsq's, with its
    defaults and bounds; ``rdy_settle_time`` is the time nsqd is assumed to need
    to read a RDY command, during which a lowered connection still counts at its
    old value.

    Driving it from an asyncio consumer:

    * after IDENTIFY and SUB: ``add_connection(conn, identify["max_rdy_count"])``;
      when the connection closes: ``remove_connection(conn)``;
    * per message frame: ``on_message(conn, msg.id)``; when sending its FIN or
      REQ: ``on_message_done(conn, msg.id, outcome)`` (also for messages of a
      connection already removed: they still count against ``max_in_flight``
      until their handlers finish);
    * every call returns a list of :class:`RdyUpdate` to write, in order
      (decreases first). Writing a connection's updates before the FIN/REQ that
      caused them saves nsqd one needless delivery during backoff;
    * after each call, (re)arm one timer at :meth:`next_deadline` (None: no
      timer) and call :meth:`tick` when it fires.

    ``conn_id`` is any hashable that identifies one connection (the connection
    object itself is best): an id may be reused only once all messages of the
    connection that had it are done. Not thread-safe: call it from the event loop.
    """

    def __init__(
        self,
        max_in_flight: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        rdy_redistribute_interval: float = 5.0,
        backoff_strategy: BackoffStrategy = "exponential",
        max_backoff_duration: float = 120.0,
        backoff_multiplier: float = 1.0,
        rdy_settle_time: float = 0.5,
        backoff_per_key: bool = False,
    ) -> None:
        self._mif = _check_count("max_in_flight", max_in_flight, " (0 pauses)")
        if not callable(clock):
            raise InvalidValueError(f"clock must be a callable returning seconds, got {clock!r}")
        if rng is not None and not isinstance(rng, random.Random):
            raise InvalidValueError(f"rng must be a random.Random or None, got {rng!r}")
        self._low_rdy_idle_timeout = _check_seconds("low_rdy_idle_timeout", low_rdy_idle_timeout)
        self._low_rdy_timeout = _check_seconds("low_rdy_timeout", low_rdy_timeout)
        self._redistribute_interval = _check_seconds("rdy_redistribute_interval", rdy_redistribute_interval)
        max_backoff = _check_seconds("max_backoff_duration", max_backoff_duration)
        multiplier = _check_seconds("backoff_multiplier", backoff_multiplier)
        self._settle = _check_seconds("rdy_settle_time", rdy_settle_time)
        if backoff_strategy not in STRATEGIES and not callable(backoff_strategy):
            raise InvalidValueError(f"backoff_strategy must be one of {STRATEGIES} or a callable level -> seconds, "
                                    f"got {backoff_strategy!r}")
        self._clock = clock
        # The hot path stamps deliveries with CLOCK_MONOTONIC itself: only with the default clock.
        self._fast_lane = clock is time.monotonic
        self._rng = rng if rng is not None else random.Random()
        self._policy = BackoffPolicy(backoff_strategy, max_backoff_duration=max_backoff, multiplier=multiplier,
                                     rng=self._rng)

        self._conns: dict[Hashable, _Conn] = {}
        self._seq = 0
        # Messages still in flight on removed connections: they still occupy handler slots.
        self._orphans: dict[Hashable, int] = {}
        self._orphan_total = 0
        # True when some connection holds less than its target (waiting for capacity to free up).
        self._deficit = False
        # In deficit: messages that must finish before a rebalance can raise anything, and those finished
        # since. A rebalance per FIN (~50 us) kept the loop busy for seconds after 80,000 FINs (Spark).
        self._dones_needed = 1
        self._dones = 0
        # Whether the extra slots rotate (some connection is waiting for one), set by _water_fill.
        self._rotating = False
        self._next_redistribute: float | None = None

        # Backoff scopes (by key with backoff_per_key, else the consumer-wide one under None), the key
        # of each connection (kept while a removed connection's messages are in flight), paused keys.
        self._per_key = bool(backoff_per_key)
        self.on_backoff: Callable[[Hashable, int, float | None], None] | None = None  # (scope, level, wait)
        self._scopes: dict[Hashable, BackoffState] = {}
        self._key_of: dict[Hashable, Hashable] = {}
        self._paused: set[Hashable] = set()
        # Held connections (RDY 0 on that one alone), each with the part of max_in_flight kept for it.
        self._held: dict[Hashable, int] = {}
        self._settle_of: dict[Hashable, float] = {}  # per connection, when less than self._settle
        # Every scope in normal operation: FINs may take the cheap path.
        self._all_normal = True
        self._holding = False  # the consumer's ready_check failing: RDY 0 everywhere (hold())

    # -- read-only state ---------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        """The consumer-wide limit of messages in flight (0: paused)."""
        return self._mif

    @property
    def backoff_level(self) -> int:
        """0 in normal operation; each counted failure adds 1, each probe success removes 1
        (with keyed backoff: the highest level of any key)."""
        return max((scope.level for scope in self._scopes.values()), default=0)

    @property
    def in_backoff(self) -> bool:
        """True while the backoff level (of some key) is above 0."""
        return self.backoff_level > 0

    @property
    def backoff_until(self) -> float | None:
        """Clock time at which the (first) current backoff wait ends, or None when not waiting."""
        waits = [s.wait_until for s in self._scopes.values() if s.phase is Phase.WAITING and s.wait_until is not None]
        return min(waits, default=None)

    def backoff_level_of(self, key: Hashable) -> int:
        """The backoff level that applies to the connections added with ``key``
        (consumer-wide unless ``backoff_per_key``; 0 for a key without connections)."""
        scope = self._scopes.get(self._scope_key(key))
        return 0 if scope is None else scope.level

    def backoff_until_of(self, key: Hashable) -> float | None:
        """When the backoff wait that applies to ``key`` ends, or None when it is not waiting."""
        scope = self._scopes.get(self._scope_key(key))
        return scope.wait_until if scope is not None and scope.phase is Phase.WAITING else None

    def is_paused(self, key: Hashable) -> bool:
        return key in self._paused

    @property
    def connection_count(self) -> int:
        """Number of live connections."""
        return len(self._conns)

    @property
    def in_flight(self) -> int:
        """Messages in flight over all connections, including connections already removed."""
        return self._orphan_total + sum(c.in_flight for c in self._conns.values())

    def record(self, conn_id: Hashable) -> _Conn:
        """The live record of a registered connection (KeyError if it is not one).

        For the consumer's hot path (:mod:`fastnsq._delivery`): while ``record.fast``
        is True it may do what :meth:`on_message` and :meth:`on_message_done` would
        do in that state, on the record itself: for a message that arrives with
        ``in_flight < rdy`` and leaves ``remaining`` above a quarter of ``rdy``, add
        one to ``in_flight``, take one from ``remaining``, set ``last_message_at``
        (``time.monotonic()``); for a FIN (not a REQ) with ``in_flight > 0``, take one
        from ``in_flight``. Anything else goes through the methods.
        """
        return self._conns[conn_id]

    def connection_stats(self, conn_id: Hashable) -> ConnectionRdyStats:
        """A snapshot of one live connection's RDY state; KeyError if it is not registered."""
        c = self._conns[conn_id]
        return ConnectionRdyStats(
            rdy=c.rdy,
            rdy_remaining=c.remaining,
            target=c.target,
            in_flight=c.in_flight,
            max_rdy_count=c.max_rdy,
            last_message_at=c.last_message_at,
            last_rdy_at=c.last_rdy_at,
        )

    def stats(self) -> dict[Hashable, ConnectionRdyStats]:
        """:meth:`connection_stats` for every live connection."""
        return {conn_id: self.connection_stats(conn_id) for conn_id in self._conns}

    def is_starved(self) -> bool:
        """True if a connection has messages in flight and at least 85 % of its last RDY in flight.

        The NSQ client guide's definition (as in go-nsq and pynsq): a batching
        consumer should process what it holds now, because that connection will
        send little more until some of it is finished. A connection at RDY 0 with
        messages in flight is starved too.
        """
        for c in self._conns.values():
            if c.in_flight > 0 and c.in_flight >= STARVED_RATIO * c.rdy:
                return True
        return False

    def next_deadline(self) -> float | None:
        """Clock time at which :meth:`tick` has work to do, or None if no timer is needed."""
        deadlines = [
            s.wait_until for s in self._scopes.values() if s.phase is Phase.WAITING and s.wait_until is not None
        ]
        if self._next_redistribute is not None:
            deadlines.append(self._next_redistribute)
        if self._deficit:
            # A raise may be waiting for a lowered connection's old RDY to settle; one settled since
            # the last rebalance too (a past deadline: tick at once), or a timer that fired a hair
            # early would leave the raise waiting for an event that may never come.
            deadlines.extend(c.pending_until for c in self._conns.values() if c.pending)
        return min(deadlines) if deadlines else None

    # -- events ------------------------------------------------------------------------------

    def add_connection(
        self, conn_id: Hashable, max_rdy_count: int, key: Hashable = None, *, held_reserve: int | None = None,
        settle: float | None = None,
    ) -> list[RdyUpdate]:
        """Register a subscribed connection; returns the RDY updates to send.

        ``max_rdy_count`` is the value from the connection's IDENTIFY response
        (nsqd's default is 2500); no RDY above it is ever sent on this connection.
        The new connection gets RDY only when ``max_in_flight`` leaves room for
        it: the others are lowered first. ``key`` is its backoff scope: connections
        added with the same key back off together (None: the consumer-wide scope).
        ``held_reserve`` adds it held (:meth:`set_held`) with that reserve; ``settle``, its own
        ``rdy_settle_time`` if less (nsqd's measured round trip).
        """
        _check_count("max_rdy_count", max_rdy_count)
        if conn_id in self._conns:
            raise ValueError(f"connection {conn_id!r} is already registered")
        if self._orphans.get(conn_id):
            raise ValueError(
                f"connection id {conn_id!r} still has {self._orphans[conn_id]} messages in flight from a "
                "removed connection; give each connection its own id"
            )
        now = self._clock()
        self._seq += 1
        self._conns[conn_id] = _Conn(conn_id, self._seq, max_rdy_count, now)
        self._key_of[conn_id] = key
        self._scopes.setdefault(self._scope_key(key), BackoffState())
        if held_reserve is not None:
            self._held[conn_id] = max(0, held_reserve)
        self._settle_of[conn_id] = self._settle if settle is None else min(self._settle, max(0.0, settle))
        return self._rebalance(now)

    def remove_connection(self, conn_id: Hashable) -> list[RdyUpdate]:
        """Forget a closed connection (unknown ids are ignored); returns RDY updates for the others.

        Its messages in flight still count against ``max_in_flight`` until reported with
        :meth:`on_message_done`. If it was the backoff probe, another connection becomes the probe.
        """
        c = self._conns.pop(conn_id, None)
        if c is None:
            return []
        c.fast = False
        self._held.pop(conn_id, None)
        self._settle_of.pop(conn_id, None)
        if c.in_flight:
            self._orphans[conn_id] = self._orphans.get(conn_id, 0) + c.in_flight
            self._orphan_total += c.in_flight
        key = self._key_of[conn_id] if c.in_flight else self._key_of.pop(conn_id)
        self._scopes[self._scope_key(key)].drop_probe(c)
        if self._per_key and not self._members(key):
            # A key's backoff lives with its connections (the consumer-wide one with the
            # consumer): nothing is left to probe, and a partition that comes back (or moved
            # for good) starts afresh.
            del self._scopes[key]
        return self._rebalance(self._clock())

    def set_held(self, conn_id: Hashable, held: bool, *, reserve: int = 0) -> list[RdyUpdate]:
        """Hold one connection at RDY 0 (``held``) or let it flow again; returns RDY updates.

        While it is held, ``reserve`` of ``max_in_flight`` goes to no other connection, so it
        is raised at once when it flows again: the others' lowered RDY never included it.
        """
        if conn_id not in self._conns:
            raise KeyError(conn_id)
        _check_count("reserve", reserve)
        self._held.pop(conn_id, None)
        if held:
            self._held[conn_id] = reserve
        return self._rebalance(self._clock())

    def hold(self, holding: bool) -> list[RdyUpdate]:
        """RDY 0 on every connection while ``holding`` (the consumer's ``ready_check`` fails: no
        probe either); released, every backoff scope is back to normal at once, at full RDY."""
        self._holding = holding
        if not holding:
            for scope in self._scopes.values():
                scope.reset()
        return self._rebalance(self._clock())

    def set_max_rdy(self, conn_id: Hashable, max_rdy_count: int) -> list[RdyUpdate]:
        """Change the most RDY one connection may hold (a cap below nsqd's max_rdy_count)."""
        _check_count("max_rdy_count", max_rdy_count)
        self._conns[conn_id].max_rdy = max_rdy_count
        return self._rebalance(self._clock())

    def set_paused(self, key: Hashable, paused: bool) -> list[RdyUpdate]:
        """Pause (RDY 0 on every connection added with ``key``) or resume it; returns RDY updates."""
        if paused:
            self._paused.add(key)
        else:
            self._paused.discard(key)
        return self._rebalance(self._clock())

    def on_message(self, conn_id: Hashable, msg_id: Hashable) -> list[RdyUpdate]:
        """A message arrived on ``conn_id``; returns RDY updates (a refill, rarely more).

        ``msg_id`` identifies the message until it is done (the 16-byte NSQ id); it is how the
        backoff probe's result is told apart from the others."""
        c = self._conns.get(conn_id)
        now = self._clock()
        if c is None:
            # A frame read after remove_connection: still a message in flight.
            self._orphans[conn_id] = self._orphans.get(conn_id, 0) + 1
            self._orphan_total += 1
            return self._rebalance(now)
        first = c.last_message_at is None
        pending = self._pending(c, now)
        authorized = pending > 0 or c.in_flight < c.rdy
        c.in_flight += 1
        if pending:
            c.pending = pending - 1
        if c.remaining:
            c.remaining -= 1
        c.last_message_at = now
        scope = self._scopes[self._scope_key(self._key_of[conn_id])]
        scope.on_message(c, msg_id)
        if not authorized or pending:
            # More than the model allows (nsqd timed a message out, or ignored a RDY for too long), or
            # a lowered connection took one before nsqd read its new RDY (then the others' RDY may no
            # longer fit): re-check the budget, which stops all grants until the excess has drained.
            updates = self._rebalance(now)
        elif c.rdy and (first or c.remaining * 4 <= c.rdy):
            # The client guide's refill at 25 %: a no-op for nsqd >= 1.0 (RDY is absolute there),
            # needed by servers that count RDY down. The first message's: what Consumer._apply held back.
            c.remaining = c.rdy
            c.last_rdy_at = now
            updates = [RdyUpdate(conn_id, c.rdy)]
        else:
            updates = []
        if not c.fast and not c.pending and self._fast_lane:
            c.fast = self._may_be_fast(conn_id)  # a lowered RDY has settled
        if first and c.rdy > 1 and all(update.conn_id != conn_id for update in updates):
            updates.append(RdyUpdate(conn_id, c.rdy))  # the same after a rebalance that left it out
        return updates

    def on_message_done(self, conn_id: Hashable, msg_id: Hashable, outcome: Outcome) -> list[RdyUpdate]:
        """A message was finished or requeued (call it as the FIN/REQ is sent); returns RDY updates.

        ``outcome`` drives backoff: :attr:`Outcome.FAILURE` (REQ with backoff)
        starts or deepens it, :attr:`Outcome.SUCCESS` (FIN) of the probe message
        eases it, :attr:`Outcome.NEUTRAL` (REQ without backoff) never counts.
        """
        c = self._conns.get(conn_id)
        if (
            outcome is not Outcome.FAILURE
            and self._all_normal
            and not self._deficit
            and c is not None
            and c.in_flight > 0
        ):
            # The common case, kept cheap: no backoff to count, nobody waiting for capacity.
            c.in_flight -= 1
            return _NO_UPDATES
        if not isinstance(outcome, Outcome):
            raise InvalidValueError(f"outcome must be an Outcome, got {outcome!r}")
        key = self._key_of.get(conn_id)
        if c is not None and c.in_flight > 0:
            c.in_flight -= 1
        elif self._orphans.get(conn_id):
            left = self._orphans[conn_id] - 1
            if left:
                self._orphans[conn_id] = left
            else:
                del self._orphans[conn_id]
                self._key_of.pop(conn_id, None)  # the removed connection's last message
            self._orphan_total -= 1
        else:
            raise ValueError(f"on_message_done for {conn_id!r} without a message in flight there")
        now = self._clock()
        if self._count_outcome(conn_id, msg_id, outcome, now, key):
            return self._rebalance(now)
        if self._deficit:
            self._dones += 1
            if self._dones >= self._dones_needed:
                return self._rebalance(now)
        return []

    def set_max_in_flight(self, max_in_flight: int) -> list[RdyUpdate]:
        """Change the consumer-wide limit at run time; 0 pauses (RDY 0 everywhere).

        During backoff the new value takes effect when backoff ends. Lowering it
        below the messages already in flight stops all deliveries until enough
        of them are done.
        """
        self._mif = _check_count("max_in_flight", max_in_flight, " (0 pauses)")
        return self._rebalance(self._clock())

    def tick(self) -> list[RdyUpdate]:
        """Run what is due (end of a backoff wait, redistribution, settled RDYs); returns RDY updates."""
        now = self._clock()
        for scope in self._scopes.values():
            scope.tick(now)
        if self._next_redistribute is not None and now >= self._next_redistribute:
            self._next_redistribute = None
            self._redistribute(now)
        return self._rebalance(now)

    # -- backoff -----------------------------------------------------------------------------

    def _count_outcome(
        self, conn_id: Hashable, msg_id: Hashable, outcome: Outcome, now: float, key: Hashable
    ) -> bool:
        """Apply one result to the backoff state of its key; True if the RDY targets changed."""
        scope = self._scopes.get(self._scope_key(key))
        changed = scope is not None and scope.count(conn_id, msg_id, outcome, now, self._policy)
        if changed and self.on_backoff is not None:
            self.on_backoff(self._scope_key(key), scope.level, scope.wait_left(now))  # type: ignore[union-attr]
        return changed

    def _scope_key(self, key: Hashable) -> Hashable:
        return key if self._per_key else None

    def _may_be_fast(self, conn_id: Hashable) -> bool:
        """Whether a connection's hot path may count for itself (see :meth:`_mark_fast`)."""
        return not self._deficit and self._flows(conn_id)

    def _members(self, scope_key: Hashable) -> list[_Conn]:
        """The live connections of a backoff scope."""
        if not self._per_key:
            return list(self._conns.values())
        return [c for conn_id, c in self._conns.items() if self._key_of[conn_id] == scope_key]

    def _probe_candidates(self, scope_key: Hashable) -> list[_Conn]:
        members = self._members(scope_key)
        return [c for c in members if c.max_rdy > 0 and self._flows_when_normal(c.conn_id)]

    def _ensure_probe(self, scope: BackoffState, scope_key: Hashable) -> _Conn | None:
        """The probe connection of a scope, chosen at random (preferring idle ones) if there is none."""
        if scope.probe is not None:
            if self._flows_when_normal(scope.probe.conn_id):
                return scope.probe
            scope.drop_probe(scope.probe)  # paused since it was chosen
        eligible = self._probe_candidates(scope_key)
        if not eligible:
            return None
        # nsqd sends nothing on RDY 1 while that connection has a message in flight.
        idle = [c for c in eligible if c.in_flight == 0]
        probe = self._rng.choice(idle or eligible)
        scope.set_probe(probe)
        return probe

    # -- distribution ------------------------------------------------------------------------

    def _compute_targets(self, now: float) -> None:
        for c in self._conns.values():
            c.target = 0
        self._rotating = False
        self._all_normal = all(scope.phase is Phase.NORMAL for scope in self._scopes.values())
        flowing = [c for conn_id, c in self._conns.items() if self._flows(conn_id)]
        if len(flowing) < len(self._conns):
            for c in self._conns.values():
                if c not in flowing:
                    self._release_extra(c, now)
        if self._mif == 0 or self._holding or not self._conns:
            return
        probes = []
        for scope_key, scope in self._scopes.items():
            if scope.phase is Phase.PROBING:
                probe = self._ensure_probe(scope, scope_key)
                if probe is not None:
                    probes.append(probe)
        if flowing:
            self._water_fill(now, flowing, max(0, self._mif - len(probes) - sum(self._held.values())))
        for probe in probes:
            probe.target = 1

    def _flows(self, conn_id: Hashable) -> bool:
        """In normal operation: its backoff scope not backing off, its key not paused, not held."""
        key = self._key_of[conn_id]
        return (not self._holding and self._scopes[self._scope_key(key)].phase is Phase.NORMAL
                and self._flows_when_normal(conn_id))

    def _flows_when_normal(self, conn_id: Hashable) -> bool:
        return self._key_of[conn_id] not in self._paused and conn_id not in self._held

    def _water_fill(self, now: float, conns: list[_Conn], budget: int) -> None:
        """Split ``budget`` evenly over ``conns``, capped per connection; the remainder goes to
        rotating holders."""
        eligible = sorted((c for c in conns if c.max_rdy > 0), key=lambda c: (c.max_rdy, c.seq))
        left = budget
        capped = 0
        # Connections whose max_rdy_count is below the even share get all they can take.
        while capped < len(eligible) and eligible[capped].max_rdy * (len(eligible) - capped) <= left:
            eligible[capped].target = eligible[capped].max_rdy
            left -= eligible[capped].max_rdy
            capped += 1
        for c in eligible[:capped]:
            self._release_extra(c, now)
        for c in conns:
            if c.max_rdy == 0:
                self._release_extra(c, now)
        rest = eligible[capped:]
        if not rest:
            return
        base, extras = divmod(left, len(rest))
        for c in rest:
            c.target = base
        holders = [c for c in rest if c.extra_since is not None]
        if len(holders) > extras:
            holders.sort(key=lambda c: (c.extra_since, c.seq))
            for c in holders[: len(holders) - extras]:
                self._release_extra(c, now)
            holders = holders[len(holders) - extras :]
        elif len(holders) < extras:
            waiting = sorted(
                (c for c in rest if c.extra_since is None), key=lambda c: (c.waiting_since, c.seq)
            )
            for c in waiting[: extras - len(holders)]:
                c.extra_since = now
                c.waiting_since = None
                holders.append(c)
        for c in holders:
            c.target = base + 1
        self._rotating = 0 < extras < len(rest)

    def _release_extra(self, c: _Conn, now: float) -> None:
        if c.extra_since is not None:
            c.extra_since = None
            c.waiting_since = now

    def _redistribute(self, now: float) -> None:
        """The rdy_redistribute_interval timer: move RDY away from idle or long-time holders."""
        if self._rotating:
            flowing = [c for conn_id, c in self._conns.items() if self._flows(conn_id)]
            waiting = sum(1 for c in flowing if c.extra_since is None and c.target < c.max_rdy)
            stale = [c for c in flowing if c.extra_since is not None and self._is_stale(c, now)]
            stale.sort(key=lambda c: (c.granted_at, c.seq))
            for c in stale[:waiting]:
                self._release_extra(c, now)
        for scope_key, scope in self._scopes.items():
            probe = scope.probe
            if probe is None or not scope.waiting_for_probe_message:
                continue
            others = [c for c in self._probe_candidates(scope_key) if c is not probe]
            if others and self._is_stale(probe, now):
                idle = [c for c in others if c.in_flight == 0]
                scope.set_probe(self._rng.choice(idle or others))

    def _is_stale(self, c: _Conn, now: float) -> bool:
        """Holding its slot for low_rdy_timeout, or idle for low_rdy_idle_timeout since it got it."""
        if c.granted_at is None or c.rdy < c.target:
            return False  # not actually granted yet: nothing to judge
        since = c.granted_at if c.extra_since is None else max(c.granted_at, c.extra_since)
        active = since if c.last_message_at is None else max(since, c.last_message_at)
        return now - active >= self._low_rdy_idle_timeout or now - since >= self._low_rdy_timeout

    def _pending(self, c: _Conn, now: float) -> int:
        if c.pending and now >= c.pending_until:
            c.pending = 0
        return c.pending

    def _capacity(self, c: _Conn, now: float) -> int:
        return max(c.rdy, c.in_flight + self._pending(c, now))

    def _rebalance(self, now: float) -> list[RdyUpdate]:
        """Recompute targets and return the RDY updates that move toward them within budget."""
        self._compute_targets(now)
        conns = list(self._conns.values())
        # What the connections could hold once nsqd has read the decreases below. Above the limit
        # (max_in_flight lowered under what is in flight), a connection that kept any RDY could take
        # a message while others still hold the excess: stop them all until enough has finished.
        settled = self._orphan_total + sum(max(min(c.rdy, c.target), c.in_flight) for c in conns)
        stop = settled > self._mif
        updates = []
        for c in conns:  # decreases first
            want = 0 if stop else c.target
            if c.rdy > want:
                updates.append(self._send(c, want, now))
            if c.granted_at is None and 0 < c.rdy == c.target:
                # Its target reached from above (max_in_flight lowered under a partial raise, with
                # or without a RDY sent): granted now, or _is_stale would never judge it.
                c.granted_at = now
        # Raises must fit what every connection can still receive, old RDY values included.
        budget = self._mif - self._orphan_total - sum(self._capacity(c, now) for c in conns)
        deficit = False
        if stop or budget < 0:
            deficit = any(c.rdy < c.target for c in conns)
        else:
            # Connections with nothing first, so a scarce budget reaches the starved ones.
            for c in sorted((c for c in conns if c.rdy < c.target), key=lambda c: (c.rdy > 0, c.seq)):
                capacity = self._capacity(c, now)
                grant = min(c.target, capacity + budget)
                if grant < c.target:
                    deficit = True
                    # Partial raises in steps of a quarter of the target, not one per finished message.
                    if grant <= c.rdy or (c.rdy > 0 and grant - c.rdy < max(1, c.target // 4)):
                        continue
                budget -= max(0, grant - capacity)
                updates.append(self._send(c, grant, now))
        self._deficit = deficit
        self._dones = 0
        self._dones_needed = self._dones_to_progress(conns, stop, budget, now) if deficit else 1
        self._schedule_redistribute(now)
        self._mark_fast()
        return updates

    def _dones_to_progress(self, conns: list[_Conn], stop: bool, budget: int, now: float) -> int:
        """How many messages must finish before a rebalance can change a RDY (at least 1).

        Each finished message lowers the settled total, and raises the budget (plus a
        connection's own capacity), by at most one; settling RDYs free capacity on the
        timer instead (:meth:`next_deadline`). Never more than needed, so no raise waits.
        """
        if stop:
            settled = self._orphan_total + sum(max(min(c.rdy, c.target), c.in_flight) for c in conns)
            return max(1, settled - self._mif)
        gaps = [
            # the smallest raise _rebalance makes: to 1 from 0, else a quarter of the target (or all of it)
            (1 if c.rdy == 0 else min(c.target, c.rdy + max(1, c.target // 4))) - self._capacity(c, now) - budget
            for c in conns
            if c.rdy < c.target
        ]
        return max(1, min(gaps, default=1))

    def _mark_fast(self) -> None:
        """Tell each record whether a hot path may count its deliveries and FINs itself.

        Only in normal operation: no backoff, nobody waiting for capacity (a FIN then
        frees nothing anyone waits for), no lowered RDY still settling on that
        connection. Every change of phase, deficit or pending goes through
        :meth:`_rebalance`, which ends here.
        """
        ok = self._fast_lane and not self._deficit
        for conn_id, c in self._conns.items():
            # A connection's first message comes through on_message (see there).
            c.fast = ok and not c.pending and c.last_message_at is not None and self._flows(conn_id)

    def _send(self, c: _Conn, value: int, now: float) -> RdyUpdate:
        if value < c.rdy:
            # Until nsqd reads the new value it may still fill the connection up to the old one.
            c.pending = max(self._pending(c, now), c.rdy - c.in_flight)
            c.pending_until = now + self._settle_of.get(c.conn_id, self._settle)
        elif value == c.target:
            c.granted_at = now
        c.rdy = value
        c.remaining = value
        c.last_rdy_at = now
        return RdyUpdate(c.conn_id, value)

    def _schedule_redistribute(self, now: float) -> None:
        needed = self._mif > 0 and (self._rotating or any(
            scope.probe is not None and scope.waiting_for_probe_message and len(self._probe_candidates(key)) > 1
            for key, scope in self._scopes.items()
        ))
        if not needed:
            self._next_redistribute = None
        elif self._next_redistribute is None:
            self._next_redistribute = now + self._redistribute_interval


def _check_count(name: str, value: object, note: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValueError(f"{name} must be an int >= 0{note}, got {value!r}")
    return value


def _check_seconds(name: str, value: object) -> float:
    low, high = _BOUNDS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                          and low <= value <= high):
        raise InvalidValueError(f"{name} must be a number of seconds in [{low:g}, {high:g}], got {value!r}")
    return float(value)
