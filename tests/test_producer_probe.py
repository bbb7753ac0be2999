"""The probe of an nsqd on probation (fastnsq.producer.probe): a handshake of its own, timed by
the kernel, against an nsqd (the real one in a real-server run) and the faults it must tell."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import pytest

from fastnsq.producer.probe import handshake_answered_within
from fastnsq.testing.proxy import FaultProxy

BOUND, TIMEOUT = 0.125, 1.0


async def test_an_answering_nsqd_passes(nsqd):
    assert await handshake_answered_within(nsqd.tcp_address, BOUND, TIMEOUT)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's arrival stamps are Linux's")
async def test_a_busy_event_loop_does_not_fail_a_probe():
    """The answer arrives at once while the loop is blocked 1.5 s (three times the bound): the
    probe reads it late but takes its arrival from the kernel's stamp, so it passes. Timed by
    the loop it failed, and a busy application kept a healthy nsqd out of the rotation."""
    received, hogging = threading.Event(), threading.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer_once_the_loop_is_blocked() -> None:  # nsqd's part, in a thread of its own
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                received.set()
                hogging.wait(5)
                conn.sendall(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")  # a response frame: OK
                conn.recv(4096)  # until the probe closes

        server = threading.Thread(target=answer_once_the_loop_is_blocked, daemon=True)
        server.start()

        async def hog() -> None:
            while not received.is_set():
                await asyncio.sleep(0.001)
            hogging.set()
            time.sleep(3 * bound)  # noqa: ASYNC251 -- the point: the loop is blocked, as a busy application blocks it

        # A wider bound than the others': the answer's own way (two thread wake-ups, the hog's
        # poll) took longer than 0.125 s on a loaded machine (the real pass beside CI).
        bound = 0.5
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        passed, _ = await asyncio.gather(handshake_answered_within(address, bound, 10 * bound), hog())
        server.join(5)
    assert passed


async def test_an_answer_later_than_the_bound_fails(nsqd):
    """Answers held 0.3 s on their way back (a retransmission's worth): failed."""
    async with FaultProxy(nsqd.tcp_address) as proxy:
        proxy.delay = 0.3
        assert not await handshake_answered_within(proxy.address, BOUND, TIMEOUT)
        proxy.delay = 0.0
        assert await handshake_answered_within(proxy.address, BOUND, TIMEOUT)


async def test_an_nsqd_that_does_not_answer_fails_at_the_timeout(nsqd):
    """A hung nsqd's kernel still accepts the connect: the probe fails once its timeout is up."""
    async with FaultProxy(nsqd.tcp_address) as proxy:
        proxy.pause("down")
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert not await handshake_answered_within(proxy.address, BOUND, 0.5)
        assert loop.time() - began >= 0.5


async def test_a_refused_or_closed_port_fails():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        assert not await handshake_answered_within(address, BOUND, TIMEOUT)  # bound, not listening: refused
    with socket.socket() as silent:  # listening, closing what it accepts without a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        probing = asyncio.ensure_future(handshake_answered_within(address, BOUND, TIMEOUT))
        accepted, _ = await asyncio.get_running_loop().run_in_executor(None, silent.accept)
        accepted.close()
        assert not await probing
