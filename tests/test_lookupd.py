"""Tests of fastnsq.lookupd: parsing of every lookupd answer form, the HTTP client and the poller.

The parsing tests need no sockets. The client and poller tests start small aiohttp
servers on 127.0.0.1 that replay the answers of a real nsqlookupd 1.3.0
(tests/captures/nsqd-master/http.json) and the HA forms of youzan nsqlookupd's ``http.go``,
so every request goes over real HTTP and TCP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from multidict import CIMultiDict

from fastnsq.errors import InvalidValueError, NSQError
from fastnsq.lookupd import (
    ACCEPT_V1,
    Discovery,
    Endpoint,
    ListLookupResult,
    LookupdClient,
    LookupdError,
    LookupdHTTPError,
    LookupdInfo,
    LookupdNode,
    LookupdPoller,
    LookupResult,
    NodeInfo,
    TopicMeta,
    decode_response,
    merge_meta,
    normalize_lookupd_address,
    parse_channels,
    parse_info,
    parse_listlookup,
    parse_lookup,
    parse_nodes,
    parse_topics,
)
from fastnsq.testing.nsqd import MASTER

from .captures import DIRECTORIES

CAPTURE_FILE = DIRECTORIES[MASTER] / "http.json"
CAPTURES: dict[str, dict[str, Any]] = json.loads(CAPTURE_FILE.read_text())

V1 = {"Content-Type": "application/json; charset=utf-8", "X-Nsq-Content-Type": "nsq; version=1.0"}
LEGACY = {"Content-Type": "application/json; charset=utf-8"}

# The nsqd of the captures, as its lookupd describes it: read from the recorded /nodes body
# with plain json (the recorder's ports are whatever was free), so the parsers are checked
# against the raw fields rather than against themselves.
_RECORDED_PEER = json.loads(CAPTURES["lookupd_nodes"]["body"])["producers"][0]
CAPTURED_NODE = NodeInfo(
    broadcast_address=_RECORDED_PEER["broadcast_address"],
    tcp_port=_RECORDED_PEER["tcp_port"],
    http_port=_RECORDED_PEER["http_port"],
    version=_RECORDED_PEER["version"],
    hostname=_RECORDED_PEER["hostname"],
    remote_address=_RECORDED_PEER["remote_address"],
)


def capture(name: str) -> tuple[int, dict[str, str], bytes]:
    entry = CAPTURES[name]
    return entry["status"], entry["headers"], entry["body"].encode()


# --------------------------------------------------------------------------- HA literal answers
# PeerInfo as the HA lookupd writes it (youzan/nsq nsqlookupd/registration_db.go).

HA_PEER_A = {
    "id": "10.0.0.5:33122",
    "remote_address": "10.0.0.5:33122",
    "hostname": "nsq-a",
    "broadcast_address": "10.0.0.5",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "0.3.7-HA.1.13.0",
    "distributed_id": "10.0.0.5:4250:4150:338437",
}
HA_PEER_B = {
    **HA_PEER_A,
    "id": "10.0.0.6:40001",
    "remote_address": "10.0.0.6:40001",
    "hostname": "nsq-b",
    "broadcast_address": "10.0.0.6",
    "distributed_id": "10.0.0.6:4250:4150:338438",
}
# An old, non-HA nsqd registered with an HA lookupd: pid -11, so only in `producers`.
OLD_PEER = {
    "id": "10.0.0.9:50000",
    "remote_address": "10.0.0.9:50000",
    "hostname": "old",
    "broadcast_address": "10.0.0.9",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "0.3.7",
}

NODE_A = NodeInfo("10.0.0.5", 4150, 4151, "0.3.7-HA.1.13.0", "nsq-a", "10.0.0.5:33122")
NODE_B = NodeInfo("10.0.0.6", 4150, 4151, "0.3.7-HA.1.13.0", "nsq-b", "10.0.0.6:40001")
NODE_OLD = NodeInfo("10.0.0.9", 4150, 4151, "0.3.7", "old", "10.0.0.9:50000")

HA_META = {
    "partition_num": 2,
    "replica": 2,
    "extend_support": False,
    "ordered": False,
    "multi_part": False,
    "disable_channel_auto_create": False,
}

HA_LOOKUP = {
    "channels": ["ch1"],
    "meta": HA_META,
    "producers": [HA_PEER_A, HA_PEER_B],
    "partitions": {"0": HA_PEER_A, "1": HA_PEER_B},
}


def wrapped(data: Any, code: int = 200, text: str = "OK") -> bytes:
    return json.dumps({"status_code": code, "status_txt": text, "data": data}).encode()


# =========================================================================== pure parsing


class TestCapturedUpstreamAnswers:
    """Every nsqlookupd 1.3.0 answer in http.json parses to what it says."""

    def test_lookup(self) -> None:
        result = parse_lookup(*capture("lookupd_lookup"))
        assert result == LookupResult(channels=("cap_channel", "cap_err"), producers=(CAPTURED_NODE,))
        assert result.is_ha is False
        assert result.meta is None
        assert result.endpoints() == {Endpoint(f"127.0.0.1:{CAPTURED_NODE.tcp_port}", None): CAPTURED_NODE}

    def test_lookup_of_unknown_topic_means_no_producers(self) -> None:
        status, _, body = capture("lookupd_lookup_missing")
        assert status == 404 and b"TOPIC_NOT_FOUND" in body
        result = parse_lookup(*capture("lookupd_lookup_missing"))
        assert result.producers == () and result.endpoints() == {}
        assert result.is_ha is False

    def test_topics(self) -> None:
        assert parse_topics(*capture("lookupd_topics")) == ("cap_topic", "cap_http")

    def test_channels(self) -> None:
        assert parse_channels(*capture("lookupd_channels")) == ("cap_channel", "cap_err")

    def test_nodes(self) -> None:
        assert parse_nodes(*capture("lookupd_nodes")) == (CAPTURED_NODE,)

    def test_info(self) -> None:
        assert parse_info(*capture("lookupd_info")) == LookupdInfo(version="1.3.0", ha_support=False)

    def test_listlookup_is_unsupported_upstream(self) -> None:
        assert parse_listlookup(*capture("lookupd_listlookup")) == ListLookupResult(supported=False)

    def test_ping_body_is_not_a_lookupd_json_answer(self) -> None:
        # "/ping" answers the text "OK": asking a JSON endpoint for it must fail clearly.
        with pytest.raises(LookupdError, match="not JSON"):
            parse_lookup(*capture("lookupd_ping"))

    def test_every_lookupd_capture_is_covered(self) -> None:
        covered = {
            "lookupd_ping",
            "lookupd_lookup",
            "lookupd_lookup_missing",
            "lookupd_topics",
            "lookupd_channels",
            "lookupd_nodes",
            "lookupd_info",
            "lookupd_listlookup",
        }
        assert {name for name in CAPTURES if name.startswith("lookupd_")} == covered


class TestHALookup:
    """The youzan /lookup forms of youzan nsqlookupd's ``http.go``."""

    EXPECTED = LookupResult(
        channels=("ch1",),
        producers=(NODE_A, NODE_B),
        partitions={0: NODE_A, 1: NODE_B},
        meta=TopicMeta(partition_num=2, replica=2),
        is_ha=True,
    )

    def test_bare_v1_form(self) -> None:
        assert parse_lookup(200, V1, json.dumps(HA_LOOKUP).encode()) == self.EXPECTED

    def test_wrapped_legacy_form_is_unwrapped(self) -> None:
        assert parse_lookup(200, LEGACY, wrapped(HA_LOOKUP)) == self.EXPECTED

    def test_header_name_is_case_insensitive(self) -> None:
        headers = {"x-nsq-content-type": "nsq; version=1.0"}
        assert parse_lookup(200, headers, json.dumps(HA_LOOKUP)) == self.EXPECTED

    def test_v1_header_means_bare_even_if_a_key_looks_like_the_wrapper(self) -> None:
        body = {"status_code": 500, "channels": [], "producers": [HA_PEER_A]}
        assert parse_lookup(200, V1, json.dumps(body)).producers == (NODE_A,)

    def test_partition_keys_are_decimal_strings(self) -> None:
        body = {"channels": [], "producers": [HA_PEER_A], "partitions": {"3": HA_PEER_A, "10": HA_PEER_A}}
        result = parse_lookup(200, V1, json.dumps(body))
        assert result.partitions == {3: NODE_A, 10: NODE_A}
        assert list(result.endpoints()) == [Endpoint("10.0.0.5:4150", 3), Endpoint("10.0.0.5:4150", 10)]

    def test_endpoints_one_per_partition(self) -> None:
        assert self.EXPECTED.endpoints() == {
            Endpoint("10.0.0.5:4150", 0): NODE_A,
            Endpoint("10.0.0.6:4150", 1): NODE_B,
        }

    def test_old_node_only_in_producers_gets_a_partitionless_endpoint(self) -> None:
        body = {
            "channels": ["c"],
            "producers": [HA_PEER_A, OLD_PEER],
            "partitions": {"0": HA_PEER_A, "1": HA_PEER_A},
        }
        result = parse_lookup(200, V1, json.dumps(body))
        assert result.partitions == {0: NODE_A, 1: NODE_A}
        assert result.endpoints() == {
            Endpoint("10.0.0.5:4150", 0): NODE_A,
            Endpoint("10.0.0.5:4150", 1): NODE_A,
            Endpoint("10.0.0.9:4150", None): NODE_OLD,
        }

    def test_null_lists_and_maps_when_cluster_writes_are_disabled(self) -> None:
        body = {"channels": None, "producers": None, "partitions": None}
        result = parse_lookup(200, V1, json.dumps(body))
        assert result == LookupResult(is_ha=True)
        assert result.endpoints() == {}

    def test_unknown_topic_is_200_with_empty_lists(self) -> None:
        result = parse_lookup(200, V1, b'{"channels":[],"producers":[],"partitions":{}}')
        assert result == LookupResult(is_ha=True)

    def test_access_w_without_channel_is_404_and_means_no_producers(self) -> None:
        body = b'{"message":"Topic has no channel, should init at least one for the new topic"}'
        result = parse_lookup(404, V1, body)
        assert result.producers == () and result.partitions == {} and result.is_ha is True

    def test_access_w_key_not_found_means_no_producers(self) -> None:
        result = parse_lookup(404, V1, b'{"message":"Key not found"}')
        assert result.producers == () and result.is_ha is True

    def test_legacy_error_is_http_500_with_status_txt(self) -> None:
        # Without the Accept header every HA error becomes HTTP 500 with the text in status_txt.
        assert parse_lookup(500, LEGACY, wrapped(None, 500, "TOPIC_NOT_FOUND")).producers == ()
        with pytest.raises(LookupdHTTPError) as info:
            parse_lookup(500, LEGACY, wrapped(None, 500, "INVALID_ACCESS_MODE"))
        assert (info.value.status, info.value.message) == (500, "INVALID_ACCESS_MODE")

    def test_other_errors_raise_with_status_and_message(self) -> None:
        with pytest.raises(LookupdHTTPError) as info:
            parse_lookup(400, V1, b'{"message":"INVALID_ACCESS_MODE"}')
        assert (info.value.status, info.value.message) == (400, "INVALID_ACCESS_MODE")
        assert isinstance(info.value, NSQError)

    def test_meta_with_every_flag(self) -> None:
        meta = {
            "partition_num": 8,
            "replica": 3,
            "extend_support": True,
            "ordered": True,
            "multi_part": True,
            "disable_channel_auto_create": True,
        }
        result = parse_lookup(
            200, V1, json.dumps({"channels": [], "producers": [], "partitions": {}, "meta": meta})
        )
        assert result.meta == TopicMeta(8, 3, True, True, True, True)

    def test_meta_not_found_has_zero_values(self) -> None:
        body = {
            "channels": [],
            "producers": [],
            "partitions": {},
            "meta": {"partition_num": 0, "replica": 0, "extend_support": False},
        }
        assert parse_lookup(200, V1, json.dumps(body)).meta == TopicMeta()

    def test_meta_alone_marks_ha(self) -> None:
        result = parse_lookup(200, V1, json.dumps({"channels": [], "producers": [], "meta": HA_META}))
        assert result.is_ha is True and result.meta == TopicMeta(2, 2)

    def test_empty_body_is_an_empty_answer(self) -> None:
        assert parse_lookup(200, V1, b"") == LookupResult()
        assert parse_lookup(200, LEGACY, b"  \n") == LookupResult()

    def test_wrapped_data_null_is_an_empty_answer(self) -> None:
        assert parse_lookup(200, LEGACY, wrapped(None)) == LookupResult()

    def test_bare_body_without_header_is_accepted(self) -> None:
        # A proxy may strip X-NSQ-Content-Type; a bare object has no wrapper keys.
        assert parse_lookup(200, LEGACY, json.dumps(HA_LOOKUP)) == self.EXPECTED

    def test_ports_as_strings_are_accepted(self) -> None:
        peer = {**HA_PEER_A, "tcp_port": "4150", "http_port": "4151"}
        assert parse_lookup(200, V1, json.dumps({"producers": [peer]})).producers == (NODE_A,)

    def test_ipv6_broadcast_address(self) -> None:
        peer = {**HA_PEER_A, "broadcast_address": "fd00::5"}
        result = parse_lookup(200, V1, json.dumps({"producers": [peer]}))
        assert result.producers[0].address == "[fd00::5]:4150"
        assert list(result.endpoints()) == [Endpoint("[fd00::5]:4150", None)]


class TestListLookup:
    def test_cluster_nodes_with_capitalised_keys_and_string_ports(self) -> None:
        body = {
            "lookupdnodes": [
                {
                    "ID": "l1",
                    "NodeIP": "10.0.0.1",
                    "TcpPort": "4160",
                    "HttpPort": "4161",
                    "RpcPort": "4260",
                    "Epoch": 5,
                },
                {
                    "ID": "l2",
                    "NodeIP": "10.0.0.2",
                    "TcpPort": "4160",
                    "HttpPort": "4171",
                    "RpcPort": "4260",
                    "Epoch": 5,
                },
            ],
            "lookupdleader": {
                "ID": "l1",
                "NodeIP": "10.0.0.1",
                "TcpPort": "4160",
                "HttpPort": "4161",
                "RpcPort": "4260",
                "Epoch": 5,
            },
        }
        result = parse_listlookup(200, V1, json.dumps(body))
        first = LookupdNode(
            node_ip="10.0.0.1", http_port=4161, tcp_port=4160, rpc_port=4260, id="l1", epoch=5
        )
        assert result.supported is True
        assert result.nodes == (first, LookupdNode("10.0.0.2", 4171, 4160, 4260, "l2", 5))
        assert result.leader == first
        assert [n.http_address for n in result.nodes] == ["http://10.0.0.1:4161", "http://10.0.0.2:4171"]

    def test_keys_match_case_insensitively_like_go(self) -> None:
        body = {"LookupdNodes": [{"id": "x", "NodeIp": "10.0.0.3", "httpport": 4161}]}
        assert parse_listlookup(200, V1, json.dumps(body)).nodes == (LookupdNode("10.0.0.3", 4161, id="x"),)

    def test_standalone_v1_is_200_with_empty_body(self) -> None:
        assert parse_listlookup(200, V1, b"") == ListLookupResult(nodes=(), leader=None, supported=True)

    def test_standalone_legacy_is_data_null(self) -> None:
        result = parse_listlookup(200, LEGACY, b'{"status_code":200,"status_txt":"OK","data":null}')
        assert result == ListLookupResult()

    def test_node_without_http_port_is_junk(self) -> None:
        body = {"lookupdnodes": [{"ID": "l1", "NodeIP": "10.0.0.1", "TcpPort": "4160"}]}
        with pytest.raises(LookupdError, match="HttpPort"):
            parse_listlookup(200, V1, json.dumps(body))

    def test_server_error_raises(self) -> None:
        with pytest.raises(LookupdHTTPError) as info:
            parse_listlookup(500, V1, b'{"message":"etcd unavailable"}')
        assert info.value.status == 500


@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (200, b"<html>oops</html>", "not JSON"),
        (200, b'["a", "b"]', "must be a JSON object"),
        (200, b'{"producers": {"a": 1}}', "producers must be a list"),
        (200, b'{"producers": ["10.0.0.5:4150"]}', "must be a JSON object"),
        (200, b'{"producers": [{"tcp_port": 4150}]}', "broadcast_address"),
        (200, b'{"producers": [{"broadcast_address": "h", "tcp_port": "abc"}]}', "tcp_port"),
        (200, b'{"producers": [{"broadcast_address": "h", "tcp_port": 0}]}', "tcp_port"),
        (200, b'{"producers": [{"broadcast_address": "h", "tcp_port": 70000}]}', "tcp_port"),
        (200, b'{"producers": [{"broadcast_address": "h", "tcp_port": true}]}', "tcp_port"),
        (200, b'{"producers": [{"broadcast_address": "h"}]}', "tcp_port is missing"),
        (200, b'{"channels": [1, 2]}', "list of strings"),
        (200, b'{"partitions": {"x": {"broadcast_address": "h", "tcp_port": 1}}}', "partition id"),
        (200, b'{"partitions": {"0": null}}', "must be a JSON object"),
        (200, b'{"partitions": []}', "partitions must be a JSON object"),
        (200, b'{"meta": {"partition_num": "many"}}', "partition_num"),
        (200, b'{"meta": {"extend_support": "yes"}}', "extend_support"),
        (200, b"\xff\xfe{}", "not UTF-8"),
        (502, b"<html>Bad Gateway</html>", "HTTP 502"),
    ],
)
def test_junk_lookup_bodies_raise_lookupd_error(status: int, body: bytes, match: str) -> None:
    with pytest.raises(LookupdError, match=match) as info:
        parse_lookup(status, V1, body)
    assert isinstance(info.value, NSQError)


def test_junk_wrapper_status_code_raises() -> None:
    with pytest.raises(LookupdError, match="status_code"):
        parse_lookup(200, LEGACY, b'{"status_code":"200","status_txt":"OK","data":{}}')


def test_decode_response_forms() -> None:
    assert decode_response(200, V1, b'{"topics":["a"]}') == {"topics": ["a"]}
    assert decode_response(200, LEGACY, wrapped({"topics": ["a"]})) == {"topics": ["a"]}
    assert decode_response(200, V1, b"") is None


def test_parse_topics_and_channels_accept_null_and_wrapper() -> None:
    assert parse_topics(200, V1, b'{"topics":null}') == ()
    assert parse_topics(200, LEGACY, wrapped({"topics": ["t"]})) == ("t",)
    assert parse_channels(200, LEGACY, wrapped({"channels": None})) == ()


def test_merge_meta() -> None:
    assert merge_meta([]) is None
    assert merge_meta([None, None]) is None
    merged = merge_meta(
        [
            TopicMeta(2, 1),
            None,
            TopicMeta(4, 2, extend_support=True),
            TopicMeta(3, 3, disable_channel_auto_create=True),
        ]
    )
    assert merged == TopicMeta(
        partition_num=4, replica=3, extend_support=True, disable_channel_auto_create=True
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:4161", "http://127.0.0.1:4161"),
        (" 127.0.0.1:4161 ", "http://127.0.0.1:4161"),
        ("http://127.0.0.1:4161/", "http://127.0.0.1:4161"),
        ("https://lookupd.example:4161", "https://lookupd.example:4161"),
        ("[::1]:4161", "http://[::1]:4161"),
        ("http://proxy.example/nsq/", "http://proxy.example/nsq"),
    ],
)
def test_normalize_lookupd_address(given: str, expected: str) -> None:
    assert normalize_lookupd_address(given) == expected


@pytest.mark.parametrize("bad", ["", "   ", "ftp://h:21", "http://", 4161])
def test_normalize_lookupd_address_rejects_junk(bad: Any) -> None:
    with pytest.raises(InvalidValueError, match="lookupd address"):
        normalize_lookupd_address(bad)


# =========================================================================== real HTTP


Answer = tuple[int, dict[str, str], bytes]


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: CIMultiDict[str]


@dataclass
class FakeLookupd:
    """An aiohttp server on 127.0.0.1 that replays canned lookupd answers and records requests.

    ``routes`` maps a path to an answer or to a function of the request returning one;
    unknown paths get upstream's ``404 {"message":"NOT_FOUND"}``. With ``failing`` set
    every request gets a 500 with a junk body.
    """

    routes: dict[str, Answer | Callable[[web.Request], Awaitable[Answer]]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    failing: bool = False
    runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [seen.path for seen in self.requests]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(Seen(request.path, dict(request.query), request.headers.copy()))
        if self.failing:
            return web.Response(status=500, body=b"<html>internal junk</html>", content_type="text/html")
        answer = self.routes.get(request.path)
        if answer is None:
            status, headers, body = capture("lookupd_listlookup")  # upstream's 404 NOT_FOUND
        elif callable(answer):
            status, headers, body = await answer(request)
        else:
            status, headers, body = answer
        return web.Response(status=status, headers=headers, body=body)


def upstream_routes() -> dict[str, Any]:
    """The captured nsqlookupd 1.3.0: /lookup knows only cap_topic."""

    async def lookup(request: web.Request) -> Answer:
        if request.query.get("topic") == "cap_topic":
            return capture("lookupd_lookup")
        return capture("lookupd_lookup_missing")

    return {
        "/lookup": lookup,
        "/topics": capture("lookupd_topics"),
        "/channels": capture("lookupd_channels"),
        "/nodes": capture("lookupd_nodes"),
        "/info": capture("lookupd_info"),
        "/ping": capture("lookupd_ping"),
    }


def upstream_lookup(*nodes: NodeInfo) -> Answer:
    """A v1 upstream /lookup answer listing these nodes, shaped like the capture."""
    producers = [
        {
            "remote_address": n.remote_address,
            "hostname": n.hostname,
            "broadcast_address": n.broadcast_address,
            "tcp_port": n.tcp_port,
            "http_port": n.http_port,
            "version": n.version,
            "topology_zone": "",
            "topology_region": "",
        }
        for n in nodes
    ]
    return 200, dict(V1), json.dumps({"channels": ["c"], "producers": producers}).encode()


def ha_lookup(partitions: dict[int, dict[str, Any]], meta: dict[str, Any] | None = None) -> Answer:
    body: dict[str, Any] = {
        "channels": ["ch1"],
        "producers": list({p["id"]: p for p in partitions.values()}.values()),
        "partitions": {str(pid): peer for pid, peer in partitions.items()},
    }
    if meta is not None:
        body["meta"] = meta
    return 200, dict(V1), json.dumps(body).encode()


def listlookup_answer(*servers: FakeLookupd) -> Answer:
    nodes = [
        {
            "ID": f"127.0.0.1:{s.port}",
            "NodeIP": "127.0.0.1",
            "TcpPort": "4160",
            "HttpPort": str(s.port),
            "RpcPort": "4260",
            "Epoch": 3,
        }
        for s in servers
    ]
    return 200, dict(V1), json.dumps({"lookupdnodes": nodes, "lookupdleader": nodes[0]}).encode()


def node(n: int) -> NodeInfo:
    return NodeInfo(f"10.1.0.{n}", 4150, 4151, "1.3.0", f"nsqd-{n}", f"10.1.0.{n}:5{n:04d}")


@pytest_asyncio.fixture
async def lookupds() -> AsyncIterator[Callable[..., Awaitable[FakeLookupd]]]:
    started: list[FakeLookupd] = []

    async def start(routes: dict[str, Any] | None = None) -> FakeLookupd:
        server = FakeLookupd(routes=dict(routes or {}))
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TestClient:
    @pytest.mark.asyncio
    async def test_lookup_sends_accept_header_and_parses_answer(self, lookupds: Any) -> None:
        server = await lookupds(upstream_routes())
        async with LookupdClient() as client:
            result = await client.lookup(server.hostport, "cap_topic")
        assert result.producers == (CAPTURED_NODE,)
        assert result.channels == ("cap_channel", "cap_err")
        [seen] = server.requests
        assert seen.path == "/lookup" and seen.query == {"topic": "cap_topic"}
        assert seen.headers["Accept"] == ACCEPT_V1 == "application/vnd.nsq; version=1.0"
        assert "Authorization" not in seen.headers

    @pytest.mark.asyncio
    async def test_unknown_topic_404_gives_no_producers(self, lookupds: Any) -> None:
        server = await lookupds(upstream_routes())
        async with LookupdClient() as client:
            result = await client.lookup(server.url, "no_such_topic")
        assert result == LookupResult()
        assert result.endpoints() == {}

    @pytest.mark.asyncio
    async def test_ha_parameters_are_sent(self, lookupds: Any) -> None:
        server = await lookupds({"/lookup": ha_lookup({3: HA_PEER_A}, HA_META)})
        async with LookupdClient() as client:
            result = await client.lookup(server.url, "t", access="w", metainfo=True, partition=3)
        assert server.requests[0].query == {"topic": "t", "access": "w", "metainfo": "true", "partition": "3"}
        assert result.partitions == {3: NODE_A} and result.meta == TopicMeta(2, 2) and result.is_ha

    @pytest.mark.asyncio
    async def test_auth_secret_is_sent_as_bearer_and_never_shown(self, lookupds: Any) -> None:
        server = await lookupds(upstream_routes())
        client = LookupdClient(auth_secret="s3cret-token")
        try:
            await client.lookup(server.hostport, "cap_topic")
            await client.topics(server.hostport)
        finally:
            await client.close()
        assert [s.headers["Authorization"] for s in server.requests] == ["Bearer s3cret-token"] * 2
        assert all(s.headers["Accept"] == ACCEPT_V1 for s in server.requests)
        assert "s3cret" not in repr(client)

    @pytest.mark.asyncio
    async def test_other_endpoints(self, lookupds: Any) -> None:
        server = await lookupds(upstream_routes())
        async with LookupdClient() as client:
            assert await client.topics(server.url) == ("cap_topic", "cap_http")
            assert await client.channels(server.url, "cap_topic") == ("cap_channel", "cap_err")
            assert await client.nodes(server.url) == (CAPTURED_NODE,)
            assert await client.info(server.url) == LookupdInfo("1.3.0", False)
            assert await client.listlookup(server.url) == ListLookupResult(supported=False)
        assert server.paths() == ["/topics", "/channels", "/nodes", "/info", "/listlookup"]
        assert server.requests[1].query == {"topic": "cap_topic"}

    @pytest.mark.asyncio
    async def test_ha_listlookup_standalone_empty_body(self, lookupds: Any) -> None:
        server = await lookupds({"/listlookup": (200, dict(V1), b"")})
        async with LookupdClient() as client:
            assert await client.listlookup(server.url) == ListLookupResult(supported=True)

    @pytest.mark.asyncio
    async def test_server_error_names_url(self, lookupds: Any) -> None:
        server = await lookupds()
        server.failing = True
        async with LookupdClient() as client:
            with pytest.raises(LookupdHTTPError) as info:
                await client.lookup(server.url, "t")
        assert info.value.status == 500
        assert info.value.url.startswith(server.url + "/lookup")

    @pytest.mark.asyncio
    async def test_unreachable_lookupd_raises_lookupd_error(self) -> None:
        async with LookupdClient(timeout=5.0) as client:
            with pytest.raises(LookupdError, match="unreachable"):
                await client.lookup(f"127.0.0.1:{unused_port()}", "t")

    @pytest.mark.asyncio
    async def test_timeout(self, lookupds: Any) -> None:
        async def slow(request: web.Request) -> Answer:
            await asyncio.sleep(5)
            return capture("lookupd_lookup")

        server = await lookupds({"/lookup": slow})
        async with LookupdClient(timeout=0.2) as client:
            with pytest.raises(LookupdError, match="did not answer within 0.2s"):
                await client.lookup(server.url, "t")

    @pytest.mark.asyncio
    async def test_given_session_is_used_and_left_open(self, lookupds: Any) -> None:
        server = await lookupds(upstream_routes())
        async with aiohttp.ClientSession() as session:
            client = LookupdClient(session)
            assert (await client.lookup(server.url, "cap_topic")).producers == (CAPTURED_NODE,)
            await client.close()
            assert not session.closed

    @pytest.mark.asyncio
    async def test_bad_arguments(self) -> None:
        with pytest.raises(InvalidValueError, match="timeout"):
            LookupdClient(timeout=0)
        async with LookupdClient() as client:
            with pytest.raises(InvalidValueError, match="access"):
                await client.lookup("127.0.0.1:1", "t", access="rw")  # type: ignore[arg-type]
            with pytest.raises(InvalidValueError, match="partition"):
                await client.lookup("127.0.0.1:1", "t", partition=-1)
            with pytest.raises(InvalidValueError, match="topic"):
                await client.lookup("127.0.0.1:1", "")


class TestPoller:
    @pytest.mark.asyncio
    async def test_union_of_two_lookupds(self, lookupds: Any) -> None:
        first = await lookupds({"/lookup": upstream_lookup(node(1), node(2))})
        second = await lookupds({"/lookup": upstream_lookup(node(2), node(3))})
        async with LookupdPoller([first.hostport, second.url], "t") as poller:
            found = await poller.poll_once()
        assert found.endpoints == {
            Endpoint("10.1.0.1:4150", None): node(1),
            Endpoint("10.1.0.2:4150", None): node(2),
            Endpoint("10.1.0.3:4150", None): node(3),
        }
        assert found.is_ha is False and found.meta is None
        assert found.lookupds == (first.url, second.url)
        assert poller.endpoints == found.endpoints
        for server in (first, second):
            assert all(s.headers["Accept"] == ACCEPT_V1 for s in server.requests)
            assert server.requests[-1].query == {"topic": "t"}

    @pytest.mark.asyncio
    async def test_lookupds_are_polled_concurrently(self, lookupds: Any) -> None:
        # Each lookupd answers only once both requests have arrived: a sequential poller
        # would see both time out.
        arrived: list[str] = []
        both_in = asyncio.Event()

        def barrier(answer: Answer) -> Callable[[web.Request], Awaitable[Answer]]:
            async def handle(request: web.Request) -> Answer:
                arrived.append(request.host)
                if len(arrived) == 2:
                    both_in.set()
                await asyncio.wait_for(both_in.wait(), 5)
                return answer

            return handle

        first = await lookupds({"/lookup": barrier(upstream_lookup(node(1)))})
        second = await lookupds({"/lookup": barrier(upstream_lookup(node(2)))})
        client = LookupdClient(timeout=2.0)
        async with LookupdPoller(
            [first.url, second.url], "t", client=client, discover_lookupds=False
        ) as poller:
            found = await poller.poll_once()
        await client.close()
        assert set(found.endpoints) == {Endpoint("10.1.0.1:4150"), Endpoint("10.1.0.2:4150")}

    @pytest.mark.asyncio
    async def test_unknown_topic_gives_no_endpoints(self, lookupds: Any) -> None:
        server = await lookupds(upstream_routes())
        async with LookupdPoller([server.url], "no_such_topic") as poller:
            found = await poller.poll_once()
        assert found.endpoints == {}
        assert poller.failures(server.url) == 0

    @pytest.mark.asyncio
    async def test_failing_lookupd_keeps_its_last_answer(self, lookupds: Any) -> None:
        flaky = await lookupds({"/lookup": upstream_lookup(node(1))})
        steady = await lookupds({"/lookup": upstream_lookup(node(2))})
        async with LookupdPoller([flaky.url, steady.url], "t") as poller:
            before = await poller.poll_once()
            flaky.failing = True
            after = await poller.poll_once()
            assert poller.failures(flaky.url) == 1
            assert poller.failures(steady.url) == 0
        assert set(before.endpoints) == {Endpoint("10.1.0.1:4150"), Endpoint("10.1.0.2:4150")}
        assert after.endpoints == before.endpoints
        assert flaky.paths()[-1] == "/lookup"  # it was asked, and failed

    @pytest.mark.asyncio
    async def test_unreachable_lookupd_keeps_its_last_answer(self, lookupds: Any) -> None:
        server = await lookupds({"/lookup": upstream_lookup(node(1), node(2))})
        async with (
            LookupdClient(timeout=5.0) as client,
            LookupdPoller([server.url], "t", client=client) as poller,
        ):
            before = await poller.poll_once()
            await server.stop()  # now the port refuses connections
            after = await poller.poll_once()
            assert poller.failures(server.url) == 1
        assert len(before.endpoints) == 2
        assert after.endpoints == before.endpoints

    @pytest.mark.asyncio
    async def test_lookupd_that_keeps_failing_is_asked_less_often_and_recovers(
        self, lookupds: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        flaky = await lookupds({"/lookup": upstream_lookup(node(1))})
        steady = await lookupds({"/lookup": upstream_lookup(node(2))})
        asked_flaky: list[int] = []
        asked_steady: list[int] = []
        secret = "poller-secret-xyz"
        caplog.set_level(logging.DEBUG, logger="fastnsq.lookupd")
        client = LookupdClient(auth_secret=secret)
        async with LookupdPoller([flaky.url, steady.url], "t", client=client, max_skip_polls=4) as poller:
            for poll in range(1, 22):
                flaky.failing = 2 <= poll <= 18
                count_flaky, count_steady = len(flaky.requests), len(steady.requests)
                found = await poller.poll_once()
                if len(flaky.requests) > count_flaky:
                    asked_flaky.append(poll)
                if len(steady.requests) > count_steady:
                    asked_steady.append(poll)
                # A failure never drops the endpoints it reported before.
                assert set(found.endpoints) == {Endpoint("10.1.0.1:4150"), Endpoint("10.1.0.2:4150")}, poll
            assert poller.failures(flaky.url) == 0
        await client.close()
        # Failures in a row n=1,2,3,4,5 sit out 0,1,3,4,4 polls (2**(n-1)-1 capped at 4);
        # back at poll 19 it answers and is asked every poll again.
        assert asked_flaky == [1, 2, 3, 5, 9, 14, 19, 20, 21]
        assert asked_steady == list(range(1, 22))
        # Upstream has no /listlookup: asked once per lookupd, then never again.
        assert steady.paths().count("/listlookup") == 1
        assert "failed" in caplog.text and secret not in caplog.text

    @pytest.mark.asyncio
    async def test_ha_discovers_cluster_lookupds_with_listlookup(self, lookupds: Any) -> None:
        peer_a_local = {**HA_PEER_A}
        peer_b_local = {**HA_PEER_B}
        second = await lookupds(
            {
                "/lookup": ha_lookup({0: peer_a_local}, {**HA_META, "extend_support": False}),
                "/listlookup": (200, dict(V1), b""),
            }
        )
        third = await lookupds(
            {
                "/lookup": ha_lookup({0: peer_a_local, 1: peer_b_local}, {**HA_META, "extend_support": True}),
            }
        )
        seed = await lookupds()
        seed.routes["/listlookup"] = listlookup_answer(second, third)
        async with LookupdPoller([seed.hostport], "t", access="r", metainfo=True) as poller:
            found = await poller.poll_once()
            again = await poller.poll_once()
        assert found.lookupds == (second.url, third.url)
        assert found.endpoints == {Endpoint("10.0.0.5:4150", 0): NODE_A, Endpoint("10.0.0.6:4150", 1): NODE_B}
        assert found.is_ha is True
        assert found.meta == TopicMeta(partition_num=2, replica=2, extend_support=True)
        assert found.channels == frozenset({"ch1"})
        # The seed is asked /listlookup on every poll (as go-nsq does), never /lookup.
        assert seed.paths() == ["/listlookup", "/listlookup"]
        assert second.paths() == ["/lookup", "/lookup"] == third.paths()
        assert second.requests[0].query == {"topic": "t", "access": "r", "metainfo": "true"}
        assert again == found

    @pytest.mark.asyncio
    async def test_ha_standalone_lookupd_with_empty_listlookup_is_asked_directly(self, lookupds: Any) -> None:
        server = await lookupds(
            {
                "/listlookup": (200, dict(V1), b""),
                "/lookup": ha_lookup({0: HA_PEER_A, 1: HA_PEER_A}),
            }
        )
        async with LookupdPoller([server.url], "t") as poller:
            found = await poller.poll_once()
        assert server.paths() == ["/listlookup", "/lookup"]
        assert found.lookupds == (server.url,)
        assert list(found.endpoints) == [Endpoint("10.0.0.5:4150", 0), Endpoint("10.0.0.5:4150", 1)]
        assert found.is_ha is True and found.meta is None

    @pytest.mark.asyncio
    async def test_failed_listlookup_keeps_the_known_cluster(self, lookupds: Any) -> None:
        member = await lookupds({"/lookup": ha_lookup({0: HA_PEER_A})})
        seed = await lookupds()
        seed.routes["/listlookup"] = listlookup_answer(member)
        async with LookupdPoller([seed.url], "t") as poller:
            first = await poller.poll_once()
            seed.failing = True
            second = await poller.poll_once()
            assert poller.failures(seed.url) == 1
        assert first.lookupds == second.lookupds == (member.url,)
        assert second.endpoints == first.endpoints == {Endpoint("10.0.0.5:4150", 0): NODE_A}
        assert member.paths() == ["/lookup", "/lookup"]

    @pytest.mark.asyncio
    async def test_run_sleeps_with_initial_jitter_then_interval(self, lookupds: Any) -> None:
        server = await lookupds({"/lookup": upstream_lookup(node(1))})
        delays: list[float] = []
        seen: list[Discovery] = []
        done = asyncio.Event()

        async def fake_sleep(delay: float) -> None:
            delays.append(delay)
            await asyncio.sleep(0)

        def callback(found: Discovery) -> None:
            seen.append(found)
            if len(seen) == 1:
                raise RuntimeError("a broken callback must not stop polling")
            if len(seen) == 3:
                done.set()

        async with LookupdPoller(
            [server.url], "t", poll_interval=30.0, poll_jitter=0.3, rng=random.Random(7), sleep=fake_sleep
        ) as poller:
            task = asyncio.ensure_future(poller.run(callback))
            await asyncio.wait_for(done.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        expected_jitter = random.Random(7).random() * 0.3 * 30.0
        assert 0 < expected_jitter <= 9.0
        assert delays[0] == pytest.approx(expected_jitter)
        assert delays[1:3] == [30.0, 30.0]
        assert [set(d.endpoints) for d in seen] == [{Endpoint("10.1.0.1:4150")}] * 3

    @pytest.mark.asyncio
    async def test_run_with_async_callback_and_trigger(self, lookupds: Any) -> None:
        server = await lookupds({"/lookup": upstream_lookup(node(1))})
        polls = asyncio.Queue[Discovery]()

        async def never(delay: float) -> None:
            await asyncio.Event().wait()

        async def callback(found: Discovery) -> None:
            await polls.put(found)

        async with LookupdPoller([server.url], "t", sleep=never) as poller:
            task = asyncio.ensure_future(poller.run(callback))
            poller.trigger()  # cuts the initial jitter short
            first = await asyncio.wait_for(polls.get(), 10)
            await asyncio.sleep(0.05)
            assert polls.empty()  # waiting out the interval
            poller.trigger()
            second = await asyncio.wait_for(polls.get(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert first.endpoints == second.endpoints == {Endpoint("10.1.0.1:4150"): node(1)}
        assert server.paths().count("/lookup") == 2

    def test_bad_options(self) -> None:
        with pytest.raises(InvalidValueError, match="poll_jitter"):
            LookupdPoller(["127.0.0.1:4161"], "t", poll_jitter=1.5)
        with pytest.raises(InvalidValueError, match="poll_interval"):
            LookupdPoller(["127.0.0.1:4161"], "t", poll_interval=0)
        with pytest.raises(InvalidValueError, match="at least one"):
            LookupdPoller([], "t")
        with pytest.raises(InvalidValueError, match="lookupd address"):
            LookupdPoller(["ftp://x:1"], "t")
        with pytest.raises(InvalidValueError, match="max_skip_polls"):
            LookupdPoller(["127.0.0.1:4161"], "t", max_skip_polls=-1)


def test_docstring_examples_hold() -> None:
    import doctest

    import fastnsq.lookupd.answers

    outcome = doctest.testmod(fastnsq.lookupd.answers)
    assert outcome.attempted > 10
    assert outcome.failed == 0
