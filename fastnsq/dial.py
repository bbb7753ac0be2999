"""A TCP connect to nsqd that does not sit out SYN retransmission (issue 57).

The kernel sends a lost SYN again only after 1 s, then 3 s, 7 s... A connect in flight when a
black hole heals (or whose SYN a lossy link dropped) stays unanswered until that
retransmission, which a 1 s ``dial_timeout`` cuts off, and the next attempt then waits for the
recovery rule's pause: the client came back 1-1.5 s after the network did. Here a connect
still unanswered after :data:`STAGGER` seconds is joined by another (a new socket, a new SYN),
until the dial timeout; the first to connect wins and the others are closed. An attempt that
fails (refused, unreachable) ends the dial with its error unless another is still in flight:
a refused port is still one SYN per dial.

An IP address is parsed here, not looked up: the event loop's ``getaddrinfo`` runs in a
thread pool even for "127.0.0.1", and on a loaded machine that hop alone outlasted a 1 s
``dial_timeout`` (a busy CI run, issue 63).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
from typing import Any

__all__ = ["STAGGER", "dial", "resolve"]

#: Seconds a connect may stay unanswered before another joins it.
STAGGER = 0.25


async def dial(host: str, port: int, timeout: float, local_addr: tuple[str, int] | None = None) -> socket.socket:
    """A connected non-blocking socket to ``host:port`` within ``timeout`` seconds (``TimeoutError``
    after it; the error of the last attempt when every attempt failed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    infos = await resolve(host, port, timeout)
    if not infos:
        raise OSError(f"no address found for {host!r}")
    tasks: list[asyncio.Task[socket.socket]] = []
    pending: set[asyncio.Task[socket.socket]] = set()
    winner: socket.socket | None = None
    try:
        next_start = loop.time()
        while True:
            now = loop.time()
            if now >= deadline:
                raise asyncio.TimeoutError(f"connect to {host}:{port} timed out after {timeout} s")
            if now >= next_start:
                task = loop.create_task(_connect_one(infos[len(tasks) % len(infos)], local_addr))
                tasks.append(task)
                pending.add(task)
                next_start = now + STAGGER
            done, pending = await asyncio.wait(pending, timeout=max(0.0, min(next_start, deadline) - loop.time()),
                                               return_when=asyncio.FIRST_COMPLETED)
            failure: BaseException | None = None
            for task in done:
                failure = task.exception()
                if failure is None:
                    winner = task.result()
                    return winner
            if failure is not None and not pending:
                raise failure
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in tasks:  # connected too, but later than the winner (or after a failure)
            if task.done() and not task.cancelled() and task.exception() is None and task.result() is not winner:
                task.result().close()


async def resolve(host: str, port: int, timeout: float) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` for a TCP connect to ``host:port``: an IP address at once, without a
    thread or DNS; a name by the event loop's resolver, within ``timeout`` seconds."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
                                      timeout)
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)


async def _connect_one(info: tuple[Any, ...], local_addr: tuple[str, int] | None) -> socket.socket:
    family, kind, proto, _, address = info
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if local_addr is not None:
            sock.bind(local_addr)
        await asyncio.get_running_loop().sock_connect(sock, address)
    except OSError as exc:
        sock.close()
        if exc.errno:  # "Connect call failed (host, port)" says less than the errno's own text
            raise OSError(exc.errno, os.strerror(exc.errno)) from None
        raise
    except BaseException:
        sock.close()
        raise
    return sock
