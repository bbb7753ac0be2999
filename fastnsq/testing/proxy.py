"""A TCP proxy that can cut, delay and stall connections: network faults for tests.

Put it between a client and nsqd (or anything else) and misbehave on demand::

    async with FaultProxy("127.0.0.1:4150") as proxy:
        consumer = Consumer("t", "c", nsqd_tcp_addresses=[proxy.address], ...)
        await proxy.stall(5.0)       # nothing moves in either direction for 5 s
        proxy.cut()                  # reset every connection now
        proxy.refuse = True          # new connections are closed at once
        proxy.delay = 0.05           # every chunk waits 50 ms each way

It copies bytes and never looks at them, so it works for TLS and compressed streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from ..config import parse_address

__all__ = ["FaultProxy"]

logger = logging.getLogger(__name__)

_CHUNK = 65536


class _Link:
    """One proxied connection: client side and upstream side, two pumps."""

    def __init__(self, proxy: FaultProxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

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
        await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
        self.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        proxy = self.proxy
        try:
            while True:
                await proxy._flowing(direction)
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if proxy.delay:
                    await asyncio.sleep(proxy.delay)
                await proxy._flowing(direction)
                proxy.bytes[direction] += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def close(self, reset: bool = False) -> None:
        for task in self.tasks:
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
    """Proxies ``listen_host:port`` (ephemeral by default) to ``upstream`` ("host:port")."""

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
        self.delay = 0.0
        self.refuse = False
        self.accepted = 0
        self.bytes = {"up": 0, "down": 0}

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

    async def __aenter__(self) -> FaultProxy:
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

    def cut(self) -> None:
        """Reset every proxied connection now (both sides see the link die)."""
        for link in list(self._links):
            link.close(reset=True)

    def pause(self, direction: str = "both") -> None:
        """Stop moving bytes ("up": client to server, "down": server to client, or both)."""
        for name in ("up", "down") if direction == "both" else (direction,):
            self._open[name].clear()

    def resume(self, direction: str = "both") -> None:
        for name in ("up", "down") if direction == "both" else (direction,):
            self._open[name].set()

    async def stall(self, seconds: float, direction: str = "both") -> None:
        """Hold every byte for ``seconds`` (the connections stay open), then let them flow."""
        self.pause(direction)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.resume(direction)
