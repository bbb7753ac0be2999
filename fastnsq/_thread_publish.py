"""The blocking producer's publishes written by the calling thread itself: no hop to the loop.

Handing a call to the loop thread and waiting for it costs two thread switches and a GIL
hand-over each way, more than the publish (bench/sync_publish.py: ~27-37 us of CPU a call).
Here a plain ``publish()`` takes an idle connection of its own (a blocking socket, one thread
at a time) to the next nsqd of the rotation (round robin, as the loop's pool), writes PUB and
reads nsqd's answer in the caller's thread, as go-nsq's goroutines do on their producer's
connection. Threads publishing at once use as many connections, up to
``thread_connections``; beyond it, or whenever this path cannot serve a call as the loop would,
the call goes through the loop (the answer :data:`NOT_TAKEN`), which has every feature:

- TLS, compression, AUTH, youzan's HA nsqd, lookupd routing, tracing: never taken here;
- a topic the loop has not validated yet, a body this path's checks refuse: the loop raises
  the error a user gets from any publish;
- no connection of the loop's open (nsqd down at start, a producer still connecting): the
  loop's fail-fast and wait-for-first-connect rules hold;
- a connection lost under a publish: the loop retries it (``max_retries``), as it would its own;
- an nsqd that does not answer within ``suspect_after`` while the producer has another (a hung
  nsqd, a black hole): the line is dropped, that nsqd is left alone here for ``QUARANTINE``
  seconds (and while the loop's pool holds it suspect), and the loop sends the call elsewhere
  (``rerouted``: the first nsqd may still take it, so it may arrive twice).

The connections identify with heartbeats off, so an idle one stays open (nsqd would drop it
after two missed heartbeats otherwise); a dead one is found at its next use. After a burst,
those unused for ``IDLE_CLOSE`` seconds close as the calls go on (the last one stays). A fork's child
never uses its parent's (the facade builds a new publisher there).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import select
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from . import codec, tracing
from .codec import round_trip
from .config import parse_address
from .errors import PublishTimeoutError, is_fatal, server_error, split_error
from .liveness import tune_socket
from .producer.load import NodeStats
from .producer.producer import _retryable

if TYPE_CHECKING:
    from .producer import Producer
    from .stats import ProducerStats

__all__ = ["NOT_TAKEN", "ThreadPublisher"]

#: The answer of :meth:`ThreadPublisher.publish` when the loop must take the call.
NOT_TAKEN: Any = object()

_SIZE = struct.Struct(">i")
_HEARTBEAT = b"_heartbeat_"
_RESPONSE = codec.FRAME_RESPONSE
_OK_FRAME = _SIZE.pack(6) + _SIZE.pack(_RESPONSE) + b"OK"
_OK_SIZE = len(_OK_FRAME)
#: Seconds a connection of this path stays open unused once others are in use (nsqd keeps a
#: producer's connection for ever with heartbeats off: a burst of 64 threads would leave 64).
IDLE_CLOSE = 60.0
#: Seconds an nsqd that left a call unanswered for suspect_after gets no new line here.
QUARANTINE = 1.0
#: The share of a wait left to the kernel's receive deadline (SO_RCVTIMEO). Its timer wheel
#: rounds a timeout up by up to an eighth (a 10 s wait ended up to 0.5 s late, all the calls
#: waiting on a hung nsqd at once); the rest is waited for with select(), whose timer is precise.
KERNEL_SHARE = 0.85


class _Lost(Exception):
    """The connection broke under a command: nothing is known of its answer."""


class _Line:
    """One blocking connection to an nsqd, used by one thread at a time."""

    __slots__ = ("_answer", "_view", "address", "idle", "idle_since", "published", "sock", "timeout")

    def __init__(self, address: str, sock: socket.socket) -> None:
        self.address = address
        self.sock = sock
        self.idle: list[_Line] = []  # the idle lines to its nsqd, where it goes back after a call
        self.published = 0
        self.timeout = -1.0  # the deadline set in the kernel
        self.idle_since = 0.0  # time.monotonic() when its last call returned
        self._answer = bytearray(256)  # an answer: OK, an error, a heartbeat
        self._view = memoryview(self._answer)

    def set_timeout(self, seconds: float) -> None:
        """Receive and send deadlines in the kernel (SO_RCVTIMEO / SO_SNDTIMEO) for
        :meth:`round_trip`: unlike ``settimeout``, no poll() before each call (KERNEL_SHARE
        of ``seconds``: round_trip waits for the rest itself)."""
        kernel = seconds * KERNEL_SHARE
        whole = int(kernel)
        micros = max(int((kernel - whole) * 1e6), 0 if whole else 1)  # 0 s 0 us would mean no deadline
        timeval = struct.pack("ll", whole, micros)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        self.timeout = seconds

    def round_trip(self, command: bytes, answer_by: float) -> tuple[int, bytes]:
        """Write ``command``, read the answer frame by ``answer_by`` (time.monotonic(); the
        socket's timeout set for it): (frame type, data). Heartbeats are answered. Raises
        BlockingIOError when no answer came by then.

        Two syscalls as a rule, run with the GIL given up once (codec.round_trip: taking it back
        is what threads publishing at once wait for), and nsqd's usual answer is checked in one
        comparison."""
        try:
            got = round_trip(self.sock, command, self._answer)
        except BlockingIOError:  # the kernel's share of the wait is over: the rest, precisely
            got = self._receive_by(answer_by)
        if got == _OK_SIZE and self._answer.startswith(_OK_FRAME):
            return _RESPONSE, b"OK"
        if got == 0:
            raise _Lost("nsqd closed the connection")
        while True:
            kind, data = self._read_frame(got)
            if kind == _RESPONSE and data == _HEARTBEAT:
                self.sock.sendall(b"NOP\n")
                got = 0
                continue
            return kind, data

    def _read_frame(self, got: int) -> tuple[int, bytes]:
        """The frame of which ``got`` bytes are read."""
        view = self._view
        while got < 8:
            got = self._receive(view, got)
        size = _SIZE.unpack_from(view)[0]
        if size < 4 or got > 4 + size:
            raise _Lost(f"an unexpected frame of {size} bytes ({got} read)")
        if 4 + size > len(view):
            frame = bytearray(4 + size)
            frame[:got] = view[:got]
            view = memoryview(frame)
        while got < 4 + size:
            got = self._receive(view, got)
        return _SIZE.unpack_from(view, 4)[0], bytes(view[8:4 + size])

    def _receive_by(self, answer_by: float) -> int:
        left = answer_by - time.monotonic()
        if left <= 0 or not select.select([self.sock], [], [], left)[0]:
            raise BlockingIOError(errno.EAGAIN, "no answer within the deadline")
        return self._receive(self._view, 0)

    def _receive(self, view: memoryview, got: int) -> int:
        count = self.sock.recv_into(view[got:])
        if count == 0:
            raise _Lost("nsqd closed the connection")
        return got + count

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class ThreadPublisher:
    """Plain publishes written and answered in the calling thread, on ``limit`` connections at most."""

    def __init__(self, producer: Producer, limit: int) -> None:
        self._producer = producer
        self._pool = producer._pool
        self._limit = limit
        self._usable = limit > 0 and _plain_connections(producer)
        #: Each nsqd's idle lines, a stack (list.pop/append are atomic: no lock on the common path).
        self._idle: dict[str, list[_Line]] = {}
        self._lock = threading.Lock()  # opening and closing lines, the counters of failures
        self._lines: set[_Line] = set()
        self._heads: dict[str, bytes] = {}  # "PUB topic\n" of each topic taken here
        self._max_msg_size = producer.options.max_msg_size
        self._opening = 0
        self._next = 0  # the rotation's last nsqd (an index of the producer's addresses)
        self._closed = False
        self.published_on_closed: dict[str, int] = {}  # per nsqd, messages of lines closed since
        self.failed = 0
        self.rerouted = 0  # calls left unanswered by a suspect nsqd and handed to the loop
        self._quarantined: dict[str, float] = {}  # address -> time.monotonic() it may be used again
        self.errors: dict[str, int] = {}

    # ---- the caller's thread ---------------------------------------------------------------

    def publish(self, topic: str, body: Any, timeout: float) -> Any:
        """nsqd's answer to PUB, or :data:`NOT_TAKEN` (the loop must take the call); raises
        nsqd's refusal, and PublishTimeoutError when no answer came within ``timeout``, as the
        loop's publish would (which never retries a timeout: the message may still arrive)."""
        command = self._command(topic, body)
        if command is None or tracing.ENABLED:
            return NOT_TAKEN
        deadline = time.monotonic() + timeout  # connecting a line counts too (issue 57)
        line = self._take(deadline)
        if line is None:
            return NOT_TAKEN
        observer = self._pool._round_trip_observer  # NSQMetrics' histogram, when one is attached
        started = time.perf_counter() if observer is not None else 0.0
        now = time.monotonic()
        left = max(deadline - now, 0.001)
        # Another nsqd to turn to: wait suspect_after for this one, not the whole timeout.
        bound = min(left, self._pool.suspect_after) if len(self._producer._nsqd_addresses) > 1 else left
        try:
            if abs(bound - line.timeout) > 0.001:  # a syscall pair only when it changed
                line.set_timeout(bound)
            kind, data = line.round_trip(command, now + bound)
        except BlockingIOError:  # the kernel's deadline: nothing came within the timeout
            self._drop(line)
            if bound < left:
                self._quarantine(line.address)
                return NOT_TAKEN  # the loop sends it elsewhere (it may still arrive here: twice)
            with self._lock:
                self.failed += 1
            raise PublishTimeoutError(f"no answer from nsqd {line.address} within {timeout:.3f} s "
                                      "(it may still arrive)") from None
        except (OSError, _Lost):
            self._drop(line)
            return NOT_TAKEN  # the loop's publish retries a lost connection's message
        except BaseException:  # Ctrl-C in the middle: the answer is unread, the line cannot be reused
            self._drop(line)
            raise
        if kind != _RESPONSE:
            return self._refused(line, kind, data)
        if observer is not None:
            observer(time.perf_counter() - started)
        line.published += 1
        self._give_back(line)
        return data

    def _command(self, topic: str, body: Any) -> bytes | None:
        """PUB of ``body`` when this path takes it: a topic the loop has validated, a body of
        bytes or text within max_msg_size (the loop raises its own errors for the others)."""
        head = self._heads.get(topic)
        if head is None:
            if not self._usable or topic not in self._producer._ready_topics:
                return None
            head = self._heads[topic] = b"PUB " + topic.encode() + b"\n"
        if type(body) is str:
            body = body.encode()
        elif type(body) is not bytes:
            return None
        if not 0 < len(body) <= self._max_msg_size:
            return None
        return head + _SIZE.pack(len(body)) + body

    def _refused(self, line: _Line, kind: int, data: bytes) -> Any:
        if kind != codec.FRAME_ERROR:  # a frame nsqd never sends a producer: the line is not to be trusted
            self._drop(line)
            return NOT_TAKEN
        code, description = split_error(data.decode("utf-8", "replace"))
        error = server_error(code, description, is_fatal(code, answers_publish=True))
        if error.fatal:
            self._drop(line)
        else:
            self._give_back(line)
        retry = _retryable(error)  # a failure on nsqd's side, not the message's: the loop retries it
        with self._lock:  # counted by code as the loop counts every refusal, retried or not
            self.errors[code] = self.errors.get(code, 0) + 1
            self.failed += 0 if retry else 1
        if retry:
            return NOT_TAKEN
        raise error

    # ---- the connections -------------------------------------------------------------------

    def _take(self, deadline: float) -> _Line | None:
        """An idle line to the next nsqd of the rotation: round robin over the nsqd, as the
        loop's pool does (a thread that took back the line it had just used sent every publish
        to one nsqd, and to the other nsqd never again once its lines were dropped in a fault)."""
        addresses = self._producer._nsqd_addresses
        count = len(addresses)
        start = 0
        if count > 1:
            start = self._next = (self._next + 1) % count
        elif not count:
            return None
        address = addresses[start]
        idle = self._idle.get(address)
        if idle and not (self._quarantined or self._pool.suspects.out and self._avoided(address)):
            try:
                return idle.pop()  # atomic; another thread may have taken the last one
            except IndexError:
                pass
        return self._take_slowly(addresses, start, deadline)

    def _take_slowly(self, addresses: list[str], start: int, deadline: float) -> _Line | None:
        """From ``start`` round the nsqd not avoided: an idle line, else a new one, else (at
        the limit) the next nsqd's."""
        count = len(addresses)
        for step in range(count):
            address = addresses[(start + step) % count]
            if self._avoided(address):
                continue
            idle = self._idle.get(address)
            if idle:
                try:
                    return idle.pop()
                except IndexError:
                    pass
            line = self._open(address, deadline)
            if line is not None:
                return line
        return None

    def _avoided(self, address: str) -> bool:
        """Whether ``address`` is left alone: quarantined here, or out of the loop pool's rotation."""
        if self._quarantined:
            until = self._quarantined.get(address)
            if until is not None:
                if time.monotonic() < until:
                    return True
                self._quarantined.pop(address, None)
        out = self._pool.suspects.out  # replaced, never changed in place: safe to read from here
        return bool(out) and any(conn.address == address for conn in out)

    def _quarantine(self, address: str) -> None:
        with self._lock:
            self.rerouted += 1
            self._quarantined[address] = time.monotonic() + QUARANTINE

    def _give_back(self, line: _Line) -> None:
        if self._closed:
            self._drop(line)
            return
        now = time.monotonic()
        line.idle_since = now
        idle = line.idle
        idle.append(line)
        # Each stack's bottom is its line unused the longest. After a burst of threads, the
        # lines no call needs any more close one per call, IDLE_CLOSE after last use.
        oldest = idle[0]
        if now - oldest.idle_since > IDLE_CLOSE:
            try:
                idle.remove(oldest)  # atomic; another thread may have taken it meanwhile
            except ValueError:
                return
            self._drop(oldest)

    def _open(self, address: str, deadline: float) -> _Line | None:
        """A new line to ``address``: None at the limit, or when the loop has no connection
        open to it (down, or not yet connected: the loop's rules answer those calls)."""
        if not self._usable or len(self._lines) + self._opening >= self._limit:
            return None
        if not any(conn.address == address for conn in self._producer.connections):
            return None
        with self._lock:
            if self._closed or len(self._lines) + self._opening >= self._limit:
                return None
            self._opening += 1  # counts toward the limit while it connects
        self._close_forgotten()
        line = None
        # With another nsqd to turn to, one that does not answer IDENTIFY within suspect_after is left alone.
        multi = len(self._producer._nsqd_addresses) > 1
        answer_by = min(deadline, time.monotonic() + self._pool.suspect_after) if multi else deadline
        try:
            line = self._connect(address, answer_by)
        except (OSError, _Lost, ValueError):
            if multi:
                self._quarantined[address] = time.monotonic() + QUARANTINE
        with self._lock:
            self._opening -= 1
            if line is not None and not self._closed:
                line.idle = self._idle.setdefault(address, [])
                self._lines.add(line)
                return line
        if line is not None:
            line.close()
        return None

    def _close_forgotten(self) -> None:
        """Close the idle lines to nsqd taken out of the producer (never taken again)."""
        current = self._producer._nsqd_addresses
        for address, lines in list(self._idle.items()):
            while address not in current and lines:
                try:
                    line = lines.pop()
                except IndexError:
                    break
                self._drop(line)

    def _connect(self, address: str, answer_by: float) -> _Line | None:
        """A connection identified with heartbeats off, by ``answer_by`` (time.monotonic(): the
        connect and IDENTIFY's answer both); None (and this path off for good) when nsqd wants
        what only the loop's connections do (AUTH, or it is youzan's HA nsqd)."""
        options = self._producer.options
        host, port = parse_address(address)
        left = max(answer_by - time.monotonic(), 0.001)
        sock = socket.create_connection((host, port), timeout=min(options.dial_timeout, left))
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tune_socket(sock, options.dead_after)  # heartbeats off here: keepalive still probes it
        line = _Line(address, sock)
        identify = {**options.identify_body(), "heartbeat_interval": -1}
        out = codec.WriteBuffer(max_body_size=options.max_body_size)
        out.identify(json.dumps(identify).encode())
        try:
            # IDENTIFY's answer, within what the connect left of the call's deadline (a hung
            # nsqd's kernel still completes the connect, not always at once)
            line.set_timeout(max(answer_by - time.monotonic(), 0.001))
            kind, data = line.round_trip(codec.MAGIC_V2 + out.take(), answer_by)
            info = json.loads(data) if kind == codec.FRAME_RESPONSE and data != b"OK" else {}
        except (OSError, _Lost, ValueError):
            line.close()
            raise
        if kind != codec.FRAME_RESPONSE or info.get("auth_required") or "HA" in str(info.get("version", "")):
            line.close()
            self._usable = False
            return None
        return line

    def _drop(self, line: _Line) -> None:
        line.close()
        with self._lock:
            if line in self._lines:
                self._lines.discard(line)
                closed = self.published_on_closed
                closed[line.address] = closed.get(line.address, 0) + line.published

    # ---- any thread ------------------------------------------------------------------------

    def added_to(self, stats: ProducerStats) -> ProducerStats:
        """The loop's figures with this path's: acknowledged, refused, its open connections."""
        with self._lock:
            published = sum(self.published_on_closed.values()) + sum(line.published for line in self._lines)
            errors = dict(stats.errors)
            for code, count in self.errors.items():
                errors[code] = errors.get(code, 0) + count
            idle = sum(len(lines) for lines in list(self._idle.values()))
            busy = max(0, len(self._lines) - idle)  # lines with a call on them now
            return dataclasses.replace(stats, published=stats.published + published, failed=stats.failed + self.failed,
                                       waiting=stats.waiting + busy, connections=stats.connections + len(self._lines),
                                       rerouted=stats.rerouted + self.rerouted, errors=errors)

    def added_to_nodes(self, nodes: dict[str, NodeStats]) -> dict[str, NodeStats]:
        """Each nsqd's figures with this path's: its answered publishes, its connections, the
        calls on them now (the average round trip stays the loop's: timing every call here
        would cost each call more than it tells)."""
        with self._lock:
            answered = dict(self.published_on_closed)
            connections: dict[str, int] = {}
            for line in self._lines:
                answered[line.address] = answered.get(line.address, 0) + line.published
                connections[line.address] = connections.get(line.address, 0) + 1
            idle = {address: len(lines) for address, lines in list(self._idle.items())}
        merged = dict(nodes)
        for address in answered.keys() | connections.keys():
            node = merged.get(address) or NodeStats(address, 0, 0.0, 0, 0)
            busy = max(0, connections.get(address, 0) - idle.get(address, 0))
            merged[address] = dataclasses.replace(node, pending=node.pending + busy,
                                                  answered=node.answered + answered.get(address, 0),
                                                  connections=node.connections + connections.get(address, 0))
        return merged

    def close(self) -> None:
        """No new calls here; idle connections close now, busy ones when their call returns."""
        self._closed = True
        for lines in list(self._idle.values()):
            while True:
                try:
                    line = lines.pop()
                except IndexError:
                    break
                self._drop(line)


def _plain_connections(producer: Producer) -> bool:
    """Whether the producer's connections are what this path writes: no TLS, compression or
    AUTH, nsqd addresses given (no lookupd routing), no youzan HA extras configured."""
    options = producer.options
    return not (options.tls_enabled or options.snappy or options.deflate or options.auth_secret
                or producer._router.topology is not None or producer._ha.compressing
                or any(conn.is_ha for conn in producer._pool.open))
