"""to-http's keep-alive HTTP/1.1 connections (fastnsq/apps/httpconn.py) against real sockets.

A small server on loopback answers each case as a server would: keep-alive, closing an idle
connection, ``Connection: close``, a chunked body, no answer, an answer that is not HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from fastnsq.apps.httpconn import HttpClient, HttpError, endpoint_of

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Server:
    """Answers every request on a connection with ``answer(n)`` (n: the connection's request
    number), then closes the connection when ``close_after(n)`` says so."""

    def __init__(self, answer: Callable[[int], bytes], close_after: Callable[[int], bool] = lambda n: False) -> None:
        self.answer, self.close_after = answer, close_after
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                served += 1
                writer.write(self.answer(served))
                await writer.drain()
                if self.close_after(served):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Server], asyncio.Future[str]]]:
    servers: list[asyncio.AbstractServer] = []

    async def start(server: Server) -> str:
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(listening)
        return f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/in"

    yield start  # type: ignore[misc]
    for listening in servers:
        listening.close()


def post(url: str, body: bytes = b"hello") -> bytes:
    host = url.split("/")[2]
    return f"POST /in HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def test_requests_share_one_keep_alive_connection(serve) -> None:
    server = Server(lambda n: OK)
    url = await serve(server)
    client = HttpClient(2.0, 5.0)
    assert [await client.request(endpoint_of(url), post(url, b"%d" % i)) for i in range(5)] == [200] * 5
    assert server.connections == 1 and server.requests[-1].endswith(b"\r\n\r\n4")
    client.close()


async def test_an_idle_connection_the_server_closed_is_replaced_without_failing_the_request(serve) -> None:
    """The server closes each connection after one answer (no Connection: close said): the next
    request, written on the closed connection, is sent again on a new one, as Go's client does."""
    server = Server(lambda n: OK, close_after=lambda n: True)
    url = await serve(server)
    client = HttpClient(2.0, 5.0)
    for pause in (0.05, 0.05, 0, 0, 0):
        assert await client.request(endpoint_of(url), post(url)) == 200
        # With a pause the close reaches the client while the connection is idle; without one
        # the next request may be written on it first, and fails there before any answer.
        await asyncio.sleep(pause)
    assert server.connections == 5 and len(server.requests) == 5
    client.close()


async def test_connection_close_and_a_chunked_answer(serve) -> None:
    chunked = b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n"
    closing = b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    server = Server(lambda n: chunked if n == 1 else closing, close_after=lambda n: n == 2)
    url = await serve(server)
    client = HttpClient(2.0, 5.0)
    assert await client.request(endpoint_of(url), post(url)) == 503  # the chunked body read and dropped
    assert await client.request(endpoint_of(url), post(url)) == 201  # on the same connection
    assert await client.request(endpoint_of(url), post(url)) == 503  # a new one: the last said close
    assert server.connections == 2
    client.close()


async def test_no_answer_times_out_and_garbage_is_an_error(serve) -> None:
    silent = Server(lambda n: b"")
    url = await serve(silent)
    client = HttpClient(2.0, 0.3)
    with pytest.raises(asyncio.TimeoutError):
        await client.request(endpoint_of(url), post(url))
    garbage = Server(lambda n: b"SMTP ready\r\n\r\n")
    url = await serve(garbage)
    with pytest.raises(HttpError, match="not an HTTP answer"):
        await client.request(endpoint_of(url), post(url))
    client.close()


async def test_a_refused_connection_is_an_oserror() -> None:
    from fastnsq.testing.process import free_port

    url = f"http://127.0.0.1:{free_port()}/in"
    with pytest.raises(OSError):
        await HttpClient(2.0, 5.0).request(endpoint_of(url), post(url))


def test_endpoints() -> None:
    assert endpoint_of("https://Bücher.example/x?y").host == "xn--bcher-kva.example"
    assert endpoint_of("https://h/x").port == 443 and endpoint_of("http://h:8080/").port == 8080
    with pytest.raises(ValueError, match="not an http"):
        endpoint_of("ftp://h/")
