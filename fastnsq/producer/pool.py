"""The producer's connections: ``pool_size`` per nsqd, round robin, reconnects, publish timeouts."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from ..config import ConnectionOptions, LoggerLike
from ..conn import HANDSHAKE_TIMEOUT, Connection
from ..errors import ConnectionClosedError, NoConnectionError, NsqdDown, NSQError, PublishTimeoutError
from ..recovery import Redial
from .probe import handshake_answered_within
from .suspects import PROBE_INTERVAL, Suspects

#: fail_fast: how long a publish waits for the reconnect attempt it hurried, from the attempt's
#: start (a refused port answers at once, a healthy nsqd within a few round trips; a connect
#: that times out would hold it for its dial_timeout, a hung nsqd's handshake for longer).
#: Below the 0.2 s the docs promise, for the loop's own latency.
FAIL_FAST_WAIT = 0.15
#: How often the pool looks at its connections' oldest unanswered commands (publish timeouts,
#: suspects): a timer per pool, none per publish.
TICK = 0.1

__all__ = ["ConnectionPool", "NsqdDown", "describe"]

logger = logging.getLogger(__name__)


class _Slot:
    """One pooled connection to one nsqd, reconnecting in the background."""

    __slots__ = ("address", "conn", "error", "lost_at")

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn: Connection | None = None
        #: When its connection was lost (time.monotonic()), until it is back: None otherwise.
        self.lost_at: float | None = None
        #: Why the last attempt failed or the connection was lost; None while open or before
        #: the first attempt ended (what :meth:`ConnectionPool.down_error` reports).
        self.error: BaseException | None = None


class ConnectionPool:
    """``pool_size`` connections to each nsqd added, and which of them are open.

    A lost connection is reconnected by the recovery rule (:class:`fastnsq.recovery.Redial`:
    every 0.2-0.4 s by default, at most 5 attempts a second per nsqd, sooner for a publish
    waiting).
    Commands unanswered for ``publish_timeout`` fail with :class:`PublishTimeoutError` (a
    sweeper checks every connection's oldest command, so no publish needs a timer of its own).

    A connection whose oldest unanswered command is ``suspect_after`` old (a hung nsqd, a black
    hole, a lossy link) is *suspect*: it takes no new publish while another connection answers,
    and the commands it holds fail with a retryable :class:`ConnectionClosedError`, which the
    producer sends again on a healthy connection (``rerouted`` counts them: if the suspect nsqd
    answers later after all, those messages are there twice). It is healthy again once it has
    answered what it held and its nsqd answered a few handshakes in a row in good time, on
    connections of their own (:mod:`fastnsq.producer.suspects`, :mod:`fastnsq.producer.probe`).
    With no healthy connection, those out of the rotation are used as before.
    """

    def __init__(
        self,
        options: ConnectionOptions,
        *,
        pool_size: int,
        publish_timeout: float,
        reconnect_delay: float,
        max_reconnect_delay: float,
        suspect_after: float = 0.5,
        log: LoggerLike = logger,
    ) -> None:
        self.options = options
        self._log = log
        self.pool_size = pool_size
        self.publish_timeout = publish_timeout
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        #: The open connections, in the order they opened (round robin walks this list).
        self.open: list[Connection] = []
        #: The connections new publishes go to: ``open`` itself while none is out of the rotation,
        #: else the others (or every open one, when all are out).
        self.usable: list[Connection] = self.open
        self.suspect_after = suspect_after
        #: The connections out of the rotation (suspect or on probation), read at each tick.
        self.suspects = Suspects(suspect_after, log, publish_timeout)
        #: Commands failed on a suspect connection for the producer to send elsewhere.
        self.rerouted = 0
        self.reconnects = 0
        self.closing = False
        self._slots: dict[str, list[_Slot]] = {}
        self._open_by_address: dict[str, list[Connection]] = {}
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Set when a connection opens or an attempt to reconnect ends: waiting publishes look again.
        self._connected: asyncio.Event | None = None
        self._redial = Redial(delay=reconnect_delay, max_delay=max_reconnect_delay, log=log,
                              on_round=lambda _address: self._news())
        self._sweeper: asyncio.TimerHandle | None = None
        self._round_trip_observer: Callable[[float], object] | None = None
        #: The probe of each nsqd on probation, and when the last one started.
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._probed_at: dict[str, float] = {}

    def set_round_trip_observer(self, observer: Callable[[float], object] | None) -> None:
        """Give every connection, open and future, this ``Connection.round_trip_observer``."""
        self._round_trip_observer = observer
        for conn in self.open:
            conn.round_trip_observer = observer

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._connected = asyncio.Event()

    def has_node(self, address: str) -> bool:
        return address in self._slots

    # ---- choosing a connection ----------------------------------------------------------

    def next_open(self) -> Connection:
        """The next open connection of any nsqd (the caller knows one is open)."""
        usable = self.usable
        self._next = (self._next + 1) % len(usable)
        return usable[self._next]

    def pick(self, address: str | None = None) -> Connection | None:
        """Round robin over the usable connections (of one nsqd when ``address`` is given: its
        healthy ones, else any of its open ones)."""
        open_conns = self.usable if address is None else self._open_by_address.get(address)
        if not open_conns:
            return None
        if address is not None and self.suspects.out:
            out = self.suspects.out
            open_conns = [conn for conn in open_conns if conn not in out] or open_conns
        self._next = (self._next + 1) % len(open_conns)
        return open_conns[self._next]

    def connected_to(self, address: str | None) -> bool:
        return bool(self.open if address is None else self._open_by_address.get(address))

    def answering(self) -> bool:
        """An open connection is in the rotation (not suspect or on probation)."""
        out = self.suspects.out
        return any(conn not in out for conn in self.open)

    def pending_of(self, address: str) -> int:
        """Commands written to ``address`` and not answered yet (its open connections)."""
        return sum(conn.pending for conn in self._open_by_address.get(address, ()))

    def addresses(self) -> list[str]:
        """Every nsqd added, open or reconnecting."""
        return list(self._slots)

    def open_count(self, address: str) -> int:
        return len(self._open_by_address.get(address, ()))

    async def connection_for(self, address: str | None, deadline: float, fail_fast: bool = False) -> Connection:
        """An open connection (to ``address`` if given), waiting for one until ``deadline``.

        ``fail_fast``: when every connection it could use is down and an attempt to reconnect
        made for this call (or within the last 0.2 s) failed too, raise :class:`NsqdDown` at
        once; otherwise a connection that opens answers the call the moment it does."""
        conn = self.pick(address)
        if conn is not None:
            return conn
        if address is not None and address not in self._slots:
            await self.add_node(address)
        return await self._wait_for_connection(deadline, address, fail_fast)

    async def _wait_for_connection(self, deadline: float, address: str | None, fail_fast: bool) -> Connection:
        assert self._loop is not None and self._connected is not None
        hurried_until: float | None = None  # fail_fast: how long the attempt it hurried may take
        while True:
            conn = self.pick(address)
            if conn is not None:
                return conn
            if self.closing:
                raise ConnectionClosedError("the producer is closed")
            now = self._loop.time()
            remaining = deadline - now
            if remaining <= 0:
                raise self._no_connection(address)
            if fail_fast:
                causes = self.down_error(address)
                if causes is not None:
                    # Every attempt failed: raise at once, or give the attempt hurried for this call
                    # FAIL_FAST_WAIT from its start (a connect that times out must not hold the call
                    # for its dial_timeout, a hung nsqd's handshake not for the publish timeout, nor
                    # each call anew for an attempt that has hung for seconds: issue 57).
                    if hurried_until is None:
                        began = self._redial.hurry_since(None if address is None else [address])
                        if began is not None:  # from the attempt's start: one that hangs is no news
                            hurried_until = began + FAIL_FAST_WAIT
                    if hurried_until is None or now >= hurried_until:
                        where = f"nsqd {address}" if address is not None else "nsqd"
                        raise NsqdDown(f"no connection to {where}: {causes}; reconnecting in the background")
                    remaining = min(remaining, hurried_until - now)
            self._connected.clear()
            try:
                await asyncio.wait_for(self._connected.wait(), remaining)
            except asyncio.TimeoutError:
                if hurried_until is None:
                    raise self._no_connection(address) from None

    def _no_connection(self, address: str | None) -> NoConnectionError:
        """The error of a publish that found no connection within its timeout: each nsqd and
        why it is down, once every connection has failed at least once."""
        causes = self.down_error()
        where = f"nsqd {address}" if address is not None else "nsqd"
        return NoConnectionError(f"no open connection to {where} within the publish timeout"
                                 + (f": {causes}; reconnecting in the background" if causes else ""))

    # ---- nodes and slots ----------------------------------------------------------------

    async def add_node(self, address: str) -> None:
        """Open ``pool_size`` connections to ``address``; raises if none of them opens
        (the others keep retrying in the background)."""
        if address in self._slots:
            return
        slots = [_Slot(address) for _ in range(self.pool_size)]
        self._slots[address] = slots
        results = await asyncio.gather(*(self._open_slot(slot) for slot in slots), return_exceptions=True)
        for slot, result in zip(slots, results):
            if isinstance(result, BaseException):
                self._log.warning("cannot connect to nsqd %s: %s", address, result)
                slot.error = result
                self._missing(slot, result)
        self._news()  # publishes waiting for these first attempts look again
        failures = [r for r in results if isinstance(r, BaseException)]
        if len(failures) == len(slots):
            raise failures[0]

    async def add_all(self, addresses: list[str]) -> str | None:
        """:meth:`add_node` for each address, at once: None if a connection is open after it,
        else what each failed with (for an error message)."""
        results = await asyncio.gather(*(self.add_node(a) for a in addresses), return_exceptions=True)
        if self.open or not addresses:
            return None
        errors = [f"{a}: {describe(r)}" for a, r in zip(addresses, results) if isinstance(r, BaseException)]
        return "; ".join(errors) or "no connection opened"

    async def add_nodes(self, addresses: list[str]) -> None:
        """:meth:`add_node` for each address not in the pool yet; failures are logged."""
        for address in addresses:
            if address not in self._slots:
                try:
                    await self.add_node(address)
                except (OSError, asyncio.TimeoutError, NSQError) as exc:
                    self._log.warning("cannot connect to nsqd %s: %s", address, exc)

    async def remove_node(self, address: str) -> None:
        """Close the connections to ``address`` and stop reconnecting to it; the publishes they
        carried fail with ConnectionClosedError (the producer retries them elsewhere)."""
        slots = self._slots.pop(address, [])
        self._redial.drop_address(address)
        self._open_by_address.pop(address, None)
        conns = [slot.conn for slot in slots if slot.conn is not None]
        for conn in conns:
            if conn in self.open:
                self.open.remove(conn)
            self.suspects.forget(conn)
        self._route()
        await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)

    async def _open_slot(self, slot: _Slot) -> None:
        conn = Connection(slot.address, self.options, on_close=functools.partial(self._on_close, slot))
        conn.round_trip_observer = self._round_trip_observer
        # The handshake within the publish timeout: a hung nsqd's kernel still accepts the connect.
        await conn.connect(handshake_timeout=min(HANDSHAKE_TIMEOUT, self.publish_timeout))
        slot.conn = conn
        slot.error = None
        self.open.append(conn)
        self._open_by_address.setdefault(slot.address, []).append(conn)
        self.suspects.joined(conn, time.perf_counter())  # the clock of the write marks
        self._route()
        self._news()
        self._ensure_sweeper()

    def _news(self) -> None:
        """A connection opened, or an attempt to reconnect ended: publishes waiting look again."""
        if self._connected is not None:
            self._connected.set()

    def _on_close(self, slot: _Slot, conn: Connection, error: BaseException | None) -> None:
        if conn in self.open:
            self.open.remove(conn)
        self.suspects.forget(conn)
        self._route()
        same_node = self._open_by_address.get(slot.address)
        if same_node is not None and conn in same_node:
            same_node.remove(conn)
        if slot.conn is conn:
            slot.conn = None
            slot.error = error or ConnectionClosedError("nsqd closed the connection")
        if not self.closing and slot in self._slots.get(slot.address, ()):  # not removed on purpose
            # connection_lost(None): nsqd closed it (an EOF); our own closes do not come here.
            why = "closed by the server" if error is None else (str(error) or type(error).__name__)
            self._log.info("connection to %s lost (%s); reconnecting", slot.address, why)
            slot.lost_at = time.monotonic()
            self._missing(slot)

    def _missing(self, slot: _Slot, error: BaseException | None = None) -> None:
        """The recovery rule reopens ``slot`` (``error``: why the attempt just made failed)."""
        if not self.closing:
            self._redial.missing(slot.address, slot, functools.partial(self._reopen, slot), error)

    async def _reopen(self, slot: _Slot) -> None:
        try:
            await self._open_slot(slot)
        except (OSError, asyncio.TimeoutError, NSQError) as exc:
            for other in self._slots.get(slot.address, ()):
                if other.conn is None:
                    other.error = exc  # the probe speaks for the address: its cause is the current one
            self._news()  # a fail_fast publish waiting for this attempt learns it failed
            raise
        self.reconnects += 1
        if slot.lost_at is not None:
            self._log.info("connection to %s re-established after %.2f s", slot.address, time.monotonic() - slot.lost_at)
            slot.lost_at = None

    # ---- while no connection is open ------------------------------------------------------

    def down_error(self, address: str | None = None) -> str | None:
        """Why no connection is open (to ``address`` if given): each nsqd and the last failure,
        for an error message.

        None while a connection is open, while no nsqd was added yet (lookupd may still name
        some) and while a first attempt to connect is still under way.
        """
        if self.connected_to(address) or not self._slots:
            return None
        slots = [slot for key, pool in self._slots.items() if address in (None, key) for slot in pool]
        if not slots or any(slot.error is None for slot in slots):
            return None
        causes = {slot.address: describe(slot.error) for slot in slots}
        return "; ".join(f"{address} ({cause})" for address, cause in causes.items())

    def hurry(self, address: str | None = None) -> bool:
        """Reconnect now (to ``address``, or every nsqd down), within the recovery rule's cap of
        attempts a second: True when an attempt is under way whose outcome is news, False when
        each nsqd was tried less than 0.2 s ago (its cause is current)."""
        return self._redial.hurry(None if address is None else [address])

    async def close(self) -> None:
        """Stop reconnecting and close every connection."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        slots = [slot for pool in self._slots.values() for slot in pool]
        for probe in self._probes.values():
            probe.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        await self._redial.close()
        await asyncio.gather(*(s.conn.close() for s in slots if s.conn is not None), return_exceptions=True)
        self.open.clear()

    # ---- timeouts -----------------------------------------------------------------------

    def _ensure_sweeper(self, delay: float = TICK) -> None:
        if self._sweeper is None and self._loop is not None:
            self._sweeper = self._loop.call_later(min(delay, self.publish_timeout / 4), self._sweep)

    def _sweep(self) -> None:
        """Reroute what suspect connections hold, then fail commands unanswered for publish_timeout
        (each connection knows when it wrote them)."""
        now = time.perf_counter()  # the clock of the connections' write marks
        self._watch_suspects(now)
        cutoff = now - self.publish_timeout
        delay = TICK
        for conn in self.open:
            conn.expire_pending(cutoff, self._timeout_error)
            since = conn.unanswered_since()
            if since is not None:  # the next tick at its deadline if that comes first: not up to a tick late
                delay = min(delay, max(0.001, since - cutoff))
        self._sweeper = None
        if not self.closing:
            self._ensure_sweeper(delay)

    def _watch_suspects(self, now: float) -> None:
        """Update who is out of the rotation; while a connection in it is open, fail what the
        suspects hold for the producer to send there."""
        if self.suspects.check(self.open, now):
            self._route()
        if self.suspects.suspect and self.usable is not self.open:  # a healthy connection to send them to
            self.rerouted += self.suspects.reroute(now, self._rerouted_error)
        if self.suspects.probation:
            self._start_probes(now)

    def _start_probes(self, now: float) -> None:
        """A probe of each nsqd on probation, one at a time, PROBE_INTERVAL s apart."""
        for address in self.suspects.probing():
            if address in self._probes or now - self._probed_at.get(address, float("-inf")) < PROBE_INTERVAL:
                continue
            self._probed_at[address] = now
            assert self._loop is not None
            self._probes[address] = self._loop.create_task(self._probe(address))

    async def _probe(self, address: str) -> None:
        try:
            passed = await handshake_answered_within(address, self.suspects.probe_bound, self.suspects.probe_timeout)
        finally:
            del self._probes[address]
        if not self.closing and self.suspects.probed(address, passed):
            self._route()

    def _route(self) -> None:
        """``usable`` after a change of the open connections or of those out of the rotation."""
        out = self.suspects.out
        self.usable = self.open if not out else [conn for conn in self.open if conn not in out] or self.open

    @staticmethod
    def _rerouted_error() -> ConnectionClosedError:
        return ConnectionClosedError("nsqd did not answer within suspect_after: sent again on another connection "
                                     "(it may arrive twice)")

    def _timeout_error(self) -> PublishTimeoutError:
        return PublishTimeoutError(f"no answer from nsqd within {self.publish_timeout} s (publish_timeout)")


def describe(error: BaseException | None) -> str:
    """An error for a one-line message: its text, or its kind when it has none (timeouts)."""
    if error is None:
        return "not connected"
    text = str(error)
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)) and not text:
        return "timed out"
    return text or type(error).__name__
