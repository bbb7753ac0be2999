"""The embedded nsqlookupd's core: registrations, the TCP protocol and the upstream HTTP API.

:class:`LookupdServer` is the upstream (nsqio) nsqlookupd; the HA dialect
(``_lookupd_ha``) builds on it, and ``lookupd`` puts both behind one public class,
:class:`~fastnsq.testing.NSQLookupd`.

One job: answer what a real ``nsqlookupd`` 1.3 answers, so that a real nsqd can
register with it, the embedded :class:`~fastnsq.testing.NSQD` can register with it,
and any lookupd client (fastnsq's own, go-nsq, pynsq) can query it — in the same
asyncio loop as the test, with nothing written to disk.

What it does, as upstream does it (nsqio/nsq ``nsqlookupd/``):

* TCP (``"  V1"`` magic, then lines): ``IDENTIFY`` + u32 length + JSON peer info
  (answered with lookupd's own JSON), ``REGISTER topic [channel]``,
  ``UNREGISTER topic [channel]``, ``PING``; every answer is a u32 big-endian
  size and the bytes (``OK``, the JSON, or an error text), without a frame
  type; every error is fatal (the answer, then the connection is closed);
  a closed connection removes its producer from every registration (the
  registrations themselves stay, so ``/lookup`` keeps answering 200).
* Producers that have not sent anything (``IDENTIFY``/``PING``) for
  ``inactive_producer_timeout`` drop out of ``/lookup`` and ``/nodes``;
  tombstoned producers drop out of ``/lookup`` for ``tombstone_lifetime``.
* HTTP: ``/ping``, ``/info``, ``/debug``, ``/lookup``, ``/topics``, ``/channels``,
  ``/nodes`` (GET) and ``/topic/create``, ``/topic/delete``,
  ``/channel/create``, ``/channel/delete``, ``/topic/tombstone`` (POST), every
  answer in the v1 form (bare JSON, ``X-Nsq-Content-Type: nsq; version=1.0``,
  errors ``{"message": "..."}`` with the real status) whatever the ``Accept``
  header says (nsqlookupd's ``http.go``); anything else is ``404 NOT_FOUND`` or
  ``405 METHOD_NOT_ALLOWED`` (so ``/listlookup`` is a 404, as upstream).

Tests that run no nsqd can put producers in directly with :meth:`NSQLookupd.register_node`.

Example::

    async with NSQLookupd() as lookupd:
        node = lookupd.register_node(tcp_port=4150, http_port=4151)
        node.register("events", "archive")
        # GET http://{lookupd.http_address}/lookup?topic=events now lists the node

``NSQLookupd(ha=True)`` is youzan's HA lookupd instead (youzan nsqlookupd's ``http.go``,
``_lookupd_ha``): ``REGISTER topic partition [channel]``, answers in the
negotiated form, ``/lookup`` with ``partitions`` (and ``meta``), ``/listlookup``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web

from fastnsq import codec
from fastnsq.errors import InvalidValueError, ProtocolError

from ._http import (
    HTTPAPIError,
    HTTPSite,
    go_json,
    join_host_port,
    parse_go_query,
    respond_plain,
    respond_v1,
)
from ._ports import PortKeeper, listen_socket

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "LOOKUPD_VERSION",
    "LookupdServer",
    "PeerInfo",
    "RegisteredNode",
    "Registration",
    "RegistrationDB",
]

logger = logging.getLogger(__name__)

#: The nsqlookupd version the embedded server reports (``/info``, IDENTIFY answers).
LOOKUPD_VERSION = "1.3.0"

# Go's time.Time{}.UnixNano(): what /debug shows for a producer never tombstoned.
_GO_ZERO_TIME_UNIX_NANO = -6795364578871345152

_U32 = struct.Struct(">I")


# ---- the registration database -------------------------------------------------------


class Registration(NamedTuple):
    """One registration key: ``("topic", T, "")``, ``("channel", T, C)`` or ``("client", "", "")``."""

    category: str
    key: str
    subkey: str

    def matches(self, category: str, key: str, subkey: str) -> bool:
        """Whether this key matches; ``"*"`` in ``key``/``subkey`` matches anything."""
        return (
            self.category == category
            and (key == "*" or self.key == key)
            and (subkey == "*" or self.subkey == subkey)
        )


_CLIENT = Registration("client", "", "")


@dataclass(eq=False)
class PeerInfo:
    """One nsqd as lookupd knows it: what it sent in IDENTIFY, plus when it was last heard."""

    id: str
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    topology_zone: str = ""
    topology_region: str = ""
    distributed_id: str = ""  # HA: the cluster node id ("" for a standalone nsqd)
    # Wall-clock ns, like nsqlookupd's lastUpdate (UnixNano): expiry compares wall clocks.
    last_update: int = field(default_factory=time.time_ns)

    def to_json(self, topology: bool = False) -> dict[str, Any]:
        """The producer object of ``/lookup`` (nsqio registration_db.go PeerInfo, in its field order).

        ``topology``: nsq master's PeerInfo, which adds the nsqd's zone and region.
        """
        out: dict[str, Any] = {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }
        if topology:
            out["topology_zone"] = self.topology_zone
            out["topology_region"] = self.topology_region
        return out


@dataclass(eq=False)
class Producer:
    """A peer inside one registration; the tombstone belongs to the pair."""

    peer: PeerInfo
    tombstoned_at: float | None = None  # time.monotonic()
    tombstoned_at_ns: int = _GO_ZERO_TIME_UNIX_NANO  # wall clock, for /debug

    def tombstone(self) -> None:
        self.tombstoned_at = time.monotonic()
        self.tombstoned_at_ns = time.time_ns()

    def is_tombstoned(self, lifetime: float) -> bool:
        return self.tombstoned_at is not None and time.monotonic() - self.tombstoned_at < lifetime


class RegistrationDB:
    """Registration key → producers, as nsqlookupd's RegistrationDB; insertion-ordered.

    Removing the last producer leaves the key in place (upstream does the same:
    a topic stays known after its nsqd goes away).
    """

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._map: dict[Registration, dict[str, Producer]] = {}
        self._on_change = on_change or (lambda: None)

    def clear(self) -> None:
        self._map.clear()
        self._on_change()

    def items(self) -> list[tuple[Registration, list[Producer]]]:
        """Every key with its producers (a snapshot)."""
        return [(k, list(producers.values())) for k, producers in self._map.items()]

    def add_registration(self, key: Registration) -> None:
        self._map.setdefault(key, {})
        self._on_change()

    def add_producer(self, key: Registration, producer: Producer) -> bool:
        """Add ``producer`` under ``key`` unless its peer is there already; whether it was added."""
        producers = self._map.setdefault(key, {})
        added = producer.peer.id not in producers
        if added:
            producers[producer.peer.id] = producer
        self._on_change()
        return added

    def remove_producer(self, key: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a peer from ``key``: (whether it was there, how many producers are left)."""
        producers = self._map.get(key)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        self._on_change()
        return removed, len(producers)

    def remove_registration(self, key: Registration) -> None:
        self._map.pop(key, None)
        self._on_change()

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        return [k for k in self._map if k.matches(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """The producers of every matching key, one per peer."""
        seen: dict[str, Producer] = {}
        for k, producers in self._map.items():
            if k.matches(category, key, subkey):
                for peer_id, producer in producers.items():
                    seen.setdefault(peer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key the peer is registered under."""
        return [k for k, producers in self._map.items() if peer_id in producers]


def filter_active(
    producers: Iterable[Producer], inactive_timeout: float, tombstone_lifetime: float
) -> list[Producer]:
    """Drop producers not heard from within ``inactive_timeout`` or tombstoned (FilterByActive)."""
    now = time.time_ns()
    limit = inactive_timeout * 1e9
    return [
        p for p in producers if now - p.peer.last_update <= limit and not p.is_tombstoned(tombstone_lifetime)
    ]


# ---- the TCP protocol ----------------------------------------------------------------


class _ClientError(Exception):
    """A lookupd ``FatalClientErr``: the text is sent, then the connection closes."""

    def __init__(self, code: str, description: str | bytes) -> None:
        if isinstance(description, str):
            description = description.encode("utf-8", "surrogateescape")
        self.text = code.encode("ascii") + b" " + description
        super().__init__(self.text)


# IDENTIFY JSON fields: Go's json.Unmarshal into nsqlookupd's PeerInfo.
_PEER_FIELDS: dict[str, type] = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "topology_zone": str,
    "topology_region": str,
}
_GO_INT_MAX = 2**63 - 1
#: The HA lookupd's PeerInfo: no topology, a cluster node id.
HA_PEER_FIELDS: dict[str, type] = {
    **{k: v for k, v in _PEER_FIELDS.items() if not k.startswith("topology_")},
    "distributed_id": str,
}


def decode_identify(body: bytes, peer_fields: dict[str, type] = _PEER_FIELDS) -> dict[str, Any]:
    """The PeerInfo fields of an IDENTIFY body, decoded as Go's ``json.Unmarshal`` would.

    Unknown keys are ignored, keys match case-insensitively, ``null`` leaves the
    zero value, a value of the wrong type is an error. Raises ``ValueError``.
    """
    data = json.loads(body.decode("utf-8", "replace"))
    fields: dict[str, Any] = {name: kind() for name, kind in peer_fields.items()}
    if data is None:
        return fields
    if not isinstance(data, dict):
        raise ValueError(f"cannot unmarshal {type(data).__name__} into PeerInfo")  # noqa: TRY004
    for key, value in data.items():
        name = key if key in peer_fields else next((f for f in peer_fields if f.lower() == key.lower()), None)
        if name is None or value is None:
            continue
        kind = peer_fields[name]
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or abs(value) > _GO_INT_MAX:
                raise ValueError(f"cannot unmarshal {value!r} into {name}")
        elif not isinstance(value, str):
            raise ValueError(f"cannot unmarshal {value!r} into {name}")
        fields[name] = value
    return fields


class _LookupProtocolV1(asyncio.BufferedProtocol):
    """One TCP client (an nsqd) of the embedded lookupd."""

    def __init__(self, lookupd: LookupdServer) -> None:
        self._lookupd = lookupd
        self._transport: asyncio.Transport | None = None
        self._remote = ""
        self._peer: PeerInfo | None = None
        self._closing = False
        self._reader = codec.CommandReader(
            self._on_command,
            on_magic=self._on_magic,
            # bufio.ReadString in nsqlookupd has no limit; this is only a guard.
            max_line=1 << 20,
            max_body_size=lookupd.max_body_size,
        )

    # -- asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; the duck type is enough.
        self._transport = transport  # type: ignore[assignment]
        peername = transport.get_extra_info("peername")
        self._remote = join_host_port(peername[0], peername[1]) if peername else "unknown:0"
        self._lookupd._connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._reader.buffer_updated(nbytes)
        except ProtocolError as exc:
            logger.info("lookupd client %s: %s; closing", self._remote, exc)
            self.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lookupd._connections.discard(self)
        self._closing = True
        if self._peer is not None:
            self._lookupd._drop_peer(self._peer)
            self._peer = None

    def close(self) -> None:
        self._closing = True
        self._reader.pause()
        if self._transport is not None:
            self._transport.close()

    # -- commands

    def _send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(_U32.pack(len(data)) + data)

    def _on_magic(self, magic: bytes) -> None:
        if magic != b"  V1":
            logger.info("lookupd client %s: bad protocol magic %r", self._remote, magic)
            self._send(b"E_BAD_PROTOCOL")
            self.close()

    def _on_command(self, name: bytes, params: list[bytes], body: bytes | int | None) -> None:
        if self._closing:
            return
        # nsqlookupd trims the line and splits it on single spaces.
        parts = b" ".join([name, *params]).strip().split(b" ")
        try:
            response = self._exec(parts[0], parts[1:], body)
        except _ClientError as exc:
            logger.info("lookupd client %s: %s", self._remote, exc.text.decode("utf-8", "replace"))
            self._send(exc.text)
            self.close()
            return
        self._send(response)

    def _exec(self, name: bytes, params: list[bytes], body: bytes | int | None) -> bytes:
        if name == b"PING":
            if self._peer is not None:
                self._peer.last_update = time.time_ns()
            return b"OK"
        if name == b"IDENTIFY":
            return self._identify(body)
        if self._lookupd.ha and name in (b"REGISTER", b"UNREGISTER"):
            self._lookupd._ha_registration(name.decode(), self._identified(), params)
            return b"OK"
        if name == b"REGISTER":
            topic, channel = self._topic_channel("REGISTER", params)
            self._lookupd._register(self._identified(), topic, channel)
            return b"OK"
        if name == b"UNREGISTER":
            topic, channel = self._topic_channel("UNREGISTER", params)
            self._lookupd._unregister(self._identified(), topic, channel)
            return b"OK"
        raise _ClientError("E_INVALID", b"invalid command " + name)

    def _identified(self) -> PeerInfo:
        if self._peer is None:
            raise _ClientError("E_INVALID", "client must IDENTIFY")
        return self._peer

    def _identify(self, body: bytes | int | None) -> bytes:
        if self._peer is not None:
            raise _ClientError("E_INVALID", "cannot IDENTIFY again")
        if isinstance(body, int) and body != 0:
            # Negative or beyond max_body_size: nsqlookupd cannot read such a body.
            raise _ClientError("E_BAD_BODY", "IDENTIFY failed to read body")
        try:
            fields = decode_identify(body if isinstance(body, bytes) else b"", self._lookupd.peer_fields)
        except ValueError:
            raise _ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        fields["remote_address"] = self._remote
        if not (
            fields["broadcast_address"] and fields["tcp_port"] and fields["http_port"] and fields["version"]
        ):
            raise _ClientError("E_BAD_BODY", "IDENTIFY missing fields")
        self._peer = PeerInfo(id=self._remote, **fields)
        self._lookupd._identify(self._peer)
        return go_json(self._lookupd._identify_response())

    def _topic_channel(self, command: str, params: list[bytes]) -> tuple[str, str]:
        """``topic [channel]`` of REGISTER/UNREGISTER, validated as nsqlookupd's getTopicChan."""
        if not params:
            raise _ClientError("E_INVALID", f"{command} insufficient number of params")
        topic = params[0].decode("utf-8", "surrogateescape")
        channel = params[1].decode("utf-8", "surrogateescape") if len(params) > 1 else ""
        if not codec.valid_topic_name(topic):
            raise _ClientError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
        if channel and not codec.valid_channel_name(channel):
            raise _ClientError("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
        return topic, channel


# ---- in-process registration ------------------------------------------------------------


class RegisteredNode:
    """An nsqd registered in-process with :meth:`NSQLookupd.register_node` (no TCP, no nsqd).

    Behaves like an nsqd's lookupd connection: :meth:`register` and
    :meth:`unregister` are REGISTER/UNREGISTER, :meth:`ping` keeps it active,
    :meth:`close` is the connection going away.
    """

    def __init__(self, lookupd: LookupdServer, peer: PeerInfo) -> None:
        self._lookupd = lookupd
        self.peer = peer
        self.closed = False

    def register(self, topic: str, channel: str | None = None) -> None:
        """REGISTER ``topic`` (and ``channel``); raises ``InvalidValueError`` for a bad name."""
        self._lookupd._register(self._open_peer(), *_checked_names(topic, channel))

    def unregister(self, topic: str, channel: str | None = None) -> None:
        """UNREGISTER ``topic`` (with no ``channel``: the topic and all its channels)."""
        self._lookupd._unregister(self._open_peer(), *_checked_names(topic, channel))

    def ping(self) -> None:
        """PING: the node counts as active for another ``inactive_producer_timeout``."""
        self._open_peer().last_update = time.time_ns()

    def close(self) -> None:
        """Drop every registration of this node, as a closed lookupd connection does."""
        if not self.closed:
            self.closed = True
            self._lookupd._drop_peer(self.peer)

    def _open_peer(self) -> PeerInfo:
        if self.closed:
            raise RuntimeError("this node was closed; register a new one")
        return self.peer


def _checked_names(topic: str, channel: str | None) -> tuple[str, str]:
    if not codec.valid_topic_name(topic):
        raise InvalidValueError(
            f"topic name {topic!r} is not valid (1-64 of [.a-zA-Z0-9_-], optional #ephemeral)"
        )
    if channel and not codec.valid_channel_name(channel):
        raise InvalidValueError(
            f"channel name {channel!r} is not valid (1-64 of [.a-zA-Z0-9_-], optional #ephemeral)"
        )
    return topic, channel or ""


# ---- the server -----------------------------------------------------------------------


def _check_port(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise InvalidValueError(f"{name} must be a port number in 0..65535 (0: any free port), got {value!r}")
    return value


def _check_duration(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


class LookupdServer:
    """nsqlookupd 1.3 in this process (TCP registration + HTTP API), memory only.

    The upstream dialect; the public class is :class:`~fastnsq.testing.NSQLookupd`.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        ha: bool = False,
        inactive_producer_timeout: float = 300.0,
        tombstone_lifetime: float = 45.0,
        broadcast_address: str | None = None,
        hostname: str | None = None,
        version: str | None = None,
        max_body_size: int = 5 * 1024 * 1024,
        emulate: str = "v1.3.0",
    ) -> None:
        if emulate not in ("v1.3.0", "master"):
            raise InvalidValueError(f"emulate must be one of ['v1.3.0', 'master'], got {emulate!r}")
        self.host = host
        self._tcp_port = _check_port("tcp_port", tcp_port)
        self._http_port = _check_port("http_port", http_port)
        self.ha = ha
        self.inactive_producer_timeout = _check_duration(
            "inactive_producer_timeout", inactive_producer_timeout
        )
        self.tombstone_lifetime = _check_duration("tombstone_lifetime", tombstone_lifetime)
        # nsqlookupd's --broadcast-address defaults to the host name.
        self.hostname = hostname or socket.gethostname()
        self.broadcast_address = broadcast_address or self.hostname
        self.version = version or LOOKUPD_VERSION
        self.max_body_size = max_body_size
        #: Which upstream nsqlookupd the answers follow: the released v1.3.0 or nsq master,
        #: whose producers and nodes carry ``topology_zone`` / ``topology_region``.
        self.emulate = emulate
        self.topology = emulate == "master" and not ha
        #: The IDENTIFY fields nsqds send (Go's PeerInfo of this dialect).
        self.peer_fields: dict[str, type] = _PEER_FIELDS
        self.db = RegistrationDB(on_change=self._notify)
        self._connections: set[_LookupProtocolV1] = set()
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http = HTTPSite(self._dispatch)
        self._ports = PortKeeper()  # the TCP port, kept while stopped
        self._waiters: set[asyncio.Future[None]] = set()
        self._node_ids = itertools.count(1)

    # -- lifecycle

    @property
    def running(self) -> bool:
        return self._tcp_server is not None

    async def start(self) -> None:
        """Listen on the TCP and HTTP ports."""
        if self._tcp_server is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        self.db.clear()
        loop = asyncio.get_running_loop()
        sock = listen_socket(self.host, self._tcp_port)
        try:
            server = await loop.create_server(lambda: _LookupProtocolV1(self), sock=sock)
        except BaseException:
            sock.close()
            raise
        self._tcp_port = int(sock.getsockname()[1])
        self._ports.release(self.host, self._tcp_port)
        try:
            self._http_port = await self._http.start(self.host, self._http_port)
        except BaseException:
            server.close()
            raise
        self._tcp_server = server
        logger.debug("nsqlookupd listening on TCP %s, HTTP %s", self.tcp_address, self.http_address)

    async def stop(self) -> None:
        """Close every connection and stop listening; the database is emptied."""
        server, self._tcp_server = self._tcp_server, None
        if server is None:
            return
        server.close()
        self._ports.hold(self.host, self._tcp_port)
        for conn in list(self._connections):
            conn.close()
        await self._http.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
        # Let connection_lost run for the connections just closed.
        await asyncio.sleep(0)
        self.db.clear()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- addresses

    @property
    def tcp_port(self) -> int:
        return self._tcp_port

    @property
    def http_port(self) -> int:
        return self._http_port

    @property
    def tcp_address(self) -> str:
        """``host:port`` for nsqd's ``--lookupd-tcp-address``."""
        return join_host_port(self.host, self._tcp_port)

    @property
    def http_address(self) -> str:
        """``host:port`` for clients' lookupd HTTP addresses."""
        return join_host_port(self.host, self._http_port)

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.http_address}"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} tcp={self.tcp_address} http={self.http_address} {state}>"

    # -- in-process use

    def register_node(
        self,
        *,
        tcp_port: int,
        http_port: int,
        broadcast_address: str = "127.0.0.1",
        hostname: str | None = None,
        version: str = "1.3.0",
        topology_zone: str = "",
        topology_region: str = "",
        remote_address: str | None = None,
    ) -> RegisteredNode:
        """Put an nsqd in the registry without a TCP connection (IDENTIFY done).

        ``broadcast_address:tcp_port`` is what consumers will connect to. Returns
        the handle to REGISTER topics and channels with.
        """
        _check_port("tcp_port", tcp_port)
        _check_port("http_port", http_port)
        if not (broadcast_address and tcp_port and http_port and version):
            raise InvalidValueError("register_node needs broadcast_address, tcp_port, http_port and version")
        peer = PeerInfo(
            id=f"in-process-{next(self._node_ids)}",
            remote_address=remote_address or join_host_port(broadcast_address, tcp_port),
            hostname=hostname or self.hostname,
            broadcast_address=broadcast_address,
            tcp_port=tcp_port,
            http_port=http_port,
            version=version,
            topology_zone=topology_zone,
            topology_region=topology_region,
        )
        self._identify(peer)
        return RegisteredNode(self, peer)

    def lookup(self, topic: str) -> dict[str, Any] | None:
        """What ``/lookup?topic=`` answers (the JSON object), or ``None`` for its 404."""
        if not self.db.find_registrations("topic", topic, ""):
            return None
        producers = filter_active(
            self.db.find_producers("topic", topic, ""),
            self.inactive_producer_timeout,
            self.tombstone_lifetime,
        )
        return {
            "channels": [k.subkey for k in self.db.find_registrations("channel", topic, "*")],
            "producers": [p.peer.to_json(self.topology) for p in producers],
        }

    def topics(self) -> list[str]:
        """What ``/topics`` lists."""
        return [k.key for k in self.db.find_registrations("topic", "*", "")]

    def channels(self, topic: str) -> list[str]:
        """What ``/channels?topic=`` lists."""
        return [k.subkey for k in self.db.find_registrations("channel", topic, "*")]

    def nodes(self) -> list[dict[str, Any]]:
        """What ``/nodes`` lists: active nsqds with their topics and tombstones."""
        nodes = []
        for producer in filter_active(self.db.find_producers(*_CLIENT), self.inactive_producer_timeout, 0):
            peer = producer.peer
            topics = [k.key for k in self.db.lookup_registrations(peer.id) if k.matches("topic", "*", "")]
            tombstones = []
            for topic in topics:
                match = [p for p in self.db.find_producers("topic", topic, "") if p.peer is peer]
                tombstones.append(any(p.is_tombstoned(self.tombstone_lifetime) for p in match))
            nodes.append({**peer.to_json(self.topology), "tombstones": tombstones, "topics": topics})
        return nodes

    async def wait_for_producers(
        self, topic: str, count: int = 1, *, timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Wait until ``/lookup?topic=`` lists at least ``count`` producers; returns them.

        Registration over TCP is asynchronous (an nsqd registers a topic when it
        creates it); tests wait here instead of sleeping.
        """

        def found() -> list[dict[str, Any]] | None:
            answer = self.lookup(topic)
            producers = answer["producers"] if answer else []
            return producers if len(producers) >= count else None

        return await self._wait(found, timeout, f"{count} producer(s) of topic {topic!r}")

    async def wait_for_nodes(self, count: int = 1, *, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Wait until ``/nodes`` lists at least ``count`` nsqds; returns them."""

        def found() -> list[dict[str, Any]] | None:
            nodes = self.nodes()
            return nodes if len(nodes) >= count else None

        return await self._wait(found, timeout, f"{count} node(s)")

    async def _wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = check()
            if result is not None:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"nsqlookupd {self.http_address}: no {what} after {timeout} s")
            waiter = loop.create_future()
            self._waiters.add(waiter)
            try:
                # Wake on every change, and now and then for time-based changes (expiry).
                await asyncio.wait_for(asyncio.shield(waiter), min(remaining, 0.05))
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(waiter)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- registry operations shared by TCP clients and in-process nodes

    def _identify(self, peer: PeerInfo) -> None:
        peer.last_update = time.time_ns()
        if self.db.add_producer(_CLIENT, Producer(peer)):
            logger.debug("lookupd: %s IDENTIFY %s:%d", peer.id, peer.broadcast_address, peer.tcp_port)

    def _identify_response(self) -> dict[str, Any]:
        # A Go map: keys sorted.
        return {
            "broadcast_address": self.broadcast_address,
            "hostname": self.hostname,
            "http_port": self._http_port,
            "tcp_port": self._tcp_port,
            "version": self.version,
        }

    def _register(self, peer: PeerInfo, topic: str, channel: str) -> None:
        if channel:
            self.db.add_producer(Registration("channel", topic, channel), Producer(peer))
        self.db.add_producer(Registration("topic", topic, ""), Producer(peer))
        logger.debug("lookupd: %s REGISTER %s %s", peer.id, topic, channel)

    def _unregister(self, peer: PeerInfo, topic: str, channel: str) -> None:
        logger.debug("lookupd: %s UNREGISTER %s %s", peer.id, topic, channel)
        if channel:
            key = Registration("channel", topic, channel)
            _, left = self.db.remove_producer(key, peer.id)
            # An ephemeral channel disappears with its last producer.
            if left == 0 and channel.endswith("#ephemeral"):
                self.db.remove_registration(key)
            return
        # A topic UNREGISTER also takes the peer off the topic's channels.
        for key in self.db.find_registrations("channel", topic, "*"):
            self.db.remove_producer(key, peer.id)
        key = Registration("topic", topic, "")
        _, left = self.db.remove_producer(key, peer.id)
        if left == 0 and topic.endswith("#ephemeral"):
            self.db.remove_registration(key)

    def _drop_peer(self, peer: PeerInfo) -> None:
        for key in self.db.lookup_registrations(peer.id):
            self.db.remove_producer(key, peer.id)
        logger.debug("lookupd: %s gone", peer.id)

    # -- HTTP

    def _routes(self) -> dict[str, tuple[str, Callable[[dict[str, str]], Any]]]:
        """path → (method, handler(params) → data); handlers raise HTTPAPIError."""
        return {
            "/ping": ("GET", self._do_ping),
            "/info": ("GET", self._do_info),
            "/debug": ("GET", self._do_debug),
            "/lookup": ("GET", self._do_lookup),
            "/topics": ("GET", self._do_topics),
            "/channels": ("GET", self._do_channels),
            "/nodes": ("GET", self._do_nodes),
            "/topic/create": ("POST", self._do_create_topic),
            "/topic/delete": ("POST", self._do_delete_topic),
            "/channel/create": ("POST", self._do_create_channel),
            "/channel/delete": ("POST", self._do_delete_channel),
            "/topic/tombstone": ("POST", self._do_tombstone_topic_producer),
        }

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        route = self._routes().get(request.path)
        if route is None:
            return self._respond(request, 404, "NOT_FOUND")
        method, handler = route
        allow = ", ".join(sorted((method, "OPTIONS")))
        if request.method == "OPTIONS":
            return web.Response(status=200, headers={"Allow": allow})
        if request.method != method:
            response = self._respond(request, 405, "METHOD_NOT_ALLOWED")
            response.headers["Allow"] = allow
            return response
        try:
            params = parse_go_query(request.rel_url.raw_query_string)
            await request.read()  # NewReqParams reads the body; nothing in it is used
            data = handler(params)
        except HTTPAPIError as exc:
            return self._respond(request, exc.status, exc.text)
        if request.path == "/ping":
            return respond_plain(data)  # /ping is the one plain-text route
        return self._respond(request, 200, data)

    def _ha_registration(self, command: str, peer: PeerInfo, params: list[bytes]) -> None:
        """REGISTER/UNREGISTER of the HA dialect (HALookupd); upstream never calls it."""
        raise _ClientError("E_INVALID", f"invalid command {command}")

    def _respond(self, request: web.Request, status: int, data: Any) -> web.Response:
        # Upstream nsqlookupd (1.2+) answers every route in the v1 form, whatever Accept says.
        return respond_v1(status, data)

    def _do_ping(self, params: dict[str, str]) -> str:
        return "OK"

    def _do_info(self, params: dict[str, str]) -> dict[str, Any]:
        return {"version": self.version}

    def _do_debug(self, params: dict[str, str]) -> dict[str, Any]:
        data: dict[str, list[dict[str, Any]]] = {}
        for key, producers in self.db.items():
            entries = data.setdefault(f"{key.category}:{key.key}:{key.subkey}", [])
            for p in producers:
                entry = {
                    "broadcast_address": p.peer.broadcast_address,
                    "hostname": p.peer.hostname,
                    "http_port": p.peer.http_port,
                    "id": p.peer.id,
                    "last_update": p.peer.last_update,
                    "tcp_port": p.peer.tcp_port,
                    "tombstoned": p.tombstoned_at is not None,
                    "tombstoned_at": p.tombstoned_at_ns,
                    "version": p.peer.version,
                    **self._debug_topology(p.peer),
                }
                # A Go map: its keys come out sorted.
                entries.append(dict(sorted(entry.items())))
        return {k: v for k, v in sorted(data.items()) if v}

    def _debug_topology(self, peer: PeerInfo) -> dict[str, str]:
        return (
            {"topology_region": peer.topology_region, "topology_zone": peer.topology_zone}
            if self.topology
            else {}
        )

    def _do_lookup(self, params: dict[str, str]) -> dict[str, Any]:
        answer = self.lookup(_required(params, "topic", "MISSING_ARG_TOPIC"))
        if answer is None:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND")
        return answer

    def _do_topics(self, params: dict[str, str]) -> dict[str, Any]:
        return {"topics": self.topics()}

    def _do_channels(self, params: dict[str, str]) -> dict[str, Any]:
        return {"channels": self.channels(_required(params, "topic", "MISSING_ARG_TOPIC"))}

    def _do_nodes(self, params: dict[str, str]) -> dict[str, Any]:
        return {"producers": self.nodes()}

    def _do_create_topic(self, params: dict[str, str]) -> None:
        topic = _required(params, "topic", "MISSING_ARG_TOPIC")
        if not codec.valid_topic_name(topic):
            raise HTTPAPIError(400, "INVALID_ARG_TOPIC")
        self.db.add_registration(Registration("topic", topic, ""))

    def _do_delete_topic(self, params: dict[str, str]) -> None:
        topic = _required(params, "topic", "MISSING_ARG_TOPIC")
        for key in self.db.find_registrations("channel", topic, "*"):
            self.db.remove_registration(key)
        for key in self.db.find_registrations("topic", topic, ""):
            self.db.remove_registration(key)

    def _do_create_channel(self, params: dict[str, str]) -> None:
        topic, channel = _topic_channel_args(params)
        self.db.add_registration(Registration("channel", topic, channel))
        self.db.add_registration(Registration("topic", topic, ""))

    def _do_delete_channel(self, params: dict[str, str]) -> None:
        topic, channel = _topic_channel_args(params)
        keys = self.db.find_registrations("channel", topic, channel)
        if not keys:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND")
        for key in keys:
            self.db.remove_registration(key)

    def _do_tombstone_topic_producer(self, params: dict[str, str]) -> None:
        topic = _required(params, "topic", "MISSING_ARG_TOPIC")
        node = _required(params, "node", "MISSING_ARG_NODE")
        for producer in self.db.find_producers("topic", topic, ""):
            peer = producer.peer
            if node in (
                f"{peer.broadcast_address}:{peer.http_port}",
                join_host_port(peer.broadcast_address, peer.http_port),
            ):
                producer.tombstone()
        self._notify()


def _required(params: dict[str, str], name: str, error: str) -> str:
    value = params.get(name)
    if value is None:
        raise HTTPAPIError(400, error)
    return value


def _topic_channel_args(params: dict[str, str]) -> tuple[str, str]:
    """nsqio http_api.GetTopicChannelArgs."""
    topic = _required(params, "topic", "MISSING_ARG_TOPIC")
    if not codec.valid_topic_name(topic):
        raise HTTPAPIError(400, "INVALID_ARG_TOPIC")
    channel = _required(params, "channel", "MISSING_ARG_CHANNEL")
    if not codec.valid_channel_name(channel):
        raise HTTPAPIError(400, "INVALID_ARG_CHANNEL")
    return topic, channel
