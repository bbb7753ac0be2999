"""Counting what clients do while nsqd is down: connection attempts, and lookupd queries.

* :class:`AttemptCounter` holds nsqd's TCP port while nsqd is down: it accepts each connection,
  reads its IDENTIFY for the client's ``client_id``, notes (client, time) and closes it. To the
  client that is one failed attempt, as a refused connect is.
* :class:`QueryCounter` is an HTTP proxy in front of an nsqlookupd: a client asks it instead,
  and the time of every request is noted.

:func:`most_in_a_second` turns the times into the figure the recovery rule caps (at most 5
attempts a second per nsqd, 2 lookupd queries a second). ``tests/test_recovery.py`` and
``bench/recovery.py`` use them.

>>> most_in_a_second([0.0, 0.3, 0.6, 0.9, 1.2])
4
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["AttemptCounter", "QueryCounter", "most_in_a_second"]


def most_in_a_second(times: list[float], start: float = float("-inf"), end: float = float("inf")) -> int:
    """The most of ``times`` (within [start, end)) that fall within any one second."""
    inside = sorted(t for t in times if start <= t < end)
    most, first = 0, 0
    for last, at in enumerate(inside):
        while at - inside[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


class AttemptCounter:
    """On ``host:port`` while no nsqd is there: each connection's ``client_id`` and time, then closed.

    ``async with AttemptCounter(address) as counter: ...``; ``counter.attempts`` lists
    ``(client_id, time.monotonic())`` ("?" when no IDENTIFY came within a second).
    """

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.attempts: list[tuple[str, float]] = []
        self._server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accepted, self.host, self.port, reuse_address=True)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def times(self, client: str) -> list[float]:
        """When ``client`` tried to connect."""
        return [at for who, at in self.attempts if who == client]

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        at, client = time.monotonic(), "?"
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.readexactly(4 + len(b"IDENTIFY\n")), 1.0)  # the magic, the command
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 1.0), "big")
            client = str(json.loads(await asyncio.wait_for(reader.readexactly(size), 1.0)).get("client_id", "?"))
        self.attempts.append((client, at))
        writer.close()


class QueryCounter:
    """An HTTP proxy in front of the nsqlookupd at ``target`` (``host:port``): ``address`` to give
    a client instead, ``requests`` the time of each request it made, ``paths`` each one's path
    (``/lookup``, ``/listlookup``, ...) in the same order."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.requests: list[float] = []
        self.paths: list[str] = []
        self.address = ""
        self._runner: Any = None
        self._session: Any = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        import aiohttp
        from aiohttp import web

        from .process import free_port

        self._session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            self.requests.append(time.monotonic())
            self.paths.append(request.path)
            async with self._session.get(f"http://{self.target}{request.path_qs}") as resp:
                return web.Response(body=await resp.read(), status=resp.status, content_type=resp.content_type)

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.address = f"127.0.0.1:{port}"

    def times(self, path: str) -> list[float]:
        """When the requests for ``path`` were made."""
        return [at for at, asked in zip(self.requests, self.paths) if asked == path]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
