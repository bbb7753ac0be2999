"""Tests of fastnsq.compression: the snappy framing stream and the raw deflate stream.

Ground truth is the real nsqd 1.3.0 conversations in tests/captures; independent
decoders (python-snappy, cramjam, zlib) check what our encoders write.
"""

from __future__ import annotations

import io
import itertools
import json
import random
import re
import zlib
from typing import Any

import cramjam
import pytest
import snappy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastnsq.compression import (
    DEFAULT_MAX_OUTPUT,
    DEFLATE_MAX_RATIO,
    GUARD_FREE_READ_SIZE,
    SNAPPY_STREAM_IDENTIFIER,
    CompressionStream,
    DeflateStream,
    SnappyStream,
    make_stream,
)
from fastnsq.errors import InvalidValueError, ProtocolError
from fastnsq.testing.nsqd import MASTER

from .captures import DIRECTORIES

CAPTURES = DIRECTORIES[MASTER]
OK_FRAME = bytes.fromhex("00000006000000004f4b")
SYNC_FLUSH_MARKER = b"\x00\x00\xff\xff"


# -- helpers -----------------------------------------------------------------


def load_capture(name: str) -> dict[str, Any]:
    with open(CAPTURES / f"{name}.json", encoding="utf-8") as f:
        capture: dict[str, Any] = json.load(f)
    return capture


def new_stream(kind: str) -> CompressionStream:
    return make_stream(kind, level=6)


def feed_in_pieces(stream: CompressionStream, wire: bytes, cuts: list[int]) -> bytes:
    """Decompress ``wire`` cut at the given offsets, one call per piece."""
    bounds = [0, *sorted(set(cuts)), len(wire)]
    return b"".join(stream.decompress(wire[a:b]) for a, b in itertools.pairwise(bounds))


def snappy_chunks(wire: bytes) -> list[tuple[int, bytes]]:
    """Split a framing stream into (type, body) pairs; the stream must be whole."""
    chunks = []
    pos = 0
    while pos < len(wire):
        length = int.from_bytes(wire[pos + 1 : pos + 4], "little")
        chunks.append((wire[pos], wire[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert pos == len(wire)
    return chunks


def masked_crc(data: bytes) -> int:
    """Reference for the snappy checksum: recover it from a stream cramjam wrote."""
    if not data:
        return 0xA282EAD8  # CRC-32C of nothing is 0; masking adds the constant
    encoder = cramjam.snappy.Compressor()
    encoder.compress(data)
    wire = bytes(encoder.flush())
    return int.from_bytes(wire[14:18], "little")


def uncompressed_chunk(data: bytes, crc: int | None = None) -> bytes:
    crc = masked_crc(data) if crc is None else crc
    return b"\x01" + (len(data) + 4).to_bytes(3, "little") + crc.to_bytes(4, "little") + data


def pub_command(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + len(body).to_bytes(4, "big") + body


def expected_pub(why: str) -> bytes:
    """Rebuild the plain command a capture step's ``why`` describes."""
    match = re.search(r"PUB (\S+) '([^']*)'", why)
    assert match, why
    return pub_command(match.group(1), match.group(2).encode())


# chunked data that is sometimes compressible, sometimes not
writes_strategy = st.lists(
    st.one_of(
        st.binary(max_size=3000),
        st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=20), st.integers(1, 5000)),
    ),
    min_size=1,
    max_size=8,
)


# -- the captured nsqd conversations --------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ("identify_snappy", "snappy"),
        ("identify_deflate", "deflate"),
        ("snappy_publish", "snappy"),
        ("deflate_publish", "deflate"),
    ],
)
def test_capture_server_stream_decodes_to_ok_frames(scenario: str, kind: str) -> None:
    steps = load_capture(scenario)["steps"]
    recvs = [bytes.fromhex(step["recv"]) for step in steps if "recv" in step]
    first, later = recvs[0], recvs[1:]
    json_size = int.from_bytes(first[:4], "big")
    assert first[8 : 4 + json_size].startswith(b"{")
    server_stream = new_stream(kind)
    plain = [server_stream.decompress(first[4 + json_size :])]
    plain += [server_stream.decompress(recv) for recv in later]
    # every server write after the JSON is exactly one OK frame
    assert plain == [OK_FRAME] * len(recvs)


@pytest.mark.parametrize(("scenario", "kind"), [("snappy_publish", "snappy"), ("deflate_publish", "deflate")])
def test_capture_client_stream_decodes_to_described_commands(scenario: str, kind: str) -> None:
    steps = load_capture(scenario)["steps"]
    identify_index = next(i for i, step in enumerate(steps) if "IDENTIFY" in step.get("text", ""))
    compressed_sends = [step for step in steps[identify_index + 1 :] if "send" in step]
    assert compressed_sends
    client_stream = new_stream(kind)  # what the embedded server would read
    for step in compressed_sends:
        assert client_stream.decompress(bytes.fromhex(step["send"])) == expected_pub(step["why"])


def test_capture_snappy_publish_second_reply_has_no_identifier() -> None:
    recv_steps = [step for step in load_capture("snappy_publish")["steps"] if "recv" in step]
    assert not bytes.fromhex(recv_steps[1]["recv"]).startswith(SNAPPY_STREAM_IDENTIFIER)


def test_snappy_compress_reproduces_nsqd_bytes() -> None:
    # nsqd's first snappy write (identify_snappy) and its second (snappy_publish)
    steps = load_capture("snappy_publish")["steps"]
    recvs = [bytes.fromhex(step["recv"]) for step in steps if "recv" in step]
    json_size = int.from_bytes(recvs[0][:4], "big")
    server = SnappyStream()
    assert server.compress(OK_FRAME) == recvs[0][4 + json_size :]
    assert server.compress(OK_FRAME) == recvs[1]


def test_snappy_compress_reproduces_captured_client_bytes() -> None:
    step = next(s for s in load_capture("snappy_publish")["steps"] if "framed-snappy" in s.get("why", ""))
    assert SnappyStream().compress(expected_pub(step["why"])) == bytes.fromhex(step["send"])


def test_capture_streams_decode_one_byte_at_a_time() -> None:
    for scenario, kind in (("snappy_publish", "snappy"), ("deflate_publish", "deflate")):
        steps = load_capture(scenario)["steps"]
        identify_index = next(i for i, step in enumerate(steps) if "IDENTIFY" in step.get("text", ""))
        wire = b"".join(bytes.fromhex(s["send"]) for s in steps[identify_index + 1 :] if "send" in s)
        stream = new_stream(kind)
        assert b"".join(stream.decompress(wire[i : i + 1]) for i in range(len(wire))).startswith(
            b"PUB cap_topic\n"
        )


# -- round trips -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(writes=writes_strategy, data=st.data())
def test_round_trip_with_random_splits(kind: str, writes: list[bytes], data: st.DataObject) -> None:
    writer, reader = new_stream(kind), new_stream(kind)
    wire = b"".join(writer.compress(w) for w in writes)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=30))
    assert feed_in_pieces(reader, wire, cuts) == b"".join(writes)


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_round_trip_one_byte_at_a_time(kind: str) -> None:
    incompressible = random.Random(5).randbytes(70000)  # stored as uncompressed chunks
    writes = [bytes(range(256)) * 300, incompressible, b"x" * 70000, b"NOP\n", bytes(1000)]
    writer, reader = new_stream(kind), new_stream(kind)
    wire = b"".join(writer.compress(w) for w in writes)
    out = bytearray()
    for i in range(len(wire)):
        out += reader.decompress(memoryview(wire)[i : i + 1])
    assert out == b"".join(writes)


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_accepts_every_bytes_like(kind: str, wrap: Any) -> None:
    writer, reader = new_stream(kind), new_stream(kind)
    wire = writer.compress(wrap(b"PUB t\n\x00\x00\x00\x02hi"))
    assert reader.decompress(wrap(wire)) == b"PUB t\n\x00\x00\x00\x02hi"


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_empty_write_and_empty_read(kind: str) -> None:
    stream = new_stream(kind)
    assert stream.compress(b"") == b""
    assert stream.decompress(b"") == b""
    # after an empty write, the first real write still opens the stream properly
    wire = stream.compress(b"abc")
    assert new_stream(kind).decompress(wire) == b"abc"


# -- our output, read by independent decoders ------------------------------------


@settings(max_examples=40, deadline=None)
@given(writes=writes_strategy)
def test_snappy_output_read_by_python_snappy_and_cramjam(writes: list[bytes]) -> None:
    writer = SnappyStream()
    wire = b"".join(writer.compress(w) for w in writes)
    out = io.BytesIO()
    snappy.stream_decompress(io.BytesIO(wire), out)
    assert out.getvalue() == b"".join(writes)
    assert bytes(cramjam.snappy.decompress(wire)) == b"".join(writes)


def test_snappy_identifier_once_and_chunks_at_most_64k() -> None:
    writer = SnappyStream()
    first, second = writer.compress(bytes(range(256)) * 1000), writer.compress(b"y" * 200000)
    assert first.startswith(SNAPPY_STREAM_IDENTIFIER)
    assert not second.startswith(SNAPPY_STREAM_IDENTIFIER)
    chunks = snappy_chunks(first + second)
    assert [ctype for ctype, _ in chunks].count(0xFF) == 1
    data_chunks = chunks[1:]
    assert len(data_chunks) >= 8  # 256000 and 200000 bytes need at least 4 chunks each
    for ctype, body in data_chunks:
        assert ctype in (0x00, 0x01)
        plain_size = len(body) - 4 if ctype == 0x01 else cramjam.snappy.decompress_raw_len(body[4:])
        assert 0 < plain_size <= 65536


def test_snappy_reads_python_snappy_stream_compressor_output() -> None:
    # pynsq writes with snappy.StreamCompressor: the embedded server must read it
    writer = snappy.StreamCompressor()
    writes = [b"IDENTIFY\n", bytes(range(256)) * 400, b"RDY 1\n"]
    wire = b"".join(writer.compress(w) for w in writes)
    assert feed_in_pieces(SnappyStream(), wire, list(range(0, len(wire), 7))) == b"".join(writes)


@settings(max_examples=40, deadline=None)
@given(writes=writes_strategy, level=st.integers(0, 9))
def test_deflate_output_read_by_zlib(writes: list[bytes], level: int) -> None:
    writer = DeflateStream(level)
    reader = zlib.decompressobj(-zlib.MAX_WBITS)
    for w in writes:
        wire = writer.compress(w)
        if w:
            assert wire.endswith(SYNC_FLUSH_MARKER)
        # sync flush: each write is readable on its own, nothing held back
        assert reader.decompress(wire) == w


def test_deflate_reads_zlib_sync_flushed_stream() -> None:
    writer = zlib.compressobj(3, zlib.DEFLATED, -zlib.MAX_WBITS)
    writes = [b"SUB t c\n", b"x" * 100000, b"FIN 0123456789abcdef\n"]
    wire = b"".join(writer.compress(w) + writer.flush(zlib.Z_SYNC_FLUSH) for w in writes)
    assert feed_in_pieces(DeflateStream(), wire, list(range(0, len(wire), 5))) == b"".join(writes)


# -- snappy framing rules and corruption ----------------------------------------------


def test_snappy_skips_padding_and_skippable_and_repeated_identifier() -> None:
    wire = (
        SNAPPY_STREAM_IDENTIFIER
        + uncompressed_chunk(b"one ")
        + b"\xfe\x03\x00\x00pad"
        + SNAPPY_STREAM_IDENTIFIER
        + b"\x80\x00\x00\x00"
        + b"\xfd\x05\x00\x00skip!"
        + uncompressed_chunk(b"two")
    )
    assert SnappyStream().decompress(wire) == b"one two"
    assert feed_in_pieces(SnappyStream(), wire, list(range(len(wire)))) == b"one two"


def test_snappy_large_skippable_chunk_split_across_reads() -> None:
    skippable = b"\x99" + (1 << 20).to_bytes(3, "little") + bytes(1 << 20)
    wire = SNAPPY_STREAM_IDENTIFIER + skippable + uncompressed_chunk(b"after")
    reader = SnappyStream()
    pieces = [reader.decompress(wire[i : i + 4096]) for i in range(0, len(wire), 4096)]
    assert b"".join(pieces) == b"after"


def test_snappy_empty_data_chunk_is_accepted() -> None:
    assert SnappyStream().decompress(SNAPPY_STREAM_IDENTIFIER + uncompressed_chunk(b"")) == b""


def test_snappy_bad_crc() -> None:
    wire = bytearray(SnappyStream().compress(b"PUB t\n\x00\x00\x00\x01x"))
    wire[14] ^= 0x01  # first byte of the first data chunk's CRC
    with pytest.raises(ProtocolError, match="CRC-32C mismatch"):
        SnappyStream().decompress(wire)


def test_snappy_bad_crc_in_compressed_chunk() -> None:
    wire = bytearray(SnappyStream().compress(b"a" * 5000))
    assert wire[10] == 0x00  # a compressed chunk
    wire[15] ^= 0x80
    with pytest.raises(ProtocolError, match="CRC-32C mismatch"):
        SnappyStream().decompress(bytes(wire))


@pytest.mark.parametrize(
    "wire",
    [
        uncompressed_chunk(b"hello"),  # no identifier at all
        b"sNaPpY" + uncompressed_chunk(b"hello"),
        b"\x00",  # a single byte already tells
        b"\xfe\x00\x00\x00" + SNAPPY_STREAM_IDENTIFIER,  # not even padding may come first
    ],
)
def test_snappy_missing_identifier(wire: bytes) -> None:
    with pytest.raises(ProtocolError, match="does not start with the stream identifier"):
        SnappyStream().decompress(wire)


def test_snappy_bad_identifier() -> None:
    with pytest.raises(ProtocolError, match="identifier chunk holds"):
        SnappyStream().decompress(b"\xff\x06\x00\x00sNaPpZ")
    with pytest.raises(ProtocolError, match="identifier chunk has length 7"):
        SnappyStream().decompress(b"\xff\x07\x00\x00sNaPpYY")


@pytest.mark.parametrize("ctype", [0x02, 0x40, 0x7F])
def test_snappy_reserved_unskippable_chunk(ctype: int) -> None:
    wire = SNAPPY_STREAM_IDENTIFIER + bytes([ctype]) + b"\x03\x00\x00abc"
    with pytest.raises(ProtocolError, match=f"reserved unskippable chunk type 0x{ctype:02x}"):
        SnappyStream().decompress(wire)


def test_snappy_oversized_chunk_refused_from_its_header() -> None:
    # the header alone is enough: nothing of the 16 MiB body is waited for
    reader = SnappyStream()
    with pytest.raises(ProtocolError, match="uncompressed chunk has length 16777215"):
        reader.decompress(SNAPPY_STREAM_IDENTIFIER + b"\x01\xff\xff\xff")
    with pytest.raises(ProtocolError, match="compressed chunk has length 80000"):
        SnappyStream().decompress(SNAPPY_STREAM_IDENTIFIER + b"\x00" + (80000).to_bytes(3, "little"))
    with pytest.raises(ProtocolError, match="uncompressed chunk has length 3"):
        SnappyStream().decompress(SNAPPY_STREAM_IDENTIFIER + b"\x01\x03\x00\x00abc")


def test_snappy_compressed_block_claiming_too_much() -> None:
    block = b"\x80\x80\x08" + b"\x00"  # varint 131072: twice the chunk limit
    wire = SNAPPY_STREAM_IDENTIFIER + b"\x00" + (len(block) + 4).to_bytes(3, "little") + bytes(4) + block
    with pytest.raises(ProtocolError, match="claims 131072 plain bytes"):
        SnappyStream().decompress(wire)


def test_snappy_invalid_compressed_block() -> None:
    block = b"\x0a\xff\xff\xff\xff"  # length 10, then a copy reaching before the start
    wire = SNAPPY_STREAM_IDENTIFIER + b"\x00" + (len(block) + 4).to_bytes(3, "little") + bytes(4) + block
    with pytest.raises(ProtocolError, match="invalid snappy block"):
        SnappyStream().decompress(wire)


def test_snappy_broken_stream_stays_broken() -> None:
    reader = SnappyStream()
    with pytest.raises(ProtocolError):
        reader.decompress(b"garbage!")
    with pytest.raises(ProtocolError, match="unusable after an earlier error"):
        reader.decompress(SNAPPY_STREAM_IDENTIFIER)


def test_snappy_truncated_stream_waits_without_error() -> None:
    wire = SnappyStream().compress(b"z" * 1000)
    reader = SnappyStream()
    assert reader.decompress(wire[:-1]) == b""
    assert reader.decompress(wire[-1:]) == b"z" * 1000


def test_snappy_error_leaves_callers_buffer_resizable() -> None:
    buf = bytearray(SNAPPY_STREAM_IDENTIFIER + uncompressed_chunk(b"hello", crc=0))
    with pytest.raises(ProtocolError) as excinfo:
        SnappyStream().decompress(buf)
    del buf[:5]  # would raise BufferError if a view into buf were still alive
    assert "CRC-32C" in str(excinfo.value)


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=300), prefix=st.booleans(), data=st.data())
def test_snappy_garbage_gives_protocol_error_or_bytes(
    garbage: bytes, prefix: bool, data: st.DataObject
) -> None:
    wire = (SNAPPY_STREAM_IDENTIFIER if prefix else b"") + garbage
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=5))
    try:
        out = feed_in_pieces(SnappyStream(), wire, cuts)
    except ProtocolError:
        return
    assert isinstance(out, bytes)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(min_size=1, max_size=200), ctype=st.sampled_from([0x00, 0x01]))
def test_snappy_garbage_chunk_body(body: bytes, ctype: int) -> None:
    # well-framed chunks with garbage inside reach cramjam: only ProtocolError may escape
    wire = SNAPPY_STREAM_IDENTIFIER + bytes([ctype]) + (len(body) + 4).to_bytes(3, "little") + bytes(4) + body
    try:
        SnappyStream().decompress(wire)
    except ProtocolError:
        return


# -- deflate corruption and end of stream -------------------------------------------


@pytest.mark.parametrize("wire", [b"\xff\xff\xff\xff", b"\x07\x00\x00\x00\x00", b"\x00\x05\x00\x00\x00abcde"])
def test_deflate_corrupt(wire: bytes) -> None:
    with pytest.raises(ProtocolError, match="deflate stream is corrupt"):
        DeflateStream().decompress(wire)


def test_deflate_data_after_final_block() -> None:
    encoder = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    wire = encoder.compress(b"last words") + encoder.flush()  # Z_FINISH: final block
    reader = DeflateStream()
    assert reader.decompress(wire) == b"last words"
    with pytest.raises(ProtocolError, match="data after the final block"):
        reader.decompress(b"more")
    with pytest.raises(ProtocolError, match="data after the final block"):
        DeflateStream().decompress(wire + b"more")


def test_deflate_broken_stream_stays_broken() -> None:
    reader = DeflateStream()
    with pytest.raises(ProtocolError):
        reader.decompress(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError, match="unusable after an earlier error"):
        reader.decompress(DeflateStream().compress(b"ok"))


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=300))
def test_deflate_garbage_gives_protocol_error_or_bytes(garbage: bytes) -> None:
    try:
        out = DeflateStream().decompress(garbage)
    except ProtocolError:
        return
    assert isinstance(out, bytes)


# -- the decompression bomb guard ---------------------------------------------------


def test_deflate_bomb_refused() -> None:
    bomb = DeflateStream(9).compress(bytes(20 * 1024 * 1024))  # 20 MiB of zeros
    assert len(bomb) < 30 * 1024
    reader = DeflateStream(max_output=1024 * 1024)
    with pytest.raises(ProtocolError, match="max_output=1048576"):
        reader.decompress(bomb)


def test_deflate_bomb_refused_by_per_call_limit() -> None:
    bomb = DeflateStream(9).compress(bytes(5 * 1024 * 1024))
    with pytest.raises(ProtocolError, match="max_output=4096"):
        DeflateStream().decompress(bomb, max_output=4096)


def test_deflate_limit_counts_per_call() -> None:
    # a 5 MiB MPUB body in pieces: each call stays under 1 MiB, the total does not
    payload = bytes(range(256)) * (5 * 4096)
    wire = DeflateStream(1).compress(payload)
    reader = DeflateStream(max_output=1024 * 1024)
    step = 4096
    out = b"".join(reader.decompress(wire[i : i + step]) for i in range(0, len(wire), step))
    assert out == payload


def test_deflate_default_limit_never_trips_on_guard_free_reads() -> None:
    # The documented promise: reads of <= GUARD_FREE_READ_SIZE never hit the default
    # limit, even for the most compressible stream there is (zeros at level 9).
    assert DEFAULT_MAX_OUTPUT >= DEFLATE_MAX_RATIO * GUARD_FREE_READ_SIZE + 258
    wire = DeflateStream(9).compress(bytes(GUARD_FREE_READ_SIZE * DEFLATE_MAX_RATIO + 4 * 1024 * 1024))
    reader = DeflateStream()
    read = reader.decompress(wire[:GUARD_FREE_READ_SIZE])
    assert len(read) > 60 * 1024 * 1024  # the read really is close to the limit
    assert read.count(0) == len(read)


def test_snappy_limit() -> None:
    wire = SnappyStream().compress(b"a" * 300000)
    with pytest.raises(ProtocolError, match="max_output=100000"):
        SnappyStream(max_output=100000).decompress(wire)
    with pytest.raises(ProtocolError, match="max_output=1000"):
        SnappyStream().decompress(wire, max_output=1000)
    # the same stream read in small pieces: every call stays under the limit
    reader = SnappyStream(max_output=100000)
    assert feed_in_pieces(reader, wire, list(range(0, len(wire), 1000))) == b"a" * 300000


# -- construction -------------------------------------------------------------------


def test_make_stream() -> None:
    assert isinstance(make_stream("snappy"), SnappyStream)
    deflate = make_stream("deflate", level=3)
    assert isinstance(deflate, DeflateStream) and deflate.level == 3
    assert SnappyStream.kind == "snappy" and DeflateStream.kind == "deflate"
    with pytest.raises(InvalidValueError, match="'snappy' or 'deflate', got 'lz4'"):
        make_stream("lz4")


@pytest.mark.parametrize("level", [-1, 10, True, 6.0])
def test_deflate_level_validated(level: Any) -> None:
    with pytest.raises(InvalidValueError, match="deflate level must be an integer in 0..9"):
        DeflateStream(level)


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
@pytest.mark.parametrize("max_output", [0, -5, None, 1.5])
def test_max_output_validated(kind: str, max_output: Any) -> None:
    with pytest.raises(InvalidValueError, match="max_output must be a positive number of bytes"):
        make_stream(kind, max_output=max_output)
    if max_output is not None:  # None on a call means "the stream's own limit"
        with pytest.raises(InvalidValueError, match="max_output"):
            new_stream(kind).decompress(b"", max_output=max_output)
