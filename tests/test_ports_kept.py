"""A stopped server keeps its ports until it starts again (fastnsq.testing._ports).

The servers restart on their old ports so that clients reconnect where they left them.
While one is down, nothing else on the machine may take those ports (a parallel test's
``bind(0)`` did once, and the restart failed with EADDRINUSE), and connections are refused
as by a server that is down. Each check below binds the stopped server's port the way
another program would: before the ports were kept, that bind succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket

import pytest

from fastnsq.testing.lookupd import NSQLookupd
from fastnsq.testing.nsqd import NSQD
from fastnsq.testing.process import NSQDProcess


def assert_kept(port: int) -> None:
    """Another program can neither bind ``port`` nor connect to it."""
    with socket.socket() as other, pytest.raises(OSError) as bound:
        other.bind(("127.0.0.1", port))
    assert bound.value.errno == errno.EADDRINUSE
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def own_sockets_on(port: int) -> int:
    """How many of this process's sockets are bound to ``port``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=fd)
            try:
                address = sock.getsockname()
                count += isinstance(address, tuple) and address[1] == port
            finally:
                sock.detach()
    return count


async def http_ok(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ping HTTP/1.0\r\n\r\n")
    answer = await reader.read()
    writer.close()
    return answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n", 1)[0]


async def test_a_stopped_embedded_nsqd_keeps_both_ports() -> None:
    nsqd = NSQD()
    await nsqd.start()
    tcp, http = nsqd.tcp_port, nsqd.http_port
    await nsqd.stop()
    assert_kept(tcp)
    assert_kept(http)
    await nsqd.start()
    try:
        assert (nsqd.tcp_port, nsqd.http_port) == (tcp, http)
        assert await http_ok(http)
        _, writer = await asyncio.open_connection("127.0.0.1", tcp)
        writer.close()
    finally:
        await nsqd.stop()


async def test_a_refusing_embedded_nsqd_keeps_its_tcp_port() -> None:
    async with NSQD() as nsqd:
        nsqd.refuse_connections = True
        assert_kept(nsqd.tcp_port)
        nsqd.refuse_connections = False
        _, writer = await asyncio.open_connection("127.0.0.1", nsqd.tcp_port)
        writer.close()


async def test_a_stopped_embedded_lookupd_keeps_both_ports() -> None:
    lookupd = NSQLookupd()
    await lookupd.start()
    tcp, http = lookupd.tcp_port, lookupd.http_port
    await lookupd.stop()
    assert_kept(tcp)
    assert_kept(http)
    await lookupd.start()
    try:
        assert (lookupd.tcp_port, lookupd.http_port) == (tcp, http)
        assert await http_ok(http)
    finally:
        await lookupd.stop()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_stopped_nsqd_process_keeps_its_ports_until_closed(how: str) -> None:
    process = NSQDProcess()
    process.start()
    try:
        tcp, http = process.tcp_port, process.http_port
        getattr(process, how)()
        assert_kept(tcp)
        assert_kept(http)
        assert own_sockets_on(tcp) == own_sockets_on(http) == 1
        process.start()
        assert (process.tcp_port, process.http_port) == (tcp, http)
        assert own_sockets_on(tcp) == own_sockets_on(http) == 0  # the server has them now
        socket.create_connection(("127.0.0.1", tcp), timeout=5).close()
    finally:
        process.close()
    assert own_sockets_on(tcp) == own_sockets_on(http) == 0  # the holds are let go
