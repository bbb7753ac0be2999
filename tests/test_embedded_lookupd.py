"""The embedded nsqlookupd answers as a real nsqlookupd 1.3 does, seen through the wire only.

Registrations go over lookupd's TCP protocol with a raw client built on the codec
(standing in for an nsqd); HTTP answers are compared with the real lookupd's of the
same version (tests/captures: the released v1.3.0 and nsq master): status,
content-type headers, JSON shape.

With ``FASTNSQ_TEST_LOOKUPD_HTTP`` (and ``FASTNSQ_TEST_LOOKUPD_TCP``) set, the same
tests run against that real nsqlookupd: the HTTP ones register topics through the real
nsqd of ``FASTNSQ_TEST_NSQD_HTTP`` (registered with that lookupd), the TCP ones talk to
its TCP port as a made-up nsqd would. Only tests that configure, restart or reach into
the embedded server skip there, each saying which.
"""

from __future__ import annotations

import asyncio
import json
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from fastnsq import codec
from fastnsq.errors import InvalidValueError
from fastnsq.testing import NSQLookupd, external_lookupd_from_env, external_nsqd_from_env
from fastnsq.testing.lookupd import LOOKUPD_VERSION, decode_identify, go_json, parse_go_query
from fastnsq.testing.real import RealLookupdServer, real_bin_dir
from tests.captures import http_answers

from .helpers import upstream_version

ACCEPT_V1 = {"Accept": "application/vnd.nsq; version=1.0"}
EXTERNAL = external_lookupd_from_env()
EXTERNAL_NSQD = external_nsqd_from_env()
#: In the real pass, the binaries that a test needing a lookupd of its own starts it from.
REAL_BIN = real_bin_dir() if EXTERNAL is not None else None


def embedded_only(why: str) -> pytest.MarkDecorator:
    """Skip on a real lookupd, saying what of the embedded one the test needs."""
    return pytest.mark.skipif(EXTERNAL is not None, reason=f"needs the embedded nsqlookupd: {why}")


def own_lookupd(**options: Any) -> Any:
    """A lookupd of the test's own (to configure or restart): embedded, or in the real pass a
    real nsqlookupd from the binaries the run is judged against, the options as its flags."""
    if EXTERNAL is None:
        return NSQLookupd(**options)
    if REAL_BIN is None:
        pytest.skip("starts its own nsqlookupd: name the real binaries with FASTNSQ_TEST_REAL_BIN "
                    "(python -m fastnsq.testing.real sets it)")
    return RealLookupdServer(REAL_BIN, **options)


def fake_port() -> int:
    """A TCP port for a made-up nsqd (nothing listens: lookupd only stores it), unique per test."""
    return 20000 + 10 * (uuid.uuid4().int % 900)

# The headers http.json recorded; compared on these names only (Date etc. vary).
COMPARED_HEADERS = ("Content-Type", "X-Nsq-Content-Type")


def unique(prefix: str) -> str:
    """A topic/channel name no other run uses (the real servers keep state)."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# ---- a raw lookupd TCP client on the codec -----------------------------------------------


class RawLookupdClient:
    """nsqd's side of the lookupd TCP protocol, with nothing of fastnsq above the codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        host, port = writer.get_extra_info("sockname")[:2]
        self.local_address = f"{host}:{port}"

    @classmethod
    async def connect(cls, address: str, magic: bytes = b"  V1") -> RawLookupdClient:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(magic)
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def send_identify(self, body: bytes) -> None:
        out = codec.WriteBuffer()
        out.identify(body)
        self.send(out.take())

    async def identify(self, **fields: Any) -> dict[str, Any]:
        self.send_identify(json.dumps(fields).encode())
        return json.loads(await self.answer())

    async def answer(self) -> bytes:
        """One answer: u32 BE size, then the bytes (no frame type)."""
        (size,) = struct.unpack(">I", await asyncio.wait_for(self.reader.readexactly(4), 5))
        return await asyncio.wait_for(self.reader.readexactly(size), 5)

    async def command(self, line: str) -> bytes:
        self.send(line.encode() + b"\n")
        return await self.answer()

    async def closed_by_server(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


def peer_fields(port: int, **overrides: Any) -> dict[str, Any]:
    """An IDENTIFY body as the released nsqd 1.3.0 sends it (TCP on ``port``, HTTP on ``port + 1``).

    (nsq master adds ``topology_zone`` and ``topology_region``; lookupds of both
    versions take either.)
    """
    fields = {
        "version": "1.3.0",
        "tcp_port": port,
        "http_port": port + 1,
        "hostname": "testhost",
        "broadcast_address": "127.0.0.1",
    }
    fields.update(overrides)
    return fields


def tcp_address(lookupd: Any) -> str:
    """The lookupd's TCP address (a real one's comes from ``FASTNSQ_TEST_LOOKUPD_TCP``)."""
    if not lookupd.tcp_address:
        pytest.skip("the real lookupd's TCP address is not given: set FASTNSQ_TEST_LOOKUPD_TCP")
    return str(lookupd.tcp_address)


async def node_of(http: aiohttp.ClientSession, lookupd: Any, remote_address: str) -> list[dict[str, Any]]:
    """The /nodes entries of the connection from ``remote_address`` (other nsqds may be registered)."""
    nodes = (await request(http, lookupd, "/nodes")).json()["producers"]
    return [n for n in nodes if n["remote_address"] == remote_address]


# ---- the server under test and how producers get into it -----------------------------------


@pytest.fixture
async def lookupd() -> AsyncIterator[Any]:
    if EXTERNAL is not None:
        yield EXTERNAL
        return
    async with NSQLookupd() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def request(
    http: aiohttp.ClientSession, server: Any, path: str, *, method: str = "GET", accept: bool = True
) -> Answer:
    headers = ACCEPT_V1 if accept else {}
    async with http.request(method, f"http://{server.http_address}{path}", headers=headers) as response:
        kept = {k: response.headers[k] for k in COMPARED_HEADERS if k in response.headers}
        return Answer(response.status, kept, await response.read())


async def version_of(lookupd: Any) -> str:
    """Which upstream lookupd this is: ``"v1.3.0"`` (released) or ``"master"`` (topology fields)."""
    if EXTERNAL is None:
        return await upstream_version(lookupd, None)
    return await upstream_version(None, EXTERNAL_NSQD.http_address if EXTERNAL_NSQD else None)


async def assert_like_capture(answer: Answer, name: str, lookupd: Any) -> Any:
    """Status and content-type headers exactly as the real lookupd's of the same version; the recorded body."""
    captured = http_answers(await version_of(lookupd))[name]
    assert answer.status == captured["status"]
    assert answer.headers == captured["headers"]
    return captured["body"]


class Registrar:
    """Puts a producer for topics/channels into the lookupd under test.

    Embedded: one raw TCP client per node (IDENTIFY + REGISTER). Real lookupd: the
    real nsqd creates the topic/channel and registers it itself.
    """

    def __init__(self, server: Any, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.http = http
        self.clients: list[RawLookupdClient] = []
        self.created: list[str] = []

    async def node(self, tcp_port: int = 24150) -> dict[str, Any]:
        """A registered node: its broadcast_address, tcp_port, http_port (and the raw client)."""
        if EXTERNAL is not None:
            if EXTERNAL_NSQD is None or EXTERNAL_NSQD.http_address is None:
                pytest.skip("registering with a real lookupd needs FASTNSQ_TEST_NSQD_HTTP")
            async with self.http.get(f"http://{EXTERNAL_NSQD.http_address}/info", headers=ACCEPT_V1) as r:
                info = json.loads(await r.read())
            return {
                "broadcast_address": info["broadcast_address"],
                "tcp_port": info["tcp_port"],
                "http_port": info["http_port"],
                "client": None,
            }
        client = await RawLookupdClient.connect(self.server.tcp_address)
        self.clients.append(client)
        await client.identify(**peer_fields(tcp_port))
        return {
            "broadcast_address": "127.0.0.1",
            "tcp_port": tcp_port,
            "http_port": tcp_port + 1,
            "client": client,
        }

    async def register(self, node: dict[str, Any], topic: str, channel: str | None = None) -> None:
        if node["client"] is not None:
            line = f"REGISTER {topic} {channel}" if channel else f"REGISTER {topic}"
            assert await node["client"].command(line) == b"OK"
            return
        assert EXTERNAL_NSQD is not None
        base = f"http://{EXTERNAL_NSQD.http_address}"
        # nsqd's /channel/create needs the topic to exist already.
        paths = [f"/topic/create?topic={topic}"]
        if channel:
            paths.append(f"/channel/create?topic={topic}&channel={channel}")
        for path in paths:
            async with self.http.post(base + path, headers=ACCEPT_V1) as r:
                assert r.status == 200
        self.created.append(topic)
        await self.wait_listed(topic, channel)

    async def wait_listed(self, topic: str, channel: str | None) -> None:
        # A real nsqd registers asynchronously.
        for _ in range(200):
            answer = await request(self.http, self.server, f"/lookup?topic={topic}")
            if (
                answer.status == 200
                and answer.json()["producers"]
                and (channel is None or channel in answer.json()["channels"])
            ):
                return
            await asyncio.sleep(0.025)
        raise AssertionError(f"{topic}/{channel} never showed up in the real lookupd")

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for topic in self.created:
            assert EXTERNAL_NSQD is not None
            async with self.http.post(f"http://{EXTERNAL_NSQD.http_address}/topic/delete?topic={topic}") as r:
                await r.read()
            async with self.http.post(f"{self.server.url}/topic/delete?topic={topic}") as r:
                await r.read()


@pytest.fixture
async def registrar(lookupd: Any, http: aiohttp.ClientSession) -> AsyncIterator[Registrar]:
    registrar = Registrar(lookupd, http)
    yield registrar
    await registrar.close()


# ---- HTTP: compared with the real nsqlookupd 1.3.0 ----------------------------------------------


async def test_ping_is_plain_ok_as_captured(lookupd: Any, http: aiohttp.ClientSession) -> None:
    answer = await request(http, lookupd, "/ping")
    assert answer.body.decode() == await assert_like_capture(answer, "lookupd_ping", lookupd)


async def test_info_has_the_captured_shape(lookupd: Any, http: aiohttp.ClientSession) -> None:
    answer = await request(http, lookupd, "/info")
    captured = json.loads(await assert_like_capture(answer, "lookupd_info", lookupd))
    assert list(answer.json()) == list(captured) == ["version"]
    if EXTERNAL is None:
        assert answer.json() == {"version": LOOKUPD_VERSION}


async def test_lookup_has_the_captured_shape(
    lookupd: Any, http: aiohttp.ClientSession, registrar: Registrar
) -> None:
    topic = unique("lk")
    node = await registrar.node()
    await registrar.register(node, topic, "cap_channel")
    await registrar.register(node, topic, "cap_err")

    answer = await request(http, lookupd, f"/lookup?topic={topic}")
    captured = json.loads(await assert_like_capture(answer, "lookupd_lookup", lookupd))
    body = answer.json()
    assert list(body) == list(captured) == ["channels", "producers"]
    assert sorted(body["channels"]) == ["cap_channel", "cap_err"]
    (producer,) = body["producers"]
    assert list(producer) == list(captured["producers"][0])
    assert {k: producer[k] for k in ("broadcast_address", "tcp_port", "http_port")} == {
        k: node[k] for k in ("broadcast_address", "tcp_port", "http_port")
    }
    if node["client"] is not None:
        # remote_address is the nsqd's end of its lookupd connection.
        assert producer["remote_address"] == node["client"].local_address
        assert (producer["hostname"], producer["version"]) == ("testhost", "1.3.0")
    # Byte-exact layout: Go's compact encoding of the same object.
    assert answer.body == go_json(body)


async def test_lookup_of_an_unknown_topic_is_the_captured_404(
    lookupd: Any, http: aiohttp.ClientSession
) -> None:
    answer = await request(http, lookupd, f"/lookup?topic={unique('nope')}")
    assert answer.body.decode() == await assert_like_capture(answer, "lookupd_lookup_missing", lookupd)


async def test_listlookup_is_the_captured_404(lookupd: Any, http: aiohttp.ClientSession) -> None:
    answer = await request(http, lookupd, "/listlookup")
    assert answer.body.decode() == await assert_like_capture(answer, "lookupd_listlookup", lookupd)


async def test_topics_channels_nodes_have_the_captured_shape(
    lookupd: Any, http: aiohttp.ClientSession, registrar: Registrar
) -> None:
    topic, other = unique("tcn"), unique("tcn2")
    node = await registrar.node()
    await registrar.register(node, topic, "cap_channel")
    await registrar.register(node, other)

    topics = await request(http, lookupd, "/topics")
    assert list(topics.json()) == list(json.loads(await assert_like_capture(topics, "lookupd_topics", lookupd)))
    assert {topic, other} <= set(topics.json()["topics"])

    channels = await request(http, lookupd, f"/channels?topic={topic}")
    assert channels.json() == {"channels": ["cap_channel"]}
    await assert_like_capture(channels, "lookupd_channels", lookupd)

    nodes = await request(http, lookupd, "/nodes")
    captured = json.loads(await assert_like_capture(nodes, "lookupd_nodes", lookupd))
    mine = [
        p
        for p in nodes.json()["producers"]
        if (p["broadcast_address"], p["tcp_port"]) == (node["broadcast_address"], node["tcp_port"])
    ]
    assert len(mine) == 1
    assert list(mine[0]) == list(captured["producers"][0])
    assert {topic, other} <= set(mine[0]["topics"])
    assert len(mine[0]["tombstones"]) == len(mine[0]["topics"])
    assert not any(mine[0]["tombstones"])


async def test_channels_of_an_unknown_topic_is_an_empty_list(
    lookupd: Any, http: aiohttp.ClientSession
) -> None:
    answer = await request(http, lookupd, f"/channels?topic={unique('none')}")
    assert (answer.status, answer.json()) == (200, {"channels": []})


@pytest.mark.parametrize(
    ("path", "method", "status", "message"),
    [
        ("/lookup", "GET", 400, "MISSING_ARG_TOPIC"),
        ("/channels", "GET", 400, "MISSING_ARG_TOPIC"),
        ("/lookup?topic=a;b", "GET", 400, "INVALID_REQUEST"),
        ("/no/such/path", "GET", 404, "NOT_FOUND"),
        ("/topic/create?topic=x", "GET", 405, "METHOD_NOT_ALLOWED"),
        ("/lookup?topic=x", "POST", 405, "METHOD_NOT_ALLOWED"),
        ("/topic/create", "POST", 400, "MISSING_ARG_TOPIC"),
        ("/topic/create?topic=bad!name", "POST", 400, "INVALID_ARG_TOPIC"),
        ("/topic/delete", "POST", 400, "MISSING_ARG_TOPIC"),
        ("/channel/create?channel=c", "POST", 400, "MISSING_ARG_TOPIC"),
        ("/channel/create?topic=t", "POST", 400, "MISSING_ARG_CHANNEL"),
        ("/channel/create?topic=t&channel=bad!name", "POST", 400, "INVALID_ARG_CHANNEL"),
        ("/channel/delete?topic=nope_t&channel=nope_c", "POST", 404, "CHANNEL_NOT_FOUND"),
        ("/topic/tombstone?topic=t", "POST", 400, "MISSING_ARG_NODE"),
    ],
)
async def test_errors_are_v1_json_with_the_real_status(
    lookupd: Any, http: aiohttp.ClientSession, path: str, method: str, status: int, message: str
) -> None:
    answer = await request(http, lookupd, path, method=method)
    assert answer.status == status
    # The same headers as the captured 404.
    assert answer.headers == http_answers(await version_of(lookupd))["lookupd_lookup_missing"]["headers"]
    assert answer.json() == {"message": message}


@pytest.mark.parametrize(
    "path",
    [
        "/lookup?topic={topic}",
        "/lookup?topic=missing_{topic}",
        "/topics",
        "/info",
        "/channels?topic={topic}",
        "/listlookup",
    ],
)
async def test_answers_are_v1_with_or_without_the_accept_header(
    lookupd: Any, http: aiohttp.ClientSession, registrar: Registrar, path: str
) -> None:
    # Upstream nsqlookupd 1.x ignores Accept (nsqlookupd's ``http.go``): same bytes either way.
    topic = unique("acc")
    node = await registrar.node()
    await registrar.register(node, topic, "ch")
    with_accept = await request(http, lookupd, path.format(topic=topic))
    without = await request(http, lookupd, path.format(topic=topic), accept=False)
    assert without.headers.get("X-Nsq-Content-Type") == "nsq; version=1.0"
    assert (without.status, without.headers) == (with_accept.status, with_accept.headers)
    # The same bytes, but for the order of listed names: nsqlookupd lists topics and
    # channels in Go's map order, which differs from one call to the next.
    assert names_sorted(without.body) == names_sorted(with_accept.body)


def names_sorted(body: bytes) -> bytes:
    """``body`` with its lists of names (topics, channels) in sorted order."""
    data = json.loads(body)
    for key in ("topics", "channels"):
        if isinstance(data, dict) and isinstance(data.get(key), list):
            data[key] = sorted(data[key])
    return go_json(data)


async def test_topic_create_and_delete(lookupd: Any, http: aiohttp.ClientSession) -> None:
    topic = unique("ct")
    created = await request(http, lookupd, f"/topic/create?topic={topic}", method="POST")
    # 200, empty body: Go sends no Content-Type for it.
    assert (created.status, created.headers, created.body) == (
        200,
        {"X-Nsq-Content-Type": "nsq; version=1.0"},
        b"",
    )
    assert topic in (await request(http, lookupd, "/topics")).json()["topics"]
    looked_up = await request(http, lookupd, f"/lookup?topic={topic}")
    assert (looked_up.status, looked_up.json()) == (200, {"channels": [], "producers": []})

    deleted = await request(http, lookupd, f"/topic/delete?topic={topic}", method="POST")
    assert (deleted.status, deleted.body) == (200, b"")
    assert topic not in (await request(http, lookupd, "/topics")).json()["topics"]
    assert (await request(http, lookupd, f"/lookup?topic={topic}")).status == 404


async def test_channel_create_and_delete(lookupd: Any, http: aiohttp.ClientSession) -> None:
    topic = unique("cc")
    created = await request(http, lookupd, f"/channel/create?topic={topic}&channel=ch", method="POST")
    assert (created.status, created.body) == (200, b"")
    assert topic in (await request(http, lookupd, "/topics")).json()["topics"]
    assert (await request(http, lookupd, f"/channels?topic={topic}")).json() == {"channels": ["ch"]}

    deleted = await request(http, lookupd, f"/channel/delete?topic={topic}&channel=ch", method="POST")
    assert (deleted.status, deleted.body) == (200, b"")
    assert (await request(http, lookupd, f"/channels?topic={topic}")).json() == {"channels": []}
    again = await request(http, lookupd, f"/channel/delete?topic={topic}&channel=ch", method="POST")
    assert (again.status, again.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})
    await request(http, lookupd, f"/topic/delete?topic={topic}", method="POST")


async def test_tombstoned_producer_leaves_lookup_but_not_nodes(
    lookupd: Any, http: aiohttp.ClientSession, registrar: Registrar
) -> None:
    topic, other = unique("tomb"), unique("tomb_other")
    node = await registrar.node()
    await registrar.register(node, topic, "ch")
    await registrar.register(node, other)
    where = f"{node['broadcast_address']}:{node['http_port']}"

    answer = await request(http, lookupd, f"/topic/tombstone?topic={topic}&node={where}", method="POST")
    assert (answer.status, answer.body) == (200, b"")

    looked_up = (await request(http, lookupd, f"/lookup?topic={topic}")).json()
    assert looked_up == {"channels": ["ch"], "producers": []}
    # Only that topic's producer is tombstoned.
    assert len((await request(http, lookupd, f"/lookup?topic={other}")).json()["producers"]) == 1
    nodes = (await request(http, lookupd, "/nodes")).json()["producers"]
    (mine,) = [p for p in nodes if p["tcp_port"] == node["tcp_port"]]
    flags = dict(zip(mine["topics"], mine["tombstones"]))
    assert flags[topic] is True and flags[other] is False


# ---- TCP: the registration protocol -------------------------------------------------------


async def test_identify_answers_lookupds_own_info(lookupd: Any) -> None:
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        client.send_identify(json.dumps(peer_fields(fake_port())).encode())
        raw = await client.answer()
        answer = json.loads(raw)
        # A Go map: keys sorted.
        assert list(answer) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
        assert (answer["tcp_port"], answer["http_port"]) == (lookupd.tcp_port, lookupd.http_port)
        assert answer["version"] == LOOKUPD_VERSION
        assert answer["broadcast_address"] == getattr(lookupd, "broadcast_address", answer["broadcast_address"])
        assert answer["broadcast_address"] and answer["hostname"]
        assert raw == go_json(answer)
        assert await client.command("PING") == b"OK"
    finally:
        await client.close()


async def test_register_unregister_and_close(lookupd: Any, http: aiohttp.ClientSession) -> None:
    events, other = unique("events"), unique("other")
    port = fake_port()
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    await client.identify(**peer_fields(port))
    assert await client.command(f"REGISTER {events} archive") == b"OK"
    assert await client.command(f"REGISTER {events} tmp#ephemeral") == b"OK"
    assert await client.command(f"REGISTER {other}") == b"OK"
    body = (await request(http, lookupd, f"/lookup?topic={events}")).json()
    assert sorted(body["channels"]) == ["archive", "tmp#ephemeral"]
    assert [p["tcp_port"] for p in body["producers"]] == [port]

    # UNREGISTER of a channel: an ephemeral one disappears, a durable one stays listed.
    assert await client.command(f"UNREGISTER {events} tmp#ephemeral") == b"OK"
    assert await client.command(f"UNREGISTER {events} archive") == b"OK"
    assert (await request(http, lookupd, f"/channels?topic={events}")).json() == {"channels": ["archive"]}

    # UNREGISTER of a topic: the producer leaves it; the topic stays known (200, no producers).
    assert await client.command(f"UNREGISTER {events}") == b"OK"
    assert (await request(http, lookupd, f"/lookup?topic={events}")).json() == {
        "channels": ["archive"],
        "producers": [],
    }
    assert [n["topics"] for n in await node_of(http, lookupd, client.local_address)] == [[other]]

    # Closing the connection removes the node everywhere.
    await client.close()
    for _ in range(100):
        if not await node_of(http, lookupd, client.local_address):
            break
        await asyncio.sleep(0.01)
    assert await node_of(http, lookupd, client.local_address) == []
    assert (await request(http, lookupd, f"/lookup?topic={other}")).json() == {"channels": [], "producers": []}
    assert {events, other} <= set((await request(http, lookupd, "/topics")).json()["topics"])


async def test_two_nodes_one_topic(lookupd: Any, http: aiohttp.ClientSession) -> None:
    shared = unique("shared")
    ports = [fake_port(), fake_port() + 5]
    clients = [await RawLookupdClient.connect(tcp_address(lookupd)) for _ in range(2)]
    try:
        for client, port in zip(clients, ports):
            await client.identify(**peer_fields(port))
            assert await client.command(f"REGISTER {shared} ch") == b"OK"
            # REGISTER twice is harmless.
            assert await client.command(f"REGISTER {shared} ch") == b"OK"
        body = (await request(http, lookupd, f"/lookup?topic={shared}")).json()
        assert sorted(p["tcp_port"] for p in body["producers"]) == sorted(ports)
        assert body["channels"] == ["ch"]
        await clients[0].close()
        for _ in range(100):
            producers = (await request(http, lookupd, f"/lookup?topic={shared}")).json()["producers"]
            if len(producers) == 1:
                break
            await asyncio.sleep(0.01)
        assert [p["tcp_port"] for p in producers] == [ports[1]]
    finally:
        for client in clients:
            await client.close()


async def test_pipelined_commands_are_answered_in_order(lookupd: Any, http: aiohttp.ClientSession) -> None:
    topic = unique("pipe")
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        out = codec.WriteBuffer()
        out.identify(json.dumps(peer_fields(fake_port())).encode())
        lines = f"PING\nREGISTER {topic}\nREGISTER {topic} b\r\nUNREGISTER {topic} b\nPING\n"
        client.send(out.take() + lines.encode())
        assert json.loads(await client.answer())["tcp_port"] == lookupd.tcp_port
        assert [await client.answer() for _ in range(5)] == [b"OK"] * 5
        # A durable channel stays listed after its UNREGISTER (see above).
        assert (await request(http, lookupd, f"/channels?topic={topic}")).json() == {"channels": ["b"]}
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("setup", "line", "error"),
    [
        (False, "REGISTER t", b"E_INVALID client must IDENTIFY"),
        (False, "UNREGISTER t", b"E_INVALID client must IDENTIFY"),
        (True, "FOO bar", b"E_INVALID invalid command FOO"),
        (True, "", b"E_INVALID invalid command "),
        (True, "REGISTER", b"E_INVALID REGISTER insufficient number of params"),
        (True, "REGISTER   ", b"E_INVALID REGISTER insufficient number of params"),
        (True, "UNREGISTER", b"E_INVALID UNREGISTER insufficient number of params"),
        (True, "REGISTER bad!topic", b"E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
        (True, "REGISTER t bad!ch", b"E_BAD_CHANNEL REGISTER channel name 'bad!ch' is not valid"),
        (True, "UNREGISTER t bad!ch", b"E_BAD_CHANNEL UNREGISTER channel name 'bad!ch' is not valid"),
    ],
)
async def test_command_errors_are_fatal(lookupd: Any, setup: bool, line: str, error: bytes) -> None:
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        if setup:
            await client.identify(**peer_fields(fake_port()))
        assert await client.command(line) == error
        assert await client.closed_by_server()
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"{not json", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (b"[1]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
        (
            json.dumps(peer_fields(24150, tcp_port="4150")).encode(),
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        ),
        (json.dumps(peer_fields(24150, tcp_port=0)).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
        (json.dumps(peer_fields(24150, version="")).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
        (json.dumps({"broadcast_address": "h"}).encode(), b"E_BAD_BODY IDENTIFY missing fields"),
        (b"null", b"E_BAD_BODY IDENTIFY missing fields"),
    ],
)
async def test_identify_errors(lookupd: Any, http: aiohttp.ClientSession, body: bytes, error: bytes) -> None:
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        client.send(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        assert await client.answer() == error
        assert await client.closed_by_server()
        assert await node_of(http, lookupd, client.local_address) == []
    finally:
        await client.close()


async def test_identify_twice_is_fatal(lookupd: Any) -> None:
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        await client.identify(**peer_fields(fake_port()))
        client.send_identify(json.dumps(peer_fields(fake_port())).encode())
        assert await client.answer() == b"E_INVALID cannot IDENTIFY again"
        assert await client.closed_by_server()
    finally:
        await client.close()


async def test_bad_magic_is_refused(lookupd: Any) -> None:
    client = await RawLookupdClient.connect(tcp_address(lookupd), magic=b"  V2")
    try:
        assert await client.answer() == b"E_BAD_PROTOCOL"
        assert await client.closed_by_server()
    finally:
        await client.close()


async def test_ping_before_identify_is_ok(lookupd: Any) -> None:
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        assert await client.command("PING") == b"OK"
        await client.identify(**peer_fields(fake_port()))
        assert await client.command(f"REGISTER {unique('ping')}") == b"OK"
    finally:
        await client.close()


async def test_identify_keys_match_like_go_json(lookupd: Any, http: aiohttp.ClientSession) -> None:
    # Go's json.Unmarshal: case-insensitive keys, unknown keys ignored, remote_address overwritten.
    topic = unique("keys")
    port = fake_port()
    client = await RawLookupdClient.connect(tcp_address(lookupd))
    try:
        await client.identify(
            BROADCAST_ADDRESS="10.1.2.3",
            Tcp_Port=port,
            http_port=port + 1,
            version="1.3.0",
            hostname="h",
            remote_address="1.1.1.1:1",
            extra={"x": 1},
            topology_zone="z1",
        )
        assert await client.command(f"REGISTER {topic}") == b"OK"
        (producer,) = (await request(http, lookupd, f"/lookup?topic={topic}")).json()["producers"]
        expected = {
            "remote_address": client.local_address,
            "hostname": "h",
            "broadcast_address": "10.1.2.3",
            "tcp_port": port,
            "http_port": port + 1,
            "version": "1.3.0",
        }
        if await version_of(lookupd) == "master":  # its PeerInfo keeps the topology
            expected.update(topology_zone="z1", topology_region="")
        assert producer == expected
    finally:
        await client.close()


async def _expiry_scenario() -> None:
    async with own_lookupd(inactive_producer_timeout=0.3, tombstone_lifetime=0.3) as lookupd:
        client = await RawLookupdClient.connect(lookupd.tcp_address)
        try:
            await client.identify(**peer_fields(24150))
            assert await client.command("REGISTER t c") == b"OK"
            async with aiohttp.ClientSession() as http:
                assert len((await request(http, lookupd, "/lookup?topic=t")).json()["producers"]) == 1
            await asyncio.sleep(0.45)
            # Not heard from for inactive_producer_timeout: gone from /lookup and /nodes, topic kept.
            async with aiohttp.ClientSession() as http:
                assert (await request(http, lookupd, "/lookup?topic=t")).json() == {
                    "channels": ["c"],
                    "producers": [],
                }
                assert (await request(http, lookupd, "/nodes")).json() == {"producers": []}
                # A PING brings it back.
                assert await client.command("PING") == b"OK"
                assert len((await request(http, lookupd, "/lookup?topic=t")).json()["producers"]) == 1

                # A tombstone lasts tombstone_lifetime; then the producer is listed again.
                where = "127.0.0.1:24151"
                await request(http, lookupd, f"/topic/tombstone?topic=t&node={where}", method="POST")
                assert (await request(http, lookupd, "/lookup?topic=t")).json()["producers"] == []
                await asyncio.sleep(0.2)
                assert await client.command("PING") == b"OK"
                assert (await request(http, lookupd, "/lookup?topic=t")).json()["producers"] == []
                await asyncio.sleep(0.2)
                assert await client.command("PING") == b"OK"
                assert len((await request(http, lookupd, "/lookup?topic=t")).json()["producers"]) == 1
        finally:
            await client.close()


async def test_inactive_producers_and_tombstones_expire() -> None:
    await _expiry_scenario()


def test_inactive_producers_and_tombstones_expire_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(_expiry_scenario())


async def test_restart_keeps_ports_and_forgets_registrations(http: aiohttp.ClientSession) -> None:
    lookupd = own_lookupd()
    await lookupd.start()
    try:
        client = await RawLookupdClient.connect(lookupd.tcp_address)
        await client.identify(**peer_fields(24150))
        assert await client.command("REGISTER t") == b"OK"
        addresses = (lookupd.tcp_address, lookupd.http_address)
        await lookupd.stop()
        # The server closed the nsqd's connection, as a lookupd going away does.
        assert await client.closed_by_server()
        await client.close()
        await lookupd.start()
        assert (lookupd.tcp_address, lookupd.http_address) == addresses
        assert (await request(http, lookupd, "/topics")).json() == {"topics": []}
        client = await RawLookupdClient.connect(lookupd.tcp_address)
        await client.identify(**peer_fields(24150))
        assert await client.command("REGISTER t") == b"OK"
        await client.close()
    finally:
        await (lookupd.stop() if isinstance(lookupd, NSQLookupd) else lookupd.close())


# ---- in-process registration and helpers ---------------------------------------------------


@embedded_only("registers a node in-process (NSQLookupd.register_node)")
async def test_register_node_in_process(lookupd: NSQLookupd, http: aiohttp.ClientSession) -> None:
    node = lookupd.register_node(tcp_port=4150, http_port=4151, hostname="n1")
    node.register("events", "archive")
    producers = await lookupd.wait_for_producers("events")
    assert producers[0]["broadcast_address"] == "127.0.0.1" and producers[0]["tcp_port"] == 4150
    # The same state is served over HTTP.
    answer = await request(http, lookupd, "/lookup?topic=events")
    assert answer.json() == lookupd.lookup("events") == {"channels": ["archive"], "producers": producers}
    assert (await request(http, lookupd, "/nodes")).json()["producers"][0]["topics"] == ["events"]

    with pytest.raises(InvalidValueError, match="topic name"):
        node.register("bad name")
    node.unregister("events")
    assert lookupd.lookup("events") == {"channels": ["archive"], "producers": []}
    node.close()
    assert lookupd.nodes() == []
    with pytest.raises(RuntimeError):
        node.register("events")


@embedded_only("waits with NSQLookupd.wait_for_producers")
async def test_wait_for_producers_times_out_with_a_clear_message(lookupd: NSQLookupd) -> None:
    with pytest.raises(TimeoutError, match="producer.*'never'"):
        await lookupd.wait_for_producers("never", timeout=0.1)


@embedded_only("waits with NSQLookupd.wait_for_producers")
async def test_wait_for_producers_wakes_on_a_tcp_registration(lookupd: NSQLookupd) -> None:
    client = await RawLookupdClient.connect(lookupd.tcp_address)
    try:
        await client.identify(**peer_fields(24150))
        waiter = asyncio.ensure_future(lookupd.wait_for_producers("late", timeout=5))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        assert await client.command("REGISTER late") == b"OK"
        assert [p["tcp_port"] for p in await waiter] == [24150]
    finally:
        await client.close()


def test_bad_options_name_the_option() -> None:
    with pytest.raises(InvalidValueError, match="tcp_port"):
        NSQLookupd(tcp_port=70000)
    with pytest.raises(InvalidValueError, match="inactive_producer_timeout"):
        NSQLookupd(inactive_producer_timeout=0)
    assert NSQLookupd(ha=True).ha  # the HA dialect (test_embedded_ha.py)


# ---- pure pieces ---------------------------------------------------------------------------------


def test_go_json_escapes_like_go() -> None:
    assert go_json({"a": "<&>", "b": [1, True, None]}) == b'{"a":"\\u003c\\u0026\\u003e","b":[1,true,null]}'


def test_parse_go_query() -> None:
    assert parse_go_query("topic=a%2Eb&topic=second&x=1+2&flag") == {"topic": "a.b", "x": "1 2", "flag": ""}
    for bad in ("topic=a;b", "topic=%zz", "topic=%4"):
        with pytest.raises(Exception, match="INVALID_REQUEST"):
            parse_go_query(bad)


def test_decode_identify_types() -> None:
    fields = decode_identify(b'{"TCP_PORT": 1, "version": null, "zzz": [1]}')
    assert fields["tcp_port"] == 1 and fields["version"] == ""
    for bad in (b'{"tcp_port": 1.5}', b'{"tcp_port": true}', b'{"hostname": 3}', b'"x"'):
        with pytest.raises(ValueError):
            decode_identify(bad)
