"""The recovery rule: how a client gets back to an nsqd it wants, and how often it asks lookupd.

One job, in one home that the :class:`~fastnsq.Consumer`, the Producer's connection pool and
the worker's supervisor all use:

* :class:`Redial`: while an nsqd a client wants is missing (its connection lost, or never
  opened), it is tried again quickly: every ``delay / 2 .. delay`` seconds (0.2-0.4 s by
  default, jittered so that the clients of a restarted nsqd do not come back all in the same
  millisecond; it only grows, doubling, when
  ``max_delay`` is set above ``delay``), and never more than :data:`MAX_ATTEMPTS_PER_SECOND`
  attempts a second per address: each round sends one probe to the address, and the other
  connections wanted there are opened only once the probe got through.
  :meth:`Redial.hurry` starts the next round now (a publish waiting for that nsqd), still
  within that cap, so a caller never learns a cause older than one round.
* :class:`PollCadence`: while what a client wants from nsqlookupd is not whole (an nsqd it
  had is missing, a worker child holds none), lookupd is asked again every
  :data:`FAST_POLL` seconds for :data:`FAST_PHASE` seconds, then the wait doubles back to the
  regular ``lookupd_poll_interval``, or to :data:`EMPTY_POLL` at most while the client holds no
  nsqd of the topic at all (a consumer started while every nsqd was down); regular waits are
  jittered so clients spread out.
  :data:`MIN_POLL_GAP` keeps any one poller at two polls a second at most.
* :class:`Recall`: an nsqd that lookupd listed and then stopped listing (a restart
  unregisters it) is still wanted for :data:`KEEP_MISSING_POLLS` poll intervals (10 minutes
  by default), so the :class:`Redial` finds it the moment it answers again, whatever
  lookupd's cadence; after that it is taken for gone.

Why: an nsqd restarted at each deploy must be used again within a second of answering,
however long it was down, without a dead host being hammered (issue 45).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Container, Hashable, Iterable
from typing import Generic, TypeVar

from .config import LoggerLike

__all__ = [
    "EMPTY_POLL",
    "FAST_PHASE",
    "FAST_POLL",
    "KEEP_MISSING_POLLS",
    "MAX_ATTEMPTS_PER_SECOND",
    "MIN_POLL_GAP",
    "RETRY_DELAY",
    "PollCadence",
    "Recall",
    "Redial",
]

logger = logging.getLogger(__name__)

#: The default ``reconnect_delay`` and ``max_reconnect_delay``: a round every 0.2-0.4 s.
RETRY_DELAY = 0.4
#: Connection attempts a second to one address, at most, whatever the options say.
MAX_ATTEMPTS_PER_SECOND = 5.0
#: The wait between two lookupd polls while the client is short of an nsqd (seconds, drawn anew).
FAST_POLL = (0.5, 0.75)
#: How long lookupd is polled at FAST_POLL before the wait doubles back to the regular interval.
FAST_PHASE = 60.0
#: The longest wait between two lookupd polls, after FAST_PHASE, while the client holds no nsqd of
#: the topic at all (started while every nsqd was down, or before any had the topic): lookupd is
#: then its only way to find one, however long that takes (half a query a second per client).
EMPTY_POLL = 2.0
#: Two polls of one poller never start closer than this (at most two lookupd queries a second).
MIN_POLL_GAP = 0.5
#: How long an nsqd lookupd stopped listing is still tried (its restart unregistered it), in
#: lookupd poll intervals: 10 minutes at the default 60 s.
KEEP_MISSING_POLLS = 10

#: One attempt to make a key whole (open its connection, subscribe...): raises when it fails.
Attempt = Callable[[], Awaitable[object]]
K = TypeVar("K", bound=Hashable)


#: Seconds between two "cannot reconnect" lines of one address while its attempts keep failing.
SAY_EVERY = 30.0


def _describe(error: BaseException | None) -> str:
    text = str(error) if error is not None else ""
    return text or (type(error).__name__ if error is not None else "unknown")


class _Address:
    """One address with connections missing: the keys wanted there and the task trying them."""

    __slots__ = ("address", "error", "failures", "hurried", "keys", "last_start", "rush", "said_at", "task", "trying",
                 "turn")

    def __init__(self, address: str) -> None:
        self.address = address
        self.keys: dict[Hashable, Attempt] = {}
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None  # why the last attempt failed
        self.failures = 0  # rounds in a row that opened nothing
        self.last_start = float("-inf")  # loop time the last attempt began
        self.trying = False  # a round is under way
        self.hurried: asyncio.Event | None = None  # set to cut the current wait short
        self.rush = False  # the next round is wanted now (hurry() before the wait began)
        self.turn = 0  # which key probes next (a key that keeps failing does not starve the others)
        self.said_at = float("-inf")  # loop time the last "still unreachable" line was logged


class Redial:
    """The connections a client wants and lacks, per address, and one task per address trying them.

    ``delay`` / ``max_delay``: the wait between rounds is drawn from ``[d / 2, d]``, ``d``
    starting at ``delay`` and doubling per round that opened nothing up to ``max_delay``;
    attempts to one address never start closer than 0.21 s (``1.05 / MAX_ATTEMPTS_PER_SECOND``).
    ``on_round`` is called after each round (a publish waiting for nsqd looks again).
    """

    def __init__(
        self,
        *,
        delay: float = RETRY_DELAY,
        max_delay: float = RETRY_DELAY,
        on_round: Callable[[str], None] | None = None,
        log: LoggerLike = logger,
        rng: random.Random | None = None,
    ) -> None:
        self.delay = delay
        self.max_delay = max(delay, max_delay)
        self._on_round = on_round
        self._log = log
        self._rng = rng if rng is not None else random.Random()
        self._addresses: dict[str, _Address] = {}
        self._closed = False

    # ---- what is missing ----------------------------------------------------------------

    def missing(self, address: str, key: Hashable, attempt: Attempt, error: BaseException | None = None) -> None:
        """``key`` (a connection at ``address``) is wanted and not there: try ``attempt`` until it
        succeeds or :meth:`drop`, the first time after one jittered wait. ``error``: why the
        caller's own attempt, just made, failed."""
        if self._closed:
            return
        entry = self._addresses.get(address)
        if entry is None:
            entry = self._addresses[address] = _Address(address)
        entry.keys[key] = attempt
        if error is not None:
            entry.error = error
            entry.last_start = max(entry.last_start, self._now())
            entry.failures = max(entry.failures, 1)
        if entry.task is None:
            entry.task = asyncio.get_running_loop().create_task(self._run(entry))

    def drop(self, key: Hashable) -> None:
        """``key`` is no longer wanted (closed on purpose, led elsewhere, forgotten)."""
        for entry in list(self._addresses.values()):
            if entry.keys.pop(key, None) is not None and not entry.keys:
                self._forget(entry)

    def drop_address(self, address: str) -> None:
        """Nothing at ``address`` is wanted any more."""
        entry = self._addresses.get(address)
        if entry is not None:
            self._forget(entry)

    def pending(self) -> list[Hashable]:
        """Every key missing now."""
        return [key for entry in self._addresses.values() for key in entry.keys]

    def has(self, key: Hashable) -> bool:
        return any(key in entry.keys for entry in self._addresses.values())

    def error(self, address: str) -> BaseException | None:
        """Why the last attempt to ``address`` failed (None: none failed, or nothing is missing there)."""
        entry = self._addresses.get(address)
        return None if entry is None else entry.error

    def hurry(self, addresses: Iterable[str] | None = None) -> bool:
        """Start the next round to these addresses (every one missing by default) now, within the
        cap on attempts a second. True if a round to one of them is under way or starting now:
        its outcome is fresher than the last; False if each was tried within the cap's gap."""
        return self.hurry_since(addresses) is not None

    def hurry_since(self, addresses: Iterable[str] | None = None) -> float | None:
        """:meth:`hurry`, answering when the freshest round under way began (loop time; now for
        one starting now), or None. A caller that waits for news waits from then: a round that has
        hung for seconds (a hung nsqd's handshake) is no news it should wait for again."""
        now = self._now()
        freshest: float | None = None
        for entry in self._entries(addresses):
            if entry.trying or now - entry.last_start >= self._gap():
                began = entry.last_start if entry.trying else now
                freshest = began if freshest is None else max(freshest, began)
                entry.rush = not entry.trying
                if entry.hurried is not None:
                    entry.hurried.set()
        return freshest

    async def close(self) -> None:
        """Stop every round."""
        self._closed = True
        tasks = [entry.task for entry in self._addresses.values() if entry.task is not None]
        self._addresses.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- the rounds ---------------------------------------------------------------------

    async def _run(self, entry: _Address) -> None:
        try:
            while entry.keys and not self._closed:
                await self._pause(entry)
                if not entry.keys or self._closed:
                    return
                await self._round(entry)
        finally:
            if self._addresses.get(entry.address) is entry and entry.task is asyncio.current_task():
                del self._addresses[entry.address]

    async def _pause(self, entry: _Address) -> None:
        """The jittered wait, cut short by :meth:`hurry`; never closer than the cap's gap."""
        ceiling = min(self.max_delay, self.delay * 2 ** min(max(entry.failures - 1, 0), 30))
        loop = asyncio.get_running_loop()
        wake_at = self._now() + self._rng.uniform(ceiling / 2, ceiling)
        entry.hurried = asyncio.Event()
        if entry.rush:
            entry.hurried.set()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(entry.hurried.wait(), max(0.0, wake_at - loop.time()))
        finally:
            entry.hurried = None
        earliest = entry.last_start + self._gap()
        while loop.time() < earliest:  # a timer may fire a fraction of a millisecond early
            await asyncio.sleep(earliest - loop.time())

    async def _round(self, entry: _Address) -> None:
        """One probe; once it got through, every other key of the address at once."""
        entry.trying = True
        entry.rush = False
        try:
            keys = list(entry.keys.items())
            probe_key, probe = keys[entry.turn % len(keys)]
            entry.turn += 1
            if await self._attempt(entry, probe_key, probe):
                # Those still wanted once the probe is back (a key may be dropped meanwhile).
                others = [(k, a) for k, a in list(entry.keys.items()) if k != probe_key]
                results = await asyncio.gather(*(self._attempt(entry, k, a) for k, a in others))
                opened = True
                whole = all(results)
            else:
                opened = whole = False
            entry.failures = 0 if opened else entry.failures + 1
            if not opened:
                self._say_failed(entry)
            elif not whole:
                self._log.debug("nsqd %s still missing: %s", entry.address, entry.error)
        finally:
            entry.trying = False
            if self._on_round is not None:
                self._on_round(entry.address)

    def _say_failed(self, entry: _Address) -> None:
        """A round that opened nothing: the first said at WARNING with its cause, then a line
        every SAY_EVERY seconds at most (not one per attempt, nor silence until it is back)."""
        now = self._now()
        if entry.failures == 1 or now - entry.said_at >= SAY_EVERY:
            entry.said_at = now
            again = "" if entry.failures == 1 else f" ({entry.failures} attempts in a row)"
            self._log.warning("cannot reconnect to nsqd %s%s: %s; trying again", entry.address, again,
                              _describe(entry.error))
        else:
            self._log.debug("nsqd %s still missing: %s", entry.address, entry.error)

    async def _attempt(self, entry: _Address, key: Hashable, attempt: Attempt) -> bool:
        entry.last_start = self._now()
        try:
            await attempt()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the attempt's failure is the news: kept as the cause
            entry.error = exc
            return False
        if entry.keys.get(key) is attempt:
            del entry.keys[key]
        entry.error = None
        return True

    # ---- helpers ------------------------------------------------------------------------

    def _entries(self, addresses: Iterable[str] | None) -> list[_Address]:
        if addresses is None:
            return list(self._addresses.values())
        return [self._addresses[a] for a in addresses if a in self._addresses]

    def _forget(self, entry: _Address) -> None:
        self._addresses.pop(entry.address, None)
        entry.keys.clear()
        if entry.task is not None and entry.task is not _current_task():
            entry.task.cancel()

    @staticmethod
    def _gap() -> float:
        # A little over 1 / MAX_ATTEMPTS_PER_SECOND: five gaps never fit in a second, even as an
        # observer's clock on the other side sees them (each connect takes its own few ms).
        return 1.05 / MAX_ATTEMPTS_PER_SECOND

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


class PollCadence:
    """The wait before a client's next lookupd poll: regular (``interval``, jittered by ±
    ``jitter`` / 2 of it), or fast while the client is short of an nsqd (see the module).

    ``clock`` and ``rng`` can be replaced in tests.

    >>> cadence = PollCadence(60.0, 0.3, clock=lambda: 0.0)
    >>> 51.0 <= cadence.next_wait() <= 69.0
    True
    >>> cadence.set_short(True)
    True
    >>> FAST_POLL[0] <= cadence.next_wait() <= FAST_POLL[1]
    True
    """

    def __init__(
        self,
        interval: float,
        jitter: float = 0.3,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.interval = interval
        self.jitter = jitter
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._short_since: float | None = None
        self._slow_steps = 0
        self._empty = False

    @property
    def short(self) -> bool:
        return self._short_since is not None

    def set_short(self, short: bool, *, empty: bool = False) -> bool:
        """Whether the client lacks an nsqd it wants (``empty``: it holds none at all, and is short
        however long that lasts); True when it just became short (poll now)."""
        self._empty = short and empty
        if short == self.short:
            return False
        self._short_since = self._clock() if short else None
        self._slow_steps = 0
        return short

    def next_wait(self) -> float:
        regular = self.interval * (1 + self.jitter * self._rng.uniform(-0.5, 0.5))
        if self._short_since is None:
            return regular
        if self._clock() - self._short_since < FAST_PHASE:
            return min(regular, self._rng.uniform(*FAST_POLL))
        self._slow_steps += 1
        longest = min(regular, EMPTY_POLL) if self._empty else regular
        return min(longest, FAST_POLL[1] * 2.0 ** min(self._slow_steps, 30))


class Recall(Generic[K]):
    """What lookupd listed lately: a key it stopped listing is still wanted for ``keep`` seconds.

    >>> now = [0.0]
    >>> recall = Recall(keep=10.0, clock=lambda: now[0])
    >>> sorted(recall.wanted({"a:4150", "b:4150"}))
    ['a:4150', 'b:4150']
    >>> now[0] = 5.0; sorted(recall.wanted({"a:4150"}))      # b restarting: still wanted
    ['a:4150', 'b:4150']
    >>> now[0] = 11.0; sorted(recall.wanted({"a:4150"}))     # gone for longer than keep
    ['a:4150']
    """

    def __init__(self, keep: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self._clock = clock
        self._seen: dict[K, float] = {}

    def wanted(self, listed: Iterable[K]) -> set[K]:
        """``listed`` now, and what was listed within ``keep`` seconds (forgetting the rest)."""
        now = self._clock()
        found = set(listed)
        for key in found:
            self._seen[key] = now
        for key, seen in list(self._seen.items()):
            if now - seen > self.keep:
                del self._seen[key]
        return found | set(self._seen)

    def kept(self, key: K) -> bool:
        """Whether ``key`` was listed within the last ``keep`` seconds."""
        seen = self._seen.get(key)
        return seen is not None and self._clock() - seen <= self.keep

    def gone(self, missing: Iterable[K], listed: Container[K], moved: Container[K] = ()) -> list[K]:
        """Of the ``missing`` keys, those no longer wanted: led elsewhere now (``moved``), or
        neither ``listed`` nor listed within ``keep`` seconds."""
        return [key for key in missing if key in moved or (key not in listed and not self.kept(key))]


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
