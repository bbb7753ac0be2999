"""The stream transforms NSQ switches on after IDENTIFY: snappy framing and raw deflate.

Once IDENTIFY has negotiated ``snappy`` or ``deflate`` (nsq's TCP protocol spec, IDENTIFY), every
byte after the IDENTIFY response goes through one of these streams, in both
directions. This module turns plain bytes into the compressed stream and back,
incrementally: callers push whatever the socket gave them and get back whatever
plain bytes it completes. It knows nothing about NSQ frames; the frame codec
runs on top of its output.

- :class:`SnappyStream`: the snappy *framing format* (a stream identifier chunk,
  then chunks carrying a masked CRC-32C), as written by golang/snappy in nsqd.
- :class:`DeflateStream`: raw DEFLATE (no zlib header), one sync flush per write,
  as Go's ``compress/flate`` does in nsqd.

Both satisfy :class:`CompressionStream`; :func:`make_stream` builds one by name.
Block compression comes from cramjam (the engine under python-snappy), the
checksum from google-crc32c, DEFLATE from zlib.

Decompression bombs: ``decompress`` never returns (nor allocates) more than
``max_output`` bytes for one call and raises :class:`~fastnsq.errors.ProtocolError`
instead. The default, :data:`DEFAULT_MAX_OUTPUT`, is chosen so that a caller
that reads at most :data:`GUARD_FREE_READ_SIZE` compressed bytes per call can
never trip it with legitimate data, whatever that data is (see its comment).
"""

from __future__ import annotations

import zlib
from typing import ClassVar, Protocol, TypeAlias

import cramjam
import google_crc32c

from fastnsq.errors import InvalidValueError, ProtocolError

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "DEFLATE_MAX_RATIO",
    "GUARD_FREE_READ_SIZE",
    "SNAPPY_STREAM_IDENTIFIER",
    "BytesLike",
    "CompressionStream",
    "DeflateStream",
    "SnappyStream",
    "make_stream",
]

BytesLike: TypeAlias = bytes | bytearray | memoryview

#: Raw DEFLATE cannot expand more than this: a 258-byte match coded in 2 bits.
DEFLATE_MAX_RATIO = 1032

#: Reads of at most this many compressed bytes never trip the default guard.
GUARD_FREE_READ_SIZE = 64 * 1024

#: Default ceiling on the plain bytes one ``decompress`` call may return.
#:
#: Why this number: one read can legitimately hold a whole maximal frame (an MPUB
#: of nsqd's default 5 MiB ``--max-body-size`` compresses to a few KiB when its
#: body is repetitive) and, pipelined, several of them, so the limit cannot be a
#: single frame. What does bound legitimate output is the input: DEFLATE expands
#: at most :data:`DEFLATE_MAX_RATIO` times (snappy about 21 times), plus one
#: 258-byte match begun in the previous read. So 65 MiB is above
#: ``1032 * 64 KiB + 258``: a caller reading <= 64 KiB per call is never refused
#: for legitimate data, while a caller handing over larger reads still cannot be
#: made to allocate more than 65 MiB (about 12 maximal MPUB frames) at once.
DEFAULT_MAX_OUTPUT = 65 * 1024 * 1024

#: The chunk every snappy framing stream starts with: type 0xff, length 6, "sNaPpY".
SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"

_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_FIRST_UNSKIPPABLE_RESERVED = 0x02
_CHUNK_FIRST_SKIPPABLE = 0x80  # 0x80-0xfd skippable, 0xfe padding: all skipped
_CHUNK_STREAM_IDENTIFIER = 0xFF
_IDENTIFIER_BODY = SNAPPY_STREAM_IDENTIFIER[4:]
_HEADER_SIZE = 4  # type (1) + little-endian length (3)
_CRC_SIZE = 4
_MAX_BLOCK_SIZE = 65536  # the framing format's limit on plain bytes per chunk
# snappy's MaxEncodedLen(65536): the largest block that can encode 64 KiB.
_MAX_COMPRESSED_BLOCK_SIZE = 32 + _MAX_BLOCK_SIZE + _MAX_BLOCK_SIZE // 6
_CRC_MASK_DELTA = 0xA282EAD8


class CompressionStream(Protocol):
    """What both streams offer, so a connection can hold either one.

    Example::

        stream: CompressionStream = make_stream("deflate", level=6)
        wire = stream.compress(b"NOP\\n")
    """

    def compress(self, data: BytesLike) -> bytes:
        """Return the compressed bytes for one write, ready for the socket."""
        ...

    def decompress(self, data: BytesLike, max_output: int | None = None) -> bytes:
        """Consume compressed bytes; return the plain bytes they complete."""
        ...


def make_stream(kind: str, level: int = 6, *, max_output: int = DEFAULT_MAX_OUTPUT) -> CompressionStream:
    """Build the stream IDENTIFY negotiated: ``"snappy"`` or ``"deflate"``.

    ``level`` is the deflate level (ignored for snappy). ``max_output`` is the
    default per-call ceiling of ``decompress`` (see :data:`DEFAULT_MAX_OUTPUT`).

    >>> make_stream("snappy").compress(b"NOP\\n")[:10] == SNAPPY_STREAM_IDENTIFIER
    True
    """
    if kind == "snappy":
        return SnappyStream(max_output=max_output)
    if kind == "deflate":
        return DeflateStream(level, max_output=max_output)
    raise InvalidValueError(f"compression kind must be 'snappy' or 'deflate', got {kind!r}")


def _check_max_output(max_output: int) -> int:
    if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1:
        raise InvalidValueError(f"max_output must be a positive number of bytes, got {max_output!r}")
    return max_output


def _byte_view(view: memoryview) -> memoryview:
    """``view`` as flat unsigned bytes (a cast only for exotic formats)."""
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _masked_crc(data: bytes) -> int:
    """The framing format's checksum: CRC-32C, rotated right 15 bits, plus a constant."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


class _Failed:
    """Remembers the first error so a broken stream keeps refusing input."""

    __slots__ = ("message",)

    def __init__(self) -> None:
        self.message: str | None = None

    def check(self, kind: str) -> None:
        if self.message is not None:
            raise ProtocolError(f"{kind} stream is unusable after an earlier error: {self.message}")


class SnappyStream:
    """Both directions of one snappy framing stream (one per connection).

    ``compress`` writes the stream identifier once, before the first chunk, then
    chunks of at most 64 KiB of plain data each, like golang/snappy's writer in
    nsqd. ``decompress`` accepts any split of its input, one byte at a time
    included; it requires the identifier first, accepts it again anywhere, skips
    padding and skippable chunks and checks every CRC. It keeps no reference to
    the buffers it is given, and holds at most one incomplete chunk between calls
    (skippable chunks are dropped as they arrive, never buffered).

    Any protocol violation raises :class:`~fastnsq.errors.ProtocolError`; the
    stream then refuses all further input.

    >>> writer, reader = SnappyStream(), SnappyStream()
    >>> wire = writer.compress(b"PUB t\\n") + writer.compress(b"\\x00\\x00\\x00\\x01x")
    >>> reader.decompress(wire[:7]) + reader.decompress(wire[7:])
    b'PUB t\\n\\x00\\x00\\x00\\x01x'
    """

    kind: ClassVar[str] = "snappy"

    def __init__(self, *, max_output: int = DEFAULT_MAX_OUTPUT) -> None:
        self._max_output = _check_max_output(max_output)
        self._encoder = cramjam.snappy.Compressor()
        self._sent_identifier = False
        self._seen_identifier = False
        # The start of a chunk not yet complete: header and/or part of its body.
        self._pending = bytearray()
        # Bytes of a skippable chunk still to drop.
        self._skip = 0
        # Plain bytes produced during the current decompress call.
        self._produced = 0
        self._failed = _Failed()

    # -- writing ---------------------------------------------------------

    def compress(self, data: BytesLike) -> bytes:
        """Return framed chunks for one write (the identifier too, if first).

        Empty input returns ``b""``. Passing ``bytes`` avoids one copy (cramjam's
        encoder accepts nothing else).
        """
        if len(data) == 0:
            return b""
        self._encoder.compress(data if type(data) is bytes else bytes(data))
        out = bytes(self._encoder.flush())
        # cramjam 2.x writes the identifier on the first flush only; hold it to
        # that in case another version writes it per flush or not at all.
        starts_with_identifier = out[:10] == SNAPPY_STREAM_IDENTIFIER
        if self._sent_identifier:
            if starts_with_identifier:
                out = out[10:]
        elif not starts_with_identifier:
            out = SNAPPY_STREAM_IDENTIFIER + out
        self._sent_identifier = True
        return out

    # -- reading ---------------------------------------------------------

    def decompress(self, data: BytesLike, max_output: int | None = None) -> bytes:
        """Consume stream bytes; return the plain bytes of the chunks they complete.

        ``max_output`` (default: the stream's) caps what this one call may
        return; more raises ProtocolError before it is allocated.
        """
        self._failed.check(self.kind)
        limit = self._max_output if max_output is None else _check_max_output(max_output)
        error: str
        # The views are released on the way out, even on error, so that a
        # caller's bytearray can be resized again (a traceback would pin them).
        with memoryview(data) as raw, _byte_view(raw) as view:
            try:
                return self._decode(view, limit)
            except ProtocolError as exc:
                error = str(exc)
        self._failed.message = error
        raise ProtocolError(error)

    def _decode(self, view: memoryview, limit: int) -> bytes:
        out: list[bytes] = []
        self._produced = 0
        end = len(view)
        pos = min(self._skip, end)
        self._skip -= pos
        if self._pending and pos < end:
            pos = self._fill_pending(view, pos, limit, out)
        while pos < end:
            if end - pos < _HEADER_SIZE:
                self._check_first_byte(view[pos])
                self._pending += view[pos:end]
                break
            ctype = view[pos]
            length = view[pos + 1] | (view[pos + 2] << 8) | (view[pos + 3] << 16)
            self._check_header(ctype, length)
            body_start = pos + _HEADER_SIZE
            if ctype >= _CHUNK_FIRST_SKIPPABLE and ctype != _CHUNK_STREAM_IDENTIFIER:
                pos = min(body_start + length, end)
                self._skip = body_start + length - pos
            elif end - body_start < length:
                self._pending += view[pos:end]
                break
            else:
                self._on_chunk(ctype, view[body_start : body_start + length], limit, out)
                pos = body_start + length
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _fill_pending(self, view: memoryview, pos: int, limit: int, out: list[bytes]) -> int:
        """Complete the buffered chunk from ``view[pos:]``; return the new position."""
        pending = self._pending
        end = len(view)
        if len(pending) < _HEADER_SIZE:
            take = min(_HEADER_SIZE - len(pending), end - pos)
            pending += view[pos : pos + take]
            pos += take
            if len(pending) < _HEADER_SIZE:
                return pos
            ctype = pending[0]
            length = pending[1] | (pending[2] << 8) | (pending[3] << 16)
            self._check_header(ctype, length)
            if ctype >= _CHUNK_FIRST_SKIPPABLE and ctype != _CHUNK_STREAM_IDENTIFIER:
                pending.clear()
                dropped = min(length, end - pos)
                self._skip = length - dropped
                return pos + dropped
        length = pending[1] | (pending[2] << 8) | (pending[3] << 16)
        take = min(_HEADER_SIZE + length - len(pending), end - pos)
        pending += view[pos : pos + take]
        pos += take
        if len(pending) == _HEADER_SIZE + length:
            chunk = bytes(pending)
            pending.clear()
            self._on_chunk(chunk[0], memoryview(chunk)[_HEADER_SIZE:], limit, out)
        return pos

    def _check_first_byte(self, ctype: int) -> None:
        """Refuse a stream that does not open with the identifier as early as possible."""
        if not self._seen_identifier and ctype != _CHUNK_STREAM_IDENTIFIER:
            raise ProtocolError(
                f"snappy stream does not start with the stream identifier chunk (first chunk type 0x{ctype:02x})"
            )

    def _check_header(self, ctype: int, length: int) -> None:
        """Validate a chunk header before any of its body is buffered."""
        self._check_first_byte(ctype)
        if ctype == _CHUNK_STREAM_IDENTIFIER:
            if length != len(_IDENTIFIER_BODY):
                raise ProtocolError(f"snappy stream identifier chunk has length {length}, expected 6")
        elif ctype == _CHUNK_COMPRESSED:
            if not _CRC_SIZE < length <= _CRC_SIZE + _MAX_COMPRESSED_BLOCK_SIZE:
                raise ProtocolError(
                    f"snappy compressed chunk has length {length}, "
                    f"outside 5..{_CRC_SIZE + _MAX_COMPRESSED_BLOCK_SIZE}"
                )
        elif ctype == _CHUNK_UNCOMPRESSED:
            if not _CRC_SIZE <= length <= _CRC_SIZE + _MAX_BLOCK_SIZE:
                raise ProtocolError(
                    f"snappy uncompressed chunk has length {length}, outside 4..{_CRC_SIZE + _MAX_BLOCK_SIZE}"
                )
        elif ctype < _CHUNK_FIRST_SKIPPABLE:
            raise ProtocolError(f"snappy stream has a reserved unskippable chunk type 0x{ctype:02x}")

    def _on_chunk(self, ctype: int, body: memoryview, limit: int, out: list[bytes]) -> None:
        """Handle one complete identifier or data chunk (header already checked)."""
        if ctype == _CHUNK_STREAM_IDENTIFIER:
            if body != _IDENTIFIER_BODY:
                raise ProtocolError(
                    f"snappy stream identifier chunk holds {bytes(body)!r}, expected b'sNaPpY'"
                )
            self._seen_identifier = True
            return
        expected_crc = int.from_bytes(body[:_CRC_SIZE], "little")
        payload = body[_CRC_SIZE:]
        if ctype == _CHUNK_COMPRESSED:
            plain = self._decode_block(payload, limit)
        else:
            self._reserve(len(payload), limit)
            plain = bytes(payload)
        actual_crc = _masked_crc(plain)
        if actual_crc != expected_crc:
            raise ProtocolError(
                f"snappy chunk CRC-32C mismatch: the chunk says 0x{expected_crc:08x}, "
                f"its {len(plain)} plain bytes give 0x{actual_crc:08x}"
            )
        if plain:
            out.append(plain)

    def _decode_block(self, block: memoryview, limit: int) -> bytes:
        try:
            size = cramjam.snappy.decompress_raw_len(block)
        except cramjam.DecompressionError as exc:
            raise ProtocolError(f"snappy compressed chunk has an invalid block header: {exc}") from None
        if size > _MAX_BLOCK_SIZE:
            raise ProtocolError(
                f"snappy compressed chunk claims {size} plain bytes, more than {_MAX_BLOCK_SIZE}"
            )
        self._reserve(size, limit)
        try:
            return bytes(cramjam.snappy.decompress_raw(block))
        except cramjam.DecompressionError as exc:
            raise ProtocolError(f"snappy compressed chunk holds an invalid snappy block: {exc}") from None

    def _reserve(self, size: int, limit: int) -> None:
        """Count ``size`` more plain bytes against this call's ceiling, or refuse."""
        self._produced += size
        if self._produced > limit:
            raise ProtocolError(
                f"snappy stream: one decompress call would yield more than max_output={limit} bytes"
            )


class DeflateStream:
    """Both directions of one raw DEFLATE stream (one per connection).

    ``compress`` ends every write with a sync flush (the empty stored block
    ``00 00 ff ff``), so the peer can decode each write as soon as it arrives;
    nsqd and go-nsq flush the same way. ``decompress`` accepts any split of its
    input and keeps no reference to the buffers it is given.

    ``level`` is the zlib level, 0..9 (nsqd negotiates 1..9, at most its
    ``--max-deflate-level``, 6 by default).

    >>> writer, reader = DeflateStream(6), DeflateStream(6)
    >>> wire = writer.compress(b"NOP\\n")
    >>> wire.endswith(b"\\x00\\x00\\xff\\xff"), reader.decompress(wire)
    (True, b'NOP\\n')
    """

    kind: ClassVar[str] = "deflate"

    def __init__(self, level: int = 6, *, max_output: int = DEFAULT_MAX_OUTPUT) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 9:
            raise InvalidValueError(f"deflate level must be an integer in 0..9, got {level!r}")
        self.level = level
        self._max_output = _check_max_output(max_output)
        self._encoder = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
        self._failed = _Failed()

    def compress(self, data: BytesLike) -> bytes:
        """Return the deflated bytes for one write, ending with a sync flush.

        Empty input returns ``b""`` (no flush marker: nothing was written).
        """
        if len(data) == 0:
            return b""
        head = self._encoder.compress(data)
        tail = self._encoder.flush(zlib.Z_SYNC_FLUSH)
        return head + tail if head else tail

    def decompress(self, data: BytesLike, max_output: int | None = None) -> bytes:
        """Consume deflated bytes; return the plain bytes they complete.

        ``max_output`` (default: the stream's) caps what this one call may
        return; zlib stops one byte past it, so a bomb is refused after at most
        that much work and memory.
        """
        self._failed.check(self.kind)
        limit = self._max_output if max_output is None else _check_max_output(max_output)
        try:
            return self._decode(data, limit)
        except ProtocolError as exc:
            self._failed.message = str(exc)
            raise

    def _decode(self, data: BytesLike, limit: int) -> bytes:
        decoder = self._decoder
        if decoder.eof:
            if len(data):
                raise ProtocolError("deflate stream: data after the final block")
            return b""
        try:
            plain = decoder.decompress(data, limit + 1)
        except zlib.error as exc:
            raise ProtocolError(f"deflate stream is corrupt: {exc}") from None
        if len(plain) > limit or decoder.unconsumed_tail:
            raise ProtocolError(
                f"deflate stream: one decompress call would yield more than max_output={limit} bytes"
            )
        if decoder.unused_data:
            raise ProtocolError("deflate stream: data after the final block")
        return plain
