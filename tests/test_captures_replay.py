"""Replay every conversation recorded from a real nsqd against the embedded nsqd.

Two recordings (``tests/captures``): the released nsqd v1.3.0 (what the embedded nsqd
answers like by default) and nsq master 3103474b (``NSQD(emulate="master")``). Each
scenario is replayed step by step on a fresh embedded :class:`~fastnsq.testing.nsqd.NSQD`
emulating that version: a ``send`` step writes the recorded bytes, a ``recv`` step
reads as many frames as the recording holds (plus a quiet period, or up to EOF) and
compares them with the recorded ones, frame by frame.

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

The HTTP answers of the released version are compared byte for byte (only the values
of ``http_requests.VARIABLE_KEYS`` may differ: times, ports, addresses, memory); the
older master recording, made from another server state, by status, headers and shape.
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

from fastnsq.testing.lookupd import NSQLookupd, go_json
from fastnsq.testing.nsqd import MASTER, NSQD, RELEASED

from .captures import VERSIONS, http_answers, http_requests, load, scenario_names
from .captures.wire import Conversation, expected_frames, split_frames
from .helpers import Slack

HEX = re.compile(rb"^[0-9a-f]{16}$")


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


def assert_messages_and_others_match(
    expected: list[tuple[int, bytes]], actual: list[tuple[int, bytes]], variable: list[str], where: str
) -> None:
    """Compare decoded frames (compressed streams are decoded by the conversation)."""
    exp_bytes = b"".join(struct.pack(">ii", 4 + len(d), t) + d for t, d in expected)
    act_bytes = b"".join(struct.pack(">ii", 4 + len(d), t) + d for t, d in actual)
    assert_frames_match(exp_bytes, act_bytes, variable, where)


async def replay(embedded: NSQD, name: str, version: str) -> None:
    """Replay scenario ``name`` of ``version``'s recording on its own connection to ``embedded``."""
    scenario = load(name, version)
    variable = scenario.get("variable") or []
    wanted = iter(expected_frames(scenario))
    conversation = await Conversation.open(embedded.tcp_address, scenario)
    try:
        for index, step in enumerate(scenario["steps"]):
            where = f"{version} {name} step {index} ({step.get('why')})"
            if "send" in step:
                await conversation.send(bytes.fromhex(step["send"]))
                continue
            expected = next(wanted)
            eof = bool(step.get("eof"))
            data, frames, closed = await conversation.receive(len(expected), eof)
            conversation.learn_ids(expected, frames)
            assert closed == eof, f"{where}: closed={closed}, recorded eof={eof}"
            assert_messages_and_others_match(expected, frames, variable, where)
            plain = conversation.stream.compression is None and not any(k == 2 for k, _ in expected)
            if plain and not any("version" in v for v in variable):
                # Without messages nor compression the bytes must be identical.
                assert data == bytes.fromhex(step["recv"]), f"{where}: {data!r}"
    finally:
        await conversation.close()


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    """Each recorded upstream version in turn: the released v1.3.0, then nsq master."""
    return str(request.param)


@pytest.fixture
async def embedded(version: str) -> AsyncIterator[NSQD]:
    """A fresh embedded nsqd emulating ``version`` (the captures are replayed on the embedded server only)."""
    server = NSQD(emulate=version)
    await server.start()
    yield server
    await server.stop()


def _scenarios(version: str) -> list[str]:
    return [n for n in scenario_names(version) if n not in ("consume", "heartbeat_timeout")]


@pytest.mark.parametrize(
    ("version", "name"), [(v, n) for v in VERSIONS for n in _scenarios(v)], indirect=["version"]
)
async def test_scenario(embedded: NSQD, version: str, name: str) -> None:
    await replay(embedded, name, version)


def test_both_recordings_have_the_same_scenarios() -> None:
    assert scenario_names(RELEASED) == scenario_names(MASTER)
    assert len(scenario_names(RELEASED)) >= 20


@pytest.mark.parametrize(("version", "topology"), [(RELEASED, False), (MASTER, True)])
def test_only_master_answers_with_the_topology(version: str, topology: bool) -> None:
    (answer,) = expected_frames(load("identify_negotiate", version))[0]
    identify = json.loads(answer[1])
    assert ("topology_zone" in identify, "topology_region" in identify) == (topology, topology)
    info = json.loads(http_answers(version)["nsqd_info"]["body"])
    assert ("topology_zone" in info) == topology


async def test_consume_after_publish(embedded: NSQD, version: str) -> None:
    # consume.json was recorded on the nsqd that had just run publish.json (same
    # topic cap_topic, no channel yet): its messages are the ones publish.json
    # published, so publish.json is replayed first on the same server. SUB then
    # creates cap_channel, which receives the messages waiting in the topic; the DPUB
    # message is deferred by 1 s from then, so the first three are hello, a, bc.
    await replay(embedded, "publish", version)
    await replay(embedded, "consume", version)


async def test_heartbeat_timeout(embedded: NSQD, version: str) -> None:
    loop = asyncio.get_running_loop()
    async with Slack() as slack:
        started = loop.time()
        scenario = load("heartbeat_timeout", version)
        conversation = await Conversation.open(embedded.tcp_address, scenario)
        try:
            for step in scenario["steps"]:
                if "send" in step:
                    await conversation.send(bytes.fromhex(step["send"]))
            # Heartbeats 1 s apart, then the read deadline (2 x 1 s) closes the connection;
            # whether the second heartbeat beats the close is a race in nsqd too.
            _, frames, closed = await conversation.receive(1, eof=True)
        finally:
            await conversation.close()
        elapsed = loop.time() - started
    assert closed
    # Not before the deadline; at it, plus the slack measured meanwhile (not a fixed margin).
    assert 1.8 < elapsed < 2 * 1.0 + slack.allowance(0.5), (elapsed, slack)
    assert frames[0][1].startswith(b"{")
    assert 1 <= len(frames) - 1 <= 2 and all(f == (0, b"_heartbeat_") for f in frames[1:]), frames


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


def assert_http_matches(version: str, key: str, status: int, headers: Any, body: bytes) -> None:
    recorded = http_answers(version)[key]
    assert status == recorded["status"], f"{key}: status {status}, body {body!r}"
    for header in http_requests.HEADERS:
        assert headers.get(header) == recorded["headers"].get(header), f"{key}: {header}"
    if recorded["headers"].get("Content-Type", "").startswith("application/json"):
        assert_same_shape(json.loads(recorded["body"]), json.loads(body), key)
    else:
        assert body.decode() == recorded["body"], key


def assert_http_same_bytes(key: str, recorded: dict[str, Any], actual: dict[str, Any]) -> None:
    """Status, headers and body as recorded, but for the values of the variable keys."""
    assert (actual["status"], actual["headers"]) == (recorded["status"], recorded["headers"]), key
    if recorded["headers"].get("Content-Type", "").startswith("application/json"):
        expected = go_json(http_requests.with_values_of(json.loads(recorded["body"]), json.loads(actual["body"])))
        assert actual["body"].encode() == expected, f"{key}:\n{actual['body']}\nrecorded (variable values filled in):\n{expected.decode()}"
    else:
        assert actual["body"] == recorded["body"], key


async def test_http_answers_of_the_released_nsqd_byte_for_byte() -> None:
    # The recording's state: every scenario in the recorder's order (publish, consume,
    # the rest) on one nsqd registered with one lookupd, then http_requests.run.
    from .captures.record import FIRST

    async with NSQLookupd() as lookupd, NSQD(emulate=RELEASED, lookupd_tcp_addresses=[lookupd.tcp_address]) as nsqd:
        for name in FIRST + [n for n in scenario_names(RELEASED) if n not in FIRST]:
            if name == "heartbeat_timeout":
                continue  # the same server state without its 2 s of waiting (nothing published)
            await replay(nsqd, name, RELEASED)
        answers = await http_requests.run(nsqd.tcp_address, nsqd.http_address, lookupd.http_address)
    recorded = http_answers(RELEASED)
    assert sorted(answers) == sorted(recorded)
    for key, actual in answers.items():
        assert actual["request"] == recorded[key]["request"], key
        assert_http_same_bytes(key, recorded[key], actual)


async def test_http_answers_of_nsq_master_have_its_shape() -> None:
    # The master recording's /stats came after publish, consume and the error scenarios
    # (which created the channel cap_err), with no client connected.
    async with NSQD(emulate=MASTER) as nsqd:
        await replay(nsqd, "publish", MASTER)
        await replay(nsqd, "consume", MASTER)
        await replay(nsqd, "err_sub_twice", MASTER)
        await asyncio.sleep(0.05)
        async with aiohttp.ClientSession(headers=http_requests.ACCEPT_V1) as session:
            for key, _, method, path, body in http_requests.NSQD_REQUESTS:
                if key not in http_answers(MASTER):
                    continue
                async with session.request(method, f"http://{nsqd.http_address}{path}", data=body) as response:
                    assert_http_matches(MASTER, key, response.status, response.headers, await response.read())
