"""Where a publish goes: any nsqd (upstream), or the leader of the partition chosen (HA).

The topic's partitions and leaders come from :class:`~fastnsq.topology.Topology`; the
choice among them from :mod:`fastnsq.sharding`. A target is ``(address, partition)``,
``(None, None)`` meaning "any nsqd of the pool".
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..errors import InvalidValueError, NoConnectionError, PublishTimeoutError
from ..recovery import FAST_POLL
from ..sharding import Hasher, RoundRobin, key_bytes
from ..topology import Topology
from .load import LoadAware, NodeLoads
from .pool import ConnectionPool

__all__ = ["ANY_NSQD", "Router", "Target"]

Target = tuple["str | None", "int | None"]
ANY_NSQD: Target = (None, None)


class Router:
    """Targets for a producer's publishes, from its topology (None without lookupd)."""

    def __init__(
        self, topology: Topology | None, pool: ConnectionPool, hasher: Hasher, loads: NodeLoads | None = None
    ) -> None:
        self.topology = topology
        self._pool = pool
        self._hasher = hasher
        self._loads = loads  # pub_strategy="dynamic_load" (.load); None: round robin
        self._turns: dict[str, Any] = {}
        self._pass_keys: dict[str, Any] = {}  # topic -> coalescing key of this loop pass
        self._short_polls: dict[str, float] = {}  # topic -> when its short route may be asked for again
        self._polling: set[asyncio.Task[None]] = set()

    def target_now(self, topic: str, partition: int | None, sharding_key: Any) -> Target | None:
        """The target from what is known now; None when a lookup is needed first."""
        if self.topology is None:
            if sharding_key is not None:
                raise InvalidValueError(
                    "sharding_key needs lookupd_http_addresses: the partition count and leaders come from nsqlookupd"
                )
            return (None, partition)
        route = self.topology.cached(topic)
        if route is None:
            return None
        if route.is_ha and len(route.partitions) < route.partition_num:
            self._poll_short(topic)
        if not route.partitions:
            if route.is_ha and route.partition_num:
                return None  # no partition's leader listed (both replicas down, say): wait for one
            if sharding_key is not None:
                raise InvalidValueError(f"topic {topic!r} has no partitions (not an HA nsqd): sharding_key needs them")
            return (None, partition)
        if partition is not None:
            if partition not in route.partitions:
                if 0 <= partition < route.partition_num:
                    return None  # it exists, and lookupd lists no leader of it now (a failover): ask again
                raise InvalidValueError(
                    f"topic {topic!r} has no partition {partition} (partitions: {list(route.pids)})"
                )
            pid = partition
        elif sharding_key is not None:
            count = route.partition_num or len(route.partitions)
            pid = self._hasher(key_bytes(sharding_key)) % count
            if pid not in route.partitions:
                return None  # its leader is not known: look it up again
        elif self._loads is None:
            pid = self._turns.setdefault(topic, RoundRobin()).next_of(route.pids)
        else:
            pid = self._turns.setdefault(topic, LoadAware(self._loads)).next_of(route.pids, route.partitions)
        return (route.partitions[pid], pid)

    async def target(self, topic: str, partition: int | None, sharding_key: Any, deadline: float) -> Target:
        """The target, looking the topic up first when needed (within ``deadline``); a partition
        that lookupd lists no leader of (its leader died, another not elected yet) is looked up
        again until one is listed or the deadline passes (lookupd asked twice a second at most)."""
        target = self.target_now(topic, partition, sharding_key)
        if target is not None:
            return target
        assert self.topology is not None
        loop = asyncio.get_running_loop()
        asked = False
        while True:
            try:
                # shield: a publish that gives up must not cancel the connects of the lookup it joined.
                await asyncio.wait_for(asyncio.shield(self._look_up(topic)), max(0.001, deadline - loop.time()))
            except asyncio.TimeoutError:
                if asked:
                    break  # lookupd answered, without a leader of the partition, until the deadline
                # A lookupd slow to answer (say, while it elects a partition's leader) uses up
                # the publish's own deadline: the same error as any other publish timeout.
                raise PublishTimeoutError(
                    f"nsqlookupd did not say where topic {topic!r} is within the publish timeout"
                ) from None
            asked = True
            target = self.target_now(topic, partition, sharding_key)
            if target is not None:
                return target
            if (partition is None and sharding_key is None and not self._leaders_due(topic)) or loop.time() >= deadline:
                break
        route = self.topology.cached(topic)
        listed = list(route.pids) if route is not None else []
        which = "the partition" if partition is None else f"partition {partition}"
        raise NoConnectionError(f"nsqlookupd knows no nsqd leading {which} of topic {topic!r} "
                                f"(partitions with a leader: {listed})")

    def _leaders_due(self, topic: str) -> bool:
        """An HA topic whose lookupd lists none of its partitions' leaders now (a failover): a
        publish to any partition waits for one, as a publish to a named partition does."""
        assert self.topology is not None
        route = self.topology.cached(topic)
        return route is not None and route.is_ha and route.partition_num > 0 and not route.partitions

    def _poll_short(self, topic: str) -> None:
        """The route lacks a partition's leader (a failover): ask lookupd again in the background,
        at the recovery rule's fast cadence (every FAST_POLL[0] s at most), so that the partition
        takes writes again within a second of lookupd listing its new leader, not after
        ``lookupd_poll_interval`` (60 s), whatever partition the publishes name."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now < self._short_polls.get(topic, 0.0):
            return
        self._short_polls[topic] = now + FAST_POLL[0]
        task = loop.create_task(self._quiet_look_up(topic))
        self._polling.add(task)
        task.add_done_callback(self._polling.discard)

    async def _quiet_look_up(self, topic: str) -> None:
        # A failed background poll changes nothing: the publishes see the route they had.
        with contextlib.suppress(Exception):
            await self._look_up(topic)

    async def _look_up(self, topic: str) -> None:
        """A new route for ``topic``, with a connection to each of its nsqd (failures logged)."""
        assert self.topology is not None
        route = await self.topology.refresh(topic)
        await self._pool.add_nodes(route.addresses)

    def coalescing_key(self, topic: str) -> tuple[str, str | None, int | None] | str | None:
        """The coalescing key from what lookupd said (None: the slow path must look it up).

        Round robin turns once per loop pass, not per publish: the publishes of one pass
        go out as one batch to one partition, and the callers that batch wakes publish
        together again. Turning per publish split every group of callers over the
        partitions, so the batches shrank pass after pass towards one message each
        (on a real youzan cluster: from ~100k to ~10k msg/s within 100k publishes).
        """
        key = self._pass_keys.get(topic)
        if key is None:
            target = self.target_now(topic, None, None)
            if target is None:
                return None
            key = topic if target == ANY_NSQD else (topic, target[0], target[1])
            self._pass_keys[topic] = key
        if not self._pool.connected_to(key[1] if type(key) is tuple else None):
            return None
        return key

    def new_pass(self) -> None:
        """A loop pass ended: the next one takes the next partition."""
        self._pass_keys.clear()

    def forget(self, topic: str, leader_moved: bool) -> None:
        """A failed publish: a new pass key, and a new lookup if the partition's leader moved."""
        self._pass_keys.pop(topic, None)
        if leader_moved and self.topology is not None:
            self.topology.forget(topic)
