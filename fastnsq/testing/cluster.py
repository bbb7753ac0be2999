"""An embedded cluster: N embedded nsqds registered with one embedded nsqlookupd, either dialect."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastnsq import codec

from .lookupd import NSQLookupd
from .nsqd import NSQD

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["NSQCluster", "PartitionPlacement"]

logger = logging.getLogger(__name__)




@dataclass
class PartitionPlacement:
    """Where one partition of an HA topic lives in an :class:`NSQCluster`: node indices."""

    leader: int
    replicas: list[int]


@dataclass
class _HATopic:
    partitions: int
    ext: bool
    ordered: bool
    placements: dict[int, PartitionPlacement]


class NSQCluster:
    """``nodes`` embedded nsqds registered with one embedded nsqlookupd.

    :meth:`start` returns once every nsqd has registered (IDENTIFY) with the
    lookupd. Node indices are stable: :meth:`stop_node` keeps the stopped nsqd in
    :attr:`nsqds` (and its addresses in the lists) so it can come back with
    :meth:`start_node` on the same ports. ``nsqd_options`` go to every
    :class:`NSQD`, ``lookupd_options`` to the :class:`NSQLookupd` (``emulate="master"``
    goes to both).

    Example::

        async with NSQCluster(nodes=3) as cluster:
            consumer = Consumer("events", "ch", lookupd_http_addresses=cluster.lookupd_http_addresses)
            await cluster.stop_node(0)

    **HA** (``ha=True``): youzan nsqds that are cluster nodes and a lookupd in cluster
    mode. Topics are created with :meth:`create_topic` (or the lookupd's
    ``POST /topic/create``), which places each partition on ``replicas`` nodes and
    spreads the leaders; :meth:`move_leader` moves a partition's leader at run time.
    What is emulated, since there is no etcd and no replication log:

    * the leader of a partition holds its messages; replicas hold the partition (so
      they answer ``E_FAILED_ON_NOT_LEADER``, not ``E_TOPIC_NOT_EXIST``) and its
      channels, but no copy of the queue;
    * moving a leader is what youzan guarantees after replication: the new leader
      serves exactly what was not yet consumed. The old leader closes the partition's
      consumers (youzan's DisableConsume) and unregisters it; its queued, deferred and
      in-flight messages move to the new leader (in-flight ones first, to be delivered
      again: duplicates are possible, losses are not), with the id and offset counters;
      the new leader registers the partition and its channels with lookupd;
    * :meth:`stop_node` first fails the node's partitions over to another running
      replica (another running node when none is left), as the coordinator would;
    * the lookupd's ``access=w`` answers hide partitions without channels, as the real
      default does (``lookupd_options={"allow_write_with_nochannels": True}`` to
      change it): create channels first (``create_topic(..., channels=[...])``) or
      subscribe before publishing; in youzan a new channel starts at the end of the
      partition, so messages published while a partition had no channel are not
      delivered to channels created later.
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        ha: bool = False,
        host: str = "127.0.0.1",
        lookupd_options: Mapping[str, Any] | None = None,
        register_timeout: float = 5.0,
        **nsqd_options: Any,
    ) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
            raise ValueError(f"nodes must be an int >= 0, got {nodes!r}")
        self.ha = ha
        self.host = host
        self._initial_nodes = nodes
        self._lookupd_options = dict(lookupd_options or {})
        self._nsqd_options = nsqd_options
        self.register_timeout = register_timeout
        if "emulate" in nsqd_options and not ha:
            # The lookupd answers like the same upstream version as the nsqds.
            self._lookupd_options.setdefault("emulate", nsqd_options["emulate"])
        self.lookupd: NSQLookupd = NSQLookupd(host=host, ha=ha, **self._lookupd_options)
        self.nsqds: list[NSQD] = []
        self._stopped: set[int] = set()
        self._ha_topics: dict[str, _HATopic] = {}
        if ha:
            self.lookupd.topic_creator = self._create_for_lookupd  # type: ignore[attr-defined]
            self.lookupd.channel_registrar = self._register_channel  # type: ignore[attr-defined]

    async def start(self) -> None:
        await self.lookupd.start()
        try:
            for _ in range(self._initial_nodes):
                await self.add_node()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every nsqd, then the lookupd."""
        for index, nsqd in enumerate(self.nsqds):
            if index not in self._stopped:
                self._stopped.add(index)
                try:
                    await nsqd.stop()
                except Exception:
                    # Keep stopping the others; the failure is still visible in the log.
                    logger.exception("NSQCluster: stopping nsqd %s failed", nsqd.tcp_address)
        await self.lookupd.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def add_node(self, **options: Any) -> NSQD:
        """Start one more nsqd (``options`` override the cluster's) and wait until it registered."""
        settings = {"host": self.host, "broadcast_address": self.host, **self._nsqd_options, **options}
        addresses: Sequence[str] = settings.pop("lookupd_tcp_addresses", ())
        nsqd = NSQD(lookupd_tcp_addresses=[self.lookupd.tcp_address, *addresses], ha=self.ha, **settings)
        if self.ha:
            nsqd.ha_cluster = True
        await nsqd.start()
        self.nsqds.append(nsqd)
        await self._wait_registered(nsqd, present=True)
        return nsqd

    async def stop_node(self, index: int, *, fail_over: bool = True, **stop_options: Any) -> None:
        """Stop nsqd ``index`` and wait until the lookupd has dropped it.

        HA: the partitions it leads fail over to another running node first; with
        ``fail_over=False`` they keep no leader until it starts again (youzan's lookupd lists
        no writable leader of a partition whose ISR lost its leader, until a node of the ISR
        comes back: the partition is not in ``/lookup?access=w`` meanwhile).
        """
        nsqd = self.nsqds[index]
        if index in self._stopped:
            return
        if self.ha and fail_over:
            await self._fail_over(index)
        self._stopped.add(index)
        await nsqd.stop(**stop_options)
        await self._wait_registered(nsqd, present=False)

    async def start_node(self, index: int) -> None:
        """Start a stopped nsqd again (same ports) and wait until it registered."""
        if index not in self._stopped:
            return
        await self.nsqds[index].start()
        self._stopped.discard(index)
        await self._wait_registered(self.nsqds[index], present=True)

    def is_running(self, index: int) -> bool:
        return 0 <= index < len(self.nsqds) and index not in self._stopped

    @property
    def running_nsqds(self) -> list[NSQD]:
        return [n for i, n in enumerate(self.nsqds) if i not in self._stopped]

    @property
    def tcp_addresses(self) -> list[str]:
        """TCP addresses of every nsqd, stopped ones included (indices match :attr:`nsqds`)."""
        return [n.tcp_address for n in self.nsqds]

    @property
    def http_addresses(self) -> list[str]:
        return [n.http_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [self.lookupd.http_address]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [self.lookupd.tcp_address]

    # -- HA topics ---------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        partitions: int = 4,
        *,
        ext: bool = False,
        ordered: bool = False,
        replicas: int | None = None,
        channels: Sequence[str] = (),
        disable_channel_auto_create: bool = False,
    ) -> dict[int, int]:
        """HA: create ``topic`` with ``partitions`` partitions; returns {partition: leader index}.

        Each partition lives on ``replicas`` running nodes (default: 2, or 1 in a
        one-node cluster); leaders go round-robin over the running nodes. ``ext`` makes
        an ext topic (consumers need ``extend_support``), ``ordered`` one that only
        allows SUB_ORDERED. ``channels`` are created on every partition (so that
        producers find the partitions with ``access=w`` and nothing published is
        missed); with ``disable_channel_auto_create`` SUB reaches no other channel.
        Returns once the lookupd lists every partition with its leader.
        """
        self._require_ha("create_topic")
        if not codec.valid_topic_name(topic):
            raise ValueError(f"topic name {topic!r} is not valid")
        running = [i for i in range(len(self.nsqds)) if i not in self._stopped]
        if not running:
            raise RuntimeError("create_topic needs a running node")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 255:
            raise ValueError(f"partitions must be an integer in 1..255, got {partitions!r}")
        if replicas is None:
            replicas = min(2, len(running))
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= len(running):
            raise ValueError(
                f"replicas must be an integer in 1..{len(running)} (running nodes), got {replicas!r}"
            )
        known = self._ha_topics.get(topic)
        if known is None:
            # Spread the leaders of successive topics too, not always from node 0.
            shift = len(self._ha_topics)
            placements = {}
            for pid in range(partitions):
                first = (pid + shift) % len(running)
                nodes = [running[(first + k) % len(running)] for k in range(replicas)]
                placements[pid] = PartitionPlacement(leader=nodes[0], replicas=nodes)
            known = self._ha_topics[topic] = _HATopic(partitions, ext, ordered, placements)
            for pid, placement in placements.items():
                for index in placement.replicas:
                    part = self.nsqds[index].create_partition(
                        topic, pid, ext=ext, ordered=ordered, leader=index == placement.leader
                    )
                    part.disable_channel_auto_create = disable_channel_auto_create
            self.lookupd.set_topic_meta(  # type: ignore[attr-defined]
                topic,
                partition_num=partitions,
                replica=replicas,
                extend_support=ext,
                ordered=ordered,
                # What a real lookupd needs to put several partitions of a topic on a node.
                multi_part=not ordered and partitions * replicas > len(running),
                disable_channel_auto_create=disable_channel_auto_create,
            )
        if disable_channel_auto_create:
            registered = self.lookupd.registered_channels.setdefault(topic, [])  # type: ignore[attr-defined]
            registered.extend(c for c in channels if c not in registered)
        for channel in channels:
            for pid, placement in known.placements.items():
                for index in placement.replicas:
                    self.nsqds[index].partitions[(topic, pid)].get_channel(channel)
        await self._wait_leaders(topic, channels)
        return self.partition_leaders(topic)

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """HA: {partition: index of the node leading it}."""
        return {pid: p.leader for pid, p in self._placed(topic).placements.items()}

    def leader_of(self, topic: str, partition: int) -> int:
        """HA: the index (in :attr:`nsqds`) of the node leading ``partition`` of ``topic``."""
        return self._placement(topic, partition).leader

    def replicas_of(self, topic: str, partition: int) -> list[int]:
        """HA: the indices of the nodes that have ``partition`` of ``topic`` (leader first)."""
        return list(self._placement(topic, partition).replicas)

    def remove_before(self, topic: str, partition: int, offset: int) -> int:
        """HA: what youzan's retention does to old segments, on demand: every node holding
        ``partition`` forgets its messages that begin before ``offset`` (the partition's
        ``backend_start`` moves there; a channel moved before it reads from the new start).
        Returns how many messages the leader removed."""
        self._require_ha("remove_before")
        placement = self._placement(topic, partition)
        removed = 0
        for index in placement.replicas:
            held = self.nsqds[index].partitions.get((topic, partition))
            if held is not None:
                count = held.remove_before(offset)
                removed = count if index == placement.leader else removed
        return removed

    def write_uncommitted(self, topic: str, partition: int, bodies: list[bytes]) -> None:
        """HA: the partition's leader writes ``bodies`` without committing them (youzan's leader
        between its local write and the ISR's acknowledgement): ``/stats`` counts them, readers
        and ``/message/get`` do not, until :meth:`commit` or :meth:`rollback`."""
        self._leader_partition(topic, partition).write_uncommitted(bodies)

    def commit(self, topic: str, partition: int) -> None:
        """HA: the ISR acknowledged what :meth:`write_uncommitted` wrote: it is read now."""
        self._leader_partition(topic, partition).commit()

    def rollback(self, topic: str, partition: int) -> int:
        """HA: replication failed (youzan: ``failed write begin rollback``): what
        :meth:`write_uncommitted` wrote is gone and the next publish takes its offsets."""
        return self._leader_partition(topic, partition).rollback()

    def _leader_partition(self, topic: str, partition: int) -> Any:
        placement = self._placement(topic, partition)
        return self.nsqds[placement.leader].partitions[(topic, partition)]

    async def move_leader(self, topic: str, partition: int, to_node: int) -> None:
        """HA: make node ``to_node`` the leader of ``partition`` (see the class docstring).

        Returns once the lookupd lists the new leader. Moving to a node that has no
        replica of the partition first makes it one.
        """
        self._require_ha("move_leader")
        placement = self._placement(topic, partition)
        if not self.is_running(to_node):
            raise ValueError(f"node {to_node} is not running")
        if to_node == placement.leader:
            return
        self._hand_over(topic, partition, placement, to_node)
        await self._wait_leaders(topic)

    def _hand_over(self, topic: str, partition: int, placement: PartitionPlacement, to_node: int) -> None:
        known = self._placed(topic)
        old = self.nsqds[placement.leader]
        new = self.nsqds[to_node]
        key = (topic, partition)
        old_part = old.partitions[key]
        new_part = new.partitions.get(key) or new.create_partition(
            topic, partition, ext=known.ext, ordered=known.ordered, leader=False
        )
        new_part.disable_channel_auto_create = old_part.disable_channel_auto_create
        old.set_leader(topic, partition, False)  # closes the partition's consumers, unregisters
        new_part.next_internal_id = max(new_part.next_internal_id, old_part.next_internal_id)
        new_part.next_offset = max(new_part.next_offset, old_part.next_offset)
        if new_part.next_offset == old_part.next_offset:  # a replica holds the leader's log, as youzan's do
            new_part.retained = deque(old_part.retained)
            new_part.retained_before = old_part.retained_before
        moved = []
        for name, channel in old_part.channels.items():
            queued, deferred = channel.take_state()  # type: ignore[attr-defined]
            target = new_part.get_channel(name)
            target.set_ordered(channel.ordered)  # type: ignore[attr-defined]
            if channel.paused:
                target.pause()
            moved.append((target, queued, deferred))
        new.set_leader(topic, partition, True)  # registers the partition and its channels
        for target, queued, deferred in moved:
            target.give_state(queued, deferred)  # type: ignore[attr-defined]
        placement.leader = to_node
        if to_node not in placement.replicas:
            placement.replicas.append(to_node)
        placement.replicas.sort(key=lambda i: i != to_node)

    async def _fail_over(self, index: int) -> None:
        for topic, known in self._ha_topics.items():
            for pid, placement in known.placements.items():
                if placement.leader != index:
                    continue
                candidates = [i for i in placement.replicas if i != index and self.is_running(i)]
                candidates += [i for i in range(len(self.nsqds)) if i != index and self.is_running(i)]
                if candidates:
                    self._hand_over(topic, pid, placement, candidates[0])
            await self._wait_leaders(topic)

    async def _create_for_lookupd(self, topic: str, meta: Any) -> None:
        """``POST /topic/create`` on the cluster's lookupd."""
        running = len(self.running_nsqds)
        await self.create_topic(
            topic,
            meta.partition_num,
            ext=meta.extend_support,
            ordered=meta.ordered,
            replicas=min(meta.replica, running) if running else None,
            disable_channel_auto_create=meta.disable_channel_auto_create,
        )

    async def _register_channel(self, topic: str, channel: str) -> None:
        """The lookupd's ``POST /channel/create``: the channel on every replica of every partition."""
        for pid, placement in self._placed(topic).placements.items():
            for index in placement.replicas:
                self.nsqds[index].partitions[(topic, pid)].get_channel(channel)
        await self._wait_leaders(topic, [channel])

    async def _wait_leaders(self, topic: str, channels: Sequence[str] = ()) -> None:
        """Until the lookupd lists every running leader (and ``channels`` on each partition)."""
        known = self._placed(topic)
        leaders = {}
        for pid, placement in known.placements.items():
            if self.is_running(placement.leader):
                node = self.nsqds[placement.leader]
                leaders[pid] = (node.tcp_port, node.http_port)
        lookupd: Any = self.lookupd
        await lookupd.wait_for_partitions(topic, len(leaders), timeout=self.register_timeout, leaders=leaders)
        if channels:

            def registered() -> bool | None:
                return all(set(channels) <= set(lookupd.channels(topic, str(pid))) for pid in leaders) or None

            await lookupd._wait(registered, self.register_timeout, f"channels {list(channels)} of {topic!r}")

    def _placed(self, topic: str) -> _HATopic:
        self._require_ha("the partition layout")
        known = self._ha_topics.get(topic)
        if known is None:
            raise KeyError(f"topic {topic!r} was not created with create_topic")
        return known

    def _placement(self, topic: str, partition: int) -> PartitionPlacement:
        placement = self._placed(topic).placements.get(partition)
        if placement is None:
            raise KeyError(f"topic {topic!r} has no partition {partition}")
        return placement

    def _require_ha(self, what: str) -> None:
        if not self.ha:
            raise RuntimeError(f"{what} is for HA clusters: NSQCluster(ha=True)")

    async def _wait_registered(self, nsqd: NSQD, *, present: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.register_timeout
        while self._registered(nsqd) != present:
            if loop.time() >= deadline:
                state = "registered with" if present else "dropped by"
                raise TimeoutError(
                    f"nsqd {nsqd.tcp_address} not {state} nsqlookupd {self.lookupd.tcp_address} "
                    f"after {self.register_timeout} s"
                )
            await asyncio.sleep(0.01)

    def _registered(self, nsqd: NSQD) -> bool:
        return any(
            node["tcp_port"] == nsqd.tcp_port and node["http_port"] == nsqd.http_port
            for node in self.lookupd.nodes()
        )

    def __repr__(self) -> str:
        return f"<NSQCluster nodes={len(self.nsqds)} stopped={sorted(self._stopped)} lookupd={self.lookupd.http_address}>"
