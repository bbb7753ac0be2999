"""The HTTP half of the recorded conversations: one script for the recorder and the replay test.

:func:`run` makes the same requests, in the same order and from the same state, to any
nsqd + nsqlookupd pair (real ones when recording, embedded ones in the test) and
returns every answer as ``{"request", "status", "headers", "body"}`` under a name.
It expects the TCP scenarios to have run first on the same nsqd (publish, consume and
the error scenarios create ``cap_topic`` with the channels ``cap_channel`` and
``cap_err``) and waits until nothing is in flight or deferred any more, so the
counts in ``/stats`` are settled whatever the server's timing.

Requests carry ``Accept: application/vnd.nsq; version=1.0``, as a client of the v1
API sends it.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import aiohttp

ACCEPT_V1 = {"Accept": "application/vnd.nsq; version=1.0"}
#: The headers that are recorded and compared (Date and Content-Length vary or follow).
HEADERS = ("Content-Type", "X-Nsq-Content-Type")
#: JSON keys whose values differ from run to run or from server to server.
VARIABLE_KEYS = frozenset(
    {"start_time", "connect_ts", "remote_address", "hostname", "tcp_port", "http_port", "memory"}
)
#: Who answers each request: (name, server, method, path, body).
NSQD_REQUESTS: list[tuple[str, str, str, str, bytes | None]] = [
    ("nsqd_ping", "nsqd", "GET", "/ping", None),
    ("nsqd_pub", "nsqd", "POST", "/pub?topic=cap_http", b"http hello"),
    ("nsqd_mpub", "nsqd", "POST", "/mpub?topic=cap_http", b"one\ntwo\n"),
    ("nsqd_pub_bad_topic", "nsqd", "POST", "/pub?topic=bad*topic", b"x"),
    ("nsqd_info", "nsqd", "GET", "/info", None),
    ("nsqd_stats", "nsqd", "GET", "/stats?format=json&topic=cap_topic", None),
    # A topic whose messages wait for a first channel: depth counts them, no channels.
    ("nsqd_stats_topic_without_channels", "nsqd", "GET", "/stats?format=json&topic=cap_http&include_mem=false", None),
    ("nsqd_stats_without_clients", "nsqd", "GET",
     "/stats?format=json&topic=cap_topic&include_clients=false&include_mem=false", None),
]
LOOKUPD_REQUESTS: list[tuple[str, str, str, str, bytes | None]] = [
    ("lookupd_ping", "lookupd", "GET", "/ping", None),
    ("lookupd_lookup", "lookupd", "GET", "/lookup?topic=cap_topic", None),
    ("lookupd_lookup_missing", "lookupd", "GET", "/lookup?topic=cap_missing", None),
    ("lookupd_topics", "lookupd", "GET", "/topics", None),
    ("lookupd_channels", "lookupd", "GET", "/channels?topic=cap_topic", None),
    ("lookupd_nodes", "lookupd", "GET", "/nodes", None),
    ("lookupd_info", "lookupd", "GET", "/info", None),
    ("lookupd_listlookup", "lookupd", "GET", "/listlookup", None),
]
#: Asked while a subscribed client (RDY 0) is connected: the client entry of /stats.
CLIENT_REQUEST = (
    "nsqd_stats_with_client",
    "nsqd",
    "GET",
    "/stats?format=json&topic=cap_topic&channel=cap_stats&include_mem=false",
    None,
)
CLIENT_IDENTIFY = {
    "client_id": "cap-client",
    "hostname": "cap-host",
    "user_agent": "fastnsq-capture/1.0",
    "feature_negotiation": True,
}


async def _ask(http: aiohttp.ClientSession, base: str, method: str, path: str, body: bytes | None) -> dict[str, Any]:
    async with http.request(method, base + path, data=body, headers=ACCEPT_V1) as response:
        return {
            "request": f"{method} {path}",
            "status": response.status,
            "headers": {h: response.headers[h] for h in HEADERS if h in response.headers},
            "body": (await response.read()).decode("utf-8"),
        }


async def _settled(http: aiohttp.ClientSession, nsqd_http: str, timeout: float = 20.0) -> None:
    """Until no channel of cap_topic has a message in flight or deferred."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        async with http.get(f"http://{nsqd_http}/stats?format=json&topic=cap_topic&include_mem=false") as r:
            stats = json.loads(await r.read())
        channels = [c for t in stats["topics"] or [] for c in t["channels"]]
        if channels and not any(c["in_flight_count"] or c["deferred_count"] for c in channels):
            return
        if loop.time() > deadline:
            raise TimeoutError(f"cap_topic still has messages in flight or deferred: {channels}")
        await asyncio.sleep(0.1)


async def _registered(http: aiohttp.ClientSession, lookupd_http: str, timeout: float = 10.0) -> None:
    """Until lookupd lists both topics and cap_topic's two channels (nsqd registers asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        async with http.get(f"http://{lookupd_http}/lookup?topic=cap_topic", headers=ACCEPT_V1) as r:
            lookup = json.loads(await r.read()) if r.status == 200 else {}
        async with http.get(f"http://{lookupd_http}/topics", headers=ACCEPT_V1) as r:
            topics = json.loads(await r.read()).get("topics", [])
        if sorted(lookup.get("channels", [])) == ["cap_channel", "cap_err"] and "cap_http" in topics:
            return
        if loop.time() > deadline:
            raise TimeoutError(f"lookupd lists {lookup} and topics {topics}")
        await asyncio.sleep(0.05)


async def _subscribed_client(nsqd_tcp: str) -> asyncio.StreamWriter:
    """A raw client subscribed to cap_topic/cap_stats with RDY 0 (nothing in flight)."""
    host, _, port = nsqd_tcp.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(CLIENT_IDENTIFY).encode()
    writer.write(b"  V2IDENTIFY\n" + struct.pack(">I", len(body)) + body + b"SUB cap_topic cap_stats\n")
    for _ in range(2):  # the IDENTIFY JSON, then OK
        size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))[0]
        await asyncio.wait_for(reader.readexactly(size), 5)
    return writer


async def run(nsqd_tcp: str, nsqd_http: str, lookupd_http: str) -> dict[str, dict[str, Any]]:
    """Every request of this script, answered by the given servers (see the module docstring)."""
    answers: dict[str, dict[str, Any]] = {}
    bases = {"nsqd": f"http://{nsqd_http}", "lookupd": f"http://{lookupd_http}"}
    async with aiohttp.ClientSession() as http:
        await _settled(http, nsqd_http)
        for name, server, method, path, body in NSQD_REQUESTS:
            answers[name] = await _ask(http, bases[server], method, path, body)
        await _registered(http, lookupd_http)
        for name, server, method, path, body in LOOKUPD_REQUESTS:
            answers[name] = await _ask(http, bases[server], method, path, body)
        writer = await _subscribed_client(nsqd_tcp)
        try:
            name, server, method, path, body = CLIENT_REQUEST
            answers[name] = await _ask(http, bases[server], method, path, body)
        finally:
            writer.close()
    return answers


def with_values_of(recorded: Any, actual: Any) -> Any:
    """``recorded`` with the values of :data:`VARIABLE_KEYS` taken from ``actual`` (same shape).

    A list of names (lookupd's ``topics`` and ``channels``) takes ``actual``'s order when
    it holds the same names: nsqlookupd lists them in Go's map order, which is random.
    """
    if _names(recorded) and _names(actual) and sorted(recorded) == sorted(actual):
        return actual
    if isinstance(recorded, dict) and isinstance(actual, dict):
        return {
            key: actual[key]
            if key in VARIABLE_KEYS and key in actual
            else with_values_of(value, actual.get(key))
            for key, value in recorded.items()
        }
    if isinstance(recorded, list) and isinstance(actual, list) and len(recorded) == len(actual):
        return [with_values_of(r, a) for r, a in zip(recorded, actual)]
    return recorded


def _names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
