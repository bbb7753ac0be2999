"""fastnsq.dial: a connect to an IP address needs no thread (issue 63: on a loaded machine the
event loop's getaddrinfo, a thread-pool hop even for "127.0.0.1", outlasted a 1 s dial_timeout)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading

import pytest

from fastnsq.dial import dial, resolve


@pytest.fixture
def busy_executor():
    """The loop's default thread pool: one thread, held until the test ends."""
    release = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    yield pool, release
    release.set()
    pool.shutdown(wait=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_an_ip_address_is_dialled_with_every_pool_thread_busy(host, busy_executor):
    """Every thread of the loop's pool busy: a dial to an IP address still connects within its
    timeout. Before, its getaddrinfo waited for a thread and the dial timed out."""
    pool, release = busy_executor
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.socket(family)
        listener.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} here")
    with listener:
        listener.listen()
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool)
        held = loop.run_in_executor(None, release.wait)
        try:
            sock = await dial(host, listener.getsockname()[1], 0.5)
            sock.close()
        finally:  # before the loop closes: its close waits for the pool's thread
            release.set()
            await held


async def test_a_name_is_still_looked_up():
    infos = await resolve("localhost", 4150, 5.0)
    assert infos and all(info[4][1] == 4150 for info in infos)


async def test_an_ip_address_resolves_to_itself():
    (family, kind, _proto, _name, address), *_ = await resolve("127.0.0.1", 4150, 5.0)
    assert (family, kind, address) == (socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 4150))
