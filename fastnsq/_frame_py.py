"""The NSQ wire codec in plain Python: the twin of the C extension ``_frame.pyx``.

Same API, same behaviour, same errors (``_frame.pyi`` documents it). It is used
when ``FASTNSQ_NO_EXTENSIONS=1`` or when the extension is missing, and as the
reference the C implementation is tested against.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

from .errors import InvalidValueError, ProtocolError, split_error

IMPLEMENTATION = "python"

__all__ = [
    "BODY_COMMANDS",
    "CLOSE_WAIT",
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MSG_SIZE",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_MAX_REQ_TIMEOUT",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "IMPLEMENTATION",
    "LAYOUT_EXT",
    "LAYOUT_HA_ID",
    "LAYOUT_OFFSET",
    "LAYOUT_UPSTREAM",
    "MAGIC_V2",
    "MESSAGE_HEADER_SIZE",
    "OK",
    "CommandReader",
    "FrameReader",
    "Message",
    "ProtocolError",
    "TracedResponse",
    "WriteBuffer",
    "decode_mpub",
    "decode_traced_response",
    "encode_error",
    "encode_message",
    "encode_response",
    "encode_traced_response",
    "fits_one_mpub",
    "message_columns",
    "valid_channel_name",
    "valid_topic_name",
]

from ._protocol import (
    BODY_COMMANDS,
    BODY_SIZE_COMMANDS,
    CLOSE_WAIT,
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MSG_SIZE,
    DEFAULT_MAX_RDY_COUNT,
    DEFAULT_MAX_REQ_TIMEOUT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    HTTP_AS_SIZE,
    LAYOUT_ALL,
    LAYOUT_EXT,
    LAYOUT_HA_ID,
    LAYOUT_OFFSET,
    LAYOUT_UPSTREAM,
    MAGIC_V2,
    MAX_EXT_SIZE,
    MAX_NAME_LENGTH,
    MESSAGE_HEADER_SIZE,
    OK,
    TRACED_RESPONSE_SIZE,
    UPSTREAM_MAX_LINE,
    TracedResponse,
)

_MIN_READ = 65536
_U64_MAX = 0xFFFFFFFFFFFFFFFF
_I32_MAX = 0x7FFFFFFF

_NAME_RE = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?\Z")
_POSITION_RE = re.compile(r"[a-z_]+:-?[0-9]+\Z")

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_SIZE_TYPE = struct.Struct(">ii")
_MSG_HEAD = struct.Struct(">qH")
_OFFSET_SIZE = struct.Struct(">QI")
_TRACED = struct.Struct(">QQQI")

BytesLike = bytes | bytearray | memoryview
Body = bytes | bytearray | memoryview | str


# ---- names -----------------------------------------------------------------------------


def _valid_name(name: object) -> bool:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH:
        return False
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        return False
    return _NAME_RE.match(raw) is not None


def valid_topic_name(name: str) -> bool:
    """Whether nsqd accepts ``name`` as a topic (1-64 of ``[.a-zA-Z0-9_-]``, optional ``#ephemeral``).

    >>> valid_topic_name("events#ephemeral"), valid_topic_name("a b")
    (True, False)
    """
    return _valid_name(name)


def valid_channel_name(name: str) -> bool:
    """Whether nsqd accepts ``name`` as a channel; the same rule as topics."""
    return _valid_name(name)


# ---- read side --------------------------------------------------------------------------


def decode_traced_response(data: BytesLike) -> TracedResponse:
    """Decode the HA traced reply: ``"OK"`` + u64 id + u64 trace id + u64 offset + u32 size."""
    if len(data) != TRACED_RESPONSE_SIZE or bytes(data[:2]) != OK:
        raise ProtocolError(
            f"a traced response is 30 bytes starting with OK, got {len(data)} bytes"
        )
    return TracedResponse(*_TRACED.unpack_from(data, 2))


class Message:
    """One message from nsqd, as a handler, ``async for`` or a batch gets it.

    Keep it as long as you need it: the body is a copy. Answer it once, with
    :meth:`finish` or :meth:`requeue` (:meth:`touch` any number of times before
    that); a second answer raises ``RuntimeError``. A handler's return finishes it
    and its exception requeues it, unless the handler called
    :meth:`disable_auto_response`. The declarations with their types are in
    ``fastnsq/_frame.pyi``.

    ``id``
        the 16 bytes nsqd sent (hex digits from upstream nsqd; the internal id and the
        trace id on HA), echoed verbatim in FIN/REQ/TOUCH. A redelivery keeps it: it is
        the key to deduplicate on.
    ``body``
        the payload (``bytes``).
    ``attempts``
        how many times nsqd delivered it, this time included.
    ``timestamp``
        when nsqd received it, in nanoseconds since the epoch.
    ``address``
        the nsqd (``host:port``) whose connection received it.
    ``partition``, ``internal_id``, ``trace_id``
        HA nsqd only (None upstream): the partition of the connection and the two
        halves of the binary id.
    ``offset``, ``raw_size``
        HA ordered subscriptions only: the message's place in the partition's queue.
    ``ext``, ``ext_bytes``, ``ext_version``
        HA ext topics: the JSON header parsed, as received, and its version (0: none).
    ``has_responded``, ``auto_response``
        whether it was answered; whether the consumer answers it when the handler returns.
    """

    __slots__ = (
        "_auto_response",
        "_ha",
        "_responded",
        "address",
        "attempts",
        "body",
        "delegate",
        "ext_bytes",
        "ext_version",
        "id",
        "offset",
        "partition",
        "raw_size",
        "timestamp",
    )

    def __init__(
        self,
        timestamp: int,
        attempts: int,
        id: bytes,
        body: bytes,
        *,
        ha: bool = False,
        ext_version: int = 0,
        ext_bytes: bytes | None = None,
        offset: int | None = None,
        raw_size: int | None = None,
        partition: int | None = None,
        address: str | None = None,
    ) -> None:
        if len(id) != 16:
            raise InvalidValueError(f"a message id is 16 bytes, got {len(id)}")
        self.timestamp = timestamp
        self.attempts = attempts
        self.id = bytes(id)
        self.body = body
        self._ha = ha
        self.ext_version = ext_version
        self.ext_bytes = ext_bytes
        self.offset = offset
        self.raw_size = raw_size
        self.delegate: Any = None
        self.partition = partition
        self.address = address
        self._responded = False
        self._auto_response = True

    @property
    def internal_id(self) -> int | None:
        return _U64.unpack_from(self.id, 0)[0] if self._ha else None

    @property
    def trace_id(self) -> int | None:
        return _U64.unpack_from(self.id, 8)[0] if self._ha else None

    @property
    def ext(self) -> Any:
        if self.ext_version != 4 or self.ext_bytes is None:
            return None
        return json.loads(self.ext_bytes)

    @property
    def has_responded(self) -> bool:
        return self._responded

    @property
    def auto_response(self) -> bool:
        return self._auto_response

    def disable_auto_response(self) -> None:
        """The handler will answer this message itself (finish/requeue), later."""
        self._auto_response = False

    def _replace_body(self, body: bytes, ext_bytes: bytes | None) -> None:
        """The body and ext header as the handler should see them (client-side decompression,
        ``fastnsq.bodies``): the wire's are compressed and marked."""
        self.body = body
        self.ext_bytes = ext_bytes

    def _check_open(self) -> Any:
        if self._responded:
            raise RuntimeError(f"message {self._id_text()} was already finished or requeued")
        if self.delegate is None:
            raise RuntimeError(f"message {self._id_text()} has no connection to answer on")
        return self.delegate

    def finish(self) -> None:
        """Send FIN: the message is done."""
        delegate = self._check_open()
        self._responded = True
        delegate.finish_message(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """Send REQ: deliver again after ``delay`` seconds (None: the consumer's default)."""
        delegate = self._check_open()
        self._responded = True
        delegate.requeue_message(self, delay, backoff)

    def touch(self) -> None:
        """Send TOUCH: reset this message's in-flight timeout on nsqd."""
        self._check_open().touch_message(self)

    def _id_text(self) -> str:
        return self.id.hex() if self._ha else self.id.decode("latin-1")

    def __repr__(self) -> str:
        # Never the body: it may hold anything, and reprs end up in logs.
        return (
            f"<Message id={self._id_text()} attempts={self.attempts} "
            f"timestamp={self.timestamp} size={len(self.body)}>"
        )


OnMessage = Callable[[Message], object]
OnResponse = Callable[[bytes | TracedResponse], object]
OnError = Callable[[str, str], object]
OnCommand = Callable[[bytes, list, bytes | int | None], object]


def _decode_error_frame(data: bytes) -> tuple[str, str]:
    return split_error(data.decode("utf-8", "replace"))


def _known_response(data: bytes) -> bytes:
    # Hand out the module's constants so callers may compare with ``is`` or ``==``.
    if data == OK:
        return OK
    if data == HEARTBEAT:
        return HEARTBEAT
    if data == CLOSE_WAIT:
        return CLOSE_WAIT
    return data


class _SplitBuffer:
    """A growable read buffer that ``asyncio.BufferedProtocol`` can read into.

    The bytearray is never resized while a view of it may be out: growing
    allocates a new one, compacting moves bytes within the same length.
    """

    __slots__ = ("_buf", "_end", "_initial", "_need", "_paused", "_start")

    def __init__(self, initial_size: int) -> None:
        if initial_size < 16:
            raise InvalidValueError(f"initial_size must be >= 16, got {initial_size}")
        self._buf = bytearray(initial_size)
        self._initial = initial_size
        self._start = 0
        self._end = 0
        self._need = 0
        self._paused = False

    def get_buffer(self, sizehint: int) -> memoryview:
        want = max(_MIN_READ // 4, self._need - (self._end - self._start))
        self._make_room(want)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if nbytes < 0 or self._end + nbytes > len(self._buf):
            raise ProtocolError(f"buffer_updated({nbytes}) beyond the buffer handed out")
        self._end += nbytes
        self._split()

    def feed(self, data: BytesLike) -> None:
        n = len(data)
        if n:
            self._make_room(n)
            self._buf[self._end : self._end + n] = data
            self._end += n
        self._split()

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._split()

    def take_unparsed(self) -> bytes:
        data = bytes(self._buf[self._start : self._end])
        self._start = self._end = 0
        self._need = 0
        return data

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def buffered(self) -> int:
        return self._end - self._start

    @property
    def capacity(self) -> int:
        return len(self._buf)

    def _make_room(self, want: int) -> None:
        if self._start == self._end:
            self._start = self._end = 0
            small = max(self._initial, want)
            if len(self._buf) > 4 * small:
                self._buf = bytearray(small)  # give back what a huge frame took
        if len(self._buf) - self._end >= want:
            return
        pending = self._end - self._start
        if self._start and pending + want <= len(self._buf):
            self._buf[:pending] = self._buf[self._start : self._end]
        else:
            grown = bytearray(max(2 * len(self._buf), pending + want))
            grown[:pending] = self._buf[self._start : self._end]
            self._buf = grown
        self._start, self._end = 0, pending

    def _split(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class FrameReader(_SplitBuffer):
    """Splits nsqd's frame stream (see ``_frame.pyi``)."""

    __slots__ = (
        "_on_error", "_on_message", "_on_response", "address", "delegate", "layout", "max_frame_size", "partition"
    )

    def __init__(
        self,
        on_message: OnMessage,
        on_response: OnResponse,
        on_error: OnError,
        *,
        layout: int = LAYOUT_UPSTREAM,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        initial_size: int = _MIN_READ,
    ) -> None:
        super().__init__(initial_size)
        if max_frame_size < 8 or max_frame_size > _I32_MAX:
            raise InvalidValueError(f"max_frame_size must be in 8..{_I32_MAX}, got {max_frame_size}")
        if layout & ~LAYOUT_ALL:
            raise InvalidValueError(f"unknown layout flags {layout:#x}")
        self._on_message = on_message
        self._on_response = on_response
        self._on_error = on_error
        self.layout = layout
        self.delegate: Any = None
        self.partition: int | None = None
        self.address: str | None = None
        self.max_frame_size = max_frame_size

    def _split(self) -> None:
        buf = self._buf
        while not self._paused:
            pos, end = self._start, self._end
            if end - pos < 8:
                self._need = 8
                break
            size, frame_type = _SIZE_TYPE.unpack_from(buf, pos)
            self._check_size(size)
            if end - pos - 4 < size:
                self._need = size + 4
                break
            data = bytes(buf[pos + 8 : pos + 4 + size])
            self._start = pos + 4 + size
            self._need = 0
            if frame_type == FRAME_MESSAGE:
                self._on_message(self._decode_message(data))
            elif frame_type == FRAME_RESPONSE:
                if len(data) == TRACED_RESPONSE_SIZE and data[:2] == OK:
                    self._on_response(TracedResponse(*_TRACED.unpack_from(data, 2)))
                else:
                    self._on_response(_known_response(data))
            elif frame_type == FRAME_ERROR:
                self._on_error(*_decode_error_frame(data))
            else:
                raise ProtocolError(f"unknown frame type {frame_type}")
            buf = self._buf  # a callback may have fed or taken bytes
        if self._start == self._end:
            self._start = self._end = 0

    def _check_size(self, size: int) -> None:
        if size == HTTP_AS_SIZE:
            raise ProtocolError("received 'HTTP' where a frame size was expected: is this nsqd's HTTP port?")
        if size < 4:
            raise ProtocolError(f"frame size {size} is below the minimum of 4")
        if size > self.max_frame_size:
            raise ProtocolError(f"frame size {size} is above the maximum of {self.max_frame_size}")

    def _decode_message(self, data: bytes) -> Message:
        n = len(data)
        if n < MESSAGE_HEADER_SIZE:
            raise ProtocolError(f"message frame of {n} bytes is shorter than the 26-byte header")
        timestamp, attempts = _MSG_HEAD.unpack_from(data, 0)
        pos = MESSAGE_HEADER_SIZE
        layout = self.layout
        ext_version = 0
        ext_bytes = None
        offset = raw_size = None
        if layout & LAYOUT_EXT:
            if pos + 1 > n:
                raise ProtocolError("message frame ends inside its ext header")
            ext_version = data[pos]
            pos += 1
            if ext_version:
                if pos + 2 > n:
                    raise ProtocolError("message frame ends inside its ext header length")
                (ext_len,) = _U16.unpack_from(data, pos)
                pos += 2
                if pos + ext_len > n:
                    raise ProtocolError(f"ext header of {ext_len} bytes runs past the message frame")
                ext_bytes = data[pos : pos + ext_len]
                pos += ext_len
        if layout & LAYOUT_OFFSET:
            if pos + 12 > n:
                raise ProtocolError("message frame ends inside its offset/size header")
            offset, raw_size = _OFFSET_SIZE.unpack_from(data, pos)
            pos += 12
        msg = Message(
            timestamp,
            attempts,
            data[10:26],
            data[pos:],
            ha=bool(layout & LAYOUT_HA_ID),
            ext_version=ext_version,
            ext_bytes=ext_bytes,
            offset=offset,
            raw_size=raw_size,
        )
        msg.delegate = self.delegate
        msg.partition = self.partition
        msg.address = self.address
        return msg


# ---- write side -------------------------------------------------------------------------


def _as_body(body: object, what: str = "message body") -> bytes | bytearray | memoryview:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise InvalidValueError(
        f"{what} must be bytes, bytearray, memoryview or str, not {type(body).__name__}"
    )


def _check_int(value: object, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValueError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidValueError(f"{what} {value} is outside {low}..{high}")
    return value


def _message_id(message_id: object) -> bytes:
    if isinstance(message_id, Message):
        return message_id.id
    if isinstance(message_id, (bytes, bytearray)) and len(message_id) == 16:
        return bytes(message_id)
    raise InvalidValueError(f"a message id is 16 bytes or a Message, got {message_id!r}")


def _name_bytes(name: object, what: str) -> bytes:
    if not _valid_name(name):
        raise InvalidValueError(
            f"invalid {what} name {name!r}: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    assert isinstance(name, str)  # _valid_name checked it
    return name.encode("ascii")


def _partition_suffix(partition: object) -> bytes:
    if partition is None:
        return b""
    return b" %d" % _check_int(partition, "partition", 0, _I32_MAX)


class WriteBuffer:
    """One connection's outgoing commands (see ``_frame.pyi``)."""

    __slots__ = ("_buf", "max_body_size", "max_msg_size", "max_rdy_count", "max_req_timeout")

    def __init__(
        self,
        *,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        max_rdy_count: int = DEFAULT_MAX_RDY_COUNT,
        max_req_timeout: int = DEFAULT_MAX_REQ_TIMEOUT,
        initial_size: int = 4096,
    ) -> None:
        self.max_msg_size = _check_int(max_msg_size, "max_msg_size", 1, _I32_MAX)
        self.max_body_size = _check_int(max_body_size, "max_body_size", 1, _I32_MAX)
        self.max_rdy_count = _check_int(max_rdy_count, "max_rdy_count", 0, _I32_MAX)
        self.max_req_timeout = _check_int(max_req_timeout, "max_req_timeout", 0, _I32_MAX)
        self._buf = bytearray()

    def __len__(self) -> int:
        return len(self._buf)

    def take(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def clear(self) -> None:
        self._buf.clear()

    # -- connection setup

    def magic(self) -> None:
        self._buf += MAGIC_V2

    def identify(self, body: BytesLike) -> None:
        data = _as_body(body, "IDENTIFY body")
        self._check_body_size(len(data), "IDENTIFY body")
        self._buf += b"IDENTIFY\n" + _U32.pack(len(data)) + data

    def auth(self, secret: Body) -> None:
        data = _as_body(secret, "AUTH secret")
        if not data:
            raise InvalidValueError("the AUTH secret is empty")
        if len(data) > self.max_body_size:
            raise InvalidValueError(f"the AUTH secret exceeds max_body_size {self.max_body_size}")
        self._buf += b"AUTH\n" + _U32.pack(len(data)) + data

    # -- consuming

    def sub(self, topic: str, channel: str, partition: int | None = None) -> None:
        self._sub(b"SUB ", topic, channel, _partition_suffix(partition))

    def sub_ordered(self, topic: str, channel: str, partition: int) -> None:
        if partition is None:
            raise InvalidValueError("SUB_ORDERED needs a partition")
        self._sub(b"SUB_ORDERED ", topic, channel, _partition_suffix(partition))

    def sub_advanced(
        self, topic: str, channel: str, partition: int | None = None, position: str | None = None
    ) -> None:
        suffix = _partition_suffix(partition)
        if position is not None:
            if partition is None:
                raise InvalidValueError("SUB_ADVANCED takes a start position only after a partition")
            if not isinstance(position, str) or not _POSITION_RE.match(position):
                raise InvalidValueError(
                    f"SUB_ADVANCED start position {position!r} is not '<type>:<int>'"
                )
            suffix += b" " + position.encode("ascii")
        self._sub(b"SUB_ADVANCED ", topic, channel, suffix)

    def _sub(self, command: bytes, topic: str, channel: str, suffix: bytes) -> None:
        line = command + _name_bytes(topic, "topic") + b" " + _name_bytes(channel, "channel")
        self._buf += line + suffix + b"\n"

    def rdy(self, count: int) -> None:
        _check_int(count, "RDY count", 0, self.max_rdy_count)
        self._buf += b"RDY %d\n" % count

    def fin(self, message_id: bytes | Message) -> None:
        self._buf += b"FIN " + _message_id(message_id) + b"\n"

    def req(self, message_id: bytes | Message, delay_ms: int) -> None:
        msg_id = _message_id(message_id)
        _check_int(delay_ms, "REQ delay (ms)", 0, self.max_req_timeout)
        self._buf += b"REQ " + msg_id + b" %d\n" % delay_ms

    def touch(self, message_id: bytes | Message) -> None:
        self._buf += b"TOUCH " + _message_id(message_id) + b"\n"

    def cls(self) -> None:
        self._buf += b"CLS\n"

    def nop(self) -> None:
        self._buf += b"NOP\n"

    # -- publishing

    def pub(self, topic: str, body: Body, partition: int | None = None) -> None:
        data = self._checked_message(body, 0)
        head = b"PUB " + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        self._buf += head + _U32.pack(len(data)) + data

    def dpub(self, topic: str, defer_ms: int, body: Body) -> None:
        _check_int(defer_ms, "DPUB defer (ms)", 0, self.max_req_timeout)
        data = self._checked_message(body, 0)
        head = b"DPUB " + _name_bytes(topic, "topic") + b" %d\n" % defer_ms
        self._buf += head + _U32.pack(len(data)) + data

    def pub_trace(self, topic: str, partition: int | None, trace_id: int, body: Body) -> None:
        _check_int(trace_id, "trace id", 0, _U64_MAX)
        data = self._checked_message(body, 8)
        head = b"PUB_TRACE " + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        self._buf += head + _U32.pack(8 + len(data)) + _U64.pack(trace_id) + data

    def pub_ext(self, topic: str, partition: int | None, ext: BytesLike, body: Body) -> None:
        ext_data = _checked_ext(ext)
        data = self._checked_message(body, 2 + len(ext_data))
        head = b"PUB_EXT " + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        size = 2 + len(ext_data) + len(data)
        self._buf += head + _U32.pack(size) + _U16.pack(len(ext_data)) + ext_data + data

    def mpub(self, topic: str, bodies: Sequence[Body], partition: int | None = None) -> None:
        parts = [self._checked_message(body, 0) for body in self._checked_batch(bodies)]
        self._mpub(b"MPUB ", topic, partition, [(b"", p) for p in parts])

    def mpub_trace(self, topic: str, partition: int | None, items: Sequence[tuple[int, Body]]) -> None:
        parts = []
        for item in self._checked_batch(items):
            trace_id, body = _pair(item, "(trace_id, body)")
            _check_int(trace_id, "trace id", 0, _U64_MAX)
            parts.append((_U64.pack(trace_id), self._checked_message(body, 8)))
        self._mpub(b"MPUB_TRACE ", topic, partition, parts)

    def mpub_ext(
        self, topic: str, partition: int | None, items: Sequence[tuple[BytesLike, Body]]
    ) -> None:
        parts = []
        for item in self._checked_batch(items):
            ext, body = _pair(item, "(ext, body)")
            ext_data = _checked_ext(ext)
            prefix = _U16.pack(len(ext_data)) + ext_data
            parts.append((prefix, self._checked_message(body, len(prefix))))
        self._mpub(b"MPUB_EXT ", topic, partition, parts)

    def _mpub(self, command: bytes, topic: str, partition: int | None, parts: list) -> None:
        head = command + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        total = 4 + sum(4 + len(prefix) + len(data) for prefix, data in parts)
        self._check_body_size(total, "MPUB body")
        out = bytearray(head)
        out += _U32.pack(total) + _U32.pack(len(parts))
        for prefix, data in parts:
            out += _U32.pack(len(prefix) + len(data))
            out += prefix
            out += data
        self._buf += out

    def internal_create_topic(self, topic: str, partition: int, ext: bool | None = None) -> None:
        if partition is None:
            raise InvalidValueError("INTERNAL_CREATE_TOPIC needs a partition")
        line = b"INTERNAL_CREATE_TOPIC " + _name_bytes(topic, "topic") + _partition_suffix(partition)
        if ext is not None:
            line += b" true" if ext else b" false"
        self._buf += line + b"\n"

    # -- checks

    def _checked_message(self, body: Body, header: int) -> bytes | bytearray | memoryview:
        data = _as_body(body)
        if not data:
            raise InvalidValueError("empty message body: nsqd rejects empty messages")
        if header + len(data) > self.max_msg_size:
            raise InvalidValueError(
                f"message of {header + len(data)} bytes exceeds max_msg_size {self.max_msg_size}"
            )
        return data

    def _checked_batch(self, items: Sequence[Any]) -> Sequence[Any]:
        if isinstance(items, (bytes, bytearray, memoryview, str)):
            raise InvalidValueError("a batch is a sequence of messages, not a single body")
        if not len(items):
            raise InvalidValueError("an MPUB batch needs at least one message")
        limit = (self.max_body_size - 4) // 5
        if len(items) > limit:
            raise InvalidValueError(f"an MPUB batch of {len(items)} messages exceeds {limit}")
        return items

    def _check_body_size(self, size: int, what: str) -> None:
        if size <= 0:
            raise InvalidValueError(f"{what} is empty")
        if size > self.max_body_size:
            raise InvalidValueError(f"{what} of {size} bytes exceeds max_body_size {self.max_body_size}")


def _pair(item: object, shape: str) -> tuple[Any, Any]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InvalidValueError(f"each batch item must be a {shape} pair, got {type(item).__name__}")
    return item[0], item[1]


def _checked_ext(ext: BytesLike) -> bytes | bytearray | memoryview:
    data = _as_body(ext, "ext header")
    if len(data) > MAX_EXT_SIZE:
        raise InvalidValueError(f"ext header of {len(data)} bytes exceeds 65535")
    return data


# ---- server side ------------------------------------------------------------------------

# HA ids are binary: FIN/REQ ids sit at [4:20], TOUCH ids at [6:22], whatever bytes they hold.
_BINARY_ID_PREFIX = {b"FIN ": 20, b"REQ ": 20, b"TOUCH ": 22}


class CommandReader(_SplitBuffer):
    """Splits a client's command stream (see ``_frame.pyi``)."""

    __slots__ = (
        "_on_command",
        "_on_magic",
        "_stopped",
        "binary_ids",
        "max_body_size",
        "max_line",
        "max_msg_size",
    )

    def __init__(
        self,
        on_command: OnCommand,
        *,
        on_magic: Callable[[bytes], object] | None = None,
        binary_ids: bool = False,
        max_line: int = UPSTREAM_MAX_LINE,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        initial_size: int = _MIN_READ,
    ) -> None:
        super().__init__(initial_size)
        self._on_command = on_command
        self._on_magic = on_magic
        self.binary_ids = binary_ids
        self.max_line = max_line
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._stopped = False

    def _split(self) -> None:
        while not self._paused and not self._stopped:
            pos, end = self._start, self._end
            if self._on_magic is not None:
                if end - pos < 4:
                    break
                on_magic, self._on_magic = self._on_magic, None
                self._start = pos + 4
                on_magic(bytes(self._buf[pos : pos + 4]))
                continue
            if not self._split_one(pos, end):
                break
        if self._start == self._end:
            self._start = self._end = 0

    def _split_one(self, pos: int, end: int) -> bool:
        buf = self._buf
        line_end = self._find_line_end(buf, pos, end)
        if line_end < 0:
            if end - pos > self.max_line:
                raise ProtocolError(f"command line longer than {self.max_line} bytes")
            return False
        line = bytes(buf[pos:line_end])
        name, params = self._parse_line(line)
        body_at = line_end + 1
        if name not in BODY_COMMANDS:
            self._start = body_at
            self._on_command(name, params, None)
            return True
        if end - body_at < 4:
            return False
        (size,) = _I32.unpack_from(buf, body_at)
        limit = self.max_body_size if name in BODY_SIZE_COMMANDS else self.max_msg_size
        if size <= 0 or size > limit:
            self._start = body_at + 4
            self._stopped = True  # nsqd answers a fatal error without reading the body
            self._on_command(name, params, size)
            return False
        if end - body_at - 4 < size:
            self._need = body_at + 4 + size - pos
            return False
        body = bytes(buf[body_at + 4 : body_at + 4 + size])
        self._start = body_at + 4 + size
        self._need = 0
        self._on_command(name, params, body)
        return True

    def _find_line_end(self, buf: bytearray, pos: int, end: int) -> int:
        if self.binary_ids:
            for prefix, id_end in _BINARY_ID_PREFIX.items():
                if buf[pos : pos + len(prefix)] == prefix:
                    if end - pos <= id_end:
                        return -1
                    return buf.find(b"\n", pos + id_end, end)
        return buf.find(b"\n", pos, min(end, pos + self.max_line + 1))

    def _parse_line(self, line: bytes) -> tuple[bytes, list[bytes]]:
        if self.binary_ids:
            for prefix, id_end in _BINARY_ID_PREFIX.items():
                if line.startswith(prefix):
                    id_start = id_end - 16
                    params = [line[id_start:id_end]]
                    if prefix == b"REQ ":
                        params.append(line[id_end + 1 :])
                    return prefix.rstrip(), params
        if line.endswith(b"\r"):
            line = line[:-1]
        parts = line.split(b" ")
        return parts[0], parts[1:]


def encode_response(data: BytesLike) -> bytes:
    """A response frame (type 0) holding ``data``."""
    return _SIZE_TYPE.pack(len(data) + 4, FRAME_RESPONSE) + bytes(data)


def encode_error(text: BytesLike) -> bytes:
    """An error frame (type 1) holding ``"<CODE> <description>"``."""
    return _SIZE_TYPE.pack(len(text) + 4, FRAME_ERROR) + bytes(text)


def encode_message(
    timestamp: int,
    attempts: int,
    message_id: bytes,
    body: BytesLike,
    *,
    ext_version: int | None = None,
    ext: BytesLike | None = None,
    offset: int | None = None,
    raw_size: int | None = None,
) -> bytes:
    """A message frame (type 2) in the layout the arguments describe.

    ``ext_version`` (with ``ext`` when not 0) writes the HA ext header; ``offset``
    with ``raw_size`` writes the HA SUB_ORDERED/SUB_ADVANCED header after it.
    """
    if len(message_id) != 16:
        raise InvalidValueError(f"a message id is 16 bytes, got {len(message_id)}")
    extra = b""
    if ext_version is not None:
        _check_int(ext_version, "ext version", 0, 255)
        extra += bytes((ext_version,))
        if ext_version:
            ext_data = bytes(ext or b"")
            if len(ext_data) > MAX_EXT_SIZE:
                raise InvalidValueError(f"ext header of {len(ext_data)} bytes exceeds 65535")
            extra += _U16.pack(len(ext_data)) + ext_data
    if (offset is None) != (raw_size is None):
        raise InvalidValueError("offset and raw_size go together")
    if offset is not None:
        extra += _OFFSET_SIZE.pack(offset, raw_size)
    size = 4 + MESSAGE_HEADER_SIZE + len(extra) + len(body)
    return b"".join(
        (
            _SIZE_TYPE.pack(size, FRAME_MESSAGE),
            _MSG_HEAD.pack(timestamp, attempts),
            bytes(message_id),
            extra,
            bytes(body),
        )
    )


def encode_traced_response(internal_id: int, trace_id: int, offset: int, size: int) -> bytes:
    """The HA traced reply frame: ``OK`` + id + trace id + offset + size (frame size 34)."""
    return encode_response(OK + _TRACED.pack(internal_id, trace_id, offset, size))


def fits_one_mpub(bodies: list[Any], limit: int, max_count: int, max_msg_size: int) -> bool:
    """Whether ``bodies`` is the common batch (see ``_frame.pyi``), in C-speed passes."""
    if not bodies or len(bodies) > max_count or set(map(type, bodies)) != _ONLY_BYTES:
        return False
    sizes = list(map(len, bodies))
    return min(sizes) > 0 and max(sizes) <= max_msg_size and sum(sizes) + 4 * len(sizes) <= limit


_ONLY_BYTES = {bytes}


def decode_mpub(body: BytesLike, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """Split an MPUB body into its messages as nsqd's readMPUB does (see ``_frame.pyi``)."""
    n = len(body)
    if n < 4:
        raise ValueError("E_BAD_BODY", "MPUB failed to read message count")
    (count,) = _I32.unpack_from(body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise ValueError("E_BAD_BODY", f"MPUB invalid message count {count}")
    messages = []
    pos = 4
    for i in range(count):
        if pos + 4 > n:
            raise ValueError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        (size,) = _I32.unpack_from(body, pos)
        pos += 4
        if size <= 0:
            raise ValueError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise ValueError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        if pos + size > n:
            raise ValueError("E_BAD_MESSAGE", "MPUB failed to read message body")
        messages.append(bytes(body[pos : pos + size]))
        pos += size
    return messages


# ---- messages as columns ------------------------------------------------------------------------

_I32_MAX = 0x7FFFFFFF


def _offsets(sizes: list[int]) -> bytes:
    return array("i", accumulate(sizes, initial=0)).tobytes()


def message_columns(messages: Sequence[Message], hex_ids: bool, max_bytes: int = _I32_MAX) -> tuple[Any, ...]:
    """The fields of ``messages`` as flat buffers, Arrow's layouts (see ``_frame.pyi``)."""
    items = list(messages)
    n = len(items)
    id_width = 32 if hex_ids else 16
    bodies = [m.body for m in items]
    body_sizes = [len(b) for b in bodies]
    addresses = [m.address for m in items]
    encoded: list[bytes] | None = [a.encode() for a in addresses if type(a) is str]
    if len(encoded or ()) != n:
        encoded = None  # a message without an address: no address column
    largest = max(sum(body_sizes), sum(map(len, encoded or ())), n * id_width)
    if largest > max_bytes:
        raise InvalidValueError(
            f"{n} messages take {largest} bytes in one column, "
            f"over the {max_bytes} an Arrow column with 32-bit offsets holds"
        )
    ids = b"".join(m.id.hex().encode() if hex_ids else m.id for m in items)
    columns: tuple[Any, ...] = (
        _offsets([id_width] * n),
        ids,
        array("q", (m.timestamp // 1000 for m in items)).tobytes(),  # nanoseconds -> Spark's microseconds
        array("i", (m.attempts for m in items)).tobytes(),
        _offsets(body_sizes),
        b"".join(bodies),
    )
    if encoded is None:
        return (*columns, None, None)
    return (*columns, _offsets([len(a) for a in encoded]), b"".join(encoded))
