"""An embedded nsqd for tests: an in-process asyncio server that behaves like nsqd 1.3.

:class:`NSQD` speaks the TCP protocol V2 of nsqio/nsq 1.3 byte for byte (the answers
recorded from a real nsqd 1.3.0 in tests/captures replay identically, see
tests/test_captures_replay.py) and its HTTP API, and registers with nsqlookupd over
lookupd's TCP protocol. It is what fastnsq's own test suite, its demo and its users'
tests run against when no real nsqd is around.

**Memory only.** Messages never touch a disk: there is no ``--data-path``, no
``--mem-queue-size`` overflow to disk and nothing survives the Python process. A
``stop()`` / ``start()`` cycle imitates nsqd's restart: ``stop(keep_messages=True)``
is a clean shutdown that keeps the queued, in-flight and deferred messages (they are
queued again after the restart, as nsqd reloads them from its backend), and
``stop(keep_messages=False)`` loses them as an unclean shutdown of a memory queue
would; the (non-ephemeral) topics and channels and their paused state survive both,
like nsqd's metadata file.

Example::

    async with NSQD() as nsqd:
        reader, writer = await asyncio.open_connection(*nsqd.tcp_address.split(":"))
        ...

``NSQD(ha=True)`` speaks the HA dialect instead (youzan's "redesigned NSQ",
youzan/nsq's source; see ``_nsqd_ha``): partitioned topics created with
``INTERNAL_CREATE_TOPIC`` or :meth:`NSQD.create_topic`, binary ids, ordered and
traced subscriptions, traced and ext publishing, its error codes. Faults are injected
through :attr:`NSQD.faults` and :attr:`NSQD.refuse_connections` (see ``_nsqd_faults``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from fastnsq import codec
from fastnsq.errors import InvalidValueError

from ._http import HTTPSite
from ._nsqd_auth import AuthState, query_any_auth_server
from ._nsqd_base import HA_VERSION, MASTER, RELEASED, VERSION, NSQDOptions
from ._nsqd_client import ClientConnection
from ._nsqd_faults import Faults
from ._nsqd_ha import HAClientConnection, HATopic
from ._nsqd_queue import EPHEMERAL_SUFFIX, Channel, Topic
from ._ports import PortKeeper

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

__all__ = ["HA_VERSION", "MASTER", "NSQD", "RELEASED", "VERSION", "NSQDOptions"]

log = logging.getLogger("fastnsq.testing.nsqd")

# How long stop() lets closed connections flush before aborting them.
_CLOSE_GRACE = 1.0


class NSQD:
    """An nsqd 1.3 in this process, on loopback ports (ephemeral unless given).

    ``start()`` binds and serves, ``stop()`` shuts down; both can be repeated and a
    restart reuses the same ports. ``async with NSQD() as nsqd`` does both. Options
    are nsqd's flags with durations in seconds (see :class:`NSQDOptions`); TLS needs
    ``tls_cert``/``tls_key`` (PEM files), AUTH needs ``auth_http_addresses``.

    ``ha=True`` makes it a standalone youzan HA nsqd (``0.3.7-HA.1.13.0``): topics are
    created with ``INTERNAL_CREATE_TOPIC`` or :meth:`create_topic`, never on use.
    :attr:`faults` and :attr:`refuse_connections` inject failures in either dialect.

    >>> nsqd = NSQD(msg_timeout=5.0)
    >>> nsqd.options.msg_timeout
    5.0
    >>> NSQD(ha=True).version
    '0.3.7-HA.1.13.0'
    """

    #: The protocol class serving each TCP connection (a subclass may change the
    #: command table or inject faults; see ClientConnection).
    connection_class: type[ClientConnection] = ClientConnection

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        broadcast_address: str = "127.0.0.1",
        lookupd_tcp_addresses: Sequence[str] = (),
        ha: bool = False,
        msg_timeout: float = 60.0,
        max_msg_timeout: float = 900.0,
        max_req_timeout: float | None = None,
        max_rdy_count: int = codec.DEFAULT_MAX_RDY_COUNT,
        max_msg_size: int = codec.DEFAULT_MAX_MSG_SIZE,
        max_body_size: int = codec.DEFAULT_MAX_BODY_SIZE,
        max_heartbeat_interval: float = 60.0,
        max_output_buffer_size: int = 65536,
        max_output_buffer_timeout: float | None = None,
        max_deflate_level: int = 6,
        snappy: bool = True,
        deflate: bool = True,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_client_auth_policy: str | None = None,
        tls_root_ca_file: str | os.PathLike[str] | None = None,
        tls_required: bool = False,
        auth_http_addresses: Sequence[str] = (),
        **more: Any,
    ) -> None:
        if isinstance(lookupd_tcp_addresses, str) or isinstance(auth_http_addresses, str):
            raise InvalidValueError(
                "lookupd_tcp_addresses and auth_http_addresses are sequences of 'host:port'"
            )
        # The dialects' defaults differ (youzan nsqd/options.go: 72 h, 50 ms, 1 s).
        if max_req_timeout is None:
            max_req_timeout = 72 * 3600.0 if ha else 3600.0
        if max_output_buffer_timeout is None:
            max_output_buffer_timeout = 1.0 if ha else 30.0
        if ha:
            more.setdefault("output_buffer_timeout", 0.05)
            more.setdefault("min_output_buffer_timeout", 0.001)
        try:
            self.options = NSQDOptions(
                host=host,
                tcp_port=tcp_port,
                http_port=http_port,
                broadcast_address=broadcast_address,
                lookupd_tcp_addresses=tuple(lookupd_tcp_addresses),
                ha=ha,
                msg_timeout=msg_timeout,
                max_msg_timeout=max_msg_timeout,
                max_req_timeout=max_req_timeout,
                max_rdy_count=max_rdy_count,
                max_msg_size=max_msg_size,
                max_body_size=max_body_size,
                max_heartbeat_interval=max_heartbeat_interval,
                max_output_buffer_size=max_output_buffer_size,
                max_output_buffer_timeout=max_output_buffer_timeout,
                max_deflate_level=max_deflate_level,
                snappy=snappy,
                deflate=deflate,
                tls_cert=os.fspath(tls_cert) if tls_cert is not None else None,
                tls_key=os.fspath(tls_key) if tls_key is not None else None,
                tls_client_auth_policy=tls_client_auth_policy,
                tls_root_ca_file=os.fspath(tls_root_ca_file) if tls_root_ca_file is not None else None,
                tls_required=tls_required,
                auth_http_addresses=tuple(auth_http_addresses),
                **more,
            )
        except TypeError as exc:  # an unknown keyword
            raise InvalidValueError(f"NSQD: {exc}") from None
        self.tcp_port = self.options.tcp_port
        self.http_port = self.options.http_port
        #: The dialect: HA (youzan) or upstream nsqd 1.3.
        self.ha = self.options.ha
        self.version = HA_VERSION if self.ha else VERSION
        if self.ha and type(self).connection_class is ClientConnection:
            self.connection_class = HAClientConnection
        #: Fault injection (see _nsqd_faults.Faults).
        self.faults = Faults(self)
        #: HA: the topic partitions this node has, by (topic, partition).
        self.partitions: dict[tuple[str, int], HATopic] = {}
        #: HA: whether this node is part of an (emulated) cluster, with a coordinator:
        #: it then leads only some partitions and refuses INTERNAL_CREATE_TOPIC.
        self.ha_cluster = False
        #: HA: the node id a cluster node sends lookupd ("" standalone).
        self.distributed_id = ""
        self.tls_context = self._build_tls_context()
        self.hostname = socket.gethostname()
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientConnection] = {}
        self._client_ids = 0
        # Message ids: a 64-bit counter that starts from the clock (like nsqd's
        # snowflake guids: increasing, unique, 16 hex digits).
        self._next_id = (time.time_ns() // 1_000_000) << 20
        self.start_time = 0
        self._started_at = 0.0
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        # An asyncio server, or one being created after refuse_connections = False.
        self._tcp_server: Any = None
        self._http_site = HTTPSite(app_factory=self._build_http_app, shutdown_timeout=0.25)
        self._ports = PortKeeper()  # the TCP port, kept while stopped or refusing
        self._http_session: aiohttp.ClientSession | None = None
        self._watched: set[Channel] = set()
        self._scan_timer: asyncio.TimerHandle | None = None
        self._preparing: dict[str, asyncio.Future[Topic]] = {}
        self._lookup: Any = None
        self._refusing = False
        self.running = False

    # -- life cycle ---------------------------------------------------------------

    @property
    def tcp_address(self) -> str:
        """``host:port`` of the TCP protocol (after ``start()``)."""
        return f"{self.options.host}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        """``host:port`` of the HTTP API (after ``start()``)."""
        return f"{self.options.host}:{self.http_port}"

    @property
    def http_session(self) -> aiohttp.ClientSession | None:
        """The session nsqd's own HTTP requests use (auth, lookupd), while running."""
        return self._http_session

    @property
    def auth_enabled(self) -> bool:
        return bool(self.options.auth_http_addresses)

    async def start(self) -> None:
        """Listen on the TCP and HTTP ports and connect to the lookupds."""
        if self.running:
            return
        from ._nsqd_lookup import LookupRegistrar

        self.loop = asyncio.get_running_loop()
        options = self.options
        sock = _listen(options.host, self.tcp_port)
        self._tcp_server = await self.loop.create_server(self._new_connection, sock=sock)
        self.tcp_port = sock.getsockname()[1]
        self._ports.release(options.host, self.tcp_port)
        self._refusing = False
        try:
            self.http_port = await self._http_site.start(options.host, self.http_port)
        except BaseException:
            self._tcp_server.close()
            raise
        timeout = aiohttp.ClientTimeout(
            total=options.http_client_request_timeout, connect=options.http_client_connect_timeout
        )
        self._http_session = aiohttp.ClientSession(timeout=timeout)
        self.start_time = int(time.time())
        self._started_at = self.loop.time()
        self.running = True
        if self.ha_cluster and not self.distributed_id:
            # youzan's node id: ip:rpc_port:tcp_port:node id (no RPC port here).
            self.distributed_id = f"{options.broadcast_address}:0:{self.tcp_port}:{self.tcp_port}"
        self._lookup = LookupRegistrar(self)
        self._lookup.start()
        log.debug("nsqd listening on %s (http %s)", self.tcp_address, self.http_address)

    async def stop(self, *, keep_messages: bool = True) -> None:
        """Shut down: close every connection and both listeners.

        ``keep_messages=True`` is nsqd's clean shutdown: the messages stay (in this
        object) for the next ``start()``. ``False`` drops them, like an unclean one.
        Ephemeral topics and channels go either way.
        """
        if not self.running:
            return
        self.running = False
        self.faults.clear()
        if self._lookup is not None:
            await self._lookup.stop()
            self._lookup = None
        self._tcp_server.close()
        self._ports.hold(self.options.host, self.tcp_port)
        clients = list(self.clients.values())
        for client in clients:
            client.close()
        self.clients.clear()
        for name, topic in list(self.topics.items()):
            if topic.ephemeral:
                for channel in topic.channels.values():
                    channel.close_clients()
                del self.topics[name]
            else:
                topic.keep_for_restart(keep_messages)
        for part in self.partitions.values():
            part.keep_for_restart(keep_messages)
        self._watched.clear()
        if self._scan_timer is not None:
            self._scan_timer.cancel()
            self._scan_timer = None
        for future in self._preparing.values():
            future.cancel()
        self._preparing.clear()
        # Closed transports first write what they hold; one whose peer does not
        # read would never finish: abort it after a moment.
        deadline = self.loop.time() + _CLOSE_GRACE
        while any(client.alive for client in clients) and self.loop.time() < deadline:
            await asyncio.sleep(0.005)
        for client in clients:
            if client.alive and client.transport is not None:
                client.transport.abort()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._tcp_server.wait_closed(), _CLOSE_GRACE)
        self._tcp_server = None
        self._refusing = False
        await self._http_site.stop()
        if self._http_session is not None:
            await self._http_session.close()
            self._http_session = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _build_http_app(self) -> web.Application:
        from ._nsqd_http import build_app
        from ._nsqd_http_ha import build_ha_app

        return build_ha_app(self) if self.ha else build_app(self)

    def _new_connection(self) -> ClientConnection:
        return self.connection_class(self)

    @property
    def refuse_connections(self) -> bool:
        """Set to True to refuse new TCP connections (a fault): nothing listens on the port.

        Connections already open stay. Set back to False to listen again on the same
        port (at once: connections made right after are queued by the kernel).
        """
        return self._refusing

    @refuse_connections.setter
    def refuse_connections(self, refuse: bool) -> None:
        if not self.running:
            raise RuntimeError("refuse_connections needs a running nsqd")
        if bool(refuse) == self._refusing:
            return
        self._refusing = bool(refuse)
        if refuse:
            self._tcp_server.close()
            self._ports.hold(self.options.host, self.tcp_port)
            return
        sock = _listen(self.options.host, self.tcp_port)
        self._ports.release(self.options.host, self.tcp_port)
        self._tcp_server = _PendingServer(self.loop, self.loop.create_server(self._new_connection, sock=sock))

    def _build_tls_context(self) -> ssl.SSLContext | None:
        options = self.options
        if options.tls_cert is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(options.tls_cert, options.tls_key)
        if options.tls_root_ca_file:
            context.load_verify_locations(options.tls_root_ca_file)
        # Python's ssl cannot ask for a client certificate without verifying it, so
        # "require" (Go's RequireAnyClientCert) verifies too: against
        # tls_root_ca_file when given, else against the system's CAs.
        if options.tls_client_auth_policy in ("require", "require-verify"):
            if not options.tls_root_ca_file:
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    # -- clients ------------------------------------------------------------------

    def next_client_id(self) -> int:
        self._client_ids += 1
        return self._client_ids

    def add_client(self, client: ClientConnection) -> None:
        self.clients[client.id] = client

    def remove_client(self, client: ClientConnection) -> None:
        self.clients.pop(client.id, None)

    def identify_answer(self, **values: Any) -> bytes:
        """The IDENTIFY JSON, with nsqd's keys in nsqd's order (nsq master adds the topology)."""
        options = self.options
        answer = {
            "max_rdy_count": options.max_rdy_count,
            "version": self.version,
            "max_msg_timeout": round(options.max_msg_timeout * 1000),
            "msg_timeout": values["msg_timeout"],
            "tls_v1": values["tls_v1"],
            "deflate": values["deflate"],
            "deflate_level": values["deflate_level"],
            "max_deflate_level": options.max_deflate_level,
            "snappy": values["snappy"],
            "sample_rate": values["sample_rate"],
            "auth_required": self.auth_enabled,
            "output_buffer_size": values["output_buffer_size"],
            "output_buffer_timeout": values["output_buffer_timeout"],
        }
        if options.topology:
            answer["topology_region"] = options.topology_region
            answer["topology_zone"] = options.topology_zone
        return json.dumps(answer, separators=(",", ":")).encode()

    async def query_auth(self, remote_ip: str, tls: bool, common_name: str, secret: str) -> AuthState | None:
        """Ask the auth servers (None when none gave a valid answer)."""
        if self._http_session is None:
            return None
        return await query_any_auth_server(
            self._http_session, self.options.auth_http_addresses, remote_ip, tls, common_name, secret
        )

    # -- message ids --------------------------------------------------------------

    def next_id(self) -> bytes:
        """A new message id: 16 ASCII hex digits of an increasing 64-bit number."""
        value = self._next_id
        self._next_id = value + 1
        return b"%016x" % value

    def take_ids(self, count: int) -> int:
        """Reserve ``count`` consecutive ids; returns the first as an integer."""
        first = self._next_id
        self._next_id = first + count
        return first

    # -- topics and channels ------------------------------------------------------

    def get_topic(self, name: str) -> Topic:
        """The topic, created (and announced to lookupd) on first use."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(self, name)
            self.notify_register(name, None)
        return topic

    def topic_preparation(self, name: str) -> Callable[[], Awaitable[None]] | None:
        """How to create a new topic when lookupd must be asked first, else None.

        nsqd asks its lookupds for the channels a new topic has elsewhere and
        creates them (not the ephemeral ones) before the first message is queued,
        so that no channel misses it.
        """
        if self._lookup is None or not self._lookup.http_addresses():
            return None

        async def prepare() -> None:
            await self.get_topic_async(name)

        return prepare

    async def get_topic_async(self, name: str) -> Topic:
        """``get_topic`` that first asks lookupd for the topic's channels (see above)."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        lookup = self._lookup
        if lookup is None or not lookup.http_addresses():
            return self.get_topic(name)
        pending = self._preparing.get(name)
        if pending is None:
            pending = self._preparing[name] = self.loop.create_future()
            try:
                channels = await lookup.topic_channels(name)
                topic = self.get_topic(name)
                for channel in channels:
                    if not channel.endswith(EPHEMERAL_SUFFIX):
                        topic.get_channel(channel)
                if not pending.done():
                    pending.set_result(topic)
            finally:
                self._preparing.pop(name, None)
                if not pending.done():
                    pending.cancel()
            return topic
        return await asyncio.shield(pending)

    def delete_topic(self, name: str) -> bool:
        """Delete a topic with its channels (their clients are disconnected)."""
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        self.notify_unregister(name, None)
        topic.delete()
        return True

    def notify_register(self, topic: str, channel: str | None) -> None:
        self.notify_lookupd(b"REGISTER", topic, *((channel,) if channel else ()))

    def notify_unregister(self, topic: str, channel: str | None) -> None:
        self.notify_lookupd(b"UNREGISTER", topic, *((channel,) if channel else ()))

    def notify_lookupd(self, verb: bytes, *params: str) -> None:
        """Send ``REGISTER``/``UNREGISTER`` with ``params`` to every lookupd."""
        if self._lookup is not None:
            self._lookup.notify(verb, params)

    def registrations(self) -> list[tuple[str, ...]]:
        """What lookupd is told after connecting (the words after REGISTER).

        Upstream: every channel, or the bare topic. HA: every partition this node
        leads (``topic partition``), then its channels (``topic partition channel``).
        """
        out: list[tuple[str, ...]] = []
        if self.ha:
            for (name, partition), part in sorted(self.partitions.items()):
                if part.leader:
                    out.append((name, str(partition)))
                    out.extend((name, str(partition), channel) for channel in part.channels)
            return out
        for topic in self.topics.values():
            if topic.channels:
                out.extend((topic.name, channel) for channel in topic.channels)
            else:
                out.append((topic.name,))
        return out

    # -- HA topic partitions ------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        *,
        ext: bool = False,
        ordered: bool = False,
        disable_channel_auto_create: bool = False,
    ) -> None:
        """HA: create partitions ``0..partitions-1`` of ``topic`` here (this node leads them).

        What ``INTERNAL_CREATE_TOPIC`` does over TCP, plus what only a cluster can
        create (``ordered`` topics, and ``disable_channel_auto_create``: SUB then only
        reaches channels created beforehand). Existing partitions are left as they are.

        >>> nsqd = NSQD(ha=True)
        >>> nsqd.create_topic("events", 2, ext=True)
        >>> sorted(nsqd.partitions)
        [('events', 0), ('events', 1)]
        """
        if not self.ha:
            raise InvalidValueError(
                "create_topic is for the HA dialect: an upstream nsqd creates topics on use"
            )
        if not codec.valid_topic_name(topic):
            raise InvalidValueError(f"topic name {topic!r} is not valid")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 255:
            raise InvalidValueError(f"partitions must be an integer in 1..255, got {partitions!r}")
        for partition in range(partitions):
            part = self.create_partition(topic, partition, ext=ext, ordered=ordered)
            part.disable_channel_auto_create = disable_channel_auto_create

    def create_partition(
        self, topic: str, partition: int, *, ext: bool = False, ordered: bool = False, leader: bool = True
    ) -> HATopic:
        """HA: the partition, created when missing (registered with lookupd if it leads it)."""
        key = (topic, partition)
        existing = self.partitions.get(key)
        if existing is not None:
            return existing
        created = self.partitions[key] = HATopic(
            self, topic, partition, ext=ext, ordered=ordered, leader=leader
        )
        if leader:
            self.notify_lookupd(b"REGISTER", topic, str(partition))
        return created

    def set_leader(self, topic: str, partition: int, leader: bool) -> None:
        """HA cluster: this node gains or loses the leadership of a partition it has.

        Losing it closes the partition's consumers (youzan's DisableConsume) and
        unregisters it from lookupd; gaining it registers it and its channels.
        """
        part = self.partitions[(topic, partition)]
        if part.leader == leader:
            return
        part.leader = leader
        pid = str(partition)
        if leader:
            self.notify_lookupd(b"REGISTER", topic, pid)
            for name in part.channels:
                self.notify_lookupd(b"REGISTER", topic, pid, name)
        else:
            for channel in part.channels.values():
                channel.close_clients()
            self.notify_lookupd(b"UNREGISTER", topic, pid)

    def last_flush(self, partition: int) -> float:
        """HA: when (loop time) youzan's flush ticker last flushed ``partition``'s topics.

        The ticker fires every ``sync_timeout`` from start; its k-th tick flushes the
        partitions p with (p + 1) % 4 == k % 4, and every 100th tick all of them.
        """
        interval = self.options.sync_timeout
        tick = int((self.loop.time() - self._started_at) // interval) - 1  # the last tick that fired
        for k in range(tick, max(tick - 4, -1), -1):
            if k % 100 == 0 or k % 4 == (partition + 1) % 4:
                return self._started_at + (k + 1) * interval
        return self._started_at

    def default_partition(self, topic: str) -> int:
        """The partition a command without one uses: cluster: one this node leads; else any local one."""
        found = [
            p
            for (name, p), part in self.partitions.items()
            if name == topic and (part.leader or not self.ha_cluster)
        ]
        return min(found) if found else -1

    # -- in-flight and deferred timers ---------------------------------------------

    def watch(self, channel: Channel) -> None:
        """Scan ``channel`` every queue_scan_interval while it has timers running."""
        self._watched.add(channel)
        if self._scan_timer is None and self.running:
            self._scan_timer = self.loop.call_later(self.options.queue_scan_interval, self._scan)

    def unwatch(self, channel: Channel) -> None:
        self._watched.discard(channel)

    def _scan(self) -> None:
        self._scan_timer = None
        now = self.loop.time()
        for channel in list(self._watched):
            if channel.exiting or not channel.scan(now):
                self._watched.discard(channel)
        if self._watched and self.running:
            self._scan_timer = self.loop.call_later(self.options.queue_scan_interval, self._scan)

    # -- stats --------------------------------------------------------------------

    def stats(
        self, topic_name: str = "", channel_name: str = "", include_clients: bool = True
    ) -> dict[str, Any]:
        """``GET /stats?format=json`` without the memory section (nsqd 1.3 shape)."""
        topics: list[dict[str, Any]] | None
        selected: list[Any] | None
        if self.ha:
            parts = sorted(self.partitions.items())
            chosen = [t for (name, _), t in parts if not topic_name or name == topic_name]
            selected = chosen if chosen or not topic_name else None
        elif topic_name:
            topic = self.topics.get(topic_name)
            selected = [topic] if topic is not None else None
        else:
            selected = sorted(self.topics.values(), key=lambda t: t.name)
        if selected is None:
            topics = None
            producers = None
        else:
            topics = []
            for topic in selected:
                entry = topic.stats(channel_name, include_clients)
                if entry is not None:
                    topics.append(entry)
            producers = None
            if include_clients:
                found = [c.stats(topic_name) for c in self.clients.values() if c.pub_counts]
                producers = found or None
        return {"topics": topics, "producers": producers}


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port), reusable at once after close."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


class _PendingServer:
    """An asyncio server being created; quacks like one for ``close``/``wait_closed``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, creating: Awaitable[asyncio.Server]) -> None:
        self._task: asyncio.Task[asyncio.Server] = loop.create_task(creating)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._task.done() and not self._task.cancelled() and self._task.exception() is None:
            self._task.result().close()
        else:
            self._task.add_done_callback(
                lambda task: None if task.cancelled() or task.exception() else task.result().close()
            )

    async def wait_closed(self) -> None:
        with contextlib.suppress(Exception):
            server = await self._task
            await server.wait_closed()
