"""Polling every nsqlookupd of a topic and keeping the union of their answers."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from fastnsq.config import Endpoint
from fastnsq.errors import InvalidValueError
from fastnsq.recovery import MIN_POLL_GAP

from .answers import (
    Discovery,
    ListLookupResult,
    LookupdError,
    LookupResult,
    NodeInfo,
    TopicMeta,
    merge_meta,
    normalize_lookupd_address,
)
from .client import Access, LookupdClient

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

class _Health:
    """Failure count of one lookupd and how many polls it still sits out."""

    __slots__ = ("failures", "skip")

    def __init__(self) -> None:
        self.failures = 0
        self.skip = 0

    def take_turn(self) -> bool:
        """Whether to ask this lookupd in this poll (consumes one skipped poll if not)."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def record(self, ok: bool, max_skip: int) -> None:
        if ok:
            self.failures = 0
            self.skip = 0
            return
        self.failures += 1
        # A first failure may be a blip: retry next poll. Then sit out 1, 3, 7, ... polls.
        self.skip = min(2 ** (self.failures - 1) - 1, max_skip)


class LookupdPoller:
    """Polls every configured lookupd for one topic and keeps the union of the answers.

    * All lookupds are asked concurrently; :meth:`poll_once` returns a
      :class:`Discovery` whose endpoints are the union of every answer, keyed by
      ``broadcast_address:tcp_port`` and, on HA, the partition.
    * A lookupd that fails keeps its last answer: a failure never drops endpoints.
    * A lookupd that keeps failing sits out polls: after ``n`` failures in a row it
      is skipped for ``min(2**(n-1) - 1, max_skip_polls)`` polls; one good answer
      resets it.
    * With ``discover_lookupds`` (default) every configured lookupd is first asked
      ``/listlookup``; an HA cluster answers with all its lookupd nodes, which
      are then asked instead. A lookupd that answers nothing (standalone HA) or
      does not know the endpoint (upstream: ``404``) is asked itself.
    * :meth:`run` polls forever: a first random delay of up to
      ``poll_jitter * poll_interval`` (so many clients started together spread
      out, as go-nsq), then one poll every ``poll_interval`` seconds (or as its
      ``next_wait`` says: :class:`fastnsq.recovery.PollCadence`), or sooner after
      :meth:`trigger`. When a poll began less than the cap's gap before the first
      would (the caller's own, as a consumer's ``start()`` makes), that poll counts
      as the first, and the regular wait follows it.
    * Two polls never start closer than :data:`fastnsq.recovery.MIN_POLL_GAP`
      (0.5 s): at most two queries a second to each lookupd, however many
      triggers and refreshes come.

    ``rng`` and ``sleep`` can be replaced, e.g. in tests.

    Example::

        async with LookupdPoller(["10.0.0.1:4161", "10.0.0.2:4161"], "events",
                                 access="r", metainfo=True) as poller:
            await poller.run(on_discovery)   # called with each Discovery
    """

    def __init__(
        self,
        lookupd_http_addresses: Sequence[str] | str,
        topic: str,
        *,
        client: LookupdClient | None = None,
        access: Access | None = None,
        metainfo: bool = False,
        partition: int | None = None,
        poll_interval: float = 60.0,
        poll_jitter: float = 0.3,
        discover_lookupds: bool = True,
        max_skip_polls: int = 8,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        addresses = (
            [lookupd_http_addresses]
            if isinstance(lookupd_http_addresses, str)
            else list(lookupd_http_addresses)
        )
        if not addresses:
            raise InvalidValueError("lookupd_http_addresses must name at least one lookupd")
        _check_number("poll_interval", poll_interval, 0.01, 300.0, "a number of seconds")
        _check_number("poll_jitter", poll_jitter, 0.0, 1.0, "a fraction of poll_interval")
        if not isinstance(max_skip_polls, int) or isinstance(max_skip_polls, bool) or max_skip_polls < 0:
            raise InvalidValueError(f"max_skip_polls must be an integer >= 0, got {max_skip_polls!r}")
        if not isinstance(topic, str) or not topic:
            raise InvalidValueError(f"topic must be a non-empty string, got {topic!r}")
        # dict.fromkeys: de-duplicate, keep the user's order.
        self._configured = tuple(dict.fromkeys(normalize_lookupd_address(a) for a in addresses))
        self._topic = topic
        self._client = client if client is not None else LookupdClient()
        self._owns_client = client is None
        self._access: Access | None = access
        self._metainfo = metainfo
        self._partition = partition
        self.poll_interval = float(poll_interval)
        self.poll_jitter = float(poll_jitter)
        self._discover = discover_lookupds
        self._max_skip = max_skip_polls
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._health: dict[str, _Health] = {}
        self._answers: dict[str, LookupResult] = {}
        # configured lookupd -> base URLs of its cluster's lookupds (absent: ask it directly)
        self._cluster: dict[str, tuple[str, ...]] = {}
        self._no_listlookup: set[str] = set()
        self._lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._woken_to: str | None = None  # what the wake-up is for: "poll" now, or "replan" the wait
        self._last = Discovery()
        self._last_started = float("-inf")  # loop time the last poll began

    def __repr__(self) -> str:
        return f"<LookupdPoller topic={self._topic!r} lookupds={list(self._configured)}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP client if this poller created it."""
        if self._owns_client:
            await self._client.close()

    @property
    def last(self) -> Discovery:
        """The result of the latest poll (empty before the first)."""
        return self._last

    @property
    def endpoints(self) -> dict[Endpoint, NodeInfo]:
        """The endpoints found by the latest poll."""
        return self._last.endpoints

    @property
    def meta(self) -> TopicMeta | None:
        """The merged HA topic meta of the latest poll (``extend_support`` etc.)."""
        return self._last.meta

    def failures(self, address: str) -> int:
        """How many polls in a row the lookupd at ``address`` has failed."""
        health = self._health.get(normalize_lookupd_address(address))
        return 0 if health is None else health.failures

    def set_lookupds(self, lookupd_http_addresses: Sequence[str]) -> None:
        """Ask these lookupds from the next poll on (a run-time change of the configured ones).

        The answers of lookupds no longer configured stop counting at the next poll.
        """
        addresses = tuple(dict.fromkeys(normalize_lookupd_address(a) for a in lookupd_http_addresses))
        if not addresses:
            raise InvalidValueError("lookupd_http_addresses must name at least one lookupd")
        for gone in set(self._configured) - set(addresses):
            self._cluster.pop(gone, None)
            self._no_listlookup.discard(gone)
        self._configured = addresses

    def trigger(self) -> None:
        """Make :meth:`run` poll now instead of waiting out the interval (e.g. after a lost connection)."""
        self._woken_to = "poll"
        self._wakeup.set()

    def replan(self) -> None:
        """Make :meth:`run` work out its wait again with ``next_wait()``, counted from the start of
        the last poll: the cadence changed (its client became short of an nsqd, or no longer is).
        A poll already asked for by :meth:`trigger` stays asked for."""
        if self._woken_to is None:
            self._woken_to = "replan"
        self._wakeup.set()

    async def poll_once(self) -> Discovery:
        """Ask the lookupds once and return the union of what every lookupd last said."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            gap = self._last_started + MIN_POLL_GAP - loop.time()
            if gap > 0:  # the loop's own clock and sleep: the cap holds whatever ``sleep`` does
                await asyncio.sleep(gap)
            self._last_started = loop.time()
            self._last = await self._poll()
            return self._last

    async def run(
        self,
        callback: Callable[[Discovery], Awaitable[None] | None],
        next_wait: Callable[[], float] | None = None,
    ) -> None:
        """Poll until cancelled, calling ``callback`` with each :class:`Discovery`; between two
        polls ``next_wait()`` seconds (``poll_interval`` without it).

        An exception from ``callback`` is logged and polling goes on.
        """
        regular_wait = (lambda: self.poll_interval) if next_wait is None else next_wait
        first = self._rng.random() * self.poll_jitter * self.poll_interval
        if self._polled_within(MIN_POLL_GAP - first):
            # The caller has just polled (a consumer's start() does): that poll stands for the
            # first, which the cap would only push back, shifting every later poll with it.
            first = regular_wait()
        await self._wait(first, regular_wait)
        while True:
            found = await self.poll_once()
            try:
                outcome = callback(found)
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("lookupd discovery callback failed for topic %r", self._topic)
            await self._wait(regular_wait(), regular_wait)

    async def _wait(self, delay: float, next_wait: Callable[[], float]) -> None:
        """``delay`` seconds until the next poll; after :meth:`replan`, ``next_wait()`` from the
        last poll's start instead (a cadence that changed within a loop pass and back, as a
        consumer's does while its first connections open, costs no poll)."""
        while await self._pause(delay) == "replan":
            delay = self._last_started + next_wait() - asyncio.get_running_loop().time()

    def _polled_within(self, seconds: float) -> bool:
        """Whether the last poll began less than ``seconds`` ago."""
        return seconds > 0 and asyncio.get_running_loop().time() - self._last_started < seconds

    async def _pause(self, delay: float) -> str | None:
        """Sleep ``delay`` seconds, or less if :meth:`trigger` or :meth:`replan` is called;
        returns what woke it ("poll", "replan"), None when the time was up."""
        if not self._wakeup.is_set() and delay > 0:
            sleeper = asyncio.ensure_future(self._sleep(delay))
            waker = asyncio.ensure_future(self._wakeup.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
        woken_to, self._woken_to = (self._woken_to if self._wakeup.is_set() else None), None
        self._wakeup.clear()
        return woken_to

    # -- one poll

    async def _poll(self) -> Discovery:
        turns: dict[str, bool] = {}
        failed: set[str] = set()
        await self._discover_clusters(turns, failed)
        targets = self._targets()
        due = [t for t in targets if t not in failed and self._turn(t, turns)]
        outcomes = await asyncio.gather(*(self._lookup(t) for t in due), return_exceptions=True)
        for target, outcome in zip(due, outcomes):
            if isinstance(outcome, LookupResult):
                self._answers[target] = outcome
            else:
                failed.add(target)
                self._log_failure(target, "lookup", outcome)
        for address, asked in turns.items():
            if asked:
                self._record(address, ok=address not in failed)
        # Answers of lookupds that left the cluster no longer count.
        for gone in set(self._answers) - set(targets):
            del self._answers[gone]
        for gone in set(self._health) - set(targets) - set(self._configured):
            del self._health[gone]
        return self._union(targets)

    async def _discover_clusters(self, turns: dict[str, bool], failed: set[str]) -> None:
        if not self._discover:
            return
        asked = [c for c in self._configured if c not in self._no_listlookup and self._turn(c, turns)]
        outcomes = await asyncio.gather(*(self._client.listlookup(c) for c in asked), return_exceptions=True)
        for address, outcome in zip(asked, outcomes):
            if not isinstance(outcome, ListLookupResult):
                # Keep whatever this lookupd said before; it counts as failed for this poll.
                failed.add(address)
                self._log_failure(address, "listlookup", outcome)
            elif not outcome.supported:
                logger.debug("nsqlookupd %s has no /listlookup (upstream); asking it directly", address)
                self._no_listlookup.add(address)
                self._cluster.pop(address, None)
            elif outcome.nodes:
                cluster = tuple(dict.fromkeys(n.http_address for n in outcome.nodes))
                if cluster != self._cluster.get(address):
                    logger.info("nsqlookupd %s: cluster lookupds %s", address, list(cluster))
                self._cluster[address] = cluster
            else:
                self._cluster.pop(address, None)

    def _targets(self) -> list[str]:
        targets: dict[str, None] = {}
        for address in self._configured:
            for target in self._cluster.get(address, (address,)):
                targets[target] = None
        return list(targets)

    def _turn(self, address: str, turns: dict[str, bool]) -> bool:
        # One turn per lookupd per poll, however many requests it gets in that poll.
        if address not in turns:
            turns[address] = self._health.setdefault(address, _Health()).take_turn()
        return turns[address]

    def _record(self, address: str, *, ok: bool) -> None:
        health = self._health.setdefault(address, _Health())
        if ok and health.failures:
            logger.info("nsqlookupd %s answers again after %d failed polls", address, health.failures)
        health.record(ok, self._max_skip)

    def _log_failure(self, address: str, what: str, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        count = self._health.setdefault(address, _Health()).failures + 1
        level = logging.WARNING if isinstance(exc, LookupdError) else logging.ERROR
        logger.log(
            level,
            "nsqlookupd %s: %s for topic %r failed (%d in a row), keeping its last answer: %s",
            address,
            what,
            self._topic,
            count,
            exc,
            exc_info=None if isinstance(exc, LookupdError) else exc,
        )

    async def _lookup(self, address: str) -> LookupResult:
        return await self._client.lookup(
            address, self._topic, access=self._access, metainfo=self._metainfo, partition=self._partition
        )

    def _union(self, targets: Sequence[str]) -> Discovery:
        endpoints: dict[Endpoint, NodeInfo] = {}
        channels: set[str] = set()
        answers = [self._answers[t] for t in targets if t in self._answers]
        for answer in answers:
            for endpoint, node in answer.endpoints().items():
                endpoints.setdefault(endpoint, node)
            channels.update(answer.channels)
        return Discovery(
            endpoints=endpoints,
            meta=merge_meta(a.meta for a in answers),
            is_ha=any(a.is_ha for a in answers),
            channels=frozenset(channels),
            lookupds=tuple(targets),
        )


def _check_number(name: str, value: float, low: float, high: float, unit: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidValueError(f"{name} must be {unit} in {low}..{high}, got {value!r}")
