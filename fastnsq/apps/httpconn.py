"""Keep-alive HTTP/1.1 requests for ``fastnsq to-http``: written as bytes, answers parsed by httptools.

to-http sends one small request per message, so what a request costs in the client is most of
what the app costs: aiohttp's client spent about 100 us of CPU on each (a request and a response
object, multidicts, cookie and redirect handling, a timer context), more than nsq_to_http's Go
client. A request here is its bytes (the head made once per address and body length by the
handler) written on an idle keep-alive connection, and an answer is what llhttp, through
httptools, says of it: its status and whether the connection may be kept. One request at a
time per connection, as Go's client does (no pipelining); the body of an answer is read and
dropped.

As Go's transport does, a request that fails on a reused connection before any byte of an
answer came (the server had closed it while it was idle) is sent once more on a new connection;
any other failure is the caller's (to-http requeues the messages). TLS is verified with the
system's trust store, and the server name is checked, as aiohttp and Go do.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["Endpoint", "HttpClient", "HttpError", "endpoint_of"]


class HttpError(Exception):
    """A request that got no answer: refused, reset, timed out, or an answer that is not HTTP."""


@dataclass(frozen=True)
class Endpoint:
    """Where a URL's requests go: one pool of connections each."""

    scheme: str
    host: str  # to connect to (IDNA form)
    port: int

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def endpoint_of(url: str) -> Endpoint:
    """The endpoint of an ``http://`` or ``https://`` URL (ValueError for anything else)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = parts.hostname.encode("idna").decode("ascii")
    return Endpoint(parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80))


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written, its answer parsed, then the next."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[int] | None = None
        self._answered_bytes = False  # some of the answer came (no silent retry then)
        self.keep = True
        self.requests = 0

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._answered_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - never asked for
            self._fail(HttpError("the server switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(HttpError(f"not an HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep = False
        self._fail(HttpError(f"connection lost: {exc}" if exc else "the server closed the connection"))

    # ---- httptools' callbacks ---------------------------------------------------------------

    def on_message_complete(self) -> None:
        self.keep = self.keep and self._parser.should_keep_alive()
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_result(self._parser.get_status_code())

    # ---- the client's side ------------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[int]:
        """Write ``request``; the future is its answer's status."""
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._answered_bytes = False
        self.requests += 1
        self.transport.write(request)
        return self._answer

    @property
    def stale(self) -> bool:
        """The last request failed before any byte of its answer, on a connection used before."""
        return self.requests > 1 and not self._answered_bytes

    def close(self) -> None:
        self.keep = False
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: Exception) -> None:
        answer, self._answer = self._answer, None
        if answer is not None and not answer.done():
            answer.set_exception(error)
        if self.transport is not None:
            self.transport.close()


@dataclass
class HttpClient:
    """Requests to any number of endpoints over keep-alive connections, opened as needed.

    The caller bounds how many requests run at once (to-http's ``--n`` senders); an idle
    connection is reused by the next request to its endpoint.
    """

    connect_timeout: float
    request_timeout: float
    _idle: dict[Endpoint, list[_Connection]] = field(default_factory=dict)
    _busy: set[_Connection] = field(default_factory=set)
    _tls: ssl.SSLContext | None = None

    async def request(self, endpoint: Endpoint, request: bytes) -> int:
        """Send ``request`` (a whole HTTP/1.1 request) to ``endpoint``; the answer's status.

        Raises HttpError (or OSError, asyncio.TimeoutError) when no answer came.
        """
        connection = await self._connection(endpoint)
        try:
            return await self._exchange(connection, request)
        except HttpError:
            if not connection.stale:
                raise
        # The server closed the idle connection as the request went out: once more, on a new one.
        return await self._exchange(await self._open(endpoint), request)

    async def _exchange(self, connection: _Connection, request: bytes) -> int:
        self._busy.add(connection)
        try:
            status = await asyncio.wait_for(connection.send(request), self.request_timeout)
        except BaseException:
            connection.close()
            raise
        finally:
            self._busy.discard(connection)
        if connection.keep:
            self._idle.setdefault(connection.endpoint, []).append(connection)
        else:
            connection.close()
        return status

    async def _connection(self, endpoint: Endpoint) -> _Connection:
        idle = self._idle.get(endpoint)
        while idle:
            connection = idle.pop()
            if connection.keep and connection.transport is not None and not connection.transport.is_closing():
                return connection
        return await self._open(endpoint)

    async def _open(self, endpoint: Endpoint) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if endpoint.tls else None
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(endpoint), endpoint.host, endpoint.port, ssl=tls,
                                       server_hostname=endpoint.host if tls else None),
                self.connect_timeout)
        except asyncio.TimeoutError:
            raise HttpError(f"connect to {endpoint.host}:{endpoint.port} timed out "
                            f"after {self.connect_timeout} s") from None
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def close(self) -> None:
        """Close every connection (a request still running fails)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        for connection in list(self._busy):
            connection.close()
