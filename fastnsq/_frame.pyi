"""The NSQ wire codec: frames from nsqd, commands to nsqd, and the server side.

Two implementations share this API: the C extension ``fastnsq._frame`` (the
default) and the pure-Python ``fastnsq._frame_py``. ``fastnsq.codec`` picks one.
Nothing here knows about asyncio, sockets or policy: bytes go in, frames and
commands come out.
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeAlias

from .errors import ProtocolError as ProtocolError

BytesLike: TypeAlias = bytes | bytearray | memoryview
Body: TypeAlias = bytes | bytearray | memoryview | str

IMPLEMENTATION: str  # "c" or "python"

FRAME_RESPONSE: int  # 0
FRAME_ERROR: int  # 1
FRAME_MESSAGE: int  # 2

# Message layouts, combined with |. Fixed per connection by what it sent
# (youzan/nsq's protocol, docs/ha.md): upstream hex ids; HA binary ids; the HA ext header
# (IDENTIFY extend_support on an ext topic); the HA offset/size header
# (SUB_ORDERED / SUB_ADVANCED). Ext comes before offset when both are set.
LAYOUT_UPSTREAM: int  # 0
LAYOUT_HA_ID: int  # 1
LAYOUT_EXT: int  # 2
LAYOUT_OFFSET: int  # 4

MAGIC_V2: bytes  # b"  V2"
OK: bytes  # b"OK"
HEARTBEAT: bytes  # b"_heartbeat_"
CLOSE_WAIT: bytes  # b"CLOSE_WAIT"

DEFAULT_MAX_MSG_SIZE: int  # 1048576, nsqd --max-msg-size
DEFAULT_MAX_BODY_SIZE: int  # 5242880, nsqd --max-body-size
DEFAULT_MAX_RDY_COUNT: int  # 2500, nsqd --max-rdy-count
DEFAULT_MAX_REQ_TIMEOUT: int  # 3600000 ms, upstream nsqd --max-req-timeout
DEFAULT_MAX_FRAME_SIZE: int  # max message + the largest headers + 4-byte type
MESSAGE_HEADER_SIZE: int  # 26

def valid_topic_name(name: str) -> bool: ...
def valid_channel_name(name: str) -> bool: ...

class TracedResponse(NamedTuple):
    """The HA 30-byte answer of PUB_TRACE / MPUB_TRACE / PUB_EXT with a trace id."""

    internal_id: int
    trace_id: int
    offset: int
    size: int

class Message:
    """One message from nsqd. Kept alive by the user as long as needed.

    ``id`` is the 16 bytes as received and is echoed verbatim in FIN/REQ/TOUCH.
    ``finish``/``requeue``/``touch`` go to ``delegate`` (the consumer's connection),
    once: a second answer raises ``RuntimeError``.
    """

    timestamp: int  # ns since the epoch
    attempts: int
    id: bytes
    body: bytes
    internal_id: int | None  # HA binary ids only
    trace_id: int | None  # HA binary ids only
    ext_version: int  # 0: no ext header
    ext_bytes: bytes | None  # the raw ext header payload
    ext: Any  # ext_bytes parsed as JSON for ext_version 4, else None
    offset: int | None  # HA SUB_ORDERED / SUB_ADVANCED only
    raw_size: int | None  # HA SUB_ORDERED / SUB_ADVANCED only
    partition: int | None  # the HA partition of the connection that received it
    address: str | None  # the nsqd ("host:port") whose connection received it
    delegate: Any
    has_responded: bool
    auto_response: bool
    def __init__(
        self,
        timestamp: int,
        attempts: int,
        id: bytes,
        body: bytes,
        *,
        ha: bool = ...,
        ext_version: int = ...,
        ext_bytes: bytes | None = ...,
        offset: int | None = ...,
        raw_size: int | None = ...,
        partition: int | None = ...,
        address: str | None = ...,
    ) -> None: ...
    def finish(self) -> None: ...
    def requeue(self, delay: float | None = None, backoff: bool = True) -> None: ...
    def touch(self) -> None: ...
    def disable_auto_response(self) -> None: ...
    def _replace_body(self, body: bytes, ext_bytes: bytes | None) -> None:
        """Client-side decompression (``fastnsq.bodies``) puts what was published in place."""

OnMessage: TypeAlias = Callable[[Message], object]
OnResponse: TypeAlias = Callable[[bytes | TracedResponse], object]
OnError: TypeAlias = Callable[[str, str], object]

class FrameReader:
    """Splits nsqd's frame stream; plugs into ``asyncio.BufferedProtocol``.

    ``get_buffer`` hands out the free tail of memory the reader owns;
    ``buffer_updated(n)`` splits every complete frame and calls ``on_message``,
    ``on_response`` (bytes, or a TracedResponse for the HA 30-byte reply) or
    ``on_error(code, description)``. ``feed`` copies bytes in (decompressed
    streams, tests). ``pause`` stops splitting after the current frame (IDENTIFY
    upgrades); ``take_unparsed`` hands back what was not split yet.
    Raises ``ProtocolError`` for a stream that is not NSQ.
    """

    layout: int
    delegate: Any
    partition: int | None  # stamped on every Message (the HA partition subscribed to)
    address: str | None  # stamped on every Message (the nsqd this connection talks to)
    max_frame_size: int
    def __init__(
        self,
        on_message: OnMessage,
        on_response: OnResponse,
        on_error: OnError,
        *,
        layout: int = ...,
        max_frame_size: int = ...,
        initial_size: int = ...,
    ) -> None: ...
    def get_buffer(self, sizehint: int) -> memoryview: ...
    def buffer_updated(self, nbytes: int) -> None: ...
    def feed(self, data: BytesLike) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def take_unparsed(self) -> bytes: ...
    @property
    def paused(self) -> bool: ...
    @property
    def buffered(self) -> int: ...
    @property
    def capacity(self) -> int: ...

class WriteBuffer:
    """One connection's outgoing commands, encoded and validated.

    Every method appends one command; ``take()`` returns everything written so
    far as one ``bytes`` for one ``transport.write``. Names, sizes and ranges are
    checked before a byte is written (``InvalidValueError`` naming the value and
    the limit); a failed call leaves the buffer unchanged.
    """

    max_msg_size: int
    max_body_size: int
    max_rdy_count: int
    max_req_timeout: int
    def __init__(
        self,
        *,
        max_msg_size: int = ...,
        max_body_size: int = ...,
        max_rdy_count: int = ...,
        max_req_timeout: int = ...,
        initial_size: int = ...,
    ) -> None: ...
    def __len__(self) -> int: ...
    def take(self) -> bytes: ...
    def clear(self) -> None: ...
    def magic(self) -> None: ...
    def identify(self, body: BytesLike) -> None: ...
    def auth(self, secret: Body) -> None: ...
    def sub(self, topic: str, channel: str, partition: int | None = None) -> None: ...
    def sub_ordered(self, topic: str, channel: str, partition: int | None) -> None: ...
    def sub_advanced(
        self, topic: str, channel: str, partition: int | None = None, position: str | None = None
    ) -> None: ...
    def rdy(self, count: int) -> None: ...
    def fin(self, message_id: bytes | Message) -> None: ...
    def req(self, message_id: bytes | Message, delay_ms: int) -> None: ...
    def touch(self, message_id: bytes | Message) -> None: ...
    def cls(self) -> None: ...
    def nop(self) -> None: ...
    def pub(self, topic: str, body: Body, partition: int | None = None) -> None: ...
    def mpub(self, topic: str, bodies: Sequence[Body], partition: int | None = None) -> None: ...
    def dpub(self, topic: str, defer_ms: int, body: Body) -> None: ...
    def pub_trace(self, topic: str, partition: int | None, trace_id: int, body: Body) -> None: ...
    def mpub_trace(
        self, topic: str, partition: int | None, items: Sequence[tuple[int, Body]]
    ) -> None: ...
    def pub_ext(self, topic: str, partition: int | None, ext: BytesLike, body: Body) -> None: ...
    def mpub_ext(
        self, topic: str, partition: int | None, items: Sequence[tuple[BytesLike, Body]]
    ) -> None: ...
    def internal_create_topic(self, topic: str, partition: int, ext: bool | None = None) -> None: ...

# ---- server side (the embedded nsqd) -------------------------------------------------

#: Commands followed by a u32 length and a body.
BODY_COMMANDS: frozenset[bytes]

OnCommand: TypeAlias = Callable[[bytes, list[bytes], bytes | int | None], object]

class CommandReader:
    """Splits a client's command stream (the server side of the protocol).

    Calls ``on_command(name, params, body)``: ``body`` is ``None`` for commands
    without one, the bytes for those with one, or the declared length (an int)
    when it is ``<= 0`` or above the command's limit (``max_msg_size`` for the
    PUB family, ``max_body_size`` for MPUB, IDENTIFY and AUTH); the reader then
    stops, as nsqd answers with a fatal error without reading the body.
    With ``binary_ids`` FIN/REQ/TOUCH ids are read as 16 raw bytes (HA server).
    A line longer than ``max_line`` raises ``ProtocolError``.
    """

    binary_ids: bool
    max_line: int
    max_msg_size: int
    max_body_size: int
    def __init__(
        self,
        on_command: OnCommand,
        *,
        on_magic: Callable[[bytes], object] | None = ...,
        binary_ids: bool = ...,
        max_line: int = ...,
        max_msg_size: int = ...,
        max_body_size: int = ...,
    ) -> None: ...
    def get_buffer(self, sizehint: int) -> memoryview: ...
    def buffer_updated(self, nbytes: int) -> None: ...
    def feed(self, data: BytesLike) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def take_unparsed(self) -> bytes: ...
    @property
    def paused(self) -> bool: ...
    @property
    def buffered(self) -> int: ...

def encode_response(data: BytesLike) -> bytes: ...
def encode_error(text: BytesLike) -> bytes: ...
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
) -> bytes: ...
def encode_traced_response(internal_id: int, trace_id: int, offset: int, size: int) -> bytes: ...
def fits_one_mpub(bodies: list[Any], limit: int, max_count: int, max_msg_size: int) -> bool:
    """Whether ``bodies`` is the common MPUB batch: all ``bytes``, none empty or above
    ``max_msg_size``, at most ``max_count`` and ``limit`` bytes framed (4 per body)."""
def decode_mpub(body: BytesLike, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """Split an MPUB body into its messages as nsqd's readMPUB does.

    Raises ``ValueError(code, description)`` with nsqd's code (``E_BAD_BODY`` for a
    bad count, ``E_BAD_MESSAGE`` for a bad message length or a short body).
    """
def decode_traced_response(data: BytesLike) -> TracedResponse: ...
def message_columns(
    messages: Sequence[Message], hex_ids: bool, max_bytes: int = ...
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes | None, bytes | None]:
    """The fields of ``messages`` as flat buffers in Arrow's layouts (native byte order), for
    building columns without a Python call per message:

    ``(id_offsets, ids, timestamps, attempts, body_offsets, bodies, address_offsets, addresses)``:
    ids as text (16 characters; with ``hex_ids``, the 16 id bytes as 32 hex digits: HA ids),
    int32 offsets (``n + 1``); timestamps as int64 microseconds (nsqd's nanoseconds // 1000);
    attempts as int32; bodies and their int32 offsets; the address of the connection each
    message came on, UTF-8 with int32 offsets, or ``(None, None)`` when a message has none.
    Raises ``InvalidValueError`` when a column would exceed ``max_bytes`` (32-bit offsets).
    """
