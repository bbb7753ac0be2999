"""The HA dialect of the embedded nsqlookupd: youzan's partitioned lookupd (youzan nsqlookupd's ``http.go``).

One job: answer what youzan's ``nsqlookupd`` (``0.3.7-HA.1.13.0``) answers:

* TCP: ``REGISTER``/``UNREGISTER <topic> <partition>[ <channel>]`` (a peer without "HA"
  in its version and without a cluster id is an *old* nsqd: its partition-less
  commands register partition ``-11``); a bad partition id is fatal
  ``E_BAD_PARTITIONID``; a topic UNREGISTER drops that partition's channels too.
* HTTP, in the negotiated form: with ``Accept: application/vnd.nsq; version=1.0`` the
  bare object (``X-Nsq-Content-Type``), otherwise ``{"status_code","status_txt","data"}``
  with every error a 500.
* ``/lookup?topic=T[&partition=P][&access=r|w][&metainfo=true]``: ``channels``,
  ``producers``, ``partitions`` keyed by the partition id as a string, and ``meta``
  when asked and the lookupd runs as a cluster one. An unknown topic is a 200 with
  empty lists. ``access=w`` leaves out tombstoned and old nodes and partitions without
  any channel (unless ``allow_write_with_nochannels``); when that empties a known
  topic the answer is ``404 Topic has no channel, should init at least one for the new topic``.
* ``/listlookup`` (capitalised keys, ports as strings; standalone: an empty body),
  ``/info`` with ``ha_support``, ``/topics``, ``/channels`` (``partition=``), ``/nodes``
  (with each node's partitions), ``/topic/tombstone``, and in cluster mode
  ``POST /topic/create?topic=&partition_num=&replicator=[&extend=true][&orderedmulti=true]``.

*Cluster mode* (``ha_cluster=True``, the default) emulates a lookupd with a
coordinator: it keeps the topic meta (from ``/topic/create`` or
:meth:`HALookupd.set_topic_meta`; zeros for a topic it does not know, as the
real one answers), reports ``ha_support``, lists itself in ``/listlookup``, and asks
its ``topic_creator`` (set by :class:`~fastnsq.testing.NSQCluster`) to place the
partitions of a topic created over HTTP. There is no etcd: leadership is what the
nsqds register (only leaders register a partition), so ``consistent=`` changes nothing.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from fastnsq import codec

from ._http import HTTPAPIError, join_host_port, parse_go_query, respond_legacy, respond_v1
from ._lookupd_core import HA_PEER_FIELDS, LookupdServer, PeerInfo, _ClientError
from ._nsqd_base import HA_VERSION
from ._nsqd_parse import go_atoi

__all__ = ["OLD_VERSION_PID", "HALookupd", "TopicMetaInfo"]

#: The partition id an old (non-HA) nsqd registers under.
OLD_VERSION_PID = -11
MAX_PARTITION_NUM = 255
MAX_REPLICATOR = 5
_ACCEPT_V1 = "application/vnd.nsq; version=1.0"
#: The coordinator's ErrNodeUnavailable as the HTTP answer shows it (CommonCoordErr.Error()).
_NODE_UNAVAILABLE = "ErrType:9 ErrCode:1 : No node is available for topic"
_NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"
_GO_ZERO_TIME_UNIX_NANO = -6795364578871345152

TopicCreator = Callable[[str, "TopicMetaInfo"], Awaitable[None]]
#: Makes a registered channel on every partition of a topic (channel auto-create disabled).
ChannelRegistrar = Callable[[str, str], Awaitable[None]]


@dataclass
class TopicMetaInfo:
    """A topic's cluster meta (consistence.TopicMetaInfo, the fields ``/lookup`` shows)."""

    partition_num: int = 0
    replica: int = 0
    extend_support: bool = False
    ordered: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False

    def to_json(self) -> dict[str, Any]:
        """The ``meta`` object (a Go map: keys sorted)."""
        return {
            "disable_channel_auto_create": self.disable_channel_auto_create,
            "extend_support": self.extend_support,
            "multi_part": self.multi_part,
            "ordered": self.ordered,
            "partition_num": self.partition_num,
            "replica": self.replica,
        }


@dataclass(eq=False)
class _TopicReg:
    """One (partition, nsqd) registration of a topic; the tombstone belongs to it."""

    pid: str
    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = _GO_ZERO_TIME_UNIX_NANO


@dataclass(frozen=True)
class _ChannelReg:
    pid: str
    peer_id: str
    channel: str


@dataclass
class _Registry:
    """youzan's RegistrationDB: topic producers per partition, channel registrations, peers."""

    peers: dict[str, PeerInfo] = field(default_factory=dict)
    topics: dict[str, list[_TopicReg]] = field(default_factory=dict)
    channels: dict[str, list[_ChannelReg]] = field(default_factory=dict)

    def clear(self) -> None:
        self.peers.clear()
        self.topics.clear()
        self.channels.clear()


def is_old_peer(peer: PeerInfo) -> bool:
    """An nsqd outside the HA cluster: no cluster id and no "HA" in its version."""
    return not peer.distributed_id and "HA" not in peer.version


def _peer_json(peer: PeerInfo) -> dict[str, Any]:
    """youzan's PeerInfo, field for field."""
    return {
        "id": peer.id,
        "remote_address": peer.remote_address,
        "hostname": peer.hostname,
        "broadcast_address": peer.broadcast_address,
        "tcp_port": peer.tcp_port,
        "http_port": peer.http_port,
        "version": peer.version,
        "distributed_id": peer.distributed_id,
    }


class HALookupd(LookupdServer):
    """youzan's nsqlookupd in this process (``NSQLookupd(ha=True)`` builds one, a :class:`HANSQLookupd`).

    Example::

        async with NSQLookupd(ha=True) as lookupd:
            nsqd = NSQD(ha=True, lookupd_tcp_addresses=[lookupd.tcp_address])
            ...
            await lookupd.wait_for_partitions("events", 4)
    """

    def __init__(
        self,
        *,
        ha: bool = True,
        ha_cluster: bool = True,
        allow_write_with_nochannels: bool = False,
        version: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(version=version or HA_VERSION, **options)
        self.ha = True
        #: Emulate a lookupd with a coordinator (meta, /listlookup nodes, ha_support).
        self.ha_cluster = bool(ha_cluster)
        #: --allow-write-with-nochannels: access=w keeps partitions without channels.
        self.allow_write_with_nochannels = bool(allow_write_with_nochannels)
        self.peer_fields = HA_PEER_FIELDS
        self.registry = _Registry()
        #: Topic meta by topic (cluster mode).
        self.topic_meta: dict[str, TopicMetaInfo] = {}
        #: Called by ``POST /topic/create`` (cluster mode) to place the partitions on nsqds.
        self.topic_creator: TopicCreator | None = None
        #: Called by ``POST /channel/create`` (cluster mode) to create the channel on them.
        self.channel_registrar: ChannelRegistrar | None = None
        #: Channels registered with ``POST /channel/create``, by topic.
        self.registered_channels: dict[str, list[str]] = {}
        self._broadcast_given = options.get("broadcast_address") is not None

    async def start(self) -> None:
        self.registry.clear()
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        self.registry.clear()

    # -- in-process use ---------------------------------------------------------------

    def set_topic_meta(
        self,
        topic: str,
        *,
        partition_num: int,
        replica: int = 1,
        extend_support: bool = False,
        ordered: bool = False,
        multi_part: bool = False,
        disable_channel_auto_create: bool = False,
    ) -> TopicMetaInfo:
        """Record a topic's cluster meta (what a cluster's ``/topic/create`` stores in etcd)."""
        meta = self.topic_meta[topic] = TopicMetaInfo(
            partition_num=partition_num,
            replica=replica,
            extend_support=extend_support,
            ordered=ordered,
            multi_part=multi_part,
            disable_channel_auto_create=disable_channel_auto_create,
        )
        self._notify()
        return meta

    def lookup(
        self, topic: str, *, access: str = "r", metainfo: bool = False, partition: str = "*"
    ) -> dict[str, Any]:
        """What ``/lookup`` answers (the bare object); raises HTTPAPIError for its errors."""
        if access not in ("r", "w"):
            raise HTTPAPIError(400, "INVALID_ACCESS_MODE")
        registry = self.registry
        regs = [r for r in registry.topics.get(topic, ()) if partition in ("*", r.pid)]
        found_in_register = bool(regs)
        if not regs and access == "w" and self.ha_cluster and topic not in self.topic_meta:
            raise HTTPAPIError(404, "Key not found")
        now = time.time_ns()
        limit = self.inactive_producer_timeout * 1e9
        regs = [
            r
            for r in regs
            if now - r.peer.last_update <= limit and not (access == "w" and self._tombstoned(r))
        ]
        partitions: dict[str, PeerInfo] = {}
        producers: dict[str, PeerInfo] = {}
        empty_filtered = False
        for reg in regs:
            if (
                access == "w"
                and not self.allow_write_with_nochannels
                and not any(c.pid == reg.pid for c in registry.channels.get(topic, ()))
            ):
                empty_filtered = True
                continue
            if go_atoi(reg.pid.encode()) >= 0:
                partitions[reg.pid] = reg.peer
            producers[reg.peer.id] = reg.peer
        if found_in_register and empty_filtered and not partitions and not producers:
            raise HTTPAPIError(404, _NO_CHANNEL)
        answer: dict[str, Any] = {"channels": self._channel_names(topic, partition)}
        if metainfo and self.ha_cluster:
            answer["meta"] = self.topic_meta.get(topic, TopicMetaInfo()).to_json()
        answer["partitions"] = {pid: _peer_json(partitions[pid]) for pid in sorted(partitions)}
        answer["producers"] = [_peer_json(p) for p in producers.values()]
        return answer

    def partitions_of(self, topic: str) -> dict[int, PeerInfo]:
        """The partitions ``/lookup?access=r`` lists for ``topic``, by id."""
        return {
            int(pid): self._peer_by_id(peer["id"]) for pid, peer in self.lookup(topic)["partitions"].items()
        }

    async def wait_for_partitions(
        self,
        topic: str,
        count: int,
        *,
        timeout: float = 5.0,
        leaders: dict[int, tuple[int, int]] | None = None,
    ) -> dict[str, Any]:
        """Wait until ``/lookup`` lists ``count`` partitions of ``topic`` (led as ``leaders`` says).

        ``leaders`` maps a partition to the ``(tcp_port, http_port)`` of its leader.
        """

        def found() -> dict[str, Any] | None:
            listed = self.lookup(topic)["partitions"]
            if len(listed) < count:
                return None
            for pid, (tcp_port, http_port) in (leaders or {}).items():
                peer = listed.get(str(pid))
                if peer is None or (peer["tcp_port"], peer["http_port"]) != (tcp_port, http_port):
                    return None
            return listed

        answer: dict[str, Any] = await self._wait(found, timeout, f"{count} partition(s) of topic {topic!r}")
        return answer

    def topics(self) -> list[str]:
        return list(self.registry.topics)

    def channels(self, topic: str, partition: str = "*") -> list[str]:
        return self._channel_names(topic, partition)

    def nodes(self) -> list[dict[str, Any]]:
        """What ``/nodes`` lists: active nsqds, their topics, partitions and tombstones."""
        now = time.time_ns()
        limit = self.inactive_producer_timeout * 1e9
        nodes = []
        for peer in self.registry.peers.values():
            if now - peer.last_update > limit:
                continue
            topics: list[str] = []
            partitions: dict[str, list[str]] = {}
            tombstones: list[bool] = []
            for topic, regs in self.registry.topics.items():
                mine = [r for r in regs if r.peer.id == peer.id]
                if mine:
                    topics.append(topic)
                    partitions[topic] = [r.pid for r in mine]
                    tombstones.append(self._tombstoned(mine[-1]))
            nodes.append(
                {
                    "remote_address": peer.remote_address,
                    "hostname": peer.hostname,
                    "broadcast_address": peer.broadcast_address,
                    "tcp_port": peer.tcp_port,
                    "http_port": peer.http_port,
                    "version": peer.version,
                    "tombstones": tombstones,
                    "topics": topics,
                    "partitions": partitions,
                }
            )
        return nodes

    # -- registry operations (TCP clients and in-process nodes) ---------------------------

    def _identify(self, peer: PeerInfo) -> None:
        peer.last_update = time.time_ns()
        self.registry.peers.setdefault(peer.id, peer)
        self._notify()

    def _ha_registration(self, command: str, peer: PeerInfo, params: list[bytes]) -> None:
        """``REGISTER``/``UNREGISTER`` as youzan's lookup_protocol_v1 reads them (errors fatal)."""
        words = [p.decode("utf-8", "surrogateescape") for p in params]
        try:
            topic, pid, channel = self._topic_partition_channel(command, words)
        except _ClientError:
            if not is_old_peer(peer):
                raise
            topic, channel = self._old_topic_channel(command, words)
            pid = str(OLD_VERSION_PID)
        peer.last_update = time.time_ns()
        if command == "REGISTER":
            self._ha_register(peer, topic, pid, channel)
        else:
            self._ha_unregister(peer, topic, pid, channel)

    @staticmethod
    def _topic_partition_channel(command: str, words: list[str]) -> tuple[str, str, str]:
        if len(words) <= 1:
            raise _ClientError("E_INVALID", f"{command} insufficient number of params")
        topic, pid = words[0], words[1]
        channel = words[2] if len(words) >= 3 else ""
        if not codec.valid_topic_name(topic):
            raise _ClientError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
        if channel and not codec.valid_channel_name(channel):
            raise _ClientError("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
        try:
            number = go_atoi(pid.encode())
        except ValueError:
            number = None
        if number is None or not (0 <= number < MAX_PARTITION_NUM or number == OLD_VERSION_PID):
            raise _ClientError("E_BAD_PARTITIONID", f"{command} partition id '{pid}' is not valid")
        return topic, pid, channel

    @staticmethod
    def _old_topic_channel(command: str, words: list[str]) -> tuple[str, str]:
        if not words:
            raise _ClientError("E_INVALID", f"{command} insufficient number of params")
        topic = words[0]
        channel = words[1] if len(words) >= 2 else ""
        if not codec.valid_topic_name(topic):
            raise _ClientError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
        if channel and not codec.valid_channel_name(channel):
            raise _ClientError("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
        return topic, channel

    def _ha_register(self, peer: PeerInfo, topic: str, pid: str, channel: str) -> None:
        registry = self.registry
        if channel:
            reg = _ChannelReg(pid, peer.id, channel)
            regs = registry.channels.setdefault(topic, [])
            if reg not in regs:
                regs.append(reg)
        producers = registry.topics.setdefault(topic, [])
        if not any(r.pid == pid and r.peer.id == peer.id for r in producers):
            producers.append(_TopicReg(pid, peer))
        self._notify()

    def _ha_unregister(self, peer: PeerInfo, topic: str, pid: str, channel: str) -> None:
        registry = self.registry
        channels = registry.channels.get(topic)
        if channels is not None:
            kept = [
                c
                for c in channels
                if not (c.pid == pid and c.peer_id == peer.id and channel in ("", c.channel))
            ]
            if len(kept) != len(channels):
                if kept:
                    registry.channels[topic] = kept
                else:
                    del registry.channels[topic]
        if not channel:
            producers = registry.topics.get(topic)
            if producers is not None:
                kept_regs = [r for r in producers if not (r.pid == pid and r.peer.id == peer.id)]
                if len(kept_regs) != len(producers):
                    if kept_regs:
                        registry.topics[topic] = kept_regs
                    else:
                        del registry.topics[topic]
        self._notify()

    def _drop_peer(self, peer: PeerInfo) -> None:
        registry = self.registry
        for topic, regs in registry.topics.items():
            registry.topics[topic] = [r for r in regs if r.peer.id != peer.id]  # keys stay, as in Go
        for topic, chans in registry.channels.items():
            registry.channels[topic] = [c for c in chans if c.peer_id != peer.id]
        registry.peers.pop(peer.id, None)
        self._notify()

    def _register(self, peer: PeerInfo, topic: str, channel: str) -> None:
        # In-process nodes (register_node) speak the old, partition-less way.
        self._ha_register(peer, topic, str(OLD_VERSION_PID) if is_old_peer(peer) else "0", channel)

    def _unregister(self, peer: PeerInfo, topic: str, channel: str) -> None:
        self._ha_unregister(peer, topic, str(OLD_VERSION_PID) if is_old_peer(peer) else "0", channel)

    def _tombstoned(self, reg: _TopicReg) -> bool:
        return reg.tombstoned or is_old_peer(reg.peer)

    def _channel_names(self, topic: str, partition: str) -> list[str]:
        names: dict[str, None] = {}
        for reg in self.registry.channels.get(topic, ()):
            if partition in ("*", reg.pid):
                names.setdefault(reg.channel, None)
        return list(names)

    def _peer_by_id(self, peer_id: str) -> PeerInfo:
        return self.registry.peers[peer_id]

    # -- HTTP --------------------------------------------------------------------------

    def _routes(self) -> dict[str, tuple[str, Callable[[dict[str, str]], Any]]]:
        return {
            "/ping": ("GET", self._do_ping),
            "/info": ("GET", self._do_info),
            "/debug": ("GET", self._do_debug),
            "/lookup": ("GET", self._do_lookup),
            "/topics": ("GET", self._do_topics),
            "/channels": ("GET", self._do_channels),
            "/nodes": ("GET", self._do_nodes),
            "/listlookup": ("GET", self._do_listlookup),
            "/topic/create": ("POST", self._do_create_topic_ha),
            "/topic/tombstone": ("POST", self._do_tombstone_topic_producer),
            "/channel/create": ("POST", self._do_create_channel_ha),
        }

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        route = self._routes().get(request.path)
        if route is None:
            return respond_v1(404, "NOT_FOUND")  # httprouter's NotFound: always the v1 form
        method, handler = route
        if request.method != method and not (request.path == "/topic/create" and request.method == "PUT"):
            return respond_v1(405, "METHOD_NOT_ALLOWED")
        try:
            params = parse_go_query(request.rel_url.raw_query_string)
            await request.read()
            data = handler(params)
            if inspect.isawaitable(data):
                data = await data
        except HTTPAPIError as exc:
            return self._respond(request, exc.status, exc.text)
        if request.path == "/ping":
            return web.Response(status=200, body=b"OK", headers={"Content-Type": "text/plain; charset=utf-8"})
        return self._respond(request, 200, data)

    def _respond(self, request: web.Request, status: int, data: Any) -> web.Response:
        """NegotiateVersion: bare with the v1 Accept header, else the wrapper (errors: 500)."""
        v1_only = request.path in ("/topic/create", "/topic/tombstone", "/channel/create")
        # acceptVersion compares the whole header, not one of its values.
        if v1_only or request.headers.get("Accept", "") == _ACCEPT_V1:
            return respond_v1(status, data)
        return respond_legacy(status, data)

    def _do_info(self, params: dict[str, str]) -> dict[str, Any]:
        return {"version": self.version, "ha_support": self.ha_cluster}

    def _do_debug(self, params: dict[str, str]) -> dict[str, Any]:
        data: dict[str, list[dict[str, Any]]] = {}
        for topic, regs in self.registry.topics.items():
            for reg in regs:
                peer = reg.peer
                data.setdefault(f"topic:{topic}", []).append(
                    {
                        "broadcast_address": peer.broadcast_address,
                        "hostname": peer.hostname,
                        "http_port": peer.http_port,
                        "id": peer.id,
                        "last_update": peer.last_update,
                        "partitionID": reg.pid,
                        "tcp_port": peer.tcp_port,
                        "tombstoned": reg.tombstoned,
                        "tombstoned_at": reg.tombstoned_at,
                        "version": peer.version,
                    }
                )
        for topic, chans in self.registry.channels.items():
            for chan in chans:
                data.setdefault(f"channel:{topic}:{chan.pid}", []).append(
                    {"channelName": chan.channel, "partitionID": chan.pid, "peerId": chan.peer_id}
                )
        return dict(sorted(data.items()))

    def _do_lookup(self, params: dict[str, str]) -> dict[str, Any]:
        topic = params.get("topic", "")
        if not topic:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        return self.lookup(
            topic,
            access=params.get("access") or "r",
            metainfo=bool(params.get("metainfo")),
            partition=params.get("partition") or "*",
        )

    def _do_topics(self, params: dict[str, str]) -> dict[str, Any]:
        topics = self.topics()
        if params.get("metaInfo") == "true" and self.ha_cluster:
            infos = []
            for topic in topics:
                meta = self.topic_meta.get(topic)
                if meta is None:
                    raise HTTPAPIError(500, f"topic meta info for {topic} not exist")
                infos.append(
                    {"topic_name": topic, "extend_support": meta.extend_support, "ordered": meta.ordered}
                )
            return {"meta_info": infos, "topics": topics}
        return {"topics": topics}

    def _do_channels(self, params: dict[str, str]) -> dict[str, Any]:
        topic = params.get("topic", "")
        if not topic:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        return {"channels": self._channel_names(topic, params.get("partition") or "*")}

    def _do_nodes(self, params: dict[str, str]) -> dict[str, Any]:
        return {"producers": self.nodes()}

    def _do_listlookup(self, params: dict[str, str]) -> Any:
        if not self.ha_cluster:
            return None  # standalone: 200 and nothing (wrapped: data null)
        address = self.broadcast_address if self._broadcast_given else self.host
        node = {
            "ID": join_host_port(address, self.http_port),
            "NodeIP": address,
            "TcpPort": str(self.tcp_port),
            "HttpPort": str(self.http_port),
            "RpcPort": "",
            "Epoch": 1,
        }
        return {"lookupdleader": node, "lookupdnodes": [dict(node)]}

    async def _do_create_topic_ha(self, params: dict[str, str]) -> None:
        topic = params.get("topic", "")
        if not topic:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        if not codec.valid_topic_name(topic):
            raise HTTPAPIError(400, "INVALID_ARG_TOPIC")
        partitions = _bounded(params, "partition_num", 1, MAX_PARTITION_NUM, "TOPIC_PARTITION_NUM")
        replica = _bounded(params, "replicator", 1, MAX_REPLICATOR, "TOPIC_REPLICATOR")
        if not self.ha_cluster:
            raise HTTPAPIError(500, "MISSING_COORDINATOR")
        meta = TopicMetaInfo(
            partition_num=partitions,
            replica=replica,
            extend_support=params.get("extend") == "true",
            ordered=params.get("orderedmulti") == "true",
            multi_part=params.get("multipart") == "true",
            disable_channel_auto_create=params.get("disable_channel_auto_create") == "true",
        )
        # The coordinator's placement: one replica of the topic per node unless the
        # topic allows several partitions on a node (orderedmulti or multipart).
        nodes = sum(1 for peer in self.registry.peers.values() if not is_old_peer(peer))
        if nodes < replica or (not (meta.ordered or meta.multi_part) and nodes < partitions * replica):
            raise HTTPAPIError(400, _NODE_UNAVAILABLE)
        existing = self.topic_meta.get(topic)
        if existing is not None:
            if existing != meta:
                raise HTTPAPIError(400, "already exist")
            return
        if self.topic_creator is not None:
            await self.topic_creator(topic, meta)
        self.topic_meta[topic] = meta
        self._notify()

    async def _do_create_channel_ha(self, params: dict[str, str]) -> None:
        """Register a channel of a topic whose channel auto-create is disabled (cluster mode)."""
        topic = params.get("topic", "")
        if not topic:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        if not codec.valid_topic_name(topic):
            raise HTTPAPIError(400, "INVALID_ARG_TOPIC")
        channel = params.get("channel", "")
        if not channel:
            raise HTTPAPIError(400, "MISSING_ARG_CHANNEL")
        if not codec.valid_channel_name(channel):
            raise HTTPAPIError(400, "INVALID_ARG_CHANNEL")
        meta = self.topic_meta.get(topic)
        if meta is None:
            raise HTTPAPIError(400, "Key not found")  # etcd's answer for the missing topic key
        if not meta.disable_channel_auto_create:
            raise HTTPAPIError(400, f"channel auto create NOT disabled in topic {topic}")
        registered = self.registered_channels.setdefault(topic, [])
        if channel in registered:
            raise HTTPAPIError(400, f"channel {channel} already registered")
        registered.append(channel)
        if self.channel_registrar is not None:
            await self.channel_registrar(topic, channel)

    def _do_tombstone_topic_producer(self, params: dict[str, str]) -> None:
        topic = params.get("topic", "")
        if not topic:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        node = params.get("node", "")
        if not node:
            raise HTTPAPIError(400, "MISSING_ARG_NODE")
        restore = params.get("restore") == "true"
        for reg in self.registry.topics.get(topic, ()):
            if f"{reg.peer.broadcast_address}:{reg.peer.http_port}" == node:
                reg.tombstoned = not restore
                reg.tombstoned_at = time.time_ns() if not restore else reg.tombstoned_at
        self._notify()


def _bounded(params: dict[str, str], name: str, low: int, high: int, what: str) -> int:
    raw = params.get(name, "")
    if not raw:
        raise HTTPAPIError(400, f"MISSING_ARG_{what}")
    try:
        value = go_atoi(raw.encode())
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise HTTPAPIError(400, f"INVALID_ARG_{what}")
    return value
