# cython: language_level=3
"""The NSQ wire codec in C: the hot path of fastnsq.

``_frame.pyi`` documents the API; ``_frame_py.py`` is the pure-Python twin that
behaves the same. Why it is fast (docs/architecture.md):

* the read buffer is malloc'd memory that the event loop reads into directly
  (``get_buffer``/``buffer_updated`` of ``asyncio.BufferedProtocol``); frames are
  split in place with pointer arithmetic;
* a message costs one ``Message`` (from a freelist) and one ``bytes`` for its body;
  everything else lives in C fields, and FIN/REQ/TOUCH copy the id straight from
  the ``Message``;
* commands are appended to one growable write buffer, flushed once per loop pass.
"""

cimport cython
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memchr, memcmp, memcpy, memmove

import json

from . import _protocol
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
    LAYOUT_EXT,
    LAYOUT_HA_ID,
    LAYOUT_OFFSET,
    LAYOUT_UPSTREAM,
    MAGIC_V2,
    MESSAGE_HEADER_SIZE,
    OK,
    UPSTREAM_MAX_LINE,
    TracedResponse,
)
from .errors import InvalidValueError, ProtocolError, split_error

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char* mem, Py_ssize_t size, int flags)
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    int PyBUF_WRITE

cdef extern from *:
    """
    #ifndef FASTNSQ_DEBUG
    #define FASTNSQ_DEBUG 0
    #endif
    """
    const int FASTNSQ_DEBUG

IMPLEMENTATION = "c"

__all__ = [
    "IMPLEMENTATION",
    "FRAME_RESPONSE",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "LAYOUT_UPSTREAM",
    "LAYOUT_HA_ID",
    "LAYOUT_EXT",
    "LAYOUT_OFFSET",
    "MAGIC_V2",
    "OK",
    "HEARTBEAT",
    "CLOSE_WAIT",
    "DEFAULT_MAX_MSG_SIZE",
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_MAX_REQ_TIMEOUT",
    "DEFAULT_MAX_FRAME_SIZE",
    "MESSAGE_HEADER_SIZE",
    "BODY_COMMANDS",
    "TracedResponse",
    "Message",
    "FrameReader",
    "WriteBuffer",
    "CommandReader",
    "valid_topic_name",
    "valid_channel_name",
    "encode_response",
    "encode_error",
    "encode_message",
    "encode_traced_response",
    "decode_mpub",
    "fits_one_mpub",
    "message_columns",
    "decode_traced_response",
    "ProtocolError",
]

cdef enum:
    C_FRAME_RESPONSE = 0
    C_FRAME_ERROR = 1
    C_FRAME_MESSAGE = 2
    C_LAYOUT_HA_ID = 1
    C_LAYOUT_EXT = 2
    C_LAYOUT_OFFSET = 4
    C_LAYOUT_ALL = 7
    C_HEADER = 26
    C_HTTP_AS_SIZE = 0x48545450
    C_TRACED_SIZE = 30
    C_MAX_NAME = 64
    C_MAX_EXT = 0xFFFF
    C_MIN_FREE = 16384
    C_MIN_READ = 65536
    C_I32_MAX = 0x7FFFFFFF
    C_NAME_CACHE_MAX = 4096

# The C constants above restate _protocol; a mismatch is a build bug, caught at import.
assert (C_FRAME_RESPONSE, C_FRAME_ERROR, C_FRAME_MESSAGE) == (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE)
assert (C_LAYOUT_HA_ID, C_LAYOUT_EXT, C_LAYOUT_OFFSET) == (LAYOUT_HA_ID, LAYOUT_EXT, LAYOUT_OFFSET)
assert C_LAYOUT_ALL == _protocol.LAYOUT_ALL and C_HEADER == MESSAGE_HEADER_SIZE
assert C_HTTP_AS_SIZE == _protocol.HTTP_AS_SIZE and C_TRACED_SIZE == _protocol.TRACED_RESPONSE_SIZE
assert C_MAX_NAME == _protocol.MAX_NAME_LENGTH and C_MAX_EXT == _protocol.MAX_EXT_SIZE

cdef uint64_t U64_MAX = 0xFFFFFFFFFFFFFFFF


# ---- big-endian helpers ------------------------------------------------------------------

cdef inline uint16_t _load_u16(const char* p) noexcept nogil:
    cdef const uint8_t* b = <const uint8_t*>p
    return <uint16_t>((<uint16_t>b[0] << 8) | b[1])


cdef inline uint32_t _load_u32(const char* p) noexcept nogil:
    cdef const uint8_t* b = <const uint8_t*>p
    return (<uint32_t>b[0] << 24) | (<uint32_t>b[1] << 16) | (<uint32_t>b[2] << 8) | b[3]


cdef inline uint64_t _load_u64(const char* p) noexcept nogil:
    return (<uint64_t>_load_u32(p) << 32) | _load_u32(p + 4)


cdef inline void _store_u16(char* p, uint16_t v) noexcept nogil:
    p[0] = <char>(v >> 8)
    p[1] = <char>v


cdef inline void _store_u32(char* p, uint32_t v) noexcept nogil:
    p[0] = <char>(v >> 24)
    p[1] = <char>(v >> 16)
    p[2] = <char>(v >> 8)
    p[3] = <char>v


cdef inline void _store_u64(char* p, uint64_t v) noexcept nogil:
    _store_u32(p, <uint32_t>(v >> 32))
    _store_u32(p + 4, <uint32_t>v)


# ---- names -------------------------------------------------------------------------------

cdef dict _name_cache = {}


cdef inline bint _name_char(uint8_t c) noexcept nogil:
    return (
        (c >= b'a' and c <= b'z') or (c >= b'A' and c <= b'Z') or (c >= b'0' and c <= b'9')
        or c == b'.' or c == b'_' or c == b'-'
    )


cdef bint _valid_name(object name):
    if not isinstance(name, str):
        return False
    cdef Py_ssize_t n = len(<str>name)
    if n < 1 or n > C_MAX_NAME:
        return False
    try:
        raw = (<str>name).encode("ascii")
    except UnicodeEncodeError:
        return False
    cdef const char* p = PyBytes_AS_STRING(raw)
    cdef Py_ssize_t base = n
    if n > 10 and memcmp(p + n - 10, b"#ephemeral", 10) == 0:
        base = n - 10
    cdef Py_ssize_t i
    for i in range(base):
        if not _name_char(<uint8_t>p[i]):
            return False
    return True


def valid_topic_name(name):
    """Whether nsqd accepts ``name`` as a topic (1-64 of ``[.a-zA-Z0-9_-]``, optional ``#ephemeral``)."""
    return _valid_name(name)


def valid_channel_name(name):
    """Whether nsqd accepts ``name`` as a channel; the same rule as topics."""
    return _valid_name(name)


cdef bytes _name_bytes(object name, str what):
    # Names repeat (one topic, millions of PUBs): validate each distinct one once.
    cdef object cached
    if type(name) is str:
        cached = _name_cache.get(name)
        if cached is not None:
            return <bytes>cached
    if not _valid_name(name):
        raise InvalidValueError(
            f"invalid {what} name {name!r}: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    cdef bytes raw = (<str>name).encode("ascii")
    if type(name) is str:
        if len(_name_cache) >= C_NAME_CACHE_MAX:
            _name_cache.clear()
        _name_cache[name] = raw
    return raw


# ---- messages ----------------------------------------------------------------------------

def decode_traced_response(data):
    """Decode the HA traced reply: ``"OK"`` + u64 id + u64 trace id + u64 offset + u32 size."""
    cdef bytes raw = bytes(data)
    cdef const char* p = PyBytes_AS_STRING(raw)
    if PyBytes_GET_SIZE(raw) != C_TRACED_SIZE or p[0] != b'O' or p[1] != b'K':
        raise ProtocolError(
            f"a traced response is 30 bytes starting with OK, got {len(raw)} bytes"
        )
    return TracedResponse(_load_u64(p + 2), _load_u64(p + 10), _load_u64(p + 18), _load_u32(p + 26))


@cython.freelist(512)
@cython.final
cdef class Message:
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

    def __init__(self, int64_t timestamp, uint16_t attempts, id, bytes body, *, bint ha=False,
                 int ext_version=0, ext_bytes=None, offset=None, raw_size=None, partition=None,
                 address=None):
        if not isinstance(id, (bytes, bytearray)) or len(id) != 16:
            raise InvalidValueError(f"a message id is 16 bytes, got {len(id)}")
        self.timestamp = timestamp
        self.attempts = attempts
        memcpy(self._id, PyBytes_AS_STRING(bytes(id)), 16)
        self.body = body
        self._ha = ha
        self.ext_version = ext_version
        self.ext_bytes = ext_bytes
        self._has_offset = offset is not None
        if self._has_offset:
            self._offset = offset
            self._raw_size = raw_size
        self.delegate = None
        self.partition = partition
        self.address = address
        self._responded = False
        self._auto_response = True

    @property
    def id(self):
        return PyBytes_FromStringAndSize(self._id, 16)

    @property
    def internal_id(self):
        return _load_u64(self._id) if self._ha else None

    @property
    def trace_id(self):
        return _load_u64(self._id + 8) if self._ha else None

    @property
    def ext(self):
        if self.ext_version != 4 or self.ext_bytes is None:
            return None
        return json.loads(self.ext_bytes)

    @property
    def offset(self):
        return self._offset if self._has_offset else None

    @property
    def raw_size(self):
        return self._raw_size if self._has_offset else None

    @property
    def has_responded(self):
        return self._responded

    @property
    def auto_response(self):
        return self._auto_response

    def disable_auto_response(self):
        """The handler will answer this message itself (finish/requeue), later."""
        self._auto_response = False

    def _replace_body(self, bytes body, ext_bytes):
        """The body and ext header as the handler should see them (client-side decompression,
        ``fastnsq.bodies``): the wire's are compressed and marked."""
        self.body = body
        self.ext_bytes = ext_bytes

    cdef object _check_open(self):
        if self._responded:
            raise RuntimeError(f"message {self._id_text()} was already finished or requeued")
        if self.delegate is None:
            raise RuntimeError(f"message {self._id_text()} has no connection to answer on")
        return self.delegate

    cpdef finish(self):
        """Send FIN: the message is done."""
        delegate = self._check_open()
        self._responded = True
        if isinstance(delegate, MessageSink):
            (<MessageSink>delegate).finish_message_c(self)  # the consumer's hot path, no Python call
        else:
            delegate.finish_message(self)

    def requeue(self, delay=None, backoff=True):
        """Send REQ: deliver again after ``delay`` seconds (None: the consumer's default)."""
        delegate = self._check_open()
        self._responded = True
        delegate.requeue_message(self, delay, backoff)

    def touch(self):
        """Send TOUCH: reset this message's in-flight timeout on nsqd."""
        self._check_open().touch_message(self)

    def _id_text(self):
        raw = PyBytes_FromStringAndSize(self._id, 16)
        return raw.hex() if self._ha else raw.decode("latin-1")

    def __repr__(self):
        # Never the body: it may hold anything, and reprs end up in logs.
        return (
            f"<Message id={self._id_text()} attempts={self.attempts} "
            f"timestamp={self.timestamp} size={len(self.body)}>"
        )


cdef class MessageSink:
    """The C interface of a consumer's end of a connection (``fastnsq._delivery.Link``).

    A ``FrameReader`` whose ``on_message`` is a sink calls :meth:`deliver` directly,
    and ``Message.finish()`` calls :meth:`finish_message_c` on a delegate that is one:
    the per-message path from the socket to the FIN then makes no Python call but the
    user's handler. Any other callable / delegate is called the Python way.
    """

    cdef int deliver(self, Message msg) except -1:
        raise NotImplementedError("MessageSink.deliver")

    cdef int finish_message_c(self, Message msg) except -1:
        raise NotImplementedError("MessageSink.finish_message_c")


# ---- the read buffer ---------------------------------------------------------------------

cdef class _SplitBuffer:
    """A malloc'd read buffer that ``asyncio.BufferedProtocol`` reads into.

    The loop writes into the free tail handed out by ``get_buffer`` and reports
    with ``buffer_updated``; the memory only moves inside our own methods, never
    between the two calls, so the loop's pointer stays valid.
    """

    def __cinit__(self, *args, **kwargs):
        self._buf = NULL
        self._cap = 0

    def __dealloc__(self):
        if self._buf != NULL:
            free(self._buf)
            self._buf = NULL

    cdef int _allocate(self, Py_ssize_t initial) except -1:
        if initial < 16:
            raise InvalidValueError(f"initial_size must be >= 16, got {initial}")
        self._buf = <char*>malloc(initial)
        if self._buf == NULL:
            raise MemoryError()
        self._cap = initial
        self._initial = initial
        self._start = self._end = self._need = 0
        self._paused = False
        return 0

    def get_buffer(self, Py_ssize_t sizehint):
        cdef Py_ssize_t want = self._need - (self._end - self._start)
        if want < C_MIN_FREE:
            want = C_MIN_FREE
        self._make_room(want)
        return PyMemoryView_FromMemory(self._buf + self._end, self._cap - self._end, PyBUF_WRITE)

    def buffer_updated(self, Py_ssize_t nbytes):
        if nbytes < 0 or self._end + nbytes > self._cap:
            raise ProtocolError(f"buffer_updated({nbytes}) beyond the buffer handed out")
        self._end += nbytes
        self._split()

    def feed(self, data):
        cdef const unsigned char[::1] view
        cdef Py_ssize_t n
        if isinstance(data, bytes):
            n = PyBytes_GET_SIZE(data)
            if n:
                self._make_room(n)
                memcpy(self._buf + self._end, PyBytes_AS_STRING(data), n)
                self._end += n
        else:
            view = data
            n = view.shape[0]
            if n:
                self._make_room(n)
                memcpy(self._buf + self._end, &view[0], n)
                self._end += n
        self._split()

    def pause(self):
        self._paused = True

    def resume(self):
        self._paused = False
        self._split()

    def take_unparsed(self):
        data = PyBytes_FromStringAndSize(self._buf + self._start, self._end - self._start)
        self._start = self._end = self._need = 0
        return data

    @property
    def paused(self):
        return self._paused

    @property
    def buffered(self):
        return self._end - self._start

    @property
    def capacity(self):
        return self._cap

    cdef int _make_room(self, Py_ssize_t want) except -1:
        cdef Py_ssize_t pending, new_cap
        cdef char* new_buf
        if self._start == self._end:
            self._start = self._end = 0
            new_cap = self._initial if self._initial > want else want
            if self._cap > 4 * new_cap:
                # Give back what one huge frame took.
                new_buf = <char*>malloc(new_cap)
                if new_buf == NULL:
                    raise MemoryError()
                free(self._buf)
                self._buf = new_buf
                self._cap = new_cap
        if self._cap - self._end >= want:
            return 0
        pending = self._end - self._start
        if self._start and pending + want <= self._cap:
            memmove(self._buf, self._buf + self._start, pending)
        else:
            new_cap = 2 * self._cap
            if new_cap < pending + want:
                new_cap = pending + want
            new_buf = <char*>malloc(new_cap)
            if new_buf == NULL:
                raise MemoryError()
            memcpy(new_buf, self._buf + self._start, pending)
            free(self._buf)
            self._buf = new_buf
            self._cap = new_cap
        self._start = 0
        self._end = pending
        return 0

    cdef int _split(self) except -1:
        return 0


cdef class FrameReader(_SplitBuffer):
    """Splits nsqd's frame stream (see ``_frame.pyi``)."""

    def __init__(self, on_message, on_response, on_error, *, int layout=0,
                 Py_ssize_t max_frame_size=DEFAULT_MAX_FRAME_SIZE,
                 Py_ssize_t initial_size=C_MIN_READ):
        if max_frame_size < 8 or max_frame_size > C_I32_MAX:
            raise InvalidValueError(f"max_frame_size must be in 8..{C_I32_MAX}, got {max_frame_size}")
        self.layout = layout
        self._allocate(initial_size)
        self._on_message = on_message
        self._sink = on_message if isinstance(on_message, MessageSink) else None
        self._on_response = on_response
        self._on_error = on_error
        self.delegate = None
        self.partition = None
        self.address = None
        self._max_frame_size = max_frame_size

    @property
    def layout(self):
        return self._layout

    @layout.setter
    def layout(self, int value):
        if value & ~C_LAYOUT_ALL:
            raise InvalidValueError(f"unknown layout flags {value:#x}")
        self._layout = value

    @property
    def max_frame_size(self):
        return self._max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, Py_ssize_t value):
        if value < 8 or value > C_I32_MAX:
            raise InvalidValueError(f"max_frame_size must be in 8..{C_I32_MAX}, got {value}")
        self._max_frame_size = value

    cdef int _split(self) except -1:
        cdef Py_ssize_t pos, avail
        cdef int32_t size, frame_type
        cdef const char* p
        while not self._paused:
            pos = self._start
            avail = self._end - pos
            if avail < 8:
                self._need = 8
                break
            p = self._buf + pos
            size = <int32_t>_load_u32(p)
            if size == C_HTTP_AS_SIZE:
                raise ProtocolError(
                    "received 'HTTP' where a frame size was expected: is this nsqd's HTTP port?"
                )
            if size < 4:
                raise ProtocolError(f"frame size {size} is below the minimum of 4")
            if size > self._max_frame_size:
                raise ProtocolError(f"frame size {size} is above the maximum of {self._max_frame_size}")
            if avail - 4 < size:
                self._need = size + 4
                break
            frame_type = <int32_t>_load_u32(p + 4)
            self._start = pos + 4 + size
            self._need = 0
            if frame_type == C_FRAME_MESSAGE:
                if self._sink is not None:
                    self._sink.deliver(self._decode_message(p + 8, size - 4))
                else:
                    self._on_message(self._decode_message(p + 8, size - 4))
            elif frame_type == C_FRAME_RESPONSE:
                self._on_response(_response_value(p + 8, size - 4))
            elif frame_type == C_FRAME_ERROR:
                text = PyBytes_FromStringAndSize(p + 8, size - 4).decode("utf-8", "replace")
                code, description = split_error(text)
                self._on_error(code, description)
            else:
                raise ProtocolError(f"unknown frame type {frame_type}")
        if self._start == self._end:
            self._start = self._end = 0
        return 0

    cdef Message _decode_message(self, const char* data, Py_ssize_t n):
        if n < C_HEADER:
            raise ProtocolError(f"message frame of {n} bytes is shorter than the 26-byte header")
        cdef Message msg = Message.__new__(Message)
        cdef Py_ssize_t pos = C_HEADER
        cdef int layout = self._layout
        cdef Py_ssize_t ext_len
        msg.timestamp = <int64_t>_load_u64(data)
        msg.attempts = _load_u16(data + 8)
        memcpy(msg._id, data + 10, 16)
        msg._ha = (layout & C_LAYOUT_HA_ID) != 0
        msg.ext_version = 0
        msg.ext_bytes = None
        msg._has_offset = False
        if layout & C_LAYOUT_EXT:
            if pos + 1 > n:
                raise ProtocolError("message frame ends inside its ext header")
            msg.ext_version = <uint8_t>data[pos]
            pos += 1
            if msg.ext_version:
                if pos + 2 > n:
                    raise ProtocolError("message frame ends inside its ext header length")
                ext_len = _load_u16(data + pos)
                pos += 2
                if pos + ext_len > n:
                    raise ProtocolError(f"ext header of {ext_len} bytes runs past the message frame")
                msg.ext_bytes = PyBytes_FromStringAndSize(data + pos, ext_len)
                pos += ext_len
        if layout & C_LAYOUT_OFFSET:
            if pos + 12 > n:
                raise ProtocolError("message frame ends inside its offset/size header")
            msg._offset = _load_u64(data + pos)
            msg._raw_size = _load_u32(data + pos + 8)
            msg._has_offset = True
            pos += 12
        msg.body = PyBytes_FromStringAndSize(data + pos, n - pos)
        msg.delegate = self.delegate
        msg.partition = self.partition
        msg.address = self.address
        msg._responded = False
        msg._auto_response = True
        return msg


cdef object _response_value(const char* p, Py_ssize_t n):
    # The module's constants for the frequent answers: no allocation, comparable with ``is``.
    if n == 2 and p[0] == b'O' and p[1] == b'K':
        return OK
    if n == 11 and memcmp(p, b"_heartbeat_", 11) == 0:
        return HEARTBEAT
    if n == 10 and memcmp(p, b"CLOSE_WAIT", 10) == 0:
        return CLOSE_WAIT
    if n == C_TRACED_SIZE and p[0] == b'O' and p[1] == b'K':
        return TracedResponse(_load_u64(p + 2), _load_u64(p + 10), _load_u64(p + 18), _load_u32(p + 26))
    return PyBytes_FromStringAndSize(p, n)


# ---- the write buffer --------------------------------------------------------------------

cdef object _body_of(object body, const char** ptr, Py_ssize_t* size, str what):
    """Point at a body's bytes; returns the object that owns them (keep it alive)."""
    if isinstance(body, bytes):
        ptr[0] = PyBytes_AS_STRING(body)
        size[0] = PyBytes_GET_SIZE(body)
        return body
    if isinstance(body, str):
        ptr[0] = PyUnicode_AsUTF8AndSize(body, size)
        return body
    if isinstance(body, (bytearray, memoryview)):
        owner = bytes(body)
        ptr[0] = PyBytes_AS_STRING(owner)
        size[0] = PyBytes_GET_SIZE(owner)
        return owner
    raise InvalidValueError(
        f"{what} must be bytes, bytearray, memoryview or str, not {type(body).__name__}"
    )


cdef inline const char* _id_ptr(object message_id) except NULL:
    if type(message_id) is Message:
        return (<Message>message_id)._id
    if isinstance(message_id, bytes) and PyBytes_GET_SIZE(message_id) == 16:
        return PyBytes_AS_STRING(message_id)
    if isinstance(message_id, bytearray) and PyByteArray_GET_SIZE(message_id) == 16:
        return PyByteArray_AS_STRING(message_id)
    raise InvalidValueError(f"a message id is 16 bytes or a Message, got {message_id!r}")


cdef int64_t _check_int(object value, str what, int64_t low, int64_t high) except? -1:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValueError(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidValueError(f"{what} {value} is outside {low}..{high}")
    return value


cdef uint64_t _check_u64(object value, str what) except? 0:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidValueError(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value <= U64_MAX:
        raise InvalidValueError(f"{what} {value} is outside 0..{U64_MAX}")
    return value


cdef bytes _partition_suffix(object partition):
    if partition is None:
        return b""
    return b" %d" % _check_int(partition, "partition", 0, C_I32_MAX)


cdef object _pair(object item, str shape):
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InvalidValueError(f"each batch item must be a {shape} pair, got {type(item).__name__}")
    return item


cdef bytes _checked_ext(object ext):
    cdef const char* p
    cdef Py_ssize_t n
    owner = _body_of(ext, &p, &n, "ext header")
    if n > C_MAX_EXT:
        raise InvalidValueError(f"ext header of {n} bytes exceeds 65535")
    return PyBytes_FromStringAndSize(p, n) if not isinstance(owner, bytes) else owner


cdef class WriteBuffer:
    """One connection's outgoing commands (see ``_frame.pyi``)."""

    def __cinit__(self, *args, **kwargs):
        self._buf = NULL
        self._len = 0
        self._cap = 0

    def __init__(self, *, max_msg_size=DEFAULT_MAX_MSG_SIZE, max_body_size=DEFAULT_MAX_BODY_SIZE,
                 max_rdy_count=DEFAULT_MAX_RDY_COUNT, max_req_timeout=DEFAULT_MAX_REQ_TIMEOUT,
                 Py_ssize_t initial_size=4096):
        self.max_msg_size = _check_int(max_msg_size, "max_msg_size", 1, C_I32_MAX)
        self.max_body_size = _check_int(max_body_size, "max_body_size", 1, C_I32_MAX)
        self.max_rdy_count = _check_int(max_rdy_count, "max_rdy_count", 0, C_I32_MAX)
        self.max_req_timeout = _check_int(max_req_timeout, "max_req_timeout", 0, C_I32_MAX)
        if initial_size < 64:
            initial_size = 64
        if self._buf == NULL:
            self._buf = <char*>malloc(initial_size)
            if self._buf == NULL:
                raise MemoryError()
            self._cap = initial_size
            self._initial = initial_size

    def __dealloc__(self):
        if self._buf != NULL:
            free(self._buf)
            self._buf = NULL

    def __len__(self):
        return self._len

    def take(self):
        data = PyBytes_FromStringAndSize(self._buf, self._len)
        self._len = 0
        if self._cap > 64 * self._initial:
            self._shrink()
        return data

    def clear(self):
        self._len = 0

    cdef _shrink(self):
        cdef char* small = <char*>malloc(self._initial)
        if small != NULL:
            free(self._buf)
            self._buf = small
            self._cap = self._initial

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self._len + extra
        cdef Py_ssize_t new_cap
        cdef char* new_buf
        if need <= self._cap:
            return 0
        new_cap = 2 * self._cap
        if new_cap < need:
            new_cap = need
        new_buf = <char*>malloc(new_cap)
        if new_buf == NULL:
            raise MemoryError()
        memcpy(new_buf, self._buf, self._len)
        free(self._buf)
        self._buf = new_buf
        self._cap = new_cap
        return 0

    cdef inline void _put(self, const char* data, Py_ssize_t n) noexcept:
        memcpy(self._buf + self._len, data, n)
        self._len += n

    cdef inline void _put_u32(self, uint32_t value) noexcept:
        _store_u32(self._buf + self._len, value)
        self._len += 4

    cdef int _put_decimal(self, uint64_t value) except -1:
        cdef char digits[24]
        cdef int i = 24
        if value == 0:
            i -= 1
            digits[i] = b'0'
        while value:
            i -= 1
            digits[i] = <char>(48 + value % 10)  # ASCII '0' + digit
            value //= 10
        self._reserve(24 - i)
        self._put(digits + i, 24 - i)
        return 0

    cdef int _put_bytes(self, bytes data) except -1:
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        self._reserve(n)
        self._put(PyBytes_AS_STRING(data), n)
        return 0

    cdef int _put_id_command(self, const char* prefix, Py_ssize_t prefix_len, object message_id) except -1:
        cdef const char* idp = _id_ptr(message_id)
        self._reserve(prefix_len + 17)
        self._put(prefix, prefix_len)
        self._put(idp, 16)
        return 0

    cdef int put_fin(self, Message msg) except -1:
        # FIN for the consumer's hot path (fastnsq._delivery): the id straight from the Message.
        cdef char* out
        if self._len + 21 > self._cap:
            self._reserve(21)
        out = self._buf + self._len
        memcpy(out, b"FIN ", 4)
        memcpy(out + 4, msg._id, 16)
        out[20] = b'\n'
        self._len += 21
        return 0

    cdef int _check_message(self, Py_ssize_t header, Py_ssize_t size) except -1:
        if size == 0:
            raise InvalidValueError("empty message body: nsqd rejects empty messages")
        if header + size > self.max_msg_size:
            raise InvalidValueError(
                f"message of {header + size} bytes exceeds max_msg_size {self.max_msg_size}"
            )
        return 0

    cdef int _check_body_size(self, Py_ssize_t size, str what) except -1:
        if size <= 0:
            raise InvalidValueError(f"{what} is empty")
        if size > self.max_body_size:
            raise InvalidValueError(f"{what} of {size} bytes exceeds max_body_size {self.max_body_size}")
        return 0

    cdef int _put_body_command(self, bytes line, const char* prefix, Py_ssize_t prefix_len,
                               const char* body, Py_ssize_t size) except -1:
        # line ends in "\n"; then u32(prefix + body), prefix, body.
        self._reserve(PyBytes_GET_SIZE(line) + 4 + prefix_len + size)
        self._put(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line))
        self._put_u32(<uint32_t>(prefix_len + size))
        if prefix_len:
            self._put(prefix, prefix_len)
        self._put(body, size)
        return 0

    # -- connection setup

    def magic(self):
        self._reserve(4)
        self._put(b"  V2", 4)

    def identify(self, body):
        cdef const char* p
        cdef Py_ssize_t n
        owner = _body_of(body, &p, &n, "IDENTIFY body")
        self._check_body_size(n, "IDENTIFY body")
        self._put_body_command(b"IDENTIFY\n", NULL, 0, p, n)

    def auth(self, secret):
        cdef const char* p
        cdef Py_ssize_t n
        owner = _body_of(secret, &p, &n, "AUTH secret")
        if n == 0:
            raise InvalidValueError("the AUTH secret is empty")
        if n > self.max_body_size:
            raise InvalidValueError(f"the AUTH secret exceeds max_body_size {self.max_body_size}")
        self._put_body_command(b"AUTH\n", NULL, 0, p, n)

    # -- consuming

    def sub(self, topic, channel, partition=None):
        self._sub(b"SUB ", topic, channel, _partition_suffix(partition))

    def sub_ordered(self, topic, channel, partition):
        if partition is None:
            raise InvalidValueError("SUB_ORDERED needs a partition")
        self._sub(b"SUB_ORDERED ", topic, channel, _partition_suffix(partition))

    def sub_advanced(self, topic, channel, partition=None, position=None):
        suffix = _partition_suffix(partition)
        if position is not None:
            if partition is None:
                raise InvalidValueError("SUB_ADVANCED takes a start position only after a partition")
            if not isinstance(position, str) or not _valid_position(position):
                raise InvalidValueError(f"SUB_ADVANCED start position {position!r} is not '<type>:<int>'")
            suffix += b" " + position.encode("ascii")
        self._sub(b"SUB_ADVANCED ", topic, channel, suffix)

    cdef _sub(self, bytes command, object topic, object channel, bytes suffix):
        line = command + _name_bytes(topic, "topic") + b" " + _name_bytes(channel, "channel")
        self._put_bytes(line + suffix + b"\n")

    def rdy(self, count):
        _check_int(count, "RDY count", 0, self.max_rdy_count)
        self._reserve(4)
        self._put(b"RDY ", 4)
        self._put_decimal(count)
        self._reserve(1)
        self._put(b"\n", 1)

    def fin(self, message_id):
        cdef const char* idp = _id_ptr(message_id)
        cdef char* out
        if self._len + 21 > self._cap:
            self._reserve(21)
        out = self._buf + self._len
        memcpy(out, b"FIN ", 4)
        memcpy(out + 4, idp, 16)
        out[20] = b'\n'
        self._len += 21

    def req(self, message_id, delay_ms):
        cdef const char* idp = _id_ptr(message_id)
        cdef int64_t delay = _check_int(delay_ms, "REQ delay (ms)", 0, self.max_req_timeout)
        self._reserve(21)
        self._put(b"REQ ", 4)
        self._put(idp, 16)
        self._put(b" ", 1)
        self._put_decimal(<uint64_t>delay)
        self._reserve(1)
        self._put(b"\n", 1)

    def touch(self, message_id):
        self._put_id_command(b"TOUCH ", 6, message_id)
        self._put(b"\n", 1)

    def cls(self):
        self._reserve(4)
        self._put(b"CLS\n", 4)

    def nop(self):
        self._reserve(4)
        self._put(b"NOP\n", 4)

    # -- publishing

    def pub(self, topic, body, partition=None):
        cdef const char* p
        cdef Py_ssize_t n
        cdef bytes name = _name_bytes(topic, "topic")
        owner = _body_of(body, &p, &n, "message body")
        self._check_message(0, n)
        if partition is None:
            self._reserve(PyBytes_GET_SIZE(name) + 9 + n)
            self._put(b"PUB ", 4)
            self._put(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name))
            self._put(b"\n", 1)
            self._put_u32(<uint32_t>n)
            self._put(p, n)
        else:
            self._put_body_command(b"PUB " + name + _partition_suffix(partition) + b"\n", NULL, 0, p, n)

    def dpub(self, topic, defer_ms, body):
        cdef const char* p
        cdef Py_ssize_t n
        cdef int64_t defer = _check_int(defer_ms, "DPUB defer (ms)", 0, self.max_req_timeout)
        cdef bytes name = _name_bytes(topic, "topic")
        owner = _body_of(body, &p, &n, "message body")
        self._check_message(0, n)
        self._put_body_command(b"DPUB " + name + b" %d\n" % defer, NULL, 0, p, n)

    def pub_trace(self, topic, partition, trace_id, body):
        cdef const char* p
        cdef Py_ssize_t n
        cdef char prefix[8]
        cdef uint64_t trace = _check_u64(trace_id, "trace id")
        cdef bytes line = b"PUB_TRACE " + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        owner = _body_of(body, &p, &n, "message body")
        self._check_message(8, n)
        _store_u64(prefix, trace)
        self._put_body_command(line, prefix, 8, p, n)

    def pub_ext(self, topic, partition, ext, body):
        cdef const char* p
        cdef Py_ssize_t n
        cdef bytes ext_data = _checked_ext(ext)
        cdef bytes line = b"PUB_EXT " + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        owner = _body_of(body, &p, &n, "message body")
        cdef Py_ssize_t ext_len = PyBytes_GET_SIZE(ext_data)
        self._check_message(2 + ext_len, n)
        cdef bytes prefix = PyBytes_FromStringAndSize(NULL, 2 + ext_len)
        _store_u16(PyBytes_AS_STRING(prefix), <uint16_t>ext_len)
        memcpy(PyBytes_AS_STRING(prefix) + 2, PyBytes_AS_STRING(ext_data), ext_len)
        self._put_body_command(line, PyBytes_AS_STRING(prefix), 2 + ext_len, p, n)

    def mpub(self, topic, bodies, partition=None):
        self._mpub(b"MPUB ", topic, partition, None, self._checked_batch(bodies))

    def mpub_trace(self, topic, partition, items):
        cdef list prefixes = []
        cdef list bodies = []
        cdef char raw[8]
        for item in self._checked_batch(items):
            trace_id, body = _pair(item, "(trace_id, body)")
            _store_u64(raw, _check_u64(trace_id, "trace id"))
            prefixes.append(PyBytes_FromStringAndSize(raw, 8))
            bodies.append(body)
        self._mpub(b"MPUB_TRACE ", topic, partition, prefixes, bodies)

    def mpub_ext(self, topic, partition, items):
        cdef list prefixes = []
        cdef list bodies = []
        cdef bytes ext_data
        cdef char raw[2]
        for item in self._checked_batch(items):
            ext, body = _pair(item, "(ext, body)")
            ext_data = _checked_ext(ext)
            _store_u16(raw, <uint16_t>PyBytes_GET_SIZE(ext_data))
            prefixes.append(PyBytes_FromStringAndSize(raw, 2) + ext_data)
            bodies.append(body)
        self._mpub(b"MPUB_EXT ", topic, partition, prefixes, bodies)

    cdef list _checked_batch(self, object items):
        if isinstance(items, (bytes, bytearray, memoryview, str)):
            raise InvalidValueError("a batch is a sequence of messages, not a single body")
        cdef list seq = items if type(items) is list else list(items)
        if not seq:
            raise InvalidValueError("an MPUB batch needs at least one message")
        cdef Py_ssize_t limit = (self.max_body_size - 4) // 5
        if len(seq) > limit:
            raise InvalidValueError(f"an MPUB batch of {len(seq)} messages exceeds {limit}")
        return seq

    cdef _mpub(self, bytes command, object topic, object partition, list prefixes, list bodies):
        cdef bytes line = command + _name_bytes(topic, "topic") + _partition_suffix(partition) + b"\n"
        cdef Py_ssize_t count = len(bodies)
        cdef Py_ssize_t i, n, prefix_len
        cdef Py_ssize_t total = 4
        cdef const char* p
        cdef list owners = bodies
        # First pass: sizes and checks, so a bad message leaves the buffer untouched.
        for i in range(count):
            body = bodies[i]
            if not isinstance(body, bytes):
                if owners is bodies:
                    owners = list(bodies)
                owner = _body_of(body, &p, &n, "message body")
                owners[i] = owner if isinstance(owner, bytes) else (<str>owner).encode("utf-8")
            n = PyBytes_GET_SIZE(owners[i])
            prefix_len = 0 if prefixes is None else PyBytes_GET_SIZE(prefixes[i])
            self._check_message(prefix_len, n)
            total += 4 + prefix_len + n
        self._check_body_size(total, "MPUB body")
        self._reserve(PyBytes_GET_SIZE(line) + 4 + total)
        self._put(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line))
        self._put_u32(<uint32_t>total)
        self._put_u32(<uint32_t>count)
        for i in range(count):
            body = owners[i]
            n = PyBytes_GET_SIZE(body)
            if prefixes is None:
                self._put_u32(<uint32_t>n)
            else:
                prefix = prefixes[i]
                prefix_len = PyBytes_GET_SIZE(prefix)
                self._put_u32(<uint32_t>(prefix_len + n))
                self._put(PyBytes_AS_STRING(prefix), prefix_len)
            self._put(PyBytes_AS_STRING(body), n)

    def internal_create_topic(self, topic, partition, ext=None):
        if partition is None:
            raise InvalidValueError("INTERNAL_CREATE_TOPIC needs a partition")
        line = b"INTERNAL_CREATE_TOPIC " + _name_bytes(topic, "topic") + _partition_suffix(partition)
        if ext is not None:
            line += b" true" if ext else b" false"
        self._put_bytes(line + b"\n")


cdef bint _valid_position(str position):
    # "<type>:<int>", e.g. "special:-1" or "timestamp:1700000000".
    kind, sep, value = position.partition(":")
    if not sep or not kind or not all(c == "_" or "a" <= c <= "z" for c in kind):
        return False
    digits = value[1:] if value.startswith("-") else value
    return digits.isdigit() and digits.isascii()


# ---- server side -------------------------------------------------------------------------

cdef class CommandReader(_SplitBuffer):
    """Splits a client's command stream (see ``_frame.pyi``)."""

    def __init__(self, on_command, *, on_magic=None, bint binary_ids=False,
                 Py_ssize_t max_line=UPSTREAM_MAX_LINE, Py_ssize_t max_msg_size=DEFAULT_MAX_MSG_SIZE,
                 Py_ssize_t max_body_size=DEFAULT_MAX_BODY_SIZE, Py_ssize_t initial_size=C_MIN_READ):
        self._allocate(initial_size)
        self._on_command = on_command
        self._on_magic = on_magic
        self.binary_ids = binary_ids
        self.max_line = max_line
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._stopped = False

    cdef int _split(self) except -1:
        cdef Py_ssize_t pos
        while not self._paused and not self._stopped:
            pos = self._start
            if self._on_magic is not None:
                if self._end - pos < 4:
                    break
                on_magic = self._on_magic
                self._on_magic = None
                self._start = pos + 4
                on_magic(PyBytes_FromStringAndSize(self._buf + pos, 4))
                continue
            if not self._split_one():
                break
        if self._start == self._end:
            self._start = self._end = 0
        return 0

    cdef int _split_one(self) except -1:
        cdef Py_ssize_t pos = self._start
        cdef Py_ssize_t end = self._end
        cdef const char* p = self._buf + pos
        cdef Py_ssize_t avail = end - pos
        cdef Py_ssize_t id_end = 0
        cdef Py_ssize_t search_from = 0
        cdef Py_ssize_t search_len
        cdef const char* nl
        cdef Py_ssize_t line_len, body_at
        cdef int32_t size
        if self.binary_ids:
            # HA ids are binary: they may hold '\n' and ' ' (protocol.md §9.3).
            if avail >= 4 and (memcmp(p, b"FIN ", 4) == 0 or memcmp(p, b"REQ ", 4) == 0):
                id_end = 20
            elif avail >= 6 and memcmp(p, b"TOUCH ", 6) == 0:
                id_end = 22
            if id_end:
                if avail <= id_end:
                    return 0
                search_from = id_end
        search_len = avail - search_from
        if not id_end and search_len > self.max_line + 1:
            search_len = self.max_line + 1
        nl = <const char*>memchr(p + search_from, b'\n', search_len)
        if nl == NULL:
            if avail > self.max_line:
                raise ProtocolError(f"command line longer than {self.max_line} bytes")
            return 0
        line_len = nl - p
        body_at = line_len + 1
        if id_end:
            name, params = _binary_id_command(p, line_len, id_end)
        else:
            name, params = _split_line(p, line_len)
        if name not in BODY_COMMANDS:
            self._start = pos + body_at
            self._on_command(name, params, None)
            return 1
        if avail - body_at < 4:
            return 0
        size = <int32_t>_load_u32(p + body_at)
        limit = self.max_body_size if name in BODY_SIZE_COMMANDS else self.max_msg_size
        if size <= 0 or size > limit:
            self._start = pos + body_at + 4
            self._stopped = True  # nsqd answers a fatal error without reading the body
            self._on_command(name, params, size)
            return 0
        if avail - body_at - 4 < size:
            self._need = body_at + 4 + size
            return 0
        body = PyBytes_FromStringAndSize(p + body_at + 4, size)
        self._start = pos + body_at + 4 + size
        self._need = 0
        self._on_command(name, params, body)
        return 1


cdef tuple _binary_id_command(const char* p, Py_ssize_t line_len, Py_ssize_t id_end):
    cdef bytes msg_id = PyBytes_FromStringAndSize(p + id_end - 16, 16)
    if id_end == 22:
        return b"TOUCH", [msg_id]
    if p[0] == b'F':
        return b"FIN", [msg_id]
    return b"REQ", [msg_id, PyBytes_FromStringAndSize(p + id_end + 1, line_len - id_end - 1)
                    if line_len > id_end else b""]


cdef tuple _split_line(const char* p, Py_ssize_t line_len):
    if line_len and p[line_len - 1] == b'\r':
        line_len -= 1
    cdef list parts = PyBytes_FromStringAndSize(p, line_len).split(b" ")
    return parts[0], parts[1:]


def encode_response(data):
    """A response frame (type 0) holding ``data``."""
    return _encode_frame(C_FRAME_RESPONSE, bytes(data))


def encode_error(text):
    """An error frame (type 1) holding ``"<CODE> <description>"``."""
    return _encode_frame(C_FRAME_ERROR, bytes(text))


cdef bytes _encode_frame(int32_t frame_type, bytes data):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 8)
    cdef char* o = PyBytes_AS_STRING(out)
    _store_u32(o, <uint32_t>(n + 4))
    _store_u32(o + 4, <uint32_t>frame_type)
    memcpy(o + 8, PyBytes_AS_STRING(data), n)
    return out


def encode_message(int64_t timestamp, uint16_t attempts, message_id, body, *, ext_version=None,
                   ext=None, offset=None, raw_size=None):
    """A message frame (type 2) in the layout the arguments describe.

    ``ext_version`` (with ``ext`` when not 0) writes the HA ext header; ``offset``
    with ``raw_size`` writes the HA SUB_ORDERED/SUB_ADVANCED header after it.
    """
    if not isinstance(message_id, (bytes, bytearray)) or len(message_id) != 16:
        raise InvalidValueError(f"a message id is 16 bytes, got {len(message_id)}")
    cdef bytes raw_id = bytes(message_id)
    cdef bytes raw_body = body if type(body) is bytes else bytes(body)
    cdef bytes ext_data = b""
    cdef Py_ssize_t extra = 0
    cdef int version = -1
    if ext_version is not None:
        version = _check_int(ext_version, "ext version", 0, 255)
        extra += 1
        if version:
            ext_data = bytes(ext or b"")
            if PyBytes_GET_SIZE(ext_data) > C_MAX_EXT:
                raise InvalidValueError(f"ext header of {len(ext_data)} bytes exceeds 65535")
            extra += 2 + PyBytes_GET_SIZE(ext_data)
    if (offset is None) != (raw_size is None):
        raise InvalidValueError("offset and raw_size go together")
    if offset is not None:
        extra += 12
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw_body)
    cdef Py_ssize_t size = 4 + C_HEADER + extra + n
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size + 4)
    cdef char* o = PyBytes_AS_STRING(out)
    _store_u32(o, <uint32_t>size)
    _store_u32(o + 4, C_FRAME_MESSAGE)
    _store_u64(o + 8, <uint64_t>timestamp)
    _store_u16(o + 16, attempts)
    memcpy(o + 18, PyBytes_AS_STRING(raw_id), 16)
    o += 34
    if version >= 0:
        o[0] = <char>version
        o += 1
        if version:
            _store_u16(o, <uint16_t>PyBytes_GET_SIZE(ext_data))
            memcpy(o + 2, PyBytes_AS_STRING(ext_data), PyBytes_GET_SIZE(ext_data))
            o += 2 + PyBytes_GET_SIZE(ext_data)
    if offset is not None:
        _store_u64(o, <uint64_t>offset)
        _store_u32(o + 8, <uint32_t>raw_size)
        o += 12
    memcpy(o, PyBytes_AS_STRING(raw_body), n)
    return out


def encode_traced_response(uint64_t internal_id, uint64_t trace_id, uint64_t offset, uint32_t size):
    """The HA traced reply frame: ``OK`` + id + trace id + offset + size (frame size 34)."""
    cdef bytes data = PyBytes_FromStringAndSize(NULL, C_TRACED_SIZE)
    cdef char* o = PyBytes_AS_STRING(data)
    o[0] = b'O'
    o[1] = b'K'
    _store_u64(o + 2, internal_id)
    _store_u64(o + 10, trace_id)
    _store_u64(o + 18, offset)
    _store_u32(o + 26, size)
    return _encode_frame(C_FRAME_RESPONSE, data)


def fits_one_mpub(list bodies, Py_ssize_t limit, Py_ssize_t max_count, Py_ssize_t max_msg_size):
    """Whether ``bodies`` is the common batch: all ``bytes``, none empty or above
    ``max_msg_size``, at most ``max_count`` of them and ``limit`` bytes framed (4 per body).
    One C pass, nothing copied; False sends a batch to the per-item path, which splits it
    or raises the precise error."""
    cdef Py_ssize_t count = len(bodies)
    cdef Py_ssize_t i, n
    cdef Py_ssize_t total = 0
    cdef object body
    if count == 0 or count > max_count:
        return False
    for i in range(count):
        body = bodies[i]
        if type(body) is not bytes:
            return False
        n = PyBytes_GET_SIZE(body)
        if n == 0 or n > max_msg_size:
            return False
        total += 4 + n
        if total > limit:
            return False
    return True


def decode_mpub(body, Py_ssize_t max_msg_size, Py_ssize_t max_body_size):
    """Split an MPUB body into its messages as nsqd's readMPUB does (see ``_frame.pyi``)."""
    cdef bytes raw = body if type(body) is bytes else bytes(body)
    cdef const char* p = PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
    cdef Py_ssize_t pos = 4
    cdef int32_t count, size, i
    if n < 4:
        raise ValueError("E_BAD_BODY", "MPUB failed to read message count")
    count = <int32_t>_load_u32(p)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise ValueError("E_BAD_BODY", f"MPUB invalid message count {count}")
    cdef list messages = []
    for i in range(count):
        if pos + 4 > n:
            raise ValueError("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        size = <int32_t>_load_u32(p + pos)
        pos += 4
        if size <= 0:
            raise ValueError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise ValueError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        if pos + size > n:
            raise ValueError("E_BAD_MESSAGE", "MPUB failed to read message body")
        messages.append(PyBytes_FromStringAndSize(p + pos, size))
        pos += size
    return messages


# ---- messages as columns -------------------------------------------------------------------

cdef const char* _HEX_DIGITS = b"0123456789abcdef"


def message_columns(messages, bint hex_ids, Py_ssize_t max_bytes=C_I32_MAX):
    """The fields of ``messages`` as flat buffers, Arrow's layouts (see ``_frame.pyi``)."""
    cdef list items = messages if type(messages) is list else list(messages)
    cdef Py_ssize_t n = len(items)
    cdef Py_ssize_t i, size
    cdef Py_ssize_t body_total = 0, address_total = 0
    cdef Py_ssize_t id_width = 32 if hex_ids else 16
    cdef Message msg
    cdef object address, last_address = None
    cdef const char* text = NULL
    cdef Py_ssize_t text_size = 0
    cdef bint addresses = True
    for i in range(n):
        msg = <Message?>items[i]
        body_total += PyBytes_GET_SIZE(msg.body)
        address = msg.address
        if type(address) is not str:
            addresses = False
        elif addresses:
            if address is not last_address:
                text = PyUnicode_AsUTF8AndSize(address, &text_size)
                last_address = address
            address_total += text_size
    if body_total > max_bytes or address_total > max_bytes or n * id_width > max_bytes:
        raise InvalidValueError(
            f"{n} messages take {max(body_total, address_total, n * id_width)} bytes in one column, "
            f"over the {max_bytes} an Arrow column with 32-bit offsets holds"
        )
    cdef bytes id_offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes ids = PyBytes_FromStringAndSize(NULL, n * id_width)
    cdef bytes timestamps = PyBytes_FromStringAndSize(NULL, 8 * n)
    cdef bytes attempts = PyBytes_FromStringAndSize(NULL, 4 * n)
    cdef bytes body_offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes bodies = PyBytes_FromStringAndSize(NULL, body_total)
    cdef int32_t* id_off = <int32_t*>PyBytes_AS_STRING(id_offsets)
    cdef unsigned char* id_out = <unsigned char*>PyBytes_AS_STRING(ids)
    cdef int64_t* ts_out = <int64_t*>PyBytes_AS_STRING(timestamps)
    cdef int32_t* att_out = <int32_t*>PyBytes_AS_STRING(attempts)
    cdef int32_t* body_off = <int32_t*>PyBytes_AS_STRING(body_offsets)
    cdef char* body_out = PyBytes_AS_STRING(bodies)
    cdef Py_ssize_t at = 0, j
    cdef unsigned char byte
    id_off[0] = 0
    body_off[0] = 0
    for i in range(n):
        msg = <Message>items[i]
        if hex_ids:
            for j in range(16):
                byte = <unsigned char>msg._id[j]
                id_out[32 * i + 2 * j] = _HEX_DIGITS[byte >> 4]
                id_out[32 * i + 2 * j + 1] = _HEX_DIGITS[byte & 15]
        else:
            memcpy(id_out + 16 * i, msg._id, 16)
        id_off[i + 1] = <int32_t>(id_width * (i + 1))
        # nsqd stamps nanoseconds; Spark's timestamps are microseconds.
        ts_out[i] = msg.timestamp // 1000
        att_out[i] = msg.attempts
        size = PyBytes_GET_SIZE(msg.body)
        memcpy(body_out + at, PyBytes_AS_STRING(msg.body), size)
        at += size
        body_off[i + 1] = <int32_t>at
    if not addresses:
        return id_offsets, ids, timestamps, attempts, body_offsets, bodies, None, None
    cdef bytes address_offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1))
    cdef bytes address_data = PyBytes_FromStringAndSize(NULL, address_total)
    cdef int32_t* addr_off = <int32_t*>PyBytes_AS_STRING(address_offsets)
    cdef char* addr_out = PyBytes_AS_STRING(address_data)
    last_address = None
    at = 0
    addr_off[0] = 0
    for i in range(n):
        address = (<Message>items[i]).address
        if address is not last_address:
            text = PyUnicode_AsUTF8AndSize(address, &text_size)
            last_address = address
        memcpy(addr_out + at, text, text_size)
        at += text_size
        addr_off[i + 1] = <int32_t>at
    return id_offsets, ids, timestamps, attempts, body_offsets, bodies, address_offsets, address_data
