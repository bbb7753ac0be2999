"""Where each topic lives, from nsqlookupd: its nsqd, and on HA its partitions and their leaders.

One job: keep, per topic, the latest :class:`TopicRoute` the lookupds gave, refresh it
one lookup at a time, and tell the listeners of a topic when a new one arrives. A
:class:`~fastnsq.Consumer` watches its topic (a poll every ``poll_interval`` and one
soon after a lost connection); a :class:`~fastnsq.Producer` asks for a topic's route
when it publishes and keeps it for ``poll_interval``. Neither keeps routes of its own.

The HTTP side is :mod:`fastnsq.lookupd`, imported on first use (it brings aiohttp).
Which partition a message goes to is :mod:`fastnsq.sharding`'s job, not this one's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .config import Endpoint, LoggerLike
from .errors import InvalidValueError, NSQError
from .recovery import PollCadence

if TYPE_CHECKING:
    from .lookupd import Discovery, LookupdClient, LookupdPoller, NodeInfo

__all__ = ["RouteListener", "TopicRoute", "Topology"]

logger = logging.getLogger(__name__)

#: A refresh asked for after a lost connection waits up to this long, so that the
#: requests of many connections lost together become one poll (and a node that keeps
#: refusing SUB while it rejoins a youzan cluster is not asked again in a tight loop).
REFRESH_DELAY = 1.0


@dataclass(frozen=True)
class TopicRoute:
    """One topic as the lookupds last described it. Treat the mappings as read-only.

    ``endpoints``: what to connect to, one per partition a node leads (HA) or one per
    nsqd (upstream); ``partitions``: partition id -> address of its leader (empty
    upstream); ``partition_num``: the partition count from the HA meta (0 if unknown);
    ``extend_support``: connections to this topic must set ``extend_support``.

    >>> route = TopicRoute("t", partitions={0: "a:4150", 1: "b:4150"}, partition_num=2)
    >>> route.pids, route.leader(1)
    ((0, 1), 'b:4150')
    >>> route.moved_away([Endpoint("a:4150", 0), Endpoint("a:4150", 1), Endpoint("c:4150", None)])
    [Endpoint(address='a:4150', partition=1)]
    """

    topic: str
    endpoints: Mapping[Endpoint, NodeInfo] = field(default_factory=dict)
    partitions: Mapping[int, str] = field(default_factory=dict)
    partition_num: int = 0
    extend_support: bool = False
    is_ha: bool = False

    @property
    def pids(self) -> tuple[int, ...]:
        """The partitions whose leader is known, in order."""
        return tuple(sorted(self.partitions))

    @property
    def addresses(self) -> list[str]:
        """Every nsqd of the route, once each, in the order of the endpoints."""
        return list(dict.fromkeys(endpoint.address for endpoint in self.endpoints))

    def leader(self, partition: int) -> str | None:
        """The address of the nsqd that leads ``partition``, if the lookupds named one."""
        return self.partitions.get(partition)

    def moved_away(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        """Those of ``endpoints`` whose partition is now led by another nsqd.

        Only a partition listed under another node counts: an answer that lists nothing
        (a lookupd restarting, a registration not in yet) must not drop working links.
        """
        return [
            e for e in endpoints
            if e.partition is not None and self.partitions.get(e.partition, e.address) != e.address
        ]

    @classmethod
    def from_discovery(cls, topic: str, discovery: Discovery) -> TopicRoute:
        meta = discovery.meta
        return cls(
            topic,
            endpoints=dict(discovery.endpoints),
            partitions={e.partition: e.address for e in discovery.endpoints if e.partition is not None},
            partition_num=meta.partition_num if meta is not None else 0,
            extend_support=bool(meta is not None and meta.extend_support),
            is_ha=discovery.is_ha,
        )


#: Called with each new route of a topic; may be a coroutine function (awaited in turn).
RouteListener = Callable[[TopicRoute], "Awaitable[None] | None"]


class _Topic:
    """What the topology keeps of one topic."""

    __slots__ = ("cadence", "listeners", "lookup", "poller", "refresh_timer", "route", "stamp", "watch_task")

    def __init__(self, poller: LookupdPoller, cadence: PollCadence) -> None:
        self.poller = poller
        self.cadence = cadence
        self.route: TopicRoute | None = None
        self.stamp = 0.0  # loop time of the route
        self.listeners: list[RouteListener] = []
        self.lookup: asyncio.Task[TopicRoute] | None = None
        self.watch_task: asyncio.Task[None] | None = None
        self.refresh_timer: asyncio.TimerHandle | None = None


class Topology:
    """The routes of the topics one client uses, from the lookupds at ``lookupd_http_addresses``.

    ``access`` is HA's lookup mode: ``"r"`` (a consumer: every partition's readable
    node) or ``"w"`` (a producer: each partition's leader); upstream ignores it.
    ``auth_secret`` goes to the lookupds as ``Authorization: Bearer`` (go-nsq's
    ``LookupdAuthorization``). A route is fresh for ``poll_interval`` seconds; a lookupd
    that does not answer within ``poll_timeout`` counts as failed for that poll.

    Example::

        topology = Topology(["127.0.0.1:4161"], access="w")
        route = await topology.route("events")
        print(route.partitions or route.addresses)
        await topology.close()
    """

    def __init__(
        self,
        lookupd_http_addresses: Sequence[str],
        *,
        access: Literal["r", "w"],
        poll_interval: float = 60.0,
        poll_jitter: float = 0.3,
        auth_secret: str | None = None,
        poll_timeout: float = 60.0,
        client: LookupdClient | None = None,
        log: LoggerLike = logger,
    ) -> None:
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        self.poll_timeout = poll_timeout
        self._log = log
        self.access = access
        self.poll_interval = poll_interval
        self.poll_jitter = poll_jitter
        self._auth_secret = auth_secret
        self._client = client
        self._topics: dict[str, _Topic] = {}
        self._node_task: asyncio.Task[None] | None = None
        self._closed = False

    # ---- asking -------------------------------------------------------------------------

    def cached(self, topic: str) -> TopicRoute | None:
        """The route of ``topic`` if one is known and fresh, else None (ask :meth:`route`)."""
        entry = self._topics.get(topic)
        if entry is None or entry.route is None:
            return None
        if asyncio.get_running_loop().time() - entry.stamp > self.poll_interval:
            return None
        return entry.route

    async def route(self, topic: str) -> TopicRoute:
        """The route of ``topic``: the fresh one, or a new lookup (one at a time per topic)."""
        route = self.cached(topic)
        if route is not None:
            return route
        return await self.refresh(topic)

    async def refresh(self, topic: str) -> TopicRoute:
        """Ask the lookupds now (joining a lookup already under way); listeners hear of it first."""
        entry = self._entry(topic)
        if entry.lookup is None:
            entry.lookup = asyncio.get_running_loop().create_task(self._lookup(topic, entry))
            entry.lookup.add_done_callback(lambda _task: setattr(entry, "lookup", None))
        # shield: one caller giving up (its own deadline) must not cancel the others' lookup.
        return await asyncio.shield(entry.lookup)

    def forget(self, topic: str) -> None:
        """Drop the route of ``topic`` (its leader moved): the next :meth:`route` looks it up."""
        entry = self._topics.get(topic)
        if entry is not None and entry.route is not None:
            self._log.info("forgetting the route of topic %s: the next publish looks it up again", topic)
            entry.route = None

    # ---- watching -----------------------------------------------------------------------

    def add_listener(self, topic: str, listener: RouteListener) -> None:
        """Call ``listener`` with every new route of ``topic`` (by any lookup, watched or asked)."""
        self._entry(topic).listeners.append(listener)

    def watch(self, topic: str) -> None:
        """Poll ``topic`` every ``poll_interval`` (the first of these polls after a random delay of up
        to ``poll_jitter`` x ``poll_interval``, so that many clients started together spread out; a
        caller that needs the route at once calls :meth:`refresh` first, as the consumer's ``start()``
        does; each wait jittered), more often while the
        watcher is short of an nsqd (:meth:`set_short`), until :meth:`close`."""
        entry = self._entry(topic)
        if entry.watch_task is None:
            async def arrived(discovery: Discovery) -> None:
                await self._arrived(topic, entry, discovery)

            entry.watch_task = asyncio.get_running_loop().create_task(
                entry.poller.run(arrived, entry.cadence.next_wait)
            )

    def set_short(self, topic: str, short: bool, *, empty: bool = False) -> None:
        """Whether the watcher of ``topic`` lacks an nsqd it wants (``empty``: it holds none at all;
        the recovery rule, :class:`fastnsq.recovery.PollCadence`): while it does, lookupd is asked
        again often."""
        entry = self._topics.get(topic)
        if entry is None or self._closed:
            return
        changed = entry.cadence.short != short
        entry.cadence.set_short(short, empty=empty)
        if changed:  # the wait under way was planned for the other cadence
            entry.poller.replan()

    def refresh_soon(self, topic: str) -> None:
        """One poll of a watched topic within :data:`REFRESH_DELAY`; requests while one is
        pending join it (each lost connection asks for one)."""
        entry = self._topics.get(topic)
        if entry is None or entry.refresh_timer is not None or self._closed:
            return
        entry.refresh_timer = asyncio.get_running_loop().call_later(
            REFRESH_DELAY * random.uniform(0.5, 1.0), self._refresh_now, entry
        )

    def set_lookupds(self, lookupd_http_addresses: Sequence[str]) -> None:
        """Ask these lookupds from now on (adding or removing one at run time); at least one."""
        addresses = list(dict.fromkeys(lookupd_http_addresses))
        if not addresses:
            raise InvalidValueError("a topology needs at least one lookupd")
        self.lookupd_http_addresses = addresses
        for entry in self._topics.values():
            entry.poller.set_lookupds(addresses)
            entry.poller.trigger()

    # ---- nodes --------------------------------------------------------------------------

    async def nodes(self) -> list[str]:
        """Every nsqd the lookupds know (``/nodes``), once each: for topics without partitions.

        A lookupd that fails is logged and left out of this answer.
        """
        client = self._ensure_client()
        found: dict[str, None] = {}
        for address in self.lookupd_http_addresses:
            try:
                for node in await client.nodes(address):
                    found[node.address] = None
            except NSQError as exc:
                self._log.warning("lookupd %s: %s", address, exc)
        return list(found)

    def watch_nodes(self, listener: Callable[[list[str]], Awaitable[None]]) -> None:
        """Call ``listener`` with :meth:`nodes` every ``poll_interval`` (after a random first delay)."""
        if self._node_task is None:
            self._node_task = asyncio.get_running_loop().create_task(self._poll_nodes(listener))

    async def close(self) -> None:
        """Stop every poll and close the HTTP client."""
        self._closed = True
        tasks: list[asyncio.Task[Any]] = [
            t for t in (self._node_task, *(e.watch_task for e in self._topics.values())) if t is not None
        ]
        for entry in self._topics.values():
            if entry.refresh_timer is not None:
                entry.refresh_timer.cancel()
            if entry.lookup is not None:
                tasks.append(entry.lookup)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    # ---- internals ----------------------------------------------------------------------

    def _ensure_client(self) -> LookupdClient:
        if self._client is None:
            from .lookupd import LookupdClient  # imported only when used: it brings aiohttp

            self._client = LookupdClient(timeout=self.poll_timeout, auth_secret=self._auth_secret)
        return self._client

    def _entry(self, topic: str) -> _Topic:
        entry = self._topics.get(topic)
        if entry is None:
            from .lookupd import LookupdPoller

            poller = LookupdPoller(
                self.lookupd_http_addresses, topic, client=self._ensure_client(), access=self.access,
                metainfo=True, poll_interval=self.poll_interval, poll_jitter=self.poll_jitter,
            )
            entry = self._topics[topic] = _Topic(poller, PollCadence(self.poll_interval, self.poll_jitter))
        return entry

    async def _lookup(self, topic: str, entry: _Topic) -> TopicRoute:
        return await self._arrived(topic, entry, await entry.poller.poll_once())

    async def _arrived(self, topic: str, entry: _Topic, discovery: Discovery) -> TopicRoute:
        route = TopicRoute.from_discovery(topic, discovery)
        for listener in list(entry.listeners):
            outcome: Any = listener(route)
            if inspect.isawaitable(outcome):
                await outcome
        entry.route = route
        entry.stamp = asyncio.get_running_loop().time()
        return route

    def _refresh_now(self, entry: _Topic) -> None:
        entry.refresh_timer = None
        if not self._closed:
            entry.poller.trigger()

    async def _poll_nodes(self, listener: Callable[[list[str]], Awaitable[None]]) -> None:
        await asyncio.sleep(random.uniform(0, self.poll_jitter * self.poll_interval))
        while not self._closed:
            await listener(await self.nodes())
            await asyncio.sleep(self.poll_interval)
