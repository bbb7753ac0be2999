"""Replay every conversation recorded from a real nsqd 1.3.0 against the embedded nsqd.

Each scenario of shared/captures/nsqd-1.3.0 is replayed step by step on a fresh
embedded :class:`~fastnsq.testing.nsqd.NSQD`: a ``send`` step writes the recorded bytes,
a ``recv`` step reads what arrives within a short wait (up to EOF for ``eof: true``)
and compares it with the recorded bytes, frame by frame.

How the comparison treats what may legitimately differ:

- the fields the scenario lists under ``variable`` (message timestamps and ids, the
  version in the JSON): a message frame must have the same size, attempts and body,
  an 8-byte timestamp and an id of 16 ASCII hex characters;
- compressed streams (after the IDENTIFY JSON of the snappy/deflate scenarios) are
  compared after decompressing both the recorded and the actual bytes with
  fastnsq.compression: two compressors need not produce the same bytes;
- the position of message frames among responses and errors: nsqd writes messages
  from its message pump goroutine and responses from the connection's read loop, so
  how they interleave is a race in nsqd itself (the capture is one outcome). Message
  frames are therefore compared in their own order, and every other frame in its
  own order.

The HTTP answers (http.json) are compared by status, content headers and JSON shape.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fastnsq.compression import DeflateStream, SnappyStream
from fastnsq.testing.nsqd import NSQD

from .captures import COMPRESSED, http_answers, load, scenario_names

# How long a recv step waits for the recorded bytes, and how long it then listens
# for anything more (a frame too many is a failure too).
RECV_TIMEOUT = 3.0
QUIET = 0.15
EMPTY_WAIT = 0.3
HEX = re.compile(rb"^[0-9a-f]{16}$")


def split_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """(frame type, data) for each complete frame, and the bytes left over."""
    frames = []
    pos = 0
    while len(data) - pos >= 8:
        size = struct.unpack_from(">i", data, pos)[0]
        if len(data) - pos - 4 < size:
            break
        frame_type = struct.unpack_from(">i", data, pos + 4)[0]
        frames.append((frame_type, data[pos + 8 : pos + 4 + size]))
        pos += 4 + size
    return frames, data[pos:]


def message_fields(data: bytes) -> tuple[int, bytes, bytes]:
    """(attempts, id, body) of a message frame's data (the timestamp is variable)."""
    assert len(data) >= 26, f"message frame too short: {data!r}"
    return struct.unpack_from(">H", data, 8)[0], data[10:26], data[26:]


def assert_frames_match(
    expected: bytes, actual: bytes, variable: list[str], where: str, ids: dict[bytes, bytes] | None = None
) -> None:
    """Compare two plain frame streams as described in the module docstring.

    ``ids`` collects recorded message id -> received message id.
    """
    exp_frames, exp_rest = split_frames(expected)
    act_frames, act_rest = split_frames(actual)
    assert exp_rest == b"", f"{where}: the recording has a partial frame"
    assert act_rest == b"", f"{where}: partial frame received: {act_rest!r}"
    assert len(act_frames) == len(exp_frames), f"{where}: frames {act_frames!r}, recorded {exp_frames!r}"
    exp_messages = [data for kind, data in exp_frames if kind == 2]
    act_messages = [data for kind, data in act_frames if kind == 2]
    assert len(act_messages) == len(exp_messages), f"{where}: {act_frames!r} vs {exp_frames!r}"
    for exp, act in zip(exp_messages, act_messages):
        exp_attempts, _, exp_body = message_fields(exp)
        act_attempts, act_id, act_body = message_fields(act)
        assert (act_attempts, act_body) == (exp_attempts, exp_body), f"{where}: message {act!r} vs {exp!r}"
        assert HEX.match(act_id), f"{where}: message id {act_id!r} is not 16 ASCII hex characters"
        if ids is not None:
            ids[message_fields(exp)[1]] = act_id
        if not any("id" in v for v in variable):
            assert act_id == message_fields(exp)[1]
    exp_others = [(kind, data) for kind, data in exp_frames if kind != 2]
    act_others = [(kind, data) for kind, data in act_frames if kind != 2]
    if any("version" in v for v in variable):
        exp_others = [(k, re.sub(rb'"version":"[^"]*"', b'"version":""', d)) for k, d in exp_others]
        act_others = [(k, re.sub(rb'"version":"[^"]*"', b'"version":""', d)) for k, d in act_others]
    assert act_others == exp_others
    if not exp_messages and not any("version" in v for v in variable):
        # Without messages the bytes must be identical (sizes included).
        assert actual == expected, f"{where}: {actual!r} vs recorded {expected!r}"


class Replayer:
    """One client connection replaying a scenario's steps."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        self.reader = reader
        self.writer = writer
        self.name = name
        self.compressed = name in COMPRESSED
        self.kind = "snappy" if "snappy" in name else "deflate"
        # Decompressors for the recorded and for the received server streams.
        self._expected_stream: SnappyStream | DeflateStream | None = None
        self._actual_stream: SnappyStream | DeflateStream | None = None
        # Message ids are variable: FIN/REQ/TOUCH of a recorded id are sent with the
        # id the embedded server gave the same message.
        self.ids: dict[bytes, bytes] = {}

    async def send(self, data: bytes) -> None:
        for recorded, received in self.ids.items():
            data = data.replace(recorded, received)
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self, expected_size: int, eof: bool, timeout: float = RECV_TIMEOUT) -> bytes:
        """What arrives: up to EOF, or ``expected_size`` bytes plus a quiet period."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        data = b""
        if eof:
            while True:
                chunk = await asyncio.wait_for(self.reader.read(65536), max(0.01, deadline - loop.time()))
                if not chunk:
                    return data
                data += chunk
        if expected_size == 0:
            try:
                return await asyncio.wait_for(self.reader.read(65536), EMPTY_WAIT)
            except asyncio.TimeoutError:
                return b""
        while len(data) < expected_size and loop.time() < deadline:
            try:
                chunk = await asyncio.wait_for(self.reader.read(65536), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            if not chunk:
                return data
            data += chunk
        try:
            data += await asyncio.wait_for(self.reader.read(65536), QUIET)
        except asyncio.TimeoutError:
            pass
        return data

    def _stream(self) -> SnappyStream | DeflateStream:
        return SnappyStream() if self.kind == "snappy" else DeflateStream()

    def compare(self, expected: bytes, actual: bytes, variable: list[str], where: str) -> None:
        if not self.compressed:
            assert_frames_match(expected, actual, variable, where, self.ids)
            return
        if self._expected_stream is None:
            # The first answer: the IDENTIFY JSON in plaintext, then the compressed stream.
            size = struct.unpack_from(">i", expected, 0)[0]
            plain_exp, expected = expected[: 4 + size], expected[4 + size :]
            assert actual[: 4 + size] == plain_exp, f"{where}: {actual!r} vs {plain_exp!r}"
            actual = actual[4 + size :]
            self._expected_stream, self._actual_stream = self._stream(), self._stream()
        if self.kind == "snappy":
            assert actual[:10] == expected[:10] or not expected.startswith(b"\xff\x06")
        plain_expected = self._expected_stream.decompress(expected)
        plain_actual = self._actual_stream.decompress(actual)  # type: ignore[union-attr]
        assert_frames_match(plain_expected, plain_actual, variable, where, self.ids)

    def expected_size(self, expected: bytes) -> int:
        """How many bytes to wait for (compressed sizes differ: wait for any)."""
        if self.compressed and self._expected_stream is not None:
            return 1
        if self.compressed:
            return struct.unpack_from(">i", expected, 0)[0] + 5
        return len(expected)


async def replay(embedded: NSQD, name: str) -> None:
    """Replay scenario ``name`` on its own connection to ``embedded``."""
    scenario = load(name)
    variable = scenario.get("variable") or []
    host, port = embedded.tcp_address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    replayer = Replayer(reader, writer, name)
    try:
        for index, step in enumerate(scenario["steps"]):
            where = f"{name} step {index} ({step.get('why')})"
            if "send" in step:
                await replayer.send(bytes.fromhex(step["send"]))
                continue
            expected = bytes.fromhex(step["recv"])
            eof = bool(step.get("eof"))
            actual = await replayer.receive(replayer.expected_size(expected), eof)
            replayer.compare(expected, actual, variable, where)
    finally:
        writer.close()


@pytest.fixture
async def embedded() -> AsyncIterator[NSQD]:
    """A fresh embedded nsqd (the captures are replayed on the embedded server only)."""
    server = NSQD()
    await server.start()
    yield server
    await server.stop()


SCENARIOS = [n for n in scenario_names() if n not in ("consume", "heartbeat_timeout")]


@pytest.mark.parametrize("name", SCENARIOS)
async def test_scenario(embedded: NSQD, name: str) -> None:
    await replay(embedded, name)


async def test_consume_after_publish(embedded: NSQD) -> None:
    # consume.json was recorded on the nsqd that had just run publish.json (same
    # topic cap_topic, no channel yet): its messages are the ones publish.json
    # published, so publish.json is replayed first on the same server. SUB then
    # creates cap_channel, which receives the messages waiting in the topic; the DPUB
    # message is deferred by 1 s from then, so the first three are hello, a, bc.
    await replay(embedded, "publish")
    await replay(embedded, "consume")


async def test_heartbeat_timeout(embedded: NSQD) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await replay(embedded, "heartbeat_timeout")
    elapsed = loop.time() - started
    # Two heartbeats 1 s apart, then the read deadline (2 x 1 s) closes the connection.
    assert 1.8 < elapsed < 3.0, elapsed


# ---- HTTP -----------------------------------------------------------------------------

# Keys nsqd leaves out when zero or empty (Go's omitempty).
OMITEMPTY = {
    "zone_local_msg_count",
    "region_local_msg_count",
    "global_msg_count",
    "authed",
    "auth_identity",
    "auth_identity_url",
    "pub_counts",
}


def assert_same_shape(expected: Any, actual: Any, where: str) -> None:
    """Same JSON shape: the same keys (in the same order) and value types, recursively."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not an object"
        exp_keys = [k for k in expected if k not in OMITEMPTY]
        act_keys = [k for k in actual if k not in OMITEMPTY]
        assert act_keys == exp_keys, f"{where}: keys {act_keys} vs recorded {exp_keys}"
        for key in set(expected) & set(actual):
            assert_same_shape(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: {actual!r} is not a list"
        if expected and actual:
            for item in actual:
                assert_same_shape(expected[0], item, f"{where}[]")
    elif expected is None:
        assert actual is None, f"{where}: {actual!r} is not null"
    else:
        # bool before int: in Python a bool is an int.
        assert type(actual) is type(expected), f"{where}: {actual!r} is not a {type(expected).__name__}"


def assert_http_matches(key: str, status: int, headers: Any, body: bytes) -> None:
    recorded = http_answers()[key]
    assert status == recorded["status"], f"{key}: status {status}, body {body!r}"
    for header in ("Content-Type", "X-Nsq-Content-Type"):
        assert headers.get(header) == recorded["headers"].get(header), f"{key}: {header}"
    if recorded["headers"].get("Content-Type", "").startswith("application/json"):
        assert_same_shape(json.loads(recorded["body"]), json.loads(body), key)
    else:
        assert body.decode() == recorded["body"], key


async def test_http_answers(embedded: NSQD) -> None:
    # The recorded /stats came after publish, consume and the error scenarios (which
    # created the channel cap_err), with no client connected: rebuild that state.
    await replay(embedded, "publish")
    await replay(embedded, "consume")
    await replay(embedded, "err_sub_twice")
    await asyncio.sleep(0.05)
    url = f"http://{embedded.http_address}"
    accept = {"Accept": "application/vnd.nsq; version=1.0"}
    requests = [
        ("nsqd_ping", "GET", "/ping", None),
        ("nsqd_pub", "POST", "/pub?topic=cap_http", b"http hello"),
        ("nsqd_mpub", "POST", "/mpub?topic=cap_http", b"one\ntwo\n"),
        ("nsqd_pub_bad_topic", "POST", "/pub?topic=bad*topic", b"x"),
        ("nsqd_info", "GET", "/info", None),
        ("nsqd_stats", "GET", "/stats?format=json&topic=cap_topic", None),
    ]
    async with aiohttp.ClientSession(headers=accept) as session:
        for key, method, path, body in requests:
            async with session.request(method, url + path, data=body) as response:
                assert_http_matches(key, response.status, response.headers, await response.read())
