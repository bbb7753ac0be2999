"""Embedded NSQ servers for tests: nsqd, nsqlookupd, an auth server and clusters of them.

Everything runs in the test's own asyncio loop (asyncio or uvloop), in memory, on
free ports. To test your own consumer::

    from fastnsq.testing import NSQD

    async def test_my_consumer():
        async with NSQD() as nsqd:
            # publish with POST http://{nsqd.http_address}/pub?topic=events, point
            # your consumer at nsqd.tcp_address, assert on what it handled
            ...

For lookupd discovery use :class:`NSQCluster` (N nsqds registered with one
:class:`NSQLookupd`; give your consumer ``cluster.lookupd_http_addresses``). With
pytest the fixtures ``nsqd``, ``nsqlookupd`` and ``nsq_cluster`` do this for you
(the plugin loads itself when fastnsq is installed); set ``FASTNSQ_TEST_NSQD``,
``FASTNSQ_TEST_NSQD_HTTP`` and ``FASTNSQ_TEST_LOOKUPD_HTTP`` to run the same tests
against real servers. ``python -m fastnsq.testing`` runs the servers from a shell.

The HA (youzan) dialect: ``NSQD(ha=True)``, ``NSQLookupd(ha=True)`` and
``NSQCluster(ha=True)``, whose :meth:`NSQCluster.create_topic` spreads a topic's
partitions and their leaders over the nodes and :meth:`NSQCluster.move_leader`
moves one at run time; the fixtures ``nsqd_ha`` and ``nsq_cluster_ha``. Faults:
``nsqd.faults`` (cut, stall, malformed frames, injected errors) and
``nsqd.refuse_connections``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .auth import Authorization, AuthRequest, AuthServer, Grant, authorization
from .lookupd import NSQLookupd, RegisteredNode

if TYPE_CHECKING:
    from typing_extensions import Self

    from .nsqd import NSQD

__all__ = [
    "EMBEDDED_HA_AVAILABLE",
    "ENV_CLUSTER_NSQD",
    "ENV_CLUSTER_NSQD_HTTP",
    "ENV_LOOKUPD_HTTP",
    "ENV_LOOKUPD_TCP",
    "ENV_NSQD",
    "ENV_NSQD_HTTP",
    "NSQD",
    "AuthRequest",
    "AuthServer",
    "Authorization",
    "ExternalCluster",
    "ExternalLookupd",
    "ExternalNSQD",
    "Grant",
    "NSQCluster",
    "NSQLookupd",
    "PartitionPlacement",
    "RegisteredNode",
    "authorization",
    "external_cluster_from_env",
    "external_lookupd_from_env",
    "external_nsqd_from_env",
    "external_servers_configured",
    "is_external",
    "is_ha",
]

logger = logging.getLogger(__name__)

#: Whether the embedded servers speak the HA (youzan) dialect (``ha=True``).
EMBEDDED_HA_AVAILABLE = True

#: Real servers to test against instead of the embedded ones (``host:port`` each).
ENV_NSQD = "FASTNSQ_TEST_NSQD"  # nsqd TCP
ENV_NSQD_HTTP = "FASTNSQ_TEST_NSQD_HTTP"  # nsqd HTTP
ENV_LOOKUPD_HTTP = "FASTNSQ_TEST_LOOKUPD_HTTP"  # nsqlookupd HTTP
ENV_LOOKUPD_TCP = "FASTNSQ_TEST_LOOKUPD_TCP"  # nsqlookupd TCP (optional)
#: A real cluster: comma-separated nsqd TCP and HTTP addresses, in the same order,
#: all registered with the lookupd of FASTNSQ_TEST_LOOKUPD_HTTP.
ENV_CLUSTER_NSQD = "FASTNSQ_TEST_CLUSTER_NSQD"
ENV_CLUSTER_NSQD_HTTP = "FASTNSQ_TEST_CLUSTER_NSQD_HTTP"


def __getattr__(name: str) -> Any:
    # NSQD is imported on first use: ``import fastnsq.testing`` (and the pytest plugin,
    # auto-loaded in every pytest run once fastnsq is installed) stays light.
    if name == "NSQD":
        from .nsqd import NSQD

        return NSQD
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


# ---- real servers --------------------------------------------------------------------


@dataclass
class ExternalNSQD:
    """A real nsqd the tests use instead of an embedded :class:`NSQD` (same address attributes).

    It cannot be started or stopped from the tests; check :func:`is_external`
    (or use the plugin's ``require_embedded``) in tests that need to.
    """

    tcp_address: str
    http_address: str | None = None
    external: ClassVar[bool] = True
    _ha: bool | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return _split_host_port(self.tcp_address)[0]

    @property
    def tcp_port(self) -> int:
        return _split_host_port(self.tcp_address)[1]

    @property
    def http_port(self) -> int | None:
        return _split_host_port(self.http_address)[1] if self.http_address else None

    async def start(self) -> None:
        raise RuntimeError(f"the external nsqd {self.tcp_address} cannot be started from the tests")

    async def stop(self, **kwargs: Any) -> None:
        raise RuntimeError(f"the external nsqd {self.tcp_address} cannot be stopped from the tests")


@dataclass
class ExternalLookupd:
    """A real nsqlookupd the tests use instead of an embedded :class:`NSQLookupd`."""

    http_address: str
    tcp_address: str | None = None
    external: ClassVar[bool] = True
    _ha: bool | None = field(default=None, repr=False)

    @property
    def http_port(self) -> int:
        return _split_host_port(self.http_address)[1]

    @property
    def tcp_port(self) -> int | None:
        return _split_host_port(self.tcp_address)[1] if self.tcp_address else None

    @property
    def url(self) -> str:
        return f"http://{self.http_address}"


@dataclass
class ExternalCluster:
    """Real nsqds registered with a real lookupd, with :class:`NSQCluster`'s attributes."""

    nsqds: list[ExternalNSQD]
    lookupd: ExternalLookupd
    external: ClassVar[bool] = True

    @property
    def tcp_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.nsqds]

    @property
    def http_addresses(self) -> list[str | None]:
        return [n.http_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [self.lookupd.http_address]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [self.lookupd.tcp_address] if self.lookupd.tcp_address else []

    async def add_node(self, **options: Any) -> ExternalNSQD:
        raise RuntimeError("nodes of an external cluster cannot be added from the tests")

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
        timeout: float = 30.0,
    ) -> dict[int, str]:
        """HA: create a topic through the lookupd (``POST /topic/create``), as on the embedded cluster.

        Waits until ``/lookup`` lists every partition, creates ``channels`` on each
        partition's leader (``POST /channel/create``) and returns {partition: leader
        nsqd TCP address}.
        """
        import aiohttp

        if replicas is None:
            replicas = min(2, max(1, len(self.nsqds)))
        query = {"topic": topic, "partition_num": str(partitions), "replicator": str(replicas)}
        if ext:
            query["extend"] = "true"
        if ordered:
            query["orderedmulti"] = "true"
        if disable_channel_auto_create:
            query["disable_channel_auto_create"] = "true"
        accept = {"Accept": "application/vnd.nsq; version=1.0"}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with aiohttp.ClientSession(headers=accept) as http:
            async with http.post(
                f"http://{self.lookupd.http_address}/topic/create", params=query
            ) as response:
                if response.status != 200:
                    raise RuntimeError(
                        f"lookupd refused /topic/create: {response.status} {await response.text()}"
                    )
            while True:
                async with http.get(
                    f"http://{self.lookupd.http_address}/lookup", params={"topic": topic, "access": "r"}
                ) as response:
                    answer = json.loads(await response.read() or b"{}")
                listed = answer.get("partitions") or {}
                if len(listed) >= partitions:
                    break
                if loop.time() > deadline:
                    raise TimeoutError(f"lookupd lists {len(listed)} of {partitions} partitions of {topic!r}")
                await asyncio.sleep(0.1)
            leaders = {int(pid): peer for pid, peer in listed.items()}
            for channel in channels:
                for pid, peer in leaders.items():
                    url = f"http://{peer['broadcast_address']}:{peer['http_port']}/channel/create"
                    params = {"topic": topic, "partition": str(pid), "channel": channel}
                    async with http.post(url, params=params) as response:
                        if response.status != 200:
                            raise RuntimeError(f"nsqd {url} refused the channel: {await response.text()}")
        return {pid: f"{peer['broadcast_address']}:{peer['tcp_port']}" for pid, peer in leaders.items()}

    async def stop_node(self, index: int) -> None:
        raise RuntimeError("nodes of an external cluster cannot be stopped from the tests")


def _env(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None


def external_servers_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names real servers (so nothing embedded should stand in)."""
    return any(_env(n, environ) for n in (ENV_NSQD, ENV_NSQD_HTTP, ENV_LOOKUPD_HTTP, ENV_CLUSTER_NSQD))


def external_nsqd_from_env(environ: Mapping[str, str] | None = None) -> ExternalNSQD | None:
    """The nsqd of ``FASTNSQ_TEST_NSQD`` (+ ``FASTNSQ_TEST_NSQD_HTTP``), or ``None``."""
    tcp = _env(ENV_NSQD, environ)
    return ExternalNSQD(tcp, _env(ENV_NSQD_HTTP, environ)) if tcp else None


def external_lookupd_from_env(environ: Mapping[str, str] | None = None) -> ExternalLookupd | None:
    """The lookupd of ``FASTNSQ_TEST_LOOKUPD_HTTP`` (+ ``FASTNSQ_TEST_LOOKUPD_TCP``), or ``None``."""
    http = _env(ENV_LOOKUPD_HTTP, environ)
    return ExternalLookupd(http, _env(ENV_LOOKUPD_TCP, environ)) if http else None


def external_cluster_from_env(environ: Mapping[str, str] | None = None) -> ExternalCluster | None:
    """The cluster of ``FASTNSQ_TEST_CLUSTER_NSQD`` (+ ``_HTTP``) and the lookupd, or ``None``."""
    tcp = _env(ENV_CLUSTER_NSQD, environ)
    lookupd = external_lookupd_from_env(environ)
    if not tcp or lookupd is None:
        return None
    tcp_list = [a.strip() for a in tcp.split(",") if a.strip()]
    http_list = [a.strip() for a in (_env(ENV_CLUSTER_NSQD_HTTP, environ) or "").split(",") if a.strip()]
    if http_list and len(http_list) != len(tcp_list):
        raise ValueError(f"{ENV_CLUSTER_NSQD} and {ENV_CLUSTER_NSQD_HTTP} must list as many addresses")
    nodes = [ExternalNSQD(t, http_list[i] if http_list else None) for i, t in enumerate(tcp_list)]
    return ExternalCluster(nodes, lookupd)


def is_external(server: object) -> bool:
    """Whether ``server`` is a real server named by the environment (not embedded)."""
    return bool(getattr(server, "external", False))


async def is_ha(server: object, *, timeout: float = 5.0) -> bool:
    """Whether ``server`` speaks the HA (youzan) dialect.

    Embedded servers and clusters say so (``.ha``); a real nsqd is asked with an
    IDENTIFY (HA when its ``version`` contains ``"HA"``, shared/protocol.md §11.6),
    a real lookupd with ``/info``. The answer is cached on the object.
    """
    if isinstance(server, (ExternalNSQD, ExternalLookupd)):
        if server._ha is None:
            probe = _probe_nsqd_version if isinstance(server, ExternalNSQD) else _probe_lookupd_version
            version = await asyncio.wait_for(probe(server), timeout)  # type: ignore[arg-type]
            server._ha = "HA" in version
        return server._ha
    if isinstance(server, ExternalCluster):
        return await is_ha(server.nsqds[0] if server.nsqds else server.lookupd, timeout=timeout)
    return bool(getattr(server, "ha", False))


async def _probe_nsqd_version(server: ExternalNSQD) -> str:
    from fastnsq import codec

    host, port = _split_host_port(server.tcp_address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        out = codec.WriteBuffer()
        out.magic()
        out.identify(json.dumps({"client_id": "fastnsq-ha-probe", "feature_negotiation": True}).encode())
        writer.write(out.take())
        size = int.from_bytes(await reader.readexactly(4), "big")
        frame = await reader.readexactly(size)
        if int.from_bytes(frame[:4], "big") != codec.FRAME_RESPONSE:
            raise ConnectionError(f"nsqd {server.tcp_address} refused IDENTIFY: {frame[4:]!r}")
        answer = json.loads(frame[4:])
        return str(answer.get("version", "")) if isinstance(answer, dict) else ""
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _probe_lookupd_version(server: ExternalLookupd) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://{server.http_address}/info", headers={"Accept": "application/vnd.nsq; version=1.0"}
        ) as response,
    ):
        data = json.loads(await response.read() or b"{}")
    if isinstance(data, dict) and isinstance(data.get("data"), dict):
        data = data["data"]  # the legacy wrapped form
    if not isinstance(data, dict):
        return ""
    return str(data.get("version", "")) + (" HA" if data.get("ha_support") else "")


# ---- an embedded cluster ---------------------------------------------------------------


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
    :class:`NSQD`, ``lookupd_options`` to the :class:`NSQLookupd`.

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
        self.lookupd: NSQLookupd = NSQLookupd(host=host, ha=ha, **self._lookupd_options)
        self.nsqds: list[NSQD] = []
        self._stopped: set[int] = set()
        self._ha_topics: dict[str, _HATopic] = {}
        if ha:
            self.lookupd.topic_creator = self._create_for_lookupd  # type: ignore[attr-defined]

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
        from .nsqd import NSQD

        settings = {"host": self.host, "broadcast_address": self.host, **self._nsqd_options, **options}
        addresses: Sequence[str] = settings.pop("lookupd_tcp_addresses", ())
        nsqd = NSQD(lookupd_tcp_addresses=[self.lookupd.tcp_address, *addresses], ha=self.ha, **settings)
        if self.ha:
            nsqd.ha_cluster = True
        await nsqd.start()
        self.nsqds.append(nsqd)
        await self._wait_registered(nsqd, present=True)
        return nsqd

    async def stop_node(self, index: int, **stop_options: Any) -> None:
        """Stop nsqd ``index`` and wait until the lookupd has dropped it.

        HA: the partitions it leads fail over to another running node first.
        """
        nsqd = self.nsqds[index]
        if index in self._stopped:
            return
        if self.ha:
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
        from fastnsq import codec

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
                disable_channel_auto_create=disable_channel_auto_create,
            )
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
