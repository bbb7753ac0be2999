"""Fault injection for the embedded nsqd: misbehave on purpose, on the server side of the wire.

One job: make an :class:`~fastnsq.testing.NSQD` (either dialect) fail the way a real
nsqd or the network between can fail, on demand, so that client tests can prove
they survive it. Every fault acts on the server's own connections: no proxy in
between, so it works with TLS, snappy and deflate too (faults that count frames
count the plain NSQ frames, before compression).

``nsqd.faults`` is a :class:`Faults`::

    nsqd.faults.cut()                              # drop every client connection now
    nsqd.faults.cut(after_frames=3)                # ... each after 3 more frames to it
    nsqd.faults.cut(after_frames=5, new_connections=1)   # the next connection, after 5 frames
    nsqd.faults.stall(2.0)                         # nothing leaves the server for 2 s
    nsqd.faults.stall(2.0, direction="read")       # nothing is read for 2 s
    nsqd.faults.send_malformed()                   # a frame of an unknown type to every client
    nsqd.faults.fail_next("PUB", "E_PUB_FAILED", "boom")   # the next PUB gets that error
    nsqd.refuse_connections = True                 # connect() fails: nothing listens any more

``await nsqd.stop(keep_messages=...)`` / ``await nsqd.start()`` restart the server on
the same ports (clean or unclean shutdown). :meth:`Faults.clear` undoes every pending
fault.

Each fault takes an optional ``where`` predicate to pick connections, e.g.
``where=lambda c: c.channel is not None`` (consumers) or ``where=lambda c: bool(c.pub_counts)``
(connections that published); see ``ClientConnection`` for what a connection exposes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fastnsq.errors import InvalidValueError

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

__all__ = ["MALFORMED_FRAMES", "FailRule", "Faults", "FaultyClient", "FaultyServer", "default_fatality"]


class FaultyClient(Protocol):
    """What faults use of a client connection (``ClientConnection`` has it all)."""

    alive: bool
    channel: Any
    pub_counts: dict[str, int]
    frames_left: int | None
    stalled_output: list[bytes] | None
    read_stalled: bool
    _last_read: float

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def cut(self) -> None: ...

    def flush_messages(self) -> None: ...

    def _write_now(self, data: bytes) -> None: ...


class FaultyServer(Protocol):
    """What faults use of the nsqd they act on."""

    @property
    def ha(self) -> bool: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def clients(self) -> Mapping[int, FaultyClient]: ...


Where = Callable[[FaultyClient], bool]
Direction = Literal["read", "write", "both"]

#: What :meth:`Faults.send_malformed` can send, by name.
MALFORMED_FRAMES: dict[str, bytes] = {
    # A well-sized frame of a type NSQ does not have (0, 1, 2 are).
    "frame_type": struct.pack(">ii", 4 + 4, 7) + b"boom",
    # A frame size below zero (go-nsq rejects it).
    "negative_size": struct.pack(">ii", -5, 0),
    # A message frame too short for the 26-byte message header.
    "short_message": struct.pack(">ii", 4 + 10, 2) + b"\x00" * 10,
    # What the HTTP port would answer: the size reads as 1213486160 ("HTTP").
    "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
    # A frame larger than any client accepts (2 GiB - 1).
    "huge": struct.pack(">ii", 0x7FFFFFFF, 0),
}

_PUBLISH_COMMANDS = frozenset(
    {b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE", b"MPUB_TRACE", b"PUB_EXT", b"MPUB_EXT"}
)
# The server's own rules (nsq's TCP protocol spec, youzan/nsq's ``nsqd/protocol_v2.go``), kept apart from the client's copy so
# that a test of the client is not checked against the client's own belief.
_NON_FATAL_UPSTREAM = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})
_NON_FATAL_HA = _NON_FATAL_UPSTREAM | {
    "E_CREATE_TOPIC_FAILED",
    "E_INVALID_JSON_HEADER",
    "INVALID_TRACE_ID",
    "E_EXT_NOT_SUPPORT",
    "E_PUB_FAILED",
    "E_MPUB_FAILED",
}
_NON_FATAL_HA_PUBLISH = frozenset({"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE"})


def default_fatality(code: str, command: bytes, ha: bool) -> bool:
    """Whether nsqd closes the connection after ``code`` answering ``command``.

    >>> default_fatality("E_PUB_FAILED", b"PUB", ha=False), default_fatality("E_PUB_FAILED", b"PUB", ha=True)
    (True, False)
    """
    if not ha:
        return code not in _NON_FATAL_UPSTREAM
    if code in _NON_FATAL_HA:
        return False
    return not (command in _PUBLISH_COMMANDS and code in _NON_FATAL_HA_PUBLISH)


@dataclass
class FailRule:
    """Answer the next ``remaining`` commands named ``command`` with an error frame."""

    command: bytes
    code: str
    description: str
    fatal: bool | None
    remaining: int


class Faults:
    """The faults armed on one nsqd (``nsqd.faults``); see the module docstring."""

    def __init__(self, server: FaultyServer) -> None:
        self._server = server
        #: Pending :meth:`fail_next` rules, oldest first (read on every command: keep it a list).
        self.rules: list[FailRule] = []
        self._new_cuts: list[int] = []  # after_frames for the next new connections
        self._stall: tuple[Direction, float] | None = None  # server-wide stall window
        self._stall_timer: object = None

    # -- what tests call ------------------------------------------------------------

    def cut(self, after_frames: int = 0, *, where: Where | None = None, new_connections: int = 0) -> int:
        """Drop client connections, without any error frame (a reset, a crash, a cable pulled).

        Every open connection (that ``where`` accepts) is cut after the server has
        written ``after_frames`` more frames to it (0: now). ``new_connections``
        more connections, the next ones to be opened, are cut after their first
        ``after_frames`` frames. Returns how many open connections were armed.
        """
        _check_count("after_frames", after_frames)
        _check_count("new_connections", new_connections)
        armed = 0
        for client in self._clients(where):
            armed += 1
            if after_frames == 0:
                client.cut()
            else:
                client.frames_left = after_frames
        self._new_cuts.extend([after_frames] * new_connections)
        return armed

    def stall(
        self, seconds: float | None, direction: Direction = "write", *, where: Where | None = None
    ) -> None:
        """Hang: stop writing (``"write"``), reading (``"read"``) or both, for ``seconds``.

        A write stall holds every byte the server would send (heartbeats included)
        and releases them in order afterwards; a read stall leaves the client's
        commands unread in the socket. Connections opened during a server-wide stall
        (no ``where``) stall too. The server times no client out while stalled, like
        a hung process. ``seconds=None`` stalls until :meth:`resume`.
        """
        if direction not in ("read", "write", "both"):
            raise InvalidValueError(f"direction must be 'read', 'write' or 'both', got {direction!r}")
        if seconds is not None and (isinstance(seconds, bool) or not seconds > 0):
            raise InvalidValueError(f"seconds must be a positive number or None, got {seconds!r}")
        for client in self._clients(where):
            _stall_client(client, direction)
        if where is None:
            self._stall = (direction, 0.0)
        self._cancel_stall_timer()
        if seconds is not None:
            self._stall_timer = self._server.loop.call_later(seconds, self.resume)

    def resume(self) -> None:
        """End every stall now: held output goes out, reading goes on."""
        self._cancel_stall_timer()
        self._stall = None
        for client in list(self._server.clients.values()):
            _unstall_client(client)

    def send_malformed(self, kind: str = "frame_type", *, where: Where | None = None) -> int:
        """Write a frame that breaks the protocol to open connections (see MALFORMED_FRAMES).

        The server keeps the connection open afterwards: closing it is the client's
        job. Returns how many connections got it.
        """
        frame = MALFORMED_FRAMES.get(kind)
        if frame is None:
            raise InvalidValueError(f"kind must be one of {sorted(MALFORMED_FRAMES)}, got {kind!r}")
        sent = 0
        for client in self._clients(where):
            client.flush_messages()
            client._write_now(frame)  # the connection's own write path
            sent += 1
        return sent

    def fail_next(
        self,
        command: str,
        code: str,
        description: str = "",
        *,
        fatal: bool | None = None,
        count: int = 1,
    ) -> None:
        """Answer the next ``count`` ``command`` commands (any connection) with ``code description``.

        The command is not executed (a failed PUB publishes nothing, a failed FIN
        leaves the message in flight). ``fatal`` says whether the server closes the
        connection after the error frame; by default it follows the dialect's rule for
        that code (nsqd's ``protocol_v2.go``; on HA a NOT_LEADER answering a publish is not
        fatal).
        """
        if not command or not isinstance(command, str):
            raise InvalidValueError(f"command must be a command name like 'PUB', got {command!r}")
        if not code or " " in code:
            raise InvalidValueError(f"code must be one token like 'E_PUB_FAILED', got {code!r}")
        _check_count("count", count)
        if count:
            self.rules.append(FailRule(command.encode("ascii"), code, description, fatal, count))

    def clear(self) -> None:
        """Disarm every pending fault: rules, cuts to come, stalls."""
        self.rules.clear()
        self._new_cuts.clear()
        for client in list(self._server.clients.values()):
            client.frames_left = None
        self.resume()

    # -- what the connections call ---------------------------------------------------

    def connection_made(self, client: FaultyClient) -> None:
        """Arm what waits for new connections."""
        if self._new_cuts:
            after = self._new_cuts.pop(0)
            if after == 0:
                client.loop.call_soon(client.cut)
            else:
                client.frames_left = after
        if self._stall is not None:
            _stall_client(client, self._stall[0])

    def injected_error(self, client: FaultyClient, name: bytes) -> tuple[str, str, bool] | None:
        """The (code, description, fatal) to answer ``name`` with, if a rule says so."""
        for index, rule in enumerate(self.rules):
            if rule.command == name:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    del self.rules[index]
                fatal = rule.fatal
                if fatal is None:
                    fatal = default_fatality(rule.code, name, self._server.ha)
                return rule.code, rule.description, fatal
        return None

    @staticmethod
    def count_frames(client: FaultyClient, data: bytes) -> tuple[bytes, bool]:
        """Take what may still be written before a cut: (bytes to write, cut after them)."""
        left = client.frames_left or 0
        pos = 0
        end = len(data)
        while left and pos + 4 <= end:
            pos += 4 + int.from_bytes(data[pos : pos + 4], "big", signed=True)
            left -= 1
        if left:
            client.frames_left = left
            return data, False
        client.frames_left = None
        return data[:pos], True

    # -- helpers ------------------------------------------------------------------------

    def _clients(self, where: Where | None) -> list[FaultyClient]:
        return [c for c in list(self._server.clients.values()) if c.alive and (where is None or where(c))]

    def _cancel_stall_timer(self) -> None:
        timer, self._stall_timer = self._stall_timer, None
        if timer is not None:
            timer.cancel()  # type: ignore[attr-defined]


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValueError(f"{name} must be an integer >= 0, got {value!r}")


def _stall_client(client: FaultyClient, direction: Direction) -> None:
    if direction in ("write", "both") and client.stalled_output is None:
        client.stalled_output = []
    if direction in ("read", "both") and not client.read_stalled:
        client.read_stalled = True
        transport = client.transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()


def _unstall_client(client: FaultyClient) -> None:
    held, client.stalled_output = client.stalled_output, None
    transport = client.transport
    if held and transport is not None and not transport.is_closing():
        transport.write(b"".join(held))
    if client.read_stalled:
        client.read_stalled = False
        if transport is not None and not transport.is_closing():
            transport.resume_reading()
    client._last_read = client.loop.time()  # the stall was the server's, not the client's
