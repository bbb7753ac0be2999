"""A TCP proxy that misbehaves on demand: network faults for tests.

Put it between a client and nsqd (or nsqlookupd, or anything else)::

    async with FaultProxy("127.0.0.1:4150") as proxy:
        consumer = Consumer("t", "c", nsqd_tcp_addresses=[proxy.address], ...)
        proxy.delay, proxy.jitter = 0.02, 0.03   # every chunk waits 20-50 ms each way
        proxy.bandwidth = 64_000                 # bytes per second each way (a throttled link)
        await proxy.stall(5.0)                   # nothing moves for 5 s, then all of it does
        await proxy.blackhole(5.0)               # 5 s of bytes silently dropped, links stay open
        await proxy.reset_mid_frame("down")      # RST both sides halfway through the next chunk
        proxy.half_open("server")                # the server's side closes, the client's stays open and dead
        proxy.cut()                              # reset every connection now
        proxy.refuse = True                      # new connections are closed at once
        proxy.heal()                             # back to a clean link

It copies bytes and never looks at them, so it works for TLS and compressed streams.
"up" is client to server, "down" server to client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from typing import TYPE_CHECKING, Literal

from ..config import parse_address
from ..errors import InvalidValueError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FaultProxy"]

logger = logging.getLogger(__name__)

_CHUNK = 65536
Direction = Literal["up", "down", "both"]
_DIRECTIONS = ("up", "down")


def _directions(direction: str) -> tuple[str, ...]:
    if direction == "both":
        return _DIRECTIONS
    if direction not in _DIRECTIONS:
        raise InvalidValueError(f"direction must be 'up', 'down' or 'both', got {direction!r}")
    return (direction,)


class _Link:
    """One proxied connection: client side and upstream side, two pumps."""

    def __init__(self, proxy: FaultProxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.dead: set[str] = set()  # half-open: the sides whose peer is gone; their bytes are dropped

    async def run(self) -> None:
        try:
            host, port = parse_address(self.proxy.upstream)
            upstream_reader, self.upstream_writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            logger.debug("proxy cannot reach %s: %s", self.proxy.upstream, exc)
            self.close()
            return
        self.tasks = [
            asyncio.create_task(self._pump(self.client_reader, self.upstream_writer, "up")),
            asyncio.create_task(self._pump(upstream_reader, self.client_writer, "down")),
        ]
        # A half-open link keeps its live side's pump running after the other side's ended.
        pending = set(self.tasks)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not self.dead:
                break
        self.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        proxy = self.proxy
        try:
            while True:
                await proxy._flowing(direction)
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if self.dead or proxy._dropping[direction]:
                    proxy.dropped[direction] += len(data)  # silently gone, as on a dead route
                    continue
                await proxy._slow_down(len(data))
                await proxy._flowing(direction)
                if proxy._reset_armed[direction] and len(data) >= 2:
                    proxy._reset_armed[direction] = False
                    writer.write(data[: len(data) // 2])  # the peer gets half a frame, then a reset
                    await writer.drain()
                    proxy.resets += 1
                    self.close(reset=True)
                    return
                proxy.bytes[direction] += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not self.dead:
                with contextlib.suppress(Exception):
                    writer.close()

    def half_open(self, side: str) -> None:
        """Reset ``side``'s connection ("server": upstream, "client") and keep the other open and silent."""
        gone, kept = (self.upstream_writer, "up") if side == "server" else (self.client_writer, "down")
        self.dead = {kept}
        if gone is not None:
            _reset(gone)

    def close(self, reset: bool = False) -> None:
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        for writer in (self.client_writer, self.upstream_writer):
            if writer is None:
                continue
            if reset:
                _reset(writer)
            with contextlib.suppress(Exception):
                writer.close()
        self.proxy._links.discard(self)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: what a crashed peer or a dead link looks like."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    transport = writer.transport
    transport.abort()


class FaultProxy:
    """Proxies ``listen_host:port`` (ephemeral by default) to ``upstream`` ("host:port").

    Knobs that apply to every chunk while set: ``delay`` and ``jitter`` (seconds: each
    chunk waits ``delay`` plus a random share of ``jitter``, in order), ``bandwidth``
    (bytes per second per direction, None for unlimited), ``refuse`` (new connections
    are reset). Counters: ``accepted``, ``bytes`` and ``dropped`` per direction, ``resets``.
    """

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        parse_address(upstream)
        self.upstream = upstream
        self._host = host
        self._port = port
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()
        self._open = {"up": asyncio.Event(), "down": asyncio.Event()}
        for event in self._open.values():
            event.set()
        self._dropping = {"up": False, "down": False}
        self._reset_armed = {"up": False, "down": False}
        self.delay = 0.0
        self.jitter = 0.0
        self.bandwidth: float | None = None
        self.refuse = False
        self.accepted = 0
        self.resets = 0
        self.bytes = {"up": 0, "down": 0}
        self.dropped = {"up": 0, "down": 0}

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    @property
    def port(self) -> int:
        assert self._server is not None, "the proxy is not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._links)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, self._port)
        self._port = self.port  # keep the port across stop/start

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.refuse:
            _reset(writer)
            return
        link = _Link(self, (reader, writer))
        self._links.add(link)
        await link.run()

    async def _flowing(self, direction: str) -> None:
        event = self._open[direction]
        if not event.is_set():
            await event.wait()

    async def _slow_down(self, size: int) -> None:
        wait = self.delay + (random.uniform(0.0, self.jitter) if self.jitter else 0.0)
        if self.bandwidth:
            wait += size / self.bandwidth
        if wait:
            await asyncio.sleep(wait)

    # -- faults -----------------------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every proxied connection now (both sides see the link die)."""
        for link in list(self._links):
            link.close(reset=True)

    def pause(self, direction: Direction = "both") -> None:
        """Stop moving bytes ("up": client to server, "down": server to client, or both).

        The proxy stops reading too, so the sender's socket buffers fill: what a peer that
        stops reading looks like.
        """
        for name in _directions(direction):
            self._open[name].clear()

    def resume(self, direction: Direction = "both") -> None:
        for name in _directions(direction):
            self._open[name].set()

    async def stall(self, seconds: float, direction: Direction = "both") -> None:
        """Hold every byte for ``seconds`` (the connections stay open), then let them flow."""
        self.pause(direction)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.resume(direction)

    def drop(self, direction: Direction = "both") -> None:
        """Blackhole: read and discard every byte (the connections stay open, nothing arrives)."""
        for name in _directions(direction):
            self._dropping[name] = True

    def undrop(self, direction: Direction = "both") -> None:
        for name in _directions(direction):
            self._dropping[name] = False

    async def blackhole(self, seconds: float, direction: Direction = "both") -> None:
        """Silently drop every byte for ``seconds``; the links that survive it carry on after."""
        self.drop(direction)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.undrop(direction)

    async def reset_mid_frame(self, direction: Direction, timeout: float = 10.0) -> None:
        """Forward half of the next chunk going ``direction`` (half a frame: NSQ's frames are
        at least 8 bytes), then reset that link on both sides; returns once it happened."""
        (name,) = _directions(direction)
        before = self.resets
        self._reset_armed[name] = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.resets == before:
            if loop.time() > deadline:
                self._reset_armed[name] = False
                raise TimeoutError(f"no chunk went {direction} within {timeout} s to reset in the middle of")
            await asyncio.sleep(0.005)

    def half_open(self, dead_side: Literal["server", "client"] = "server") -> int:
        """Half-open every link: reset ``dead_side``'s connection (it sees the link die), keep
        the other side's open and drop whatever it sends (it finds out only by its own
        deadlines). Returns how many links. New connections are normal."""
        if dead_side not in ("server", "client"):
            raise InvalidValueError(f"dead_side must be 'server' or 'client', got {dead_side!r}")
        links = list(self._links)
        for link in links:
            link.half_open(dead_side)
        return len(links)

    def heal(self) -> None:
        """Every knob and fault off: bytes flow, nothing is dropped, delayed, throttled or refused."""
        self.resume()
        self.undrop()
        self._reset_armed = {"up": False, "down": False}
        self.delay = self.jitter = 0.0
        self.bandwidth = None
        self.refuse = False
