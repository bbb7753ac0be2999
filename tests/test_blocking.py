"""The blocking producer's round trip (fastnsq/_blocking.pyx and its twin) on real sockets."""

from __future__ import annotations

import signal
import socket
import struct
import threading
import time

import pytest

from fastnsq import _blocking_py

from .conftest import NO_EXTENSIONS
from .helpers import Slack

try:
    from fastnsq import _blocking as _blocking_c
except ImportError:  # pragma: no cover
    _blocking_c = None

IMPLS = [pytest.param(m, id=m.IMPLEMENTATION) for m in (_blocking_c, _blocking_py) if m is not None]


def test_default_round_trip_is_the_c_extension():
    from fastnsq import codec

    expected = "fastnsq._blocking_py" if NO_EXTENSIONS else "fastnsq._blocking"
    assert codec.round_trip.__module__ == expected


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


class _Peer(threading.Thread):
    """The other end: reads ``expect`` bytes, waits ``delay``, then writes ``answer``."""

    def __init__(self, sock: socket.socket, expect: int, answer: bytes, delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.sock, self.expect, self.answer, self.delay = sock, expect, answer, delay
        self.received = b""
        self.start()

    def run(self) -> None:
        while len(self.received) < self.expect:
            self.received += self.sock.recv(1 << 20)
        time.sleep(self.delay)
        self.sock.sendall(self.answer)


@pytest.mark.parametrize("impl", IMPLS)
def test_writes_the_command_and_reads_the_answer(impl, pair):
    ours, theirs = pair
    command = b"PUB t\n" + struct.pack(">i", 3) + b"abc"
    peer = _Peer(theirs, len(command), b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
    answer = bytearray(64)
    assert impl.round_trip(ours, command, answer) == 10
    assert answer[:10] == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    peer.join(5)
    assert peer.received == command


@pytest.mark.parametrize("impl", IMPLS)
def test_a_command_larger_than_the_socket_buffers_is_written_whole(impl, pair):
    ours, theirs = pair
    command = bytes(range(256)) * (16 << 10)  # 4 MiB: many partial writes
    peer = _Peer(theirs, len(command), b"done")
    answer = bytearray(16)
    assert impl.round_trip(ours, command, answer) == 4
    peer.join(10)
    assert peer.received == command


@pytest.mark.parametrize("impl", IMPLS)
def test_the_peer_closing_reads_zero(impl, pair):
    ours, theirs = pair
    theirs.close()
    try:
        got = impl.round_trip(ours, b"x", bytearray(8))
    except (BrokenPipeError, ConnectionResetError):
        return  # the write found the peer gone first: the caller's error either way
    assert got == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_the_kernel_deadline_raises_blocking_io_error(impl, pair):
    ours, _theirs = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 50_000))
    with Slack() as slack:
        began = time.monotonic()
        with pytest.raises(BlockingIOError):
            impl.round_trip(ours, b"no answer comes", bytearray(8))
        took = time.monotonic() - began
    # Not before the deadline; at the first one (not retried), plus the slack measured beside it.
    assert 0.04 <= took < 0.05 + slack.allowance(0.05), (took, slack)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_closed_socket_and_an_answer_without_room_are_refused(impl, pair):
    ours, _theirs = pair
    with pytest.raises(ValueError, match="answer has no room"):
        impl.round_trip(ours, b"x", bytearray())
    ours.close()
    with pytest.raises(OSError):
        impl.round_trip(ours, b"x", bytearray(8))


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("impl", IMPLS)
def test_a_signal_handler_that_raises_ends_the_wait(impl, pair):
    """Ctrl-C in a script blocked on nsqd's answer: KeyboardInterrupt, not a hang."""
    ours, _theirs = pair

    def handler(signum, frame):
        raise _Interrupted

    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 5, 0))  # no hang if it is missed
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        with Slack() as slack:
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            began = time.monotonic()
            with pytest.raises(_Interrupted):
                impl.round_trip(ours, b"x", bytearray(8))
            took = time.monotonic() - began
        # At the signal (0.1 s), not at the 5 s kernel deadline with the handler run afterwards.
        assert took < 0.1 + slack.allowance(0.1), (took, slack)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_signal_handler_that_returns_lets_the_wait_go_on(impl, pair):
    ours, theirs = pair
    handled = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: handled.append(signum))
    try:
        peer = _Peer(theirs, 1, b"late", delay=0.3)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        answer = bytearray(8)
        assert impl.round_trip(ours, b"x", answer) == 4
        assert answer[:4] == b"late" and handled == [signal.SIGALRM]
        peer.join(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
