"""Property tests of the codec: both implementations, every layout, any chunking, garbage."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fastnsq import _frame_py
from fastnsq.errors import ProtocolError

try:
    from fastnsq import _frame as _frame_c
except ImportError:  # pragma: no cover
    _frame_c = None

IMPLEMENTATIONS = [m for m in (_frame_c, _frame_py) if m is not None]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u64 = st.integers(0, 2**64 - 1)
layouts = st.sampled_from([0, 1, 3, 5, 7])


@st.composite
def message_frames(draw, layout: int):
    ext_version = None
    ext = None
    if layout & 2:
        ext_version = draw(st.sampled_from([0, 2, 4]))
        if ext_version:
            ext = draw(st.binary(max_size=300))
    offset = raw_size = None
    if layout & 4:
        offset = draw(u64)
        raw_size = draw(st.integers(0, 2**32 - 1))
    return (
        "msg",
        draw(st.integers(-(2**63), 2**63 - 1)),
        draw(st.integers(0, 65535)),
        draw(st.binary(min_size=16, max_size=16)),
        draw(st.binary(max_size=2000)),
        ext_version,
        ext,
        offset,
        raw_size,
    )


def other_frames():
    return st.one_of(
        st.sampled_from([("resp", b"OK"), ("resp", b"_heartbeat_"), ("resp", b"CLOSE_WAIT")]),
        st.builds(lambda d: ("resp", b"{" + d), st.binary(max_size=200)),
        st.builds(lambda *v: ("traced", *v), u64, u64, u64, st.integers(0, 2**32 - 1)),
        st.builds(
            lambda code, desc: ("err", code, desc),
            st.sampled_from(["E_FIN_FAILED", "E_INVALID", "INVALID_TRACE_ID", "E_TOPIC_NOT_EXIST"]),
            st.text(alphabet="abc 0123", max_size=40).map(str.strip),
        ),
    )


@st.composite
def streams(draw):
    layout = draw(layouts)
    frames = draw(st.lists(st.one_of(message_frames(layout), other_frames()), max_size=30))
    return layout, frames


def encode(codec, frame) -> bytes:
    kind = frame[0]
    if kind == "msg":
        _, ts, attempts, msg_id, body, ext_version, ext, offset, raw_size = frame
        return codec.encode_message(
            ts, attempts, msg_id, body, ext_version=ext_version, ext=ext, offset=offset, raw_size=raw_size
        )
    if kind == "resp":
        return codec.encode_response(frame[1])
    if kind == "traced":
        return codec.encode_traced_response(*frame[1:])
    text = f"{frame[1]} {frame[2]}".rstrip() if frame[2] else f"{frame[1]} "
    return codec.encode_error(text.encode())


def expected(frame) -> tuple:
    kind = frame[0]
    if kind == "msg":
        _, ts, attempts, msg_id, body, ext_version, ext, offset, raw_size = frame
        return ("msg", ts, attempts, msg_id, body, ext_version or 0, ext if ext_version else None, offset, raw_size)
    if kind == "traced":
        return ("resp", tuple(frame[1:]))
    if kind == "err":
        return ("err", frame[1], frame[2])
    return frame


def decode(codec, chunks: list[bytes], layout: int) -> list[tuple]:
    out: list[tuple] = []

    def on_message(m):
        out.append(("msg", m.timestamp, m.attempts, m.id, m.body, m.ext_version, m.ext_bytes, m.offset, m.raw_size))

    def on_response(data):
        out.append(("resp", tuple(data) if isinstance(data, tuple) else bytes(data)))

    reader = codec.FrameReader(on_message, on_response, lambda c, d: out.append(("err", c, d)), layout=layout)
    for chunk in chunks:
        view = reader.get_buffer(-1)
        if len(chunk) <= len(view):
            view[: len(chunk)] = chunk
            reader.buffer_updated(len(chunk))
        else:
            reader.feed(chunk)
    assert reader.buffered == 0
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for p in points + [len(data)]:
        pieces.append(data[start:p])
        start = p
    return pieces


@SETTINGS
@given(streams(), st.lists(st.integers(0, 10**6), max_size=40))
def test_any_stream_in_any_chunks_decodes_identically(stream, cuts):
    layout, frames = stream
    wanted = [expected(f) for f in frames]
    for encoder in IMPLEMENTATIONS:
        data = b"".join(encode(encoder, f) for f in frames)
        for decoder in IMPLEMENTATIONS:
            assert decode(decoder, split(data, cuts), layout) == wanted


@settings(max_examples=40, deadline=None)
@given(streams())
def test_one_byte_at_a_time(stream):
    layout, frames = stream
    data = b"".join(encode(_frame_py, f) for f in frames)
    wanted = [expected(f) for f in frames]
    for codec in IMPLEMENTATIONS:
        assert decode(codec, [data[i : i + 1] for i in range(len(data))], layout) == wanted


names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)
bodies = st.one_of(st.binary(min_size=1, max_size=500), st.text(min_size=1, max_size=100))
ids = st.binary(min_size=16, max_size=16)
partitions = st.one_of(st.none(), st.integers(0, 2**31 - 1))

commands = st.one_of(
    st.tuples(st.just("pub"), names, bodies, partitions),
    st.tuples(st.just("mpub"), names, st.lists(bodies, min_size=1, max_size=10), partitions),
    st.tuples(st.just("dpub"), names, st.integers(0, 3600000), bodies),
    st.tuples(st.just("pub_trace"), names, partitions, u64, bodies),
    st.tuples(st.just("pub_ext"), names, partitions, st.binary(max_size=100), bodies),
    st.tuples(st.just("mpub_trace"), names, partitions, st.lists(st.tuples(u64, bodies), min_size=1, max_size=5)),
    st.tuples(st.just("sub"), names, names, partitions),
    st.tuples(st.just("sub_ordered"), names, names, st.integers(0, 1000)),
    st.tuples(st.just("rdy"), st.integers(0, 2500)),
    st.tuples(st.just("fin"), ids),
    st.tuples(st.just("req"), ids, st.integers(0, 3600000)),
    st.tuples(st.just("touch"), ids),
    st.tuples(st.just("identify"), st.binary(min_size=1, max_size=300)),
    st.tuples(st.just("auth"), st.binary(min_size=1, max_size=100)),
    st.tuples(st.just("nop")),
    st.tuples(st.just("cls")),
)


def write(codec, cmds) -> bytes:
    w = codec.WriteBuffer()
    for name, *args in cmds:
        getattr(w, name)(*args)
    return w.take()


def as_bytes(body) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


def expected_command(cmd) -> tuple:
    """What the server-side splitter must give back for a command."""
    name, *args = cmd
    part = lambda p: [] if p is None else [b"%d" % p]
    if name == "pub":
        return (b"PUB", [args[0].encode(), *part(args[2])], as_bytes(args[1]))
    if name == "mpub":
        msgs = [as_bytes(b) for b in args[1]]
        body = struct.pack(">i", len(msgs)) + b"".join(struct.pack(">i", len(m)) + m for m in msgs)
        return (b"MPUB", [args[0].encode(), *part(args[2])], body)
    if name == "dpub":
        return (b"DPUB", [args[0].encode(), b"%d" % args[1]], as_bytes(args[2]))
    if name == "pub_trace":
        return (b"PUB_TRACE", [args[0].encode(), *part(args[1])], struct.pack(">Q", args[2]) + as_bytes(args[3]))
    if name == "pub_ext":
        ext = bytes(args[2])
        return (b"PUB_EXT", [args[0].encode(), *part(args[1])], struct.pack(">H", len(ext)) + ext + as_bytes(args[3]))
    if name == "mpub_trace":
        msgs = [struct.pack(">Q", t) + as_bytes(b) for t, b in args[2]]
        body = struct.pack(">i", len(msgs)) + b"".join(struct.pack(">i", len(m)) + m for m in msgs)
        return (b"MPUB_TRACE", [args[0].encode(), *part(args[1])], body)
    if name in ("sub", "sub_ordered"):
        return (name.upper().encode(), [args[0].encode(), args[1].encode(), *part(args[2])], None)
    if name == "rdy":
        return (b"RDY", [b"%d" % args[0]], None)
    if name in ("fin", "touch"):
        return (name.upper().encode(), [args[0]], None)
    if name == "req":
        return (b"REQ", [args[0], b"%d" % args[1]], None)
    if name in ("identify", "auth"):
        return (name.upper().encode(), [], bytes(args[0]))
    return (name.upper().encode(), [], None)


@SETTINGS
@given(st.lists(commands, min_size=1, max_size=20), st.lists(st.integers(0, 10**6), max_size=20))
def test_commands_round_trip_through_the_server_splitter(cmds, cuts):
    encoded = {codec.IMPLEMENTATION: write(codec, cmds) for codec in IMPLEMENTATIONS}
    assert len(set(encoded.values())) == 1, "both implementations write the same bytes"
    data = next(iter(encoded.values()))
    wanted = [expected_command(c) for c in cmds]
    for codec in IMPLEMENTATIONS:
        out: list[tuple] = []
        reader = codec.CommandReader(lambda n, p, b, out=out: out.append((n, p, b)), binary_ids=True)
        for chunk in split(data, cuts):
            reader.feed(chunk)
        assert out == wanted
        assert reader.buffered == 0


@SETTINGS
@given(st.binary(max_size=3000), st.lists(st.integers(0, 10**6), max_size=10), layouts)
def test_garbage_only_raises_protocol_error_and_stays_bounded(garbage, cuts, layout):
    for codec in IMPLEMENTATIONS:
        reader = codec.FrameReader(lambda m: None, lambda d: None, lambda c, d: None, layout=layout,
                                   max_frame_size=4096, initial_size=1024)
        try:
            for chunk in split(garbage, cuts):
                reader.feed(chunk)
        except ProtocolError:
            pass
        assert reader.capacity <= 2 * (4096 + 4) + 16384


@SETTINGS
@given(streams(), st.integers(1, 400), st.binary(min_size=1, max_size=50))
def test_truncated_or_corrupted_streams_only_raise_protocol_error(stream, cut, noise):
    layout, frames = stream
    assume(frames)
    data = b"".join(encode(_frame_py, f) for f in frames)
    corrupted = data[: max(0, len(data) - cut)] + noise
    for codec in IMPLEMENTATIONS:
        reader = codec.FrameReader(lambda m: None, lambda d: None, lambda c, d: None, layout=layout)
        try:
            reader.feed(corrupted)
        except ProtocolError:
            pass


@pytest.mark.parametrize("codec_impl", IMPLEMENTATIONS, ids=lambda m: m.IMPLEMENTATION)
@SETTINGS
@given(garbage=st.binary(max_size=2000))
def test_command_reader_garbage_only_raises_protocol_error(codec_impl, garbage):
    reader = codec_impl.CommandReader(lambda n, p, b: None, binary_ids=True, max_line=256)
    try:
        reader.feed(garbage)
    except ProtocolError:
        pass
    # A declared body length may be up to max_msg_size, but memory follows what arrived.
    assert reader.capacity == 65536
