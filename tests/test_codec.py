"""The wire codec, both implementations: frames, messages, commands, limits, errors."""

from __future__ import annotations

import json
import os
import struct

import pytest

from fastnsq import codec as active_codec
from fastnsq.errors import InvalidValueError, ProtocolError

from .conftest import NO_EXTENSIONS

TS = 1700000000000000000
UPSTREAM_ID = b"0a1b2c3d4e5f6071"


class Collector:
    """Collects what a FrameReader splits, in order."""

    def __init__(self) -> None:
        self.frames: list[tuple] = []

    def on_message(self, msg) -> None:
        self.frames.append(("msg", msg))

    def on_response(self, data) -> None:
        self.frames.append(("resp", data))

    def on_error(self, code: str, description: str) -> None:
        self.frames.append(("err", code, description))

    def reader(self, codec, **kwargs):
        return codec.FrameReader(self.on_message, self.on_response, self.on_error, **kwargs)


def decode_all(codec, data: bytes, **kwargs) -> list[tuple]:
    col = Collector()
    col.reader(codec, **kwargs).feed(data)
    return col.frames


# ---- the build ---------------------------------------------------------------------------


def test_default_import_is_the_c_extension():
    """Fails when a build silently fell back to the pure-Python codec."""
    if NO_EXTENSIONS:
        assert active_codec.IMPLEMENTATION == "python"
        assert active_codec.FrameReader.__module__ == "fastnsq._frame_py"
    else:
        assert active_codec.IMPLEMENTATION == "c"
        import fastnsq._frame

        assert fastnsq._frame.__file__.endswith((".so", ".pyd"))
        assert type(active_codec.WriteBuffer()).__module__ == "fastnsq._frame"


def test_both_implementations_export_the_same_names(codec):
    from fastnsq import _frame_py

    assert set(codec.__all__) == set(_frame_py.__all__)
    for name in codec.__all__:
        assert hasattr(codec, name), name


# ---- read side: the worked examples of protocol.md §12 --------------------------------------


def test_ok_heartbeat_close_wait_frames(codec):
    data = bytes.fromhex(
        "00000006000000004f4b"
        "0000000f000000005f6865617274626561745f"
        "0000000e00000000434c4f53455f57414954"
    )
    frames = decode_all(codec, data)
    assert frames == [("resp", b"OK"), ("resp", b"_heartbeat_"), ("resp", b"CLOSE_WAIT")]
    # the frequent answers are the module's constants (no allocation, comparable by identity)
    assert frames[0][1] is codec.OK and frames[1][1] is codec.HEARTBEAT and frames[2][1] is codec.CLOSE_WAIT


def test_upstream_message_frame(codec):
    data = bytes.fromhex(
        "00000023 00000002 17979cfe362a0000 0001 30613162326333643465356636303731 68656c6c6f".replace(" ", "")
    )
    [(kind, msg)] = decode_all(codec, data)
    assert kind == "msg"
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (TS, 1, UPSTREAM_ID, b"hello")
    assert msg.internal_id is None and msg.trace_id is None
    assert msg.offset is None and msg.raw_size is None and msg.ext is None and msg.ext_version == 0


def test_ha_plain_message_frame(codec):
    data = bytes.fromhex(
        "00000023 00000002 17979cfe362a0000 0001 0000000000001234 0000000000000000 68656c6c6f".replace(" ", "")
    )
    [(_, msg)] = decode_all(codec, data, layout=codec.LAYOUT_HA_ID)
    assert msg.internal_id == 0x1234 and msg.trace_id == 0
    assert msg.id == bytes.fromhex("00000000000012340000000000000000")
    assert msg.body == b"hello"


def test_ha_ext_and_offset_frame_ext_before_offset(codec):
    data = bytes.fromhex(
        (
            "0000003b 00000002 17979cfe362a0000 0001 0000000000001234 0000000000000000"
            " 04 0009 7b226b223a2276227d 00000000000003e8 0000002a 68656c6c6f"
        ).replace(" ", "")
    )
    layout = codec.LAYOUT_HA_ID | codec.LAYOUT_EXT | codec.LAYOUT_OFFSET
    [(_, msg)] = decode_all(codec, data, layout=layout)
    assert msg.ext_version == 4 and msg.ext_bytes == b'{"k":"v"}' and msg.ext == {"k": "v"}
    assert (msg.offset, msg.raw_size, msg.body) == (1000, 42, b"hello")


def test_ha_ext_version_zero_has_no_length(codec):
    frame = codec.encode_message(TS, 3, bytes(16), b"body", ext_version=0, offset=7, raw_size=9)
    layout = codec.LAYOUT_HA_ID | codec.LAYOUT_EXT | codec.LAYOUT_OFFSET
    [(_, msg)] = decode_all(codec, frame, layout=layout)
    assert (msg.ext_version, msg.ext_bytes, msg.offset, msg.raw_size, msg.body) == (0, None, 7, 9, b"body")
    assert frame[34] == 0 and len(frame) == 4 + 4 + 26 + 1 + 12 + 4


def test_traced_response(codec):
    data = bytes.fromhex(
        "00000022 00000000 4f4b 0000000000001234 0000000000000063 00000000000003e8 0000002a".replace(" ", "")
    )
    [(_, resp)] = decode_all(codec, data)
    assert isinstance(resp, codec.TracedResponse)
    assert resp == (0x1234, 99, 1000, 42)
    assert codec.decode_traced_response(data[8:]) == resp
    assert codec.encode_traced_response(0x1234, 99, 1000, 42) == data


def test_json_response_and_error_frames(codec):
    body = b'{"max_rdy_count":2500}'
    data = codec.encode_response(body) + codec.encode_error(b"E_TOPIC_NOT_EXIST ")
    data += codec.encode_error(b"too much client connections")
    data += codec.encode_error(b"INVALID_TRACE_ID invalid trace id")
    assert decode_all(codec, data) == [
        ("resp", body),
        ("err", "E_TOPIC_NOT_EXIST", ""),
        ("err", "too much client connections", ""),
        ("err", "INVALID_TRACE_ID", "invalid trace id"),
    ]


# ---- read side: bad streams ---------------------------------------------------------------


@pytest.mark.parametrize(
    "data, words",
    [
        (struct.pack(">ii", 3, 0) + b"x", "below the minimum"),
        (struct.pack(">ii", -5, 0), "below the minimum"),
        (struct.pack(">ii", 2**31 - 1, 0), "above the maximum"),
        (b"HTTP/1.1 400 Bad Request\r\n", "HTTP"),
        (struct.pack(">ii", 6, 7) + b"OK", "unknown frame type 7"),
        (struct.pack(">ii", 14, 2) + b"0123456789", "shorter than the 26-byte header"),
    ],
)
def test_bad_frames_raise_protocol_error(codec, data, words):
    with pytest.raises(ProtocolError, match=words):
        decode_all(codec, data)


def test_configured_max_frame_size(codec):
    frame = codec.encode_response(b"x" * 100)
    assert decode_all(codec, frame, max_frame_size=104) == [("resp", b"x" * 100)]
    with pytest.raises(ProtocolError, match="above the maximum of 103"):
        decode_all(codec, frame, max_frame_size=103)


def test_huge_announced_frame_is_refused_before_allocating(codec):
    col = Collector()
    reader = col.reader(codec)
    with pytest.raises(ProtocolError):
        reader.feed(struct.pack(">ii", 0x7FFFFFF0, 2))
    assert reader.capacity <= 2**17


@pytest.mark.parametrize(
    "layout, tail, words",
    [
        (2, b"", "ext header"),
        (2, b"\x04", "ext header length"),
        (2, b"\x04\x00\x09{}", "runs past"),
        (4, b"\x00" * 11, "offset/size"),
    ],
)
def test_truncated_ha_headers(codec, layout, tail, words):
    data = struct.pack(">qH", TS, 1) + bytes(16) + tail
    frame = struct.pack(">ii", len(data) + 4, 2) + data
    with pytest.raises(ProtocolError, match=words):
        decode_all(codec, frame, layout=layout | 1)


def test_unknown_layout_flags_rejected(codec):
    with pytest.raises(InvalidValueError):
        Collector().reader(codec, layout=8)


# ---- read side: buffering -----------------------------------------------------------------


def test_buffered_protocol_interface_one_byte_at_a_time(codec):
    frames = codec.encode_response(b"OK") + codec.encode_message(TS, 2, UPSTREAM_ID, b"x" * 300)
    col = Collector()
    reader = col.reader(codec, initial_size=64)
    for byte in frames:
        view = reader.get_buffer(-1)
        assert len(view) > 0
        view[0] = byte
        reader.buffer_updated(1)
    assert [f[0] for f in col.frames] == ["resp", "msg"]
    assert col.frames[1][1].body == b"x" * 300
    assert reader.buffered == 0


def test_buffer_grows_for_a_large_frame_and_shrinks_back(codec):
    col = Collector()
    reader = col.reader(codec, initial_size=1024)
    body = os.urandom(300_000)
    frame = codec.encode_message(TS, 1, UPSTREAM_ID, body)
    reader.feed(frame[:10])
    view = reader.get_buffer(-1)
    assert len(view) >= len(frame) - 10  # room for the whole announced frame in one read
    view[: len(frame) - 10] = frame[10:]
    reader.buffer_updated(len(frame) - 10)
    assert col.frames[0][1].body == body
    reader.get_buffer(-1)
    assert reader.capacity < 300_000


def test_buffer_updated_beyond_the_buffer_is_an_error(codec):
    reader = Collector().reader(codec)
    view = reader.get_buffer(-1)
    with pytest.raises(ProtocolError):
        reader.buffer_updated(len(view) + 1)


def test_pause_and_take_unparsed_for_upgrades(codec):
    """After the IDENTIFY JSON the rest belongs to the compressed stream (protocol.md §4)."""
    col = Collector()
    reader = col.reader(codec)

    def on_response(data):
        col.frames.append(("resp", data))
        reader.pause()

    reader = codec.FrameReader(col.on_message, on_response, col.on_error)
    json_frame = codec.encode_response(b'{"deflate":true}')
    reader.feed(json_frame + b"\x00\x0a\x00\xf5\xffcompressed")
    assert col.frames == [("resp", b'{"deflate":true}')]
    assert reader.paused
    assert reader.take_unparsed() == b"\x00\x0a\x00\xf5\xffcompressed"
    assert reader.buffered == 0
    reader.resume()
    reader.feed(codec.encode_response(b"OK"))
    assert col.frames[-1] == ("resp", b"OK")


def test_messages_carry_the_delegate(codec):
    class Delegate:
        def __init__(self):
            self.calls = []

        def finish_message(self, msg):
            self.calls.append(("fin", msg.id))

        def requeue_message(self, msg, delay, backoff):
            self.calls.append(("req", msg.id, delay, backoff))

        def touch_message(self, msg):
            self.calls.append(("touch", msg.id))

    delegate = Delegate()
    col = Collector()
    reader = col.reader(codec)
    reader.delegate = delegate
    reader.feed(b"".join(codec.encode_message(TS, 1, b"%016d" % i, b"b") for i in range(3)))
    a, b, c = (f[1] for f in col.frames)
    a.touch()
    a.finish()
    b.requeue(2.5, backoff=False)
    c.disable_auto_response()
    assert not c.auto_response and a.has_responded and b.has_responded and not c.has_responded
    assert delegate.calls == [
        ("touch", b"%016d" % 0),
        ("fin", b"%016d" % 0),
        ("req", b"%016d" % 1, 2.5, False),
    ]
    with pytest.raises(RuntimeError, match="already"):
        a.finish()
    with pytest.raises(RuntimeError, match="already"):
        b.touch()


def test_message_without_delegate_cannot_answer(codec):
    msg = codec.Message(TS, 1, UPSTREAM_ID, b"x")
    with pytest.raises(RuntimeError, match="no connection"):
        msg.finish()


def test_message_repr_never_shows_the_body(codec):
    msg = codec.Message(TS, 1, UPSTREAM_ID, b"secret-body-content")
    assert "secret" not in repr(msg) and "0a1b2c3d4e5f6071" in repr(msg)


# ---- write side ---------------------------------------------------------------------------


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def test_worked_byte_examples(codec):
    """protocol.md §12, byte for byte."""
    w = codec.WriteBuffer()
    w.magic()
    assert w.take() == hexbytes("20 20 56 32")
    w.pub("test", b"hello")
    assert w.take() == hexbytes("50 55 42 20 74 65 73 74 0a 00 00 00 05 68 65 6c 6c 6f")
    w.pub("test", b"hello", partition=0)
    assert w.take() == hexbytes("50 55 42 20 74 65 73 74 20 30 0a 00 00 00 05 68 65 6c 6c 6f")
    w.mpub("test", [b"a", b"bc"])
    assert w.take() == hexbytes(
        "4d 50 55 42 20 74 65 73 74 0a 00 00 00 0f  00 00 00 02  00 00 00 01 61  00 00 00 02 62 63"
    )
    w.fin(hexbytes("00 00 00 00 00 00 12 34 00 00 00 00 00 00 00 00"))
    assert w.take() == hexbytes("46 49 4e 20 00 00 00 00 00 00 12 34 00 00 00 00 00 00 00 00 0a")
    w.pub_trace("test", 0, 99, b"hello")
    assert w.take() == hexbytes(
        "50 55 42 5f 54 52 41 43 45 20 74 65 73 74 20 30 0a 00 00 00 0d"
        " 00 00 00 00 00 00 00 63 68 65 6c 6c 6f"
    )
    w.pub_ext("test", 0, b'{"##trace_id":"99"}', b"hello")
    assert w.take() == hexbytes(
        "50 55 42 5f 45 58 54 20 74 65 73 74 20 30 0a 00 00 00 1a 00 13 7b 22 23 23 74 72 61 63"
        " 65 5f 69 64 22 3a 22 39 39 22 7d 68 65 6c 6c 6f"
    )


def test_ha_fin_req_touch_exact_lengths(codec):
    msg_id = b"\n \n \x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b"
    w = codec.WriteBuffer()
    w.fin(msg_id)
    assert len(w.take()) == 21
    w.touch(msg_id)
    assert len(w.take()) == 23
    w.req(msg_id, 1500)
    assert w.take() == b"REQ " + msg_id + b" 1500\n"


def test_every_command_both_implementations_identical():
    from fastnsq import _frame_py

    try:
        from fastnsq import _frame as c_codec
    except ImportError:
        pytest.skip("C codec not built")
    outputs = []
    for impl in (c_codec, _frame_py):
        w = impl.WriteBuffer()
        w.magic()
        w.identify(b'{"feature_negotiation":true}')
        w.auth("s3cret")
        w.sub("t", "c")
        w.sub("t", "c#ephemeral", 3)
        w.sub_ordered("t", "c", 0)
        w.sub_advanced("t", "c")
        w.sub_advanced("t", "c", 2, "special:-1")
        w.rdy(0)
        w.rdy(2500)
        w.fin(b"f" * 16)
        w.req(b"r" * 16, 0)
        w.touch(b"t" * 16)
        w.cls()
        w.nop()
        w.pub("t", "héllo")
        w.pub("t", memoryview(b"mv"), 7)
        w.mpub("t", [b"a", bytearray(b"bb"), "ccc"], 1)
        w.dpub("t", 3600000, b"later")
        w.pub_trace("t", None, 2**64 - 1, b"x")
        w.mpub_trace("t", 0, [(1, b"a"), (2, "b")])
        w.pub_ext("t", 1, b"{}", b"x")
        w.mpub_ext("t", 1, [(b"", b"plain"), (b'{"a":1}', b"y")])
        w.internal_create_topic("t", 0)
        w.internal_create_topic("t", 1, False)
        outputs.append(w.take())
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda w: w.pub("bad*topic", b"x"), "invalid topic name 'bad\\*topic'"),
        (lambda w: w.pub("", b"x"), "invalid topic name"),
        (lambda w: w.pub("a" * 65, b"x"), "1-64"),
        (lambda w: w.pub("#ephemeral", b"x"), "invalid topic"),
        (lambda w: w.pub("tópico", b"x"), "invalid topic"),
        (lambda w: w.sub("t", "bad channel"), "invalid channel name"),
        (lambda w: w.pub("t", b""), "empty message body"),
        (lambda w: w.pub("t", 123), "must be bytes, bytearray, memoryview or str, not int"),
        (lambda w: w.pub("t", b"x" * 1048577), "1048577 bytes exceeds max_msg_size 1048576"),
        (lambda w: w.pub_trace("t", 0, 1, b"x" * 1048569), "exceeds max_msg_size"),
        (lambda w: w.pub_trace("t", 0, -1, b"x"), "trace id -1 is outside"),
        (lambda w: w.pub_ext("t", 0, b"x" * 65536, b"x"), "exceeds 65535"),
        (lambda w: w.mpub("t", []), "at least one message"),
        (lambda w: w.mpub("t", b"abc"), "not a single body"),
        (lambda w: w.mpub("t", [b"a", b""]), "empty message body"),
        (lambda w: w.mpub("t", [b"x" * 1000000] * 6), "exceeds max_body_size 5242880"),
        (lambda w: w.mpub_trace("t", 0, [b"x"]), "pair"),
        (lambda w: w.rdy(2501), "RDY count 2501 is outside 0..2500"),
        (lambda w: w.rdy(-1), "outside"),
        (lambda w: w.rdy(True), "must be an int"),
        (lambda w: w.req(b"x" * 16, -1), "REQ delay"),
        (lambda w: w.req(b"x" * 16, 3600001), "outside 0..3600000"),
        (lambda w: w.dpub("t", 3600001, b"x"), "DPUB defer"),
        (lambda w: w.fin(b"1234"), "16 bytes"),
        (lambda w: w.fin("0a1b2c3d4e5f6071"), "16 bytes"),
        (lambda w: w.pub("t", b"x", -1), "partition -1"),
        (lambda w: w.sub_ordered("t", "c", None), "needs a partition"),
        (lambda w: w.sub_advanced("t", "c", 1, "nope"), "start position"),
        (lambda w: w.sub_advanced("t", "c", None, "special:-1"), "after a partition"),
        (lambda w: w.auth(b""), "AUTH secret is empty"),
        (lambda w: w.identify(b""), "IDENTIFY body is empty"),
    ],
)
def test_bad_input_is_refused_before_a_byte_is_written(codec, call, words):
    w = codec.WriteBuffer()
    w.nop()
    with pytest.raises(InvalidValueError, match=words):
        call(w)
    assert w.take() == b"NOP\n"


def test_limits_are_configurable(codec):
    w = codec.WriteBuffer(max_msg_size=10, max_body_size=30, max_rdy_count=5, max_req_timeout=100)
    w.pub("t", b"x" * 10)
    w.rdy(5)
    w.req(b"x" * 16, 100)
    with pytest.raises(InvalidValueError, match="max_msg_size 10"):
        w.pub("t", b"x" * 11)
    with pytest.raises(InvalidValueError, match="max_body_size 30"):
        w.mpub("t", [b"x" * 10, b"y" * 10])
    w.max_rdy_count = 10
    w.rdy(10)
    with pytest.raises(InvalidValueError, match="max_msg_size must be an int"):
        codec.WriteBuffer(max_msg_size="big")


def test_write_buffer_take_and_clear(codec):
    w = codec.WriteBuffer(initial_size=16)
    for _ in range(1000):
        w.fin(b"x" * 16)
    assert len(w) == 21000
    data = w.take()
    assert len(data) == 21000 and len(w) == 0
    w.nop()
    w.clear()
    assert w.take() == b""


# ---- server side --------------------------------------------------------------------------


def split_commands(codec, data: bytes, **kwargs) -> list[tuple]:
    out: list[tuple] = []
    reader = codec.CommandReader(lambda n, p, b: out.append((n, p, b)), **kwargs)
    reader.feed(data)
    return out


def test_command_reader_splits_lines_and_bodies(codec):
    w = codec.WriteBuffer()
    w.identify(b"{}")
    w.sub("t", "c", 2)
    w.rdy(7)
    w.pub("t", b"body")
    w.nop()
    assert split_commands(codec, w.take()) == [
        (b"IDENTIFY", [], b"{}"),
        (b"SUB", [b"t", b"c", b"2"], None),
        (b"RDY", [b"7"], None),
        (b"PUB", [b"t"], b"body"),
        (b"NOP", [], None),
    ]


def test_command_reader_magic_and_crlf(codec):
    seen = []
    out = []
    reader = codec.CommandReader(lambda n, p, b: out.append((n, p, b)), on_magic=seen.append)
    reader.feed(b"  V2NOP\r\nFIN 0a1b2c3d4e5f6071\n")
    assert seen == [b"  V2"]
    assert out == [(b"NOP", [], None), (b"FIN", [b"0a1b2c3d4e5f6071"], None)]


def test_command_reader_binary_ids(codec):
    weird = b"\n \n\r" + bytes(range(12))
    w = codec.WriteBuffer()
    w.fin(weird)
    w.req(weird, 250)
    w.touch(weird)
    w.req(weird, 0)
    assert split_commands(codec, w.take(), binary_ids=True) == [
        (b"FIN", [weird], None),
        (b"REQ", [weird, b"250"], None),
        (b"TOUCH", [weird], None),
        (b"REQ", [weird, b"0"], None),
    ]


@pytest.mark.parametrize(
    "data, name, size",
    [
        (b"PUB t\n\x00\x00\x00\x00", b"PUB", 0),
        (b"PUB t\n\x00\x10\x00\x01", b"PUB", 0x100001),
        (b"MPUB t\n\xff\xff\xff\xff", b"MPUB", -1),
        (b"IDENTIFY\n\x00\x50\x00\x01", b"IDENTIFY", 0x500001),
    ],
)
def test_command_reader_reports_bad_lengths_without_reading(codec, data, name, size):
    out = split_commands(codec, data + b"NOP\n")
    assert out == [(name, [b"t"] if name != b"IDENTIFY" else [], size)]


def test_command_reader_line_limit(codec):
    with pytest.raises(ProtocolError, match="longer than 100"):
        split_commands(codec, b"X" * 200, max_line=100)
    assert split_commands(codec, b"X" * 99 + b"\n", max_line=100) == [(b"X" * 99, [], None)]


def test_decode_mpub_rules(codec):
    good = struct.pack(">i", 2) + struct.pack(">i", 1) + b"a" + struct.pack(">i", 2) + b"bc"
    assert codec.decode_mpub(good, 10, 100) == [b"a", b"bc"]
    cases = [
        (b"", ("E_BAD_BODY", "MPUB failed to read message count")),
        (struct.pack(">i", 0), ("E_BAD_BODY", "MPUB invalid message count 0")),
        (struct.pack(">i", 50), ("E_BAD_BODY", "MPUB invalid message count 50")),
        (struct.pack(">ii", 1, 0), ("E_BAD_MESSAGE", "MPUB invalid message(0) body size 0")),
        (struct.pack(">ii", 1, 11), ("E_BAD_MESSAGE", "MPUB message too big 11 > 10")),
        (struct.pack(">ii", 1, 3) + b"a", ("E_BAD_MESSAGE", "MPUB failed to read message body")),
        (struct.pack(">i", 2) + struct.pack(">i", 1) + b"a", ("E_BAD_MESSAGE", "MPUB failed to read message(1) body size")),
    ]
    for body, expected in cases:
        with pytest.raises(ValueError) as info:
            codec.decode_mpub(body, 10, 100)
        assert info.value.args == expected


def test_encode_message_layouts_round_trip(codec):
    cases = [
        (0, {}),
        (1, {}),
        (3, {"ext_version": 4, "ext": b'{"##trace_id":"5"}'}),
        (5, {"offset": 2**63, "raw_size": 77}),
        (7, {"ext_version": 2, "ext": b"tag", "offset": 1, "raw_size": 2}),
    ]
    for layout, extra in cases:
        frame = codec.encode_message(TS, 65535, b"I" * 16, b"payload", **extra)
        [(_, msg)] = decode_all(codec, frame, layout=layout)
        assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (TS, 65535, b"I" * 16, b"payload")
        assert msg.offset == extra.get("offset") and msg.raw_size == extra.get("raw_size")
        assert msg.ext_version == extra.get("ext_version", 0)
        assert msg.ext_bytes == extra.get("ext")


def test_ext_json_parsing(codec):
    msg = codec.Message(TS, 1, bytes(16), b"x", ha=True, ext_version=4, ext_bytes=json.dumps({"a": [1]}).encode())
    assert msg.ext == {"a": [1]} and msg.internal_id == 0 and msg.trace_id == 0


def test_names(codec):
    assert codec.valid_topic_name("a") and codec.valid_topic_name("a" * 64)
    assert codec.valid_topic_name("x.y_z-1#ephemeral") and codec.valid_channel_name("c" * 54 + "#ephemeral")
    for bad in ("", "a" * 65, "a b", "a#ephemeralx", "#ephemeral", "é", None, 5, "c" * 55 + "#ephemeral"):
        assert not codec.valid_topic_name(bad), bad


def test_messages_are_stamped_with_the_connections_partition(codec):
    col = Collector()
    reader = col.reader(codec, layout=codec.LAYOUT_HA_ID)
    assert reader.partition is None
    reader.feed(codec.encode_message(TS, 1, bytes(16), b"before"))
    reader.partition = 7
    reader.feed(codec.encode_message(TS, 1, bytes(16), b"after"))
    assert [f[1].partition for f in col.frames] == [None, 7]
    assert codec.Message(TS, 1, bytes(16), b"x", partition=2).partition == 2


def test_messages_are_stamped_with_the_connections_address(codec):
    col = Collector()
    reader = col.reader(codec)
    reader.address = "10.0.0.5:4150"
    reader.feed(codec.encode_message(TS, 1, UPSTREAM_ID, b"x"))
    assert col.frames[0][1].address == "10.0.0.5:4150"
    assert codec.Message(TS, 1, UPSTREAM_ID, b"y", address="h:1").address == "h:1"


def test_message_columns_are_flat_buffers_in_arrows_layouts(codec):
    from array import array

    def ints(data: bytes, code: str) -> list[int]:
        return array(code, data).tolist()

    messages = [
        codec.Message(TS + 1999, 1, UPSTREAM_ID, b"first", address="10.0.0.5:4150"),
        codec.Message(TS, 65535, b"ffffffffffffffff", b"\x00" * 3, address="10.0.0.5:4150"),
        codec.Message(TS + 1000, 2, b"0000000000000000", b"x", address="h\u00e9:4150"),
    ]
    id_offsets, ids, stamps, attempts, body_offsets, bodies, address_offsets, addresses = \
        codec.message_columns(messages, False)
    assert ints(id_offsets, "i") == [0, 16, 32, 48]
    assert ids == UPSTREAM_ID + b"ffffffffffffffff" + b"0000000000000000"
    assert ints(stamps, "q") == [TS // 1000 + 1, TS // 1000, TS // 1000 + 1]  # microseconds, rounded down
    assert ints(attempts, "i") == [1, 65535, 2]
    assert ints(body_offsets, "i") == [0, 5, 8, 9] and bodies == b"first\x00\x00\x00x"
    assert ints(address_offsets, "i") == [0, 13, 26, 34]
    assert addresses.decode() == "10.0.0.5:415010.0.0.5:4150h\u00e9:4150"
    # HA ids are binary: as text they are their 32 hex digits.
    ha_id = (7).to_bytes(8, "big") + (99).to_bytes(8, "big")
    ha_offsets, ha_ids, *_ = codec.message_columns([codec.Message(TS, 1, ha_id, b"x", ha=True)], True)
    assert ints(ha_offsets, "i") == [0, 32] and ha_ids == ha_id.hex().encode()
    # A message without an address (not from a connection): no address column, the rest as usual.
    *rest, no_offsets, no_addresses = codec.message_columns([*messages, codec.Message(TS, 1, UPSTREAM_ID, b"y")], False)
    assert no_offsets is None and no_addresses is None and rest[5] == bodies + b"y"
    empty = codec.message_columns([], False)
    assert ints(empty[0], "i") == [0] and empty[1] == b"" and ints(empty[4], "i") == [0]
    # A column that 32-bit offsets cannot hold is refused, naming the sizes.
    with pytest.raises(InvalidValueError, match=r"3 messages take 48 bytes in one column, over the 40"):
        codec.message_columns(messages, False, 40)


def test_message_columns_agree_between_implementations():
    from fastnsq import _frame_py

    c_codec = pytest.importorskip("fastnsq._frame")
    stamps = [0, 1, 999, 1000, TS, 2**62]
    for hex_ids in (False, True):
        made = {
            impl: [impl.Message(ts, i % 7, b"%016x" % (i * 7919), bytes([i % 251]) * (i % 50 + 1),
                                ha=hex_ids, address=f"127.0.0.{i % 3}:4150")
                   for i, ts in enumerate(stamps * 20)]
            for impl in (c_codec, _frame_py)
        }
        assert c_codec.message_columns(made[c_codec], hex_ids) == _frame_py.message_columns(made[_frame_py], hex_ids)


def test_fits_one_mpub_is_the_common_batch_only(codec):
    # limit is the MPUB body budget after its 8 framing bytes: 4 + len per body.
    assert codec.fits_one_mpub([b"ab", b"c"], 4 + 2 + 4 + 1, 2, 2)
    assert not codec.fits_one_mpub([b"ab", b"c"], 4 + 2 + 4 + 1 - 1, 2, 2)  # one byte over the budget
    assert not codec.fits_one_mpub([b"ab", b"c"], 100, 1, 2)  # more messages than max_count
    assert not codec.fits_one_mpub([b"abc"], 100, 5, 2)  # above max_msg_size
    assert not codec.fits_one_mpub([b"a", b""], 100, 5, 2)  # nsqd refuses empty messages
    assert not codec.fits_one_mpub([b"a", bytearray(b"b")], 100, 5, 2)  # per-item path converts it
    assert not codec.fits_one_mpub([], 100, 5, 2)
