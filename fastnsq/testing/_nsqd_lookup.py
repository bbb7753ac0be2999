"""The embedded nsqd's registration with nsqlookupd, over lookupd's TCP protocol.

What nsqd 1.3 does (``nsqd/lookup.go``, ``nsqd/lookup_peer.go``), per lookupd address:
connect, send the magic ``"  V1"``, ``IDENTIFY`` with a JSON body (broadcast address,
hostname, ports, version; nsq master adds the topology), then ``REGISTER <topic> <channel>`` for every
channel it has (``REGISTER <topic>`` for a topic without channels); afterwards one
``REGISTER``/``UNREGISTER`` per topic or channel created or deleted, and ``PING``
every 15 s. Every command is answered by lookupd with ``u32 size`` + data.

When lookupd goes away the peer reconnects, after 1 s and then backing off up to
15 s (nsqd reconnects on its next command, at the latest at the next ping), and
registers everything again. The HTTP address lookupd reports in its IDENTIFY answer
is what :meth:`LookupRegistrar.topic_channels` queries for a new topic's channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from typing import Any, Protocol

import aiohttp

from ._nsqd_base import NSQDIdentity

__all__ = ["LookupPeer", "LookupRegistrar", "RegisteringServer"]


class RegisteringServer(NSQDIdentity, Protocol):
    """What the registration uses of its nsqd."""

    @property
    def ha(self) -> bool: ...

    @property
    def distributed_id(self) -> str: ...

    @property
    def http_session(self) -> aiohttp.ClientSession | None: ...

    def registrations(self) -> list[tuple[str, ...]]: ...

log = logging.getLogger("fastnsq.testing.nsqd")

_MAGIC_V1 = b"  V1"
_RECONNECT_FIRST = 1.0
_RECONNECT_MAX = 15.0
_IO_TIMEOUT = 5.0


def _command(verb: bytes, params: tuple[str, ...]) -> bytes:
    """``REGISTER topic [channel]`` (upstream) or ``REGISTER topic partition [channel]`` (HA)."""
    return b" ".join((verb, *(p.encode() for p in params))) + b"\n"


class LookupPeer:
    """The connection to one nsqlookupd (``host:port`` of its TCP protocol)."""

    def __init__(self, registrar: LookupRegistrar, address: str) -> None:
        self.registrar = registrar
        self.server = registrar.server
        self.address = address
        host, _, port = address.rpartition(":")
        self._host = host.strip("[]") or "127.0.0.1"
        self._port = int(port)
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.info: dict[str, Any] | None = None  # lookupd's IDENTIFY answer
        self.connected = asyncio.Event()

    @property
    def http_address(self) -> str | None:
        info = self.info
        if not info or not info.get("broadcast_address") or not info.get("http_port"):
            return None
        return f"{info['broadcast_address']}:{info['http_port']}"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # Python 3.11's wait_for can swallow a cancellation that races with the
            # answer it waits for (gh-86296): cancel until the task is really done.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.05)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        self._close()

    def notify(self, command: bytes) -> None:
        if self.connected.is_set():
            self._queue.put_nowait(command)

    def _close(self) -> None:
        self.connected.clear()
        self.info = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _run(self) -> None:
        delay = _RECONNECT_FIRST
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self._host, self._port), _IO_TIMEOUT
                )
                self._writer = writer
                writer.write(_MAGIC_V1)
                if not await self._identify(reader, writer):
                    raise ConnectionError("lookupd refused IDENTIFY")
                # Anything queued before this point is covered by the full sync.
                while not self._queue.empty():
                    self._queue.get_nowait()
                self.connected.set()
                for params in self.server.registrations():
                    await self._send(reader, writer, _command(b"REGISTER", params))
                delay = _RECONNECT_FIRST
                await self._serve(reader, writer)
            except asyncio.CancelledError:
                raise
            except (
                OSError,
                ConnectionError,
                asyncio.IncompleteReadError,
                asyncio.TimeoutError,
                ValueError,
            ) as exc:
                log.debug("lookupd %s: %s; reconnecting in %.0f s", self.address, exc, delay)
            self._close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX)

    async def _identify(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        server = self.server
        options = server.options
        if server.ha:
            # youzan's connectCallback: a Go map (sorted keys), with the cluster node id.
            identity = {
                "broadcast_address": options.broadcast_address,
                "distributed_id": server.distributed_id,
                "hostname": server.hostname,
                "http_port": server.http_port,
                "tcp_port": server.tcp_port,
                "version": server.version,
            }
        else:
            # A Go map too; nsq master adds the topology, the released 1.3.0 has none.
            identity = {
                "broadcast_address": options.broadcast_address,
                "hostname": server.hostname,
                "http_port": server.http_port,
                "tcp_port": server.tcp_port,
                "version": server.version,
            }
            if options.topology:
                identity["topology_region"] = options.topology_region
                identity["topology_zone"] = options.topology_zone
                identity = dict(sorted(identity.items()))
        body = json.dumps(identity, separators=(",", ":")).encode()
        answer = await self._send(reader, writer, b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        if answer.startswith(b"E_"):
            log.warning("lookupd %s refused IDENTIFY: %r", self.address, answer)
            return False
        self.info = json.loads(answer)
        return True

    async def _send(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, command: bytes
    ) -> bytes:
        writer.write(command)
        await writer.drain()
        size = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), _IO_TIMEOUT))[0]
        answer = await asyncio.wait_for(reader.readexactly(size), _IO_TIMEOUT)
        if answer != b"OK" and not command.startswith(b"IDENTIFY"):
            log.warning("lookupd %s answered %r to %r", self.address, answer, command.strip())
        return answer

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send queued commands and the pings; notice at once when lookupd closes.

        lookupd never speaks unasked, so while idle a read returning anything (EOF
        included) means the connection is gone.
        """
        loop = asyncio.get_running_loop()
        interval = self.server.options.lookupd_ping_interval
        next_ping = loop.time() + interval
        while True:
            queued = asyncio.ensure_future(self._queue.get())
            closed = asyncio.ensure_future(reader.read(1))
            try:
                await asyncio.wait(
                    {queued, closed},
                    timeout=max(0.0, next_ping - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for future in (queued, closed):
                    if not future.done():
                        future.cancel()
                await asyncio.gather(queued, closed, return_exceptions=True)
            if closed.done() and not closed.cancelled():
                raise ConnectionError("lookupd closed the connection")
            if queued.done() and not queued.cancelled():
                command = queued.result()
            else:
                command = b"PING\n"
                next_ping = loop.time() + interval
            await self._send(reader, writer, command)


class LookupRegistrar:
    """All of an nsqd's lookupd peers (``lookupd_tcp_addresses``)."""

    def __init__(self, server: RegisteringServer) -> None:
        self.server = server
        self.peers = [LookupPeer(self, address) for address in server.options.lookupd_tcp_addresses]

    def start(self) -> None:
        for peer in self.peers:
            peer.start()

    async def stop(self) -> None:
        for peer in self.peers:
            await peer.stop()

    def notify(self, verb: bytes, params: tuple[str, ...]) -> None:
        command = _command(verb, params)
        for peer in self.peers:
            peer.notify(command)

    def http_addresses(self) -> list[str]:
        return [address for peer in self.peers if (address := peer.http_address)]

    async def topic_channels(self, topic: str) -> list[str]:
        """The channels lookupd knows for ``topic`` (``GET /channels``), union of all."""
        session = self.server.http_session
        names: list[str] = []
        if session is None:
            return names
        for address in self.http_addresses():
            try:
                async with session.get(
                    f"http://{address}/channels",
                    params={"topic": topic},
                    headers={"Accept": "application/vnd.nsq; version=1.0"},
                ) as response:
                    if response.status != 200:
                        continue
                    data = json.loads(await response.read())
            except (aiohttp.ClientError, OSError, ValueError, asyncio.TimeoutError) as exc:
                log.warning("failed to query nsqlookupd %s for channels of %s: %s", address, topic, exc)
                continue
            if isinstance(data, dict) and "data" in data and "channels" not in data:
                data = data["data"]
            for name in (data or {}).get("channels") or []:
                if isinstance(name, str) and name not in names:
                    names.append(name)
        return names
