"""The codec against real nsqd conversations (tests/captures): ground truth.

Every byte the server sent decodes, through both implementations, to the frames the
capture lists (compressed streams are decompressed first, as a connection does); every
command the client sent is reproduced byte for byte by the encoders, and the commands
that nsqd rejects as malformed are refused by the encoders before a byte is written.
"""

from __future__ import annotations

import pytest

from fastnsq.compression import make_stream
from fastnsq.errors import InvalidValueError

from . import captures
from .captures.wire import compression_of

SCENARIOS = captures.scenario_names()


class ServerSide:
    """Decodes what the server sent, switching to decompression after the IDENTIFY JSON."""

    def __init__(self, codec, compression: str | None) -> None:
        self.frames: list[tuple] = []
        self.compression = compression
        self.stream = None
        self.reader = codec.FrameReader(
            lambda m: self.frames.append(("msg", m)), self._on_response, self._on_error
        )

    def _on_response(self, data) -> None:
        self.frames.append(("resp", data))
        if self.compression and self.stream is None and bytes(data).startswith(b"{"):
            self.reader.pause()  # what follows the JSON is the compressed stream

    def _on_error(self, code: str, description: str) -> None:
        self.frames.append(("err", f"{code} {description}".rstrip()))

    def receive(self, data: bytes) -> list[tuple]:
        start = len(self.frames)
        if self.stream is not None:
            self.reader.feed(self.stream.decompress(data))
        else:
            self.reader.feed(data)
            if self.reader.paused:
                self.stream = make_stream(self.compression)
                rest = self.reader.take_unparsed()
                self.reader.resume()
                self.reader.feed(self.stream.decompress(rest))
        return self.frames[start:]


def _expected(frame: dict) -> tuple:
    if frame["type"] == 2:
        return ("msg", frame["timestamp"], frame["attempts"], frame["id"].encode(), frame["body"].encode())
    if frame["type"] == 1:
        return ("err", frame["data"])
    return ("resp", frame["data"].encode("latin-1"))


def _actual(frame: tuple) -> tuple:
    if frame[0] == "msg":
        m = frame[1]
        return ("msg", m.timestamp, m.attempts, m.id, m.body)
    return frame


@pytest.mark.parametrize("version", captures.VERSIONS)
@pytest.mark.parametrize("name", SCENARIOS)
def test_server_bytes_decode_to_the_recorded_frames(codec, name, version):
    # Both recordings: the released nsqd v1.3.0 and nsq master.
    scenario = captures.load(name, version)
    compression = compression_of(scenario)
    side = ServerSide(codec, compression)
    checked = 0
    for step in scenario["steps"]:
        if "recv" not in step:
            continue
        raw = bytes.fromhex(step["recv"])
        expected = [_expected(f) for f in step["frames"]]
        listed = sum(f["size"] + 4 for f in step["frames"])
        if compression and len(raw) > listed:
            # The capture lists frames up to the compressed bytes; in every compressed
            # scenario those bytes hold nsqd's OK (to the upgrade, then to the PUB).
            expected.append(("resp", b"OK"))
        else:
            assert listed == len(raw), "the listed frames cover the bytes"
        got = [_actual(f) for f in side.receive(raw)]
        assert got == expected, step["why"]
        for frame, recorded in zip(got, step["frames"]):
            if frame[0] == "resp":
                assert recorded["size"] == len(frame[1]) + 4
        checked += len(got)
    assert checked, "a scenario with nothing to check"


def test_compressed_scenarios_are_recognised():
    found = {name: compression_of(captures.load(name)) for name in captures.COMPRESSED}
    assert found == {
        "deflate_publish": "deflate",
        "identify_deflate": "deflate",
        "snappy_publish": "snappy",
        "identify_snappy": "snappy",
    }


# ---- client commands ---------------------------------------------------------------------

# Commands nsqd rejects as malformed; the encoders must refuse to produce them.
REFUSED = {
    (b"PUB", (b"bad*topic",)): lambda w: w.pub("bad*topic", b"x"),
    (b"PUB", (b"cap_topic",), 0): lambda w: w.pub("cap_topic", b""),
    (b"FIN", (b"1234",)): lambda w: w.fin(b"1234"),
    (b"RDY", (b"2501",)): lambda w: w.rdy(2501),
}
NO_ENCODER = {b"BOGUS", b"  V1"}  # an unknown command and a wrong magic: no encoder writes them


def _reencode(codec, w, name: bytes, params: list[bytes], body) -> None:
    text = [p.decode("latin-1") for p in params]
    if name == b"IDENTIFY":
        w.identify(body)
    elif name == b"AUTH":
        w.auth(body)
    elif name == b"SUB":
        w.sub(*text[:2], *(int(p) for p in text[2:]))
    elif name == b"RDY":
        w.rdy(int(text[0]))
    elif name == b"FIN":
        w.fin(params[0])
    elif name == b"REQ":
        w.req(params[0], int(text[1]))
    elif name == b"TOUCH":
        w.touch(params[0])
    elif name == b"CLS":
        w.cls()
    elif name == b"NOP":
        w.nop()
    elif name == b"PUB":
        w.pub(text[0], body)
    elif name == b"MPUB":
        w.mpub(text[0], codec.decode_mpub(body, 1048576, 5242880))
    elif name == b"DPUB":
        w.dpub(text[0], int(text[1]), body)
    else:  # pragma: no cover - a capture with a command this test does not know
        raise AssertionError(f"no encoder mapping for {name!r}")


def _client_streams(codec, name: str):
    """Yields (plain bytes, [(name, params, body)]) for each client send, decompressed."""
    scenario = captures.load(name)
    compression = compression_of(scenario)
    stream = None
    identified = False
    for step in scenario["steps"]:
        if "send" not in step:
            continue
        raw = bytes.fromhex(step["send"])
        if stream is not None:
            raw = stream.decompress(raw)
        commands: list[tuple] = []
        magic: list[bytes] = []
        if raw in (b"  V2", b"  V1"):
            magic.append(raw)
        else:
            reader = codec.CommandReader(lambda n, p, b, commands=commands: commands.append((n, p, b)))
            reader.feed(raw)
            # Everything was split, except after a refused length (nsqd stops reading there).
            assert reader.buffered == 0 or isinstance(commands[-1][2], int)
        yield raw, magic, commands
        if compression and not identified and commands and commands[0][0] == b"IDENTIFY":
            identified = True
            stream = make_stream(compression)


@pytest.mark.parametrize("name", SCENARIOS)
def test_client_commands_are_reproduced_byte_for_byte(codec, name):
    reproduced = refused = 0
    for raw, magic, commands in _client_streams(codec, name):
        w = codec.WriteBuffer()
        if magic:
            if magic[0] == b"  V1":
                assert b"  V1" in NO_ENCODER
                refused += 1
                continue
            w.magic()
            assert w.take() == raw
            reproduced += 1
            continue
        all_encodable = True
        for cmd_name, params, body in commands:
            key = (cmd_name, tuple(params)) + ((body,) if isinstance(body, int) else ())
            if key in REFUSED:
                with pytest.raises(InvalidValueError):
                    REFUSED[key](codec.WriteBuffer())
                refused += 1
                all_encodable = False
            elif cmd_name in NO_ENCODER:
                refused += 1
                all_encodable = False
            else:
                _reencode(codec, w, cmd_name, params, body)
        if all_encodable:
            assert w.take() == raw, name
            reproduced += len(commands)
    assert reproduced + refused > 0


def test_every_capture_command_kind_is_covered(codec):
    seen = set()
    for name in SCENARIOS:
        for _, magic, commands in _client_streams(codec, name):
            seen.update(c[0] for c in commands)
            seen.update(magic)
    assert seen == {
        b"  V2", b"  V1", b"IDENTIFY", b"AUTH", b"SUB", b"RDY", b"FIN", b"REQ", b"TOUCH",
        b"CLS", b"NOP", b"PUB", b"MPUB", b"DPUB", b"BOGUS",
    }
