"""Conformance tests of nsqd 1.3's behaviour, run against the embedded nsqd.

Every test talks to the server only through the wire (a raw protocol client built on
the project's codec: ``codec.WriteBuffer`` to send, ``codec.FrameReader`` to read) and
through the HTTP API, so the same tests run against a real nsqd 1.3: set
``FASTNSQ_TEST_NSQD`` (tcp host:port) and ``FASTNSQ_TEST_NSQD_HTTP``. Tests that need a
server configured in a particular way (TLS, AUTH, small limits, lookupd, restarts)
start their own (``make_nsqd``): an embedded one, or in the real pass a real nsqd from
the binaries the run is judged against (``FASTNSQ_TEST_REAL_BIN``, which
``python -m fastnsq.testing.real`` sets) with the same settings as flags.

Timing-sensitive tests use nsqd's smallest client settings (heartbeat_interval and
msg_timeout of 1000 ms) so that the file runs in seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web

from fastnsq import codec as nsq_codec
from fastnsq.compression import DeflateStream, SnappyStream
from fastnsq.testing import external_cluster_from_env
from fastnsq.testing.lookupd import NSQLookupd
from fastnsq.testing.nsqd import NSQD
from fastnsq.testing.real import RealLookupdServer, RealNSQDServer, real_bin_dir

from .captures import load
from .captures.wire import expected_frames
from .helpers import Slack, due_within, upstream_version

if TYPE_CHECKING:
    from typing_extensions import Self

EXTERNAL_TCP = os.environ.get("FASTNSQ_TEST_NSQD", "").strip()
EXTERNAL_HTTP = os.environ.get("FASTNSQ_TEST_NSQD_HTTP", "").strip()
#: In the real pass, the binaries that tests needing a server of their own start it from.
REAL_BIN = real_bin_dir() if EXTERNAL_TCP else None
EVENT_TIMEOUT = 3.0
MAX_MSG_SIZE = nsq_codec.DEFAULT_MAX_MSG_SIZE
MAX_BODY_SIZE = nsq_codec.DEFAULT_MAX_BODY_SIZE



def own_server_binaries() -> Any:
    """The real binaries to start a test's own server from (real pass), None when embedded."""
    if not EXTERNAL_TCP:
        return None
    if REAL_BIN is None:
        pytest.skip("starts its own nsqd: name the real binaries with FASTNSQ_TEST_REAL_BIN "
                    "(python -m fastnsq.testing.real sets it)")
    return REAL_BIN



def unique(prefix: str = "t") -> str:
    """A fresh topic/channel name per test (the server may be shared)."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# ---- a raw protocol client -----------------------------------------------------------


class RawClient(asyncio.Protocol):
    """A bare NSQ connection: commands out through WriteBuffer, frames in through FrameReader.

    Frames become events in :attr:`events`: ``("message", Message)``,
    ``("response", bytes)``, ``("error", code, description)`` and ``("eof",)``.
    Heartbeats are answered with NOP and skipped unless ``keep_heartbeats``.
    The IDENTIFY upgrades (TLS, snappy, deflate) are followed like go-nsq does.
    """

    def __init__(self, keep_heartbeats: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.reader = nsq_codec.FrameReader(self._on_message, self._on_response, self._on_error)
        self.out = nsq_codec.WriteBuffer()
        self.transport: asyncio.Transport | None = None
        self.keep_heartbeats = keep_heartbeats
        self.closed = self.loop.create_future()
        self._compressor: SnappyStream | DeflateStream | None = None
        self._decompressor: SnappyStream | DeflateStream | None = None
        self._identify_pending = False
        self._plan: list[Any] = []  # upgrades still to do after IDENTIFY
        self._pause_on_ok = False

    @classmethod
    async def connect(cls, address: str, *, magic: bool = True, keep_heartbeats: bool = False) -> RawClient:
        host, port = address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(keep_heartbeats), host, int(port))
        if magic:
            client.out.magic()
            client.flush()
        return client

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._decompressor is not None:
            data = self._decompressor.decompress(data)
        self.reader.feed(data)
        self._advance()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.put_nowait(("eof",))
        if not self.closed.done():
            self.closed.set_result(None)

    # frames
    def _on_message(self, message: Any) -> None:
        self.events.put_nowait(("message", message))

    def _on_response(self, data: Any) -> None:
        data = bytes(data)
        if data == nsq_codec.HEARTBEAT and not self.keep_heartbeats:
            self.send_raw(b"NOP\n")
            return
        if self._identify_pending and data != nsq_codec.HEARTBEAT:
            self._identify_pending = False
            if data.startswith(b"{"):
                answer = json.loads(data)
                if answer.get("tls_v1"):
                    self._plan.append("tls")
                if answer.get("snappy"):
                    self._plan.append(("snappy", 0))
                elif answer.get("deflate"):
                    self._plan.append(("deflate", answer["deflate_level"]))
                if self._plan:
                    self.reader.pause()
        elif self._pause_on_ok and data == nsq_codec.OK:
            self._pause_on_ok = False
            self.reader.pause()
        self.events.put_nowait(("response", data))

    def _on_error(self, code: str, description: str) -> None:
        self.events.put_nowait(("error", code, description))

    def _advance(self) -> None:
        """Switch to compression where the stream switches (bytes after the JSON/OK)."""
        if not self.reader.paused or not self._plan or self._plan[0] == "tls":
            return
        kind, level = self._plan.pop(0)
        rest = self.reader.take_unparsed()
        if kind == "snappy":
            self._compressor, self._decompressor = SnappyStream(), SnappyStream()
        else:
            self._compressor, self._decompressor = DeflateStream(level), DeflateStream(level)
        self.reader.resume()
        if rest:
            self.reader.feed(self._decompressor.decompress(rest))

    # writing
    def flush(self) -> None:
        data = self.out.take()
        if data:
            self.send_raw(data)

    def send_raw(self, data: bytes) -> None:
        if self._compressor is not None:
            data = self._compressor.compress(data)
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # reading
    async def event(self, timeout: float = EVENT_TIMEOUT) -> tuple[Any, ...]:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def response(self, timeout: float = EVENT_TIMEOUT) -> bytes:
        event = await self.event(timeout)
        assert event[0] == "response", f"expected a response, got {event!r}"
        return event[1]

    async def ok(self) -> None:
        assert await self.response() == b"OK"

    async def error(self, timeout: float = EVENT_TIMEOUT) -> str:
        """The next event must be an error frame: its full text."""
        event = await self.event(timeout)
        assert event[0] == "error", f"expected an error frame, got {event!r}"
        return f"{event[1]} {event[2]}"

    async def message(self, timeout: float = EVENT_TIMEOUT) -> Any:
        event = await self.event(timeout)
        assert event[0] == "message", f"expected a message, got {event!r}"
        return event[1]

    async def messages(self, count: int, timeout: float = EVENT_TIMEOUT) -> list[Any]:
        return [await self.message(timeout) for _ in range(count)]

    async def eof(self, timeout: float = EVENT_TIMEOUT) -> None:
        event = await self.event(timeout)
        assert event == ("eof",), f"expected the server to close, got {event!r}"

    async def fatal(self, text: str) -> None:
        """The server answers ``text`` and closes the connection."""
        assert await self.error() == text
        await self.eof()

    async def nothing(self, wait: float = 0.2) -> None:
        try:
            event = await asyncio.wait_for(self.events.get(), wait)
        except asyncio.TimeoutError:
            return
        raise AssertionError(f"expected nothing, got {event!r}")

    # commands
    async def identify(self, tls_context: ssl.SSLContext | None = None, **fields: Any) -> Any:
        """IDENTIFY; returns the JSON answer (upgrades done) or the ``b"OK"``/error event."""
        self._identify_pending = True
        self.out.identify(json.dumps(fields).encode())
        self.flush()
        event = await self.event()
        if event[0] != "response" or not event[1].startswith(b"{"):
            return event[1] if event[0] == "response" else event
        answer = json.loads(event[1])
        if self._plan and self._plan[0] == "tls":
            assert tls_context is not None, "the server negotiated TLS: pass tls_context"
            self._plan.pop(0)
            self._pause_on_ok = bool(self._plan)
            self.transport = await self.loop.start_tls(
                self.transport, self, tls_context, server_hostname="127.0.0.1"
            )
            self.reader.resume()
            self._advance()
            assert await self.response() == b"OK"  # over TLS
            self._advance()
        if answer.get("snappy") or answer.get("deflate"):
            assert await self.response() == b"OK"  # compressed
        return answer

    async def subscribe(self, topic: str, channel: str, rdy: int | None = None, **identify: Any) -> None:
        if identify:
            answer = await self.identify(**identify)
            assert isinstance(answer, dict) or answer == b"OK", answer
        self.out.sub(topic, channel)
        self.flush()
        await self.ok()
        if rdy is not None:
            self.rdy(rdy)

    def rdy(self, count: int) -> None:
        self.send_raw(b"RDY %d\n" % count)

    def fin(self, message_id: bytes) -> None:
        self.send_raw(b"FIN " + message_id + b"\n")

    def req(self, message_id: bytes, delay_ms: int) -> None:
        self.send_raw(b"REQ " + message_id + b" %d\n" % delay_ms)

    def touch(self, message_id: bytes) -> None:
        self.send_raw(b"TOUCH " + message_id + b"\n")

    async def publish(self, topic: str, *bodies: bytes) -> None:
        for body in bodies:
            self.out.pub(topic, body)
        self.flush()
        for _ in bodies:
            await self.ok()


def port_of(address: str | None) -> int:
    return int((address or ":0").rpartition(":")[2])


def command(name: bytes, *params: bytes, body: bytes | None = None) -> bytes:
    """Raw command bytes (for what WriteBuffer refuses to encode: bad names, sizes)."""
    line = b" ".join((name, *params)) + b"\n"
    return line if body is None else line + struct.pack(">I", len(body)) + body


def mpub_body(*bodies: bytes) -> bytes:
    return struct.pack(">I", len(bodies)) + b"".join(struct.pack(">I", len(b)) + b for b in bodies)


# ---- servers ---------------------------------------------------------------------------


@dataclass
class Server:
    tcp: str
    http: str | None
    embedded: NSQD | None

    async def connect(self, **kwargs: Any) -> RawClient:
        return await RawClient.connect(self.tcp, **kwargs)

    def url(self, path: str) -> str:
        if not self.http:
            pytest.skip("FASTNSQ_TEST_NSQD_HTTP is not set")
        return f"http://{self.http}{path}"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    if EXTERNAL_TCP:
        yield Server(EXTERNAL_TCP, EXTERNAL_HTTP or None, None)
        return
    nsqd = NSQD()
    await nsqd.start()
    try:
        yield Server(nsqd.tcp_address, nsqd.http_address, nsqd)
    finally:
        await nsqd.stop()


@pytest.fixture
async def make_nsqd() -> AsyncIterator[Callable[..., Any]]:
    """Start nsqds with given options, stopped at the end of the test: embedded ones, or in
    the real pass real ones with the options as flags (:class:`RealNSQDServer`)."""
    started: list[Any] = []

    async def make(**options: Any) -> Any:
        binaries = own_server_binaries()
        nsqd = NSQD(**options) if binaries is None else RealNSQDServer(binaries, **options)
        started.append(nsqd)
        await nsqd.start()
        return nsqd

    yield make
    for nsqd in started:
        await (nsqd.stop() if isinstance(nsqd, NSQD) else nsqd.close())


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Accept": "application/vnd.nsq; version=1.0"}) as session:
        yield session


async def stats(
    session: aiohttp.ClientSession, server: Server, topic: str, channel: str = ""
) -> dict[str, Any]:
    params = {"format": "json", "topic": topic}
    if channel:
        params["channel"] = channel
    async with session.get(server.url("/stats"), params=params) as response:
        assert response.status == 200
        return json.loads(await response.read())


async def channel_stats(
    session: aiohttp.ClientSession, server: Server, topic: str, channel: str
) -> dict[str, Any]:
    data = await stats(session, server, topic, channel)
    assert data["topics"], data
    (entry,) = data["topics"][0]["channels"]
    return entry


# ---- magic, unknown commands ---------------------------------------------------------------


async def test_bad_magic_is_refused(server: Server) -> None:
    client = await server.connect(magic=False)
    client.send_raw(b"  V1")
    await client.fatal("E_BAD_PROTOCOL ")  # the frame is "E_BAD_PROTOCOL": no description


async def test_unknown_command_is_fatal(server: Server) -> None:
    client = await server.connect()
    client.send_raw(b"BOGUS\n")
    await client.fatal("E_INVALID invalid command BOGUS")


async def test_nop_answers_nothing(server: Server) -> None:
    client = await server.connect()
    client.send_raw(b"NOP\n")
    await client.nothing()
    await client.publish(unique(), b"still open")


async def test_line_longer_than_16k_drops_the_connection(server: Server) -> None:
    client = await server.connect()
    client.send_raw(b"PUB " + b"a" * 20000)
    await client.eof()


# ---- IDENTIFY -------------------------------------------------------------------------------


async def test_identify_without_feature_negotiation_answers_ok(server: Server) -> None:
    client = await server.connect()
    assert await client.identify(client_id="c", hostname="h", user_agent="test/1") == b"OK"


async def recorded_identify_keys(server: Server) -> list[str]:
    """The keys of the IDENTIFY answer recorded from the nsqd version this server is."""
    version = await upstream_version(server.embedded, server.http)
    (frame,) = expected_frames(load("identify_negotiate", version))[0]
    return list(json.loads(frame[1]))


async def test_identify_answer(server: Server) -> None:
    client = await server.connect()
    answer = await client.identify(feature_negotiation=True, msg_timeout=5000)
    # The released 1.3.0 ends at output_buffer_timeout; nsq master adds the topology.
    assert list(answer) == await recorded_identify_keys(server)
    assert list(answer)[:13] == [
        "max_rdy_count",
        "version",
        "max_msg_timeout",
        "msg_timeout",
        "tls_v1",
        "deflate",
        "deflate_level",
        "max_deflate_level",
        "snappy",
        "sample_rate",
        "auth_required",
        "output_buffer_size",
        "output_buffer_timeout",
    ]
    assert answer["msg_timeout"] == 5000
    assert answer["version"].startswith("1.")
    assert (answer["tls_v1"], answer["deflate"], answer["snappy"]) == (False, False, False)
    assert (answer["output_buffer_size"], answer["output_buffer_timeout"]) == (16384, 250)
    assert answer["deflate_level"] == min(6, answer["max_deflate_level"])


async def test_identify_client_settings_are_echoed(server: Server) -> None:
    client = await server.connect()
    answer = await client.identify(
        feature_negotiation=True, output_buffer_size=-1, output_buffer_timeout=100, sample_rate=10
    )
    # -1 turns buffering off: a 1-byte buffer and no flush timer.
    assert (answer["output_buffer_size"], answer["output_buffer_timeout"], answer["sample_rate"]) == (
        1,
        0,
        10,
    )


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"heartbeat_interval": 999}, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
        ({"heartbeat_interval": 60001}, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
        ({"heartbeat_interval": -2}, "E_BAD_BODY IDENTIFY heartbeat interval (-2) is invalid"),
        ({"output_buffer_timeout": 24}, "E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid"),
        ({"output_buffer_timeout": 30001}, "E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid"),
        ({"output_buffer_size": 63}, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
        ({"output_buffer_size": 65537}, "E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
        ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        ({"sample_rate": -1}, "E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
        ({"msg_timeout": 999}, "E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
        ({"msg_timeout": 900001}, "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
        ({"heartbeat_interval": "1000"}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
        ({"feature_negotiation": 1}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ],
)
async def test_identify_invalid_values_are_fatal(server: Server, fields: dict[str, Any], text: str) -> None:
    client = await server.connect()
    assert await client.identify(**fields) == ("error", *text.split(" ", 1))
    await client.eof()


async def test_identify_body_not_json_is_fatal(server: Server) -> None:
    client = await server.connect()
    client.send_raw(command(b"IDENTIFY", body=b"{not json"))
    await client.fatal("E_BAD_BODY IDENTIFY failed to decode JSON body")


async def test_identify_empty_body_is_fatal(server: Server) -> None:
    client = await server.connect()
    client.send_raw(b"IDENTIFY\n" + struct.pack(">I", 0))
    await client.fatal("E_BAD_BODY IDENTIFY invalid body size 0")


async def test_identify_body_too_big_is_fatal(server: Server) -> None:
    client = await server.connect()
    client.send_raw(b"IDENTIFY\n" + struct.pack(">I", MAX_BODY_SIZE + 1))
    await client.fatal(f"E_BAD_BODY IDENTIFY body too big {MAX_BODY_SIZE + 1} > {MAX_BODY_SIZE}")


async def test_identify_after_sub_is_fatal(server: Server) -> None:
    client = await server.connect()
    await client.subscribe(unique(), "c")
    client.out.identify(b"{}")
    client.flush()
    await client.fatal("E_INVALID cannot IDENTIFY in current state")


async def test_identify_both_compressions_is_fatal(server: Server) -> None:
    client = await server.connect()
    event = await client.identify(feature_negotiation=True, snappy=True, deflate=True)
    assert event == ("error", "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
    await client.eof()


async def test_deflate_level_follows_the_request_up_to_the_maximum(server: Server) -> None:
    client = await server.connect()
    answer = await client.identify(feature_negotiation=True, deflate=True, deflate_level=9)
    assert answer["deflate"] is True
    assert answer["deflate_level"] == answer["max_deflate_level"]
    other = await server.connect()
    answer = await other.identify(feature_negotiation=True, deflate=True, deflate_level=1)
    assert answer["deflate_level"] == 1


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
async def test_compressed_connection_publishes_and_consumes(server: Server, kind: str) -> None:
    topic = unique()
    client = await server.connect()
    answer = await client.identify(feature_negotiation=True, **{kind: True})
    assert answer[kind] is True
    await client.publish(topic, b"compressed " * 50, b"two")
    await client.subscribe(topic, "c", rdy=10)
    first, second = await client.messages(2)
    assert (first.body, second.body, first.attempts) == (b"compressed " * 50, b"two", 1)
    client.fin(first.id)
    client.send_raw(b"FIN 0000000000000000\n")
    assert await client.error() == "E_FIN_FAILED FIN 0000000000000000 failed ID not in flight"


# ---- TLS (embedded: the test owns the certificates) ---------------------------------------


@pytest.fixture
def tls_files(tmp_path: Any) -> dict[str, Any]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("client.example", common_name="client.example")
    paths = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca", "client")}
    server_cert.cert_chain_pems[0].write_to_path(paths["cert"])
    server_cert.private_key_pem.write_to_path(paths["key"])
    ca.cert_pem.write_to_path(paths["ca"])
    client_cert.private_key_and_cert_chain_pem.write_to_path(paths["client"])
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    with_cert = ssl.create_default_context()
    ca.configure_trust(with_cert)
    with_cert.load_cert_chain(paths["client"])
    return {**paths, "context": client_context, "context_with_cert": with_cert}


async def test_tls_upgrade(make_nsqd: Callable[..., Any], tls_files: dict[str, Any]) -> None:
    nsqd = await make_nsqd(tls_cert=tls_files["cert"], tls_key=tls_files["key"])
    client = await RawClient.connect(nsqd.tcp_address)
    answer = await client.identify(tls_context=tls_files["context"], feature_negotiation=True, tls_v1=True)
    assert answer["tls_v1"] is True
    assert client.transport.get_extra_info("ssl_object") is not None
    topic = unique()
    await client.publish(topic, b"over tls")
    await client.subscribe(topic, "c", rdy=1)
    assert (await client.message()).body == b"over tls"


async def test_tls_with_snappy(make_nsqd: Callable[..., Any], tls_files: dict[str, Any]) -> None:
    nsqd = await make_nsqd(tls_cert=tls_files["cert"], tls_key=tls_files["key"])
    client = await RawClient.connect(nsqd.tcp_address)
    answer = await client.identify(
        tls_context=tls_files["context"], feature_negotiation=True, tls_v1=True, snappy=True
    )
    assert (answer["tls_v1"], answer["snappy"]) == (True, True)
    await client.publish(unique(), b"tls and snappy")


async def test_tls_not_offered_without_certificates(server: Server) -> None:
    client = await server.connect()
    answer = await client.identify(feature_negotiation=True, tls_v1=True)
    if EXTERNAL_TCP and answer["tls_v1"]:
        client.close()
        pytest.skip(f"the real nsqd {server.tcp} offers TLS: the test needs one without")
    assert answer["tls_v1"] is False
    await client.publish(unique(), b"plain")


async def test_tls_required_refuses_commands_before_the_upgrade(
    make_nsqd: Callable[..., Any], tls_files: dict[str, Any]
) -> None:
    nsqd = await make_nsqd(tls_cert=tls_files["cert"], tls_key=tls_files["key"], tls_required=True)
    client = await RawClient.connect(nsqd.tcp_address)
    client.out.pub(unique(), b"x")
    client.flush()
    await client.fatal("E_INVALID cannot PUB in current state (TLS required)")
    client = await RawClient.connect(nsqd.tcp_address)
    await client.identify(tls_context=tls_files["context"], feature_negotiation=True, tls_v1=True)
    await client.publish(unique(), b"allowed now")


async def test_tls_client_certificate_required(
    make_nsqd: Callable[..., Any], tls_files: dict[str, Any]
) -> None:
    nsqd = await make_nsqd(
        tls_cert=tls_files["cert"],
        tls_key=tls_files["key"],
        tls_client_auth_policy="require-verify",
        tls_root_ca_file=tls_files["ca"],
    )
    good = await RawClient.connect(nsqd.tcp_address)
    await good.identify(tls_context=tls_files["context_with_cert"], feature_negotiation=True, tls_v1=True)
    await good.publish(unique(), b"with a client certificate")
    bad = await RawClient.connect(nsqd.tcp_address)
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError, asyncio.TimeoutError)):
        await bad.identify(tls_context=tls_files["context"], feature_negotiation=True, tls_v1=True)
        # TLS 1.3 reports a refused client certificate only on the first read.
        await bad.publish(unique(), b"refused")


# ---- heartbeats and the read deadline -----------------------------------------------------


async def test_heartbeats_every_interval_to_a_producer(server: Server) -> None:
    client = await server.connect(keep_heartbeats=True)
    await client.identify(heartbeat_interval=1000)
    await client.publish(unique(), b"producer")
    async with Slack() as slack:
        started = time.monotonic()
        assert await client.response(2.0 + 5.0) == b"_heartbeat_"
        client.send_raw(b"NOP\n")
        assert await client.response(2.0 + 5.0) == b"_heartbeat_"
        elapsed = time.monotonic() - started
    # Two heartbeats 1 s apart: the second within two intervals, plus the slack measured meanwhile.
    assert 0.8 < elapsed < 2 * 1.0 + slack.allowance(0.3), (elapsed, slack)


async def test_heartbeats_start_before_identify(make_nsqd: Callable[..., Any]) -> None:
    # The default interval is half the server's client timeout: 60 s in nsqd 1.3, which
    # has no flag for it (a real nsqd sends the first one after 30 s); 2 s embedded.
    if own_server_binaries() is None:
        nsqd, interval = await make_nsqd(client_timeout=2.0), 1.0
    else:
        nsqd, interval = await make_nsqd(), 30.0
    client = await RawClient.connect(nsqd.tcp_address, keep_heartbeats=True)
    started = time.monotonic()
    assert await client.response(interval + 2.0) == b"_heartbeat_"
    assert time.monotonic() - started > interval * 0.8  # not before the interval


async def test_read_deadline_closes_a_silent_client(server: Server) -> None:
    client = await server.connect(keep_heartbeats=True)
    async with Slack() as slack:
        started = time.monotonic()
        await client.identify(heartbeat_interval=1000)
        assert await client.response() == b"_heartbeat_"
        # The second heartbeat (at 2 s) and the read deadline (2 x 1 s after IDENTIFY) fall
        # due together: in nsqd either can win (the recordings hold both outcomes).
        event = await client.event()
        if event != ("eof",):
            assert event == ("response", b"_heartbeat_")
            await client.eof()
        took = time.monotonic() - started
    # Not before the deadline; at it (not a third interval later), plus the slack measured meanwhile.
    assert 1.8 < took < 2 * 1.0 + slack.allowance(0.5), (took, slack)


async def test_answering_heartbeats_keeps_the_connection(server: Server) -> None:
    client = await server.connect()  # answers every heartbeat with NOP
    await client.identify(heartbeat_interval=1000)
    await client.nothing(2.6)
    await client.publish(unique(), b"alive")


# ---- SUB --------------------------------------------------------------------------------


async def test_sub_twice_is_fatal(server: Server) -> None:
    client = await server.connect()
    topic = unique()
    await client.subscribe(topic, "c")
    client.out.sub(topic, "c")
    client.flush()
    await client.fatal("E_INVALID cannot SUB in current state")


@pytest.mark.parametrize(
    ("params", "text"),
    [
        (b" bad*topic c", 'E_BAD_TOPIC SUB topic name "bad*topic" is not valid'),
        (b" good bad:channel", 'E_BAD_CHANNEL SUB channel name "bad:channel" is not valid'),
        (b" " + b"x" * 65 + b" c", 'E_BAD_TOPIC SUB topic name "' + "x" * 65 + '" is not valid'),
        (b" onlytopic", "E_INVALID SUB insufficient number of parameters"),
    ],
)
async def test_sub_invalid(server: Server, params: bytes, text: str) -> None:
    client = await server.connect()
    client.send_raw(b"SUB" + params + b"\n")
    await client.fatal(text)


async def test_sub_with_heartbeats_disabled_is_fatal(server: Server) -> None:
    client = await server.connect()
    assert await client.identify(heartbeat_interval=-1) == b"OK"
    client.out.sub(unique(), "c")
    client.flush()
    await client.fatal("E_INVALID cannot SUB with heartbeats disabled")


async def test_max_channel_consumers(make_nsqd: Callable[..., Any]) -> None:
    nsqd = await make_nsqd(max_channel_consumers=1)
    topic = unique()
    first = await RawClient.connect(nsqd.tcp_address)
    await first.subscribe(topic, "c")
    second = await RawClient.connect(nsqd.tcp_address)
    second.out.sub(topic, "c")
    second.flush()
    await second.fatal(f"E_SUB_FAILED SUB failed consumers for {topic}:c exceeds limit of 1")


# ---- RDY -------------------------------------------------------------------------------


async def test_rdy_before_sub_is_fatal(server: Server) -> None:
    client = await server.connect()
    client.rdy(1)
    await client.fatal("E_INVALID cannot RDY in current state")


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"RDY 2501\n", "E_INVALID RDY count 2501 out of range 0-2500"),
        (b"RDY -1\n", "E_INVALID RDY could not parse count -1"),
        (b"RDY x\n", "E_INVALID RDY could not parse count x"),
    ],
)
async def test_rdy_out_of_range_is_fatal(server: Server, line: bytes, text: str) -> None:
    client = await server.connect()
    await client.subscribe(unique(), "c")
    client.send_raw(line)
    await client.fatal(text)


async def test_rdy_without_a_count_means_one(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"1", b"2")
    await client.subscribe(topic, "c")
    client.send_raw(b"RDY\n")
    assert (await client.message()).body == b"1"
    await client.nothing()


async def test_rdy_bounds_messages_in_flight(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, *[b"m%d" % i for i in range(5)])
    await client.subscribe(topic, "c", rdy=2)
    first, second = await client.messages(2)
    await client.nothing()
    client.fin(first.id)
    assert (await client.message()).body == b"m2"
    await client.nothing()
    client.rdy(0)
    client.fin(second.id)
    await client.nothing()
    client.rdy(5)
    assert [m.body for m in await client.messages(2)] == [b"m3", b"m4"]


# ---- delivery ------------------------------------------------------------------------------


async def test_message_frame(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    before = time.time_ns()
    await client.publish(topic, b"hello")
    await client.subscribe(topic, "c", rdy=1)
    message = await client.message()
    assert message.body == b"hello"
    assert message.attempts == 1
    assert len(message.id) == 16 and all(c in b"0123456789abcdef" for c in message.id)
    assert before - 10**9 < message.timestamp < time.time_ns() + 10**9


async def test_message_ids_increase(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    client.out.mpub(topic, [b"%d" % i for i in range(20)])
    client.flush()
    await client.ok()
    await client.subscribe(topic, "c", rdy=20)
    ids = [m.id for m in await client.messages(20)]
    assert len(set(ids)) == 20
    assert ids == sorted(ids, key=lambda i: int(i, 16))


async def test_every_channel_gets_a_copy(server: Server) -> None:
    topic = unique()
    one = await server.connect()
    two = await server.connect()
    await one.subscribe(topic, "one", rdy=10)
    await two.subscribe(topic, "two", rdy=10)
    producer = await server.connect()
    await producer.publish(topic, b"a", b"b", b"c")
    got_one = [m.body for m in await one.messages(3)]
    got_two = [m.body for m in await two.messages(3)]
    assert got_one == got_two == [b"a", b"b", b"c"]


async def test_messages_before_any_channel_go_to_the_first_channel(server: Server) -> None:
    topic = unique()
    producer = await server.connect()
    await producer.publish(topic, b"early")
    first = await server.connect()
    await first.subscribe(topic, "first", rdy=10)
    assert (await first.message()).body == b"early"
    second = await server.connect()
    await second.subscribe(topic, "second", rdy=10)
    await second.nothing()
    await producer.publish(topic, b"later")
    assert (await first.message()).body == b"later"
    assert (await second.message()).body == b"later"


async def test_messages_spread_over_ready_clients(server: Server) -> None:
    topic = unique()
    one = await server.connect()
    two = await server.connect()
    await one.subscribe(topic, "shared", rdy=1)
    await two.subscribe(topic, "shared", rdy=1)
    await asyncio.sleep(0.05)
    producer = await server.connect()
    await producer.publish(topic, b"x", b"y")
    bodies = {(await one.message()).body, (await two.message()).body}
    assert bodies == {b"x", b"y"}
    await one.nothing(0.1)
    await two.nothing(0.1)


async def test_fin_of_an_unknown_id_is_not_fatal(server: Server) -> None:
    client = await server.connect()
    await client.subscribe(unique(), "c")
    client.fin(b"0000000000000000")
    assert await client.error() == "E_FIN_FAILED FIN 0000000000000000 failed ID not in flight"
    client.req(b"0000000000000001", 0)
    assert await client.error() == "E_REQ_FAILED REQ 0000000000000001 failed ID not in flight"
    client.touch(b"0000000000000002")
    assert await client.error() == "E_TOUCH_FAILED TOUCH 0000000000000002 failed ID not in flight"
    client.send_raw(b"CLS\n")
    assert await client.response() == b"CLOSE_WAIT"


async def test_fin_of_another_clients_message(server: Server) -> None:
    topic = unique()
    owner = await server.connect()
    other = await server.connect()
    await owner.publish(topic, b"mine")
    await owner.subscribe(topic, "c", rdy=1)
    message = await owner.message()
    await other.subscribe(topic, "c")
    other.fin(message.id)
    assert await other.error() == f"E_FIN_FAILED FIN {message.id.decode()} failed client does not own message"
    owner.fin(message.id)
    await owner.nothing()


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"FIN 1234\n", "E_INVALID invalid message ID"),
        (b"FIN\n", "E_INVALID FIN insufficient number of params"),
        (b"REQ 0000000000000000\n", "E_INVALID REQ insufficient number of params"),
        (b"REQ 0000000000000000 soon\n", "E_INVALID REQ could not parse timeout soon"),
        (b"TOUCH 12\n", "E_INVALID invalid message ID"),
    ],
)
async def test_fin_req_touch_malformed_are_fatal(server: Server, line: bytes, text: str) -> None:
    client = await server.connect()
    await client.subscribe(unique(), "c")
    client.send_raw(line)
    await client.fatal(text)


@pytest.mark.parametrize(
    ("verb", "line"),
    [
        ("FIN", b"FIN 0000000000000000\n"),
        ("REQ", b"REQ 0000000000000000 0\n"),
        ("TOUCH", b"TOUCH 0000000000000000\n"),
        ("CLS", b"CLS\n"),
    ],
)
async def test_consumer_commands_before_sub_are_fatal(server: Server, verb: str, line: bytes) -> None:
    client = await server.connect()
    client.send_raw(line)
    await client.fatal(f"E_INVALID cannot {verb} in current state")


async def test_timeout_requeues_with_more_attempts(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"slow")
    await client.subscribe(topic, "c", rdy=1, heartbeat_interval=1000, msg_timeout=1000)
    first = await client.message()
    started = time.monotonic()
    again = await client.message(due_within(1.0))
    waited = time.monotonic() - started
    assert (again.id, again.body, again.attempts) == (first.id, b"slow", 2)
    assert waited > 0.9, waited  # never before msg_timeout; later by up to nsqd's scan cadence
    client.fin(first.id)  # the first delivery timed out: its FIN now finishes the redelivery
    await client.nothing()


async def test_req_requeues_now_or_later(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"again")
    await client.subscribe(topic, "c", rdy=1)
    first = await client.message()
    client.req(first.id, 0)
    second = await client.message()
    assert (second.id, second.attempts) == (first.id, 2)
    client.req(second.id, 400)
    started = time.monotonic()
    if server.http:
        # REQ has no answer: /stats may be asked before nsqd has read it (seen once against nsqd 1.3.0).
        for _ in range(50):
            entry = await channel_stats(http, server, topic, "c")
            if entry["requeue_count"] == 2:
                break
            await asyncio.sleep(0.005)
        assert (entry["deferred_count"], entry["in_flight_count"], entry["requeue_count"]) == (1, 0, 2)
    third = await client.message(due_within(0.4))
    assert time.monotonic() - started > 0.35
    assert (third.id, third.attempts) == (first.id, 3)


async def test_req_delay_is_clamped_not_refused(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"far")
    await client.subscribe(topic, "c", rdy=1)
    message = await client.message()
    client.req(message.id, 10**12)  # far above max_req_timeout: clamped, no error
    await client.nothing()
    if server.http:
        assert (await channel_stats(http, server, topic, "c"))["deferred_count"] == 1


async def test_touch_extends_the_deadline(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"long job")
    await client.subscribe(topic, "c", rdy=1, heartbeat_interval=1000, msg_timeout=1000)
    message = await client.message()
    for _ in range(3):
        await asyncio.sleep(0.6)
        client.touch(message.id)
    await client.nothing(0.5)  # 2.3 s after delivery and still not redelivered
    again = await client.message(due_within(1.0))  # no more TOUCH: it times out
    assert (again.id, again.attempts) == (message.id, 2)


async def test_touch_stops_at_max_msg_timeout(make_nsqd: Callable[..., Any]) -> None:
    nsqd = await make_nsqd(max_msg_timeout=2.0)
    topic = unique()
    client = await RawClient.connect(nsqd.tcp_address)
    await client.publish(topic, b"capped")
    await client.subscribe(topic, "c", rdy=1, heartbeat_interval=1000, msg_timeout=1000)
    message = await client.message()
    # A real nsqd redelivers it when its queue scan notices (up to 5 s late on a new channel).
    latest = 2.0 + 0.1 if own_server_binaries() is None else due_within(2.0)  # the embedded scan: 100 ms
    async with Slack() as slack:
        started = time.monotonic()
        deadline = started + latest + 10.0  # a wait: the bound is asserted below
        again = None
        while again is None and time.monotonic() < deadline:
            client.touch(message.id)
            try:
                event = await client.event(0.3)
            except asyncio.TimeoutError:
                continue
            assert event[0] == "message"
            again = event[1]
        took = time.monotonic() - started
    assert again is not None and again.attempts == 2
    # Redelivered at max_msg_timeout however often it is touched: not before, and not later than
    # the scan's lateness plus the slack measured meanwhile.
    assert 1.8 < took < latest + slack.allowance(0.3), (took, slack)


async def test_cls_answers_close_wait_and_keeps_the_connection(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"1", b"2")
    await client.subscribe(topic, "c", rdy=1)
    message = await client.message()
    client.send_raw(b"CLS\n")
    assert await client.response() == b"CLOSE_WAIT"
    client.rdy(5)  # ignored after CLS
    client.fin(message.id)  # still allowed
    client.send_raw(b"NOP\n")
    await client.nothing(0.3)
    client.out.pub(topic, b"3")
    client.flush()
    await client.ok()


async def test_sample_rate_drops_messages_for_the_channel(
    server: Server, http: aiohttp.ClientSession
) -> None:
    topic = unique()
    producer = await server.connect()
    producer.out.mpub(topic, [b"%d" % i for i in range(200)])
    producer.flush()
    await producer.ok()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=200, feature_negotiation=True, sample_rate=50)
    received = 0
    try:
        while True:
            await client.message(0.5)
            received += 1
    except asyncio.TimeoutError:
        pass
    # nsqd keeps a message when rand(100) <= sample_rate: 51 % on average.
    assert 50 < received < 160, received
    if server.http:
        entry = await channel_stats(http, server, topic, "c")
        assert entry["depth"] == 0 and entry["in_flight_count"] == received


# ---- output buffering -----------------------------------------------------------------------


async def test_output_buffer_waits_for_the_timeout_while_ready(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=10, feature_negotiation=True, output_buffer_timeout=1000)
    producer = await server.connect()
    async with Slack() as slack:
        started = time.monotonic()
        await producer.publish(topic, b"buffered")
        await client.message(2.0 + 5.0)
        took = time.monotonic() - started
    # Still ready (RDY 10, 1 in flight): the frame waits for the 1 s flush tick, and no second one.
    assert 0.5 < took < 1.0 + slack.allowance(0.3), (took, slack)


async def test_output_buffer_flushes_when_not_ready(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=1, feature_negotiation=True, output_buffer_timeout=1000)
    producer = await server.connect()
    async with Slack() as slack:
        started = time.monotonic()
        await producer.publish(topic, b"at once")
        await client.message()
        took = time.monotonic() - started
    # At once, not at the 1 s flush tick: a publish and a delivery, plus the slack measured meanwhile.
    assert took < slack.allowance(0.3), (took, slack)


async def test_output_buffer_flushes_when_full(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(
        topic, "c", rdy=10, feature_negotiation=True, output_buffer_size=64, output_buffer_timeout=1000
    )
    producer = await server.connect()
    async with Slack() as slack:
        started = time.monotonic()
        await producer.publish(topic, b"x" * 100)  # a frame bigger than the 64-byte buffer
        await client.message()
        took = time.monotonic() - started
    assert took < slack.allowance(0.3), (took, slack)  # at once, not at the 1 s flush tick


# ---- publishing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (command(b"PUB", body=b"x"), "E_INVALID PUB insufficient number of parameters"),
        (command(b"PUB", b"bad*topic", body=b"x"), 'E_BAD_TOPIC PUB topic name "bad*topic" is not valid'),
        (command(b"PUB", b"t", body=b""), "E_BAD_MESSAGE PUB invalid message body size 0"),
        (
            b"PUB t\n" + struct.pack(">I", MAX_MSG_SIZE + 1),
            f"E_BAD_MESSAGE PUB message too big {MAX_MSG_SIZE + 1} > {MAX_MSG_SIZE}",
        ),
        (
            command(b"MPUB", b"bad*topic", body=mpub_body(b"x")),
            'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad*topic" is not valid',
        ),
        (b"MPUB t\n" + struct.pack(">I", 0), "E_BAD_BODY MPUB invalid body size 0"),
        (
            b"MPUB t\n" + struct.pack(">I", MAX_BODY_SIZE + 1),
            f"E_BAD_BODY MPUB body too big {MAX_BODY_SIZE + 1} > {MAX_BODY_SIZE}",
        ),
        (command(b"MPUB", b"t", body=struct.pack(">I", 0)), "E_BAD_BODY MPUB invalid message count 0"),
        (
            command(b"MPUB", b"t", body=mpub_body(b"a", b"")),
            "E_BAD_MESSAGE MPUB invalid message(1) body size 0",
        ),
        (command(b"DPUB", b"t", body=b"x"), "E_INVALID DPUB insufficient number of parameters"),
        (command(b"DPUB", b"t", b"soon", body=b"x"), "E_INVALID DPUB could not parse timeout soon"),
        (command(b"DPUB", b"t", b"-5", body=b"x"), "E_INVALID DPUB could not parse timeout -5"),
        (
            command(b"DPUB", b"t", b"3600001", body=b"x"),
            "E_INVALID DPUB timeout 3600001 out of range 0-3600000",
        ),
        (command(b"DPUB", b"t", b"10", body=b""), "E_BAD_MESSAGE DPUB invalid message body size 0"),
    ],
)
async def test_publish_errors_are_fatal(server: Server, raw: bytes, text: str) -> None:
    client = await server.connect()
    client.send_raw(raw)
    await client.fatal(text)


async def test_pipelined_publishes_are_answered_in_order(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    client.out.pub(topic, b"1")
    client.out.nop()
    client.out.mpub(topic, [b"2", b"3"])
    client.out.dpub(topic, 0, b"4")
    client.out.pub(topic, b"5")
    client.flush()
    for _ in range(4):
        await client.ok()
    await client.nothing()
    await client.subscribe(topic, "c", rdy=10)
    assert [m.body for m in await client.messages(5)] == [b"1", b"2", b"3", b"4", b"5"]


async def test_dpub_delivers_after_the_delay(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=10, feature_negotiation=True, output_buffer_size=-1)
    producer = await server.connect()
    producer.out.dpub(topic, 500, b"later")
    producer.out.pub(topic, b"now")
    producer.flush()
    started = time.monotonic()
    await producer.ok()
    await producer.ok()
    assert (await client.message()).body == b"now"
    if server.http:
        assert (await channel_stats(http, server, topic, "c"))["deferred_count"] == 1
    assert (await client.message(due_within(0.5))).body == b"later"
    assert time.monotonic() - started > 0.45


async def test_max_size_message_is_accepted(server: Server) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"m" * MAX_MSG_SIZE)
    await client.subscribe(topic, "c", rdy=1)
    assert len((await client.message()).body) == MAX_MSG_SIZE


# ---- ephemeral topics and channels ------------------------------------------------------------


async def test_ephemeral_channel_goes_with_its_last_client(
    server: Server, http: aiohttp.ClientSession
) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "eph#ephemeral")
    names = [c["channel_name"] for c in (await stats(http, server, topic))["topics"][0]["channels"]]
    assert names == ["eph#ephemeral"]
    client.close()
    await client.closed
    await asyncio.sleep(0.1)
    assert (await stats(http, server, topic))["topics"][0]["channels"] == []


async def test_ephemeral_topic_goes_with_its_last_channel(
    server: Server, http: aiohttp.ClientSession
) -> None:
    topic = unique() + "#ephemeral"
    client = await server.connect()
    await client.subscribe(topic, "c#ephemeral")
    assert (await stats(http, server, topic))["topics"]
    client.close()
    await client.closed
    await asyncio.sleep(0.1)
    assert (await stats(http, server, topic))["topics"] is None


# ---- stats -------------------------------------------------------------------------------------


async def test_stats_follow_the_channel_and_its_clients(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.identify(client_id="stats-client", hostname="stats-host", user_agent="tests/1")
    await client.publish(topic, b"1", b"2", b"3", b"4")
    await client.subscribe(topic, "c", rdy=3)
    one, two, three = await client.messages(3)
    client.fin(one.id)
    client.req(two.id, 60000)
    fourth = await client.message()
    await asyncio.sleep(0.05)
    data = await stats(http, server, topic)
    assert data["version"].startswith("1.") and data["health"] == "OK"
    (entry,) = data["topics"]
    assert (entry["topic_name"], entry["depth"], entry["message_count"], entry["message_bytes"]) == (
        topic,
        0,
        4,
        4,
    )
    (channel,) = entry["channels"]
    assert channel["channel_name"] == "c"
    assert (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 2, 1)
    assert (channel["message_count"], channel["requeue_count"], channel["timeout_count"]) == (4, 1, 0)
    assert channel["client_count"] == 1 and channel["paused"] is False
    (me,) = channel["clients"]
    assert (me["client_id"], me["hostname"], me["user_agent"], me["version"]) == (
        "stats-client",
        "stats-host",
        "tests/1",
        "V2",
    )
    assert (me["ready_count"], me["in_flight_count"], me["message_count"]) == (3, 2, 4)
    assert (me["finish_count"], me["requeue_count"], me["state"]) == (1, 1, 3)
    # A shared server may list other producers too: find this one.
    mine = [p for p in data["producers"] if p["client_id"] == "stats-client"]
    assert [p["pub_counts"] for p in mine] == [[{"topic": topic, "count": 4}]]
    del three, fourth


async def test_stats_filters(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "a")
    other = await server.connect()
    await other.subscribe(topic, "b")
    assert [c["channel_name"] for c in (await stats(http, server, topic))["topics"][0]["channels"]] == [
        "a",
        "b",
    ]
    assert [c["channel_name"] for c in (await stats(http, server, topic, "b"))["topics"][0]["channels"]] == [
        "b"
    ]
    assert (await stats(http, server, unique()))["topics"] is None
    async with http.get(server.url(f"/stats?format=json&topic={topic}&include_clients=false")) as response:
        data = json.loads(await response.read())
    # Without clients nsqd leaves the list nil: null (the recordings show it).
    assert data["topics"][0]["channels"][0]["clients"] is None and data["producers"] is None
    async with http.get(server.url("/stats?format=json&include_mem=false")) as response:
        assert "memory" not in json.loads(await response.read())


# ---- HTTP API ----------------------------------------------------------------------------------


async def http_call(
    http: aiohttp.ClientSession, server: Server, method: str, path: str, body: bytes | None = None
) -> tuple[int, Any, bytes]:
    async with http.request(method, server.url(path), data=body) as response:
        return response.status, response.headers, await response.read()


async def test_http_ping_and_info(server: Server, http: aiohttp.ClientSession) -> None:
    status, headers, body = await http_call(http, server, "GET", "/ping")
    assert (status, body, headers["Content-Type"]) == (200, b"OK", "text/plain; charset=utf-8")
    assert "X-Nsq-Content-Type" not in headers
    status, headers, body = await http_call(http, server, "GET", "/info")
    info = json.loads(body)
    assert status == 200 and headers["X-Nsq-Content-Type"] == "nsq; version=1.0"
    assert set(info) >= {
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
    }
    assert info["tcp_port"] == int(server.tcp.rsplit(":", 1)[1])
    assert info["max_heartbeat_interval"] == 60 * 10**9  # a Go time.Duration: nanoseconds


async def test_http_pub_and_mpub(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    status, headers, body = await http_call(http, server, "POST", f"/pub?topic={topic}", b"via http")
    assert (status, body, headers["Content-Type"]) == (200, b"OK", "text/plain; charset=utf-8")
    assert (await http_call(http, server, "POST", f"/mpub?topic={topic}", b"a\n\nb\n"))[0] == 200
    binary = mpub_body(b"bin\n1", b"bin2")
    assert (await http_call(http, server, "POST", f"/mpub?topic={topic}&binary=true", binary))[0] == 200
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=10)
    assert [m.body for m in await client.messages(5)] == [b"via http", b"a", b"b", b"bin\n1", b"bin2"]


async def test_http_pub_defer(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=10, feature_negotiation=True, output_buffer_size=-1)
    started = time.monotonic()
    assert (await http_call(http, server, "POST", f"/pub?topic={topic}&defer=400", b"deferred"))[0] == 200
    assert (await client.message(due_within(0.4))).body == b"deferred"
    assert time.monotonic() - started > 0.35


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("/pub?topic=bad*topic", b"x", 400, "INVALID_TOPIC"),
        ("/pub?topic=t&defer=x", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
        ("/pub?topic=t", b"x" * (MAX_MSG_SIZE + 1), 413, "MSG_TOO_BIG"),
        ("/mpub?topic=t", b"x" * (MAX_BODY_SIZE + 1), 413, "BODY_TOO_BIG"),
        ("/mpub?topic=t&binary=true", struct.pack(">I", 0), 413, "BAD_BODY"),
        ("/mpub?topic=t&binary=true", mpub_body(b"a", b""), 413, "BAD_MESSAGE"),
        ("/topic/create", None, 400, "MISSING_ARG_TOPIC"),
        ("/topic/create?topic=bad*topic", None, 400, "INVALID_TOPIC"),
        ("/topic/delete?topic=nosuchtopic_x", None, 404, "TOPIC_NOT_FOUND"),
        ("/topic/pause?topic=nosuchtopic_x", None, 404, "TOPIC_NOT_FOUND"),
        ("/topic/empty?topic=nosuchtopic_x", None, 404, "TOPIC_NOT_FOUND"),
        ("/channel/create?topic=nosuchtopic_x&channel=c", None, 404, "TOPIC_NOT_FOUND"),
        ("/channel/create?topic=t", None, 400, "MISSING_ARG_CHANNEL"),
        ("/channel/create?topic=t&channel=bad*", None, 400, "INVALID_ARG_CHANNEL"),
        ("/channel/create?topic=bad*&channel=c", None, 400, "INVALID_ARG_TOPIC"),
        ("/nowhere", None, 404, "NOT_FOUND"),
    ],
)
async def test_http_errors(
    server: Server, http: aiohttp.ClientSession, path: str, body: bytes | None, status: int, message: str
) -> None:
    answer = await http_call(http, server, "POST", path, body)
    assert (answer[0], json.loads(answer[2])) == (status, {"message": message})
    assert answer[1]["Content-Type"] == "application/json; charset=utf-8"
    assert answer[1]["X-Nsq-Content-Type"] == "nsq; version=1.0"


async def test_http_wrong_method(server: Server, http: aiohttp.ClientSession) -> None:
    status, _, body = await http_call(http, server, "GET", "/pub?topic=t")
    assert (status, json.loads(body)) == (405, {"message": "METHOD_NOT_ALLOWED"})


async def test_http_topic_and_channel_administration(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    status, headers, body = await http_call(http, server, "POST", f"/topic/create?topic={topic}")
    assert (status, body) == (200, b"") and headers["X-Nsq-Content-Type"] == "nsq; version=1.0"
    assert (await http_call(http, server, "POST", f"/channel/create?topic={topic}&channel=c"))[0] == 200
    assert [c["channel_name"] for c in (await stats(http, server, topic))["topics"][0]["channels"]] == ["c"]
    assert (await http_call(http, server, "POST", f"/channel/delete?topic={topic}&channel=c"))[0] == 200
    status, _, body = await http_call(http, server, "POST", f"/channel/delete?topic={topic}&channel=c")
    assert (status, json.loads(body)) == (404, {"message": "CHANNEL_NOT_FOUND"})
    assert (await http_call(http, server, "POST", f"/topic/delete?topic={topic}"))[0] == 200
    assert (await stats(http, server, topic))["topics"] is None


async def test_http_channel_created_before_publishing_gets_the_messages(
    server: Server, http: aiohttp.ClientSession
) -> None:
    topic = unique()
    await http_call(http, server, "POST", f"/topic/create?topic={topic}")
    await http_call(http, server, "POST", f"/channel/create?topic={topic}&channel=a")
    await http_call(http, server, "POST", f"/channel/create?topic={topic}&channel=b")
    await http_call(http, server, "POST", f"/pub?topic={topic}", b"both")

    async def depths() -> list[tuple[str, int]]:
        channels = (await stats(http, server, topic))["topics"][0]["channels"]
        return [(c["channel_name"], c["depth"]) for c in channels]

    # A real nsqd copies the message into its channels in the topic's own goroutine, after
    # /pub answered: a /stats right after may see it in one channel only (seen under load).
    await eventually(lambda: _equals(depths, [("a", 1), ("b", 1)]))
    assert await depths() == [("a", 1), ("b", 1)]


async def test_paused_channel_stops_delivering(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=10, feature_negotiation=True, output_buffer_size=-1)
    assert (await http_call(http, server, "POST", f"/channel/pause?topic={topic}&channel=c"))[0] == 200
    await http_call(http, server, "POST", f"/pub?topic={topic}", b"held")
    await client.nothing(0.3)
    entry = await channel_stats(http, server, topic, "c")
    assert (entry["paused"], entry["depth"]) == (True, 1)
    assert (await http_call(http, server, "POST", f"/channel/unpause?topic={topic}&channel=c"))[0] == 200
    assert (await client.message()).body == b"held"


async def test_paused_topic_holds_messages(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c", rdy=10, feature_negotiation=True, output_buffer_size=-1)
    assert (await http_call(http, server, "POST", f"/topic/pause?topic={topic}"))[0] == 200
    await http_call(http, server, "POST", f"/pub?topic={topic}", b"waits in the topic")
    await client.nothing(0.3)
    entry = (await stats(http, server, topic))["topics"][0]
    assert (entry["paused"], entry["depth"], entry["channels"][0]["depth"]) == (True, 1, 0)
    assert (await http_call(http, server, "POST", f"/topic/unpause?topic={topic}"))[0] == 200
    assert (await client.message()).body == b"waits in the topic"


async def test_channel_empty_drops_queued_and_in_flight(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    client = await server.connect()
    await client.publish(topic, b"1", b"2", b"3")
    await client.subscribe(topic, "c", rdy=1)
    message = await client.message()
    assert (await http_call(http, server, "POST", f"/channel/empty?topic={topic}&channel=c"))[0] == 200
    entry = await channel_stats(http, server, topic, "c")
    assert (entry["depth"], entry["in_flight_count"]) == (0, 0)
    client.fin(message.id)
    assert await client.error() == f"E_FIN_FAILED FIN {message.id.decode()} failed ID not in flight"


async def test_topic_empty_drops_what_waits_in_the_topic(server: Server, http: aiohttp.ClientSession) -> None:
    topic = unique()
    await http_call(http, server, "POST", f"/pub?topic={topic}", b"dropped")
    assert (await http_call(http, server, "POST", f"/topic/empty?topic={topic}"))[0] == 200
    assert (await stats(http, server, topic))["topics"][0]["depth"] == 0


async def test_deleting_a_channel_disconnects_its_consumers(
    server: Server, http: aiohttp.ClientSession
) -> None:
    topic = unique()
    client = await server.connect()
    await client.subscribe(topic, "c")
    assert (await http_call(http, server, "POST", f"/channel/delete?topic={topic}&channel=c"))[0] == 200
    await client.eof()


# ---- AUTH (embedded nsqd with a tiny auth server) -----------------------------------------------


class TinyAuthServer:
    """An auth HTTP endpoint answering from a secret -> answer table, recording queries."""

    def __init__(self, answers: dict[str, dict[str, Any]]) -> None:
        self.answers = answers
        self.queries: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        answer = self.answers.get(request.query.get("secret", ""))
        if answer is None:
            return web.Response(status=403, text="forbidden")
        return web.json_response(answer)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/auth", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.address = f"127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


def grant(topic: str, channels: list[str], permissions: list[str]) -> dict[str, Any]:
    return {"topic": topic, "channels": channels, "permissions": permissions}


AUTH_ANSWERS = {
    "good": {
        "ttl": 3600,
        "identity": "alice",
        "identity_url": "https://example/alice",
        "authorizations": [
            grant("^allowed", [".*"], ["publish", "subscribe"]),
            grant("^readonly$", ["^ch$"], ["subscribe"]),
        ],
    },
    "nothing": {"ttl": 3600, "identity": "nobody", "identity_url": "", "authorizations": []},
    "short": {
        "ttl": 1,
        "identity": "brief",
        "identity_url": "",
        "authorizations": [grant(".*", [".*"], ["publish", "subscribe"])],
    },
    "bogus": {
        "ttl": 3600,
        "identity": "x",
        "identity_url": "",
        "authorizations": [grant(".*", [".*"], ["write"])],
    },
}


@pytest.fixture
async def auth_nsqd(make_nsqd: Callable[..., Any]) -> AsyncIterator[tuple[NSQD, TinyAuthServer]]:
    async with TinyAuthServer(AUTH_ANSWERS) as auth:
        yield await make_nsqd(auth_http_addresses=[auth.address]), auth


async def authed(nsqd: NSQD, secret: str) -> tuple[RawClient, Any]:
    client = await RawClient.connect(nsqd.tcp_address)
    answer = await client.identify(feature_negotiation=True)
    assert answer["auth_required"] is True
    client.out.auth(secret)
    client.flush()
    return client, await client.event()


async def test_auth_required_before_publishing(auth_nsqd: tuple[NSQD, TinyAuthServer]) -> None:
    nsqd, _ = auth_nsqd
    client = await RawClient.connect(nsqd.tcp_address)
    client.out.pub("allowed_topic", b"x")
    client.flush()
    await client.fatal("E_AUTH_FIRST AUTH required before PUB")
    client = await RawClient.connect(nsqd.tcp_address)
    client.out.sub("allowed_topic", "c")
    client.flush()
    await client.fatal("E_AUTH_FIRST AUTH required before SUB")


async def test_auth_grants_and_refuses(auth_nsqd: tuple[NSQD, TinyAuthServer]) -> None:
    nsqd, auth = auth_nsqd
    client, event = await authed(nsqd, "good")
    assert event[0] == "response"
    assert json.loads(event[1]) == {
        "identity": "alice",
        "identity_url": "https://example/alice",
        "permission_count": 2,
    }
    query = auth.queries[-1]
    assert (query["secret"], query["tls"], query["remote_ip"], query["common_name"]) == (
        "good",
        "false",
        "127.0.0.1",
        "",
    )
    await client.publish("allowed_topic", b"ok")
    client.out.pub("other_topic", b"no")
    client.flush()
    await client.fatal('E_UNAUTHORIZED AUTH failed for PUB on "other_topic" ""')
    reader, _ = await authed(nsqd, "good")
    await reader.subscribe("readonly", "ch")
    writer, _ = await authed(nsqd, "good")
    writer.out.pub("readonly", b"x")
    writer.flush()
    await writer.fatal('E_UNAUTHORIZED AUTH failed for PUB on "readonly" ""')
    other, _ = await authed(nsqd, "good")
    other.out.sub("readonly", "other")
    other.flush()
    await other.fatal('E_UNAUTHORIZED AUTH failed for SUB on "readonly" "other"')


async def test_auth_failures(auth_nsqd: tuple[NSQD, TinyAuthServer]) -> None:
    nsqd, _ = auth_nsqd
    client, event = await authed(nsqd, "unknown secret")
    assert event == ("error", "E_AUTH_FAILED", "AUTH failed")
    await client.eof()
    client, event = await authed(nsqd, "bogus")  # an invalid answer counts as a failure
    assert event == ("error", "E_AUTH_FAILED", "AUTH failed")
    client, event = await authed(nsqd, "nothing")
    assert event == ("error", "E_UNAUTHORIZED", "AUTH no authorizations found")
    await client.eof()
    client, event = await authed(nsqd, "good")
    client.out.auth("good")
    client.flush()
    await client.fatal("E_INVALID AUTH already set")


async def test_auth_is_asked_again_when_expired(auth_nsqd: tuple[NSQD, TinyAuthServer]) -> None:
    nsqd, auth = auth_nsqd
    client, event = await authed(nsqd, "short")
    assert event[0] == "response"
    await client.publish("anything", b"1")
    asked = len(auth.queries)
    await asyncio.sleep(1.1)
    await client.publish("anything", b"2")
    assert len(auth.queries) == asked + 1


async def test_auth_over_tls_sends_the_client_certificate_name(
    make_nsqd: Callable[..., Any], tls_files: dict[str, Any]
) -> None:
    async with TinyAuthServer(AUTH_ANSWERS) as auth:
        nsqd = await make_nsqd(
            tls_cert=tls_files["cert"],
            tls_key=tls_files["key"],
            tls_client_auth_policy="require-verify",
            tls_root_ca_file=tls_files["ca"],
            auth_http_addresses=[auth.address],
        )
        client = await RawClient.connect(nsqd.tcp_address)
        answer = await client.identify(
            tls_context=tls_files["context_with_cert"], feature_negotiation=True, tls_v1=True
        )
        assert (answer["tls_v1"], answer["auth_required"]) == (True, True)
        client.out.auth("good")
        client.flush()
        assert json.loads(await client.response())["identity"] == "alice"
        assert (auth.queries[-1]["tls"], auth.queries[-1]["common_name"]) == ("true", "client.example")


async def test_auth_disabled(server: Server) -> None:
    client = await server.connect()
    client.out.auth("secret")
    client.flush()
    await client.fatal("E_AUTH_DISABLED AUTH disabled")


# ---- lookupd registration --------------------------------------------------------------------


@dataclass
class Registered:
    """nsqds registered with one lookupd: embedded ones, or the real cluster of the environment."""

    nsqds: list[Server]
    lookupd_http: str


@pytest.fixture
async def registered(make_nsqd: Callable[..., Any]) -> AsyncIterator[Registered]:
    """Two nsqds registered with a lookupd (the real ones of FASTNSQ_TEST_CLUSTER_NSQD, when given)."""
    if EXTERNAL_TCP:
        cluster = external_cluster_from_env()
        if cluster is None or not all(cluster.http_addresses) or len(cluster.nsqds) < 2:
            pytest.skip("needs a real cluster: FASTNSQ_TEST_CLUSTER_NSQD(_HTTP) with FASTNSQ_TEST_LOOKUPD_HTTP")
        nodes = [Server(n.tcp_address, n.http_address, None) for n in cluster.nsqds[:2]]
        yield Registered(nodes, cluster.lookupd.http_address)
        return
    async with NSQLookupd() as lookupd:
        nsqds = [await make_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address]) for _ in range(2)]
        await lookupd.wait_for_nodes(2)
        yield Registered([Server(n.tcp_address, n.http_address, n) for n in nsqds], lookupd.http_address)


@pytest.fixture
async def lookupd() -> AsyncIterator[Any]:
    """A lookupd of the test's own, for the tests that restart it or configure the nsqds
    around it: embedded, or in the real pass a real nsqlookupd."""
    binaries = own_server_binaries()
    async with (NSQLookupd() if binaries is None else RealLookupdServer(binaries)) as server:
        yield server


#: How long a real nsqd takes to register again with a lookupd that came back: its PING
#: every 15 s (built in: no flag) finds the connection dead and closes it, the next one
#: reconnects and registers everything again (nsqd/lookup.go): up to 30 s; embedded 5 s.
REREGISTER_WITHIN = 40.0 if EXTERNAL_TCP else 5.0


async def lookup(lookupd: Any, path: str) -> tuple[int, Any]:
    """GET ``path`` of a lookupd (an object with ``http_address``, or the address itself)."""
    address = lookupd if isinstance(lookupd, str) else lookupd.http_address
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{address}{path}", headers={"Accept": "application/vnd.nsq; version=1.0"}) as response,
    ):
        return response.status, json.loads(await response.read())


async def eventually(check: Callable[[], Any], timeout: float = 3.0) -> Any:
    """Poll ``check`` (async) until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.02)


async def test_registers_topics_and_channels_with_lookupd(registered: Registered) -> None:
    nsqd, lookupd = registered.nsqds[0], registered.lookupd_http
    topic = unique()
    client = await nsqd.connect()
    await client.publish(topic, b"registered")

    async def producers() -> Any:
        status, data = await lookup(lookupd, f"/lookup?topic={topic}")
        return status == 200 and data["producers"]

    found = await eventually(producers)
    assert found and len(found) == 1
    assert (found[0]["tcp_port"], found[0]["http_port"]) == (port_of(nsqd.tcp), port_of(nsqd.http))
    await client.subscribe(topic, "reader")

    async def channels() -> Any:
        return (await lookup(lookupd, f"/channels?topic={topic}"))[1]["channels"] == ["reader"]

    assert await eventually(channels)
    # UNREGISTER: nsqlookupd drops a channel registration when its last producer goes
    # only for ephemeral channels (others stay listed), so watch an ephemeral one.
    ephemeral = await nsqd.connect()
    await ephemeral.subscribe(topic, "gone#ephemeral")

    async def both() -> Any:
        names = (await lookup(lookupd, f"/channels?topic={topic}"))[1]["channels"]
        return sorted(names) == ["gone#ephemeral", "reader"]

    assert await eventually(both)
    ephemeral.close()

    assert await eventually(channels)


async def test_registers_again_after_lookupd_restarts(make_nsqd: Callable[..., Any], lookupd: Any) -> None:
    nsqd = await make_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
    topic = unique()
    client = await RawClient.connect(nsqd.tcp_address)
    await client.subscribe(topic, "c")

    async def registered() -> Any:
        status, data = await lookup(lookupd, f"/lookup?topic={topic}")
        return status == 200 and data["channels"] == ["c"] and data["producers"]

    assert await eventually(registered)
    await lookupd.stop()
    await lookupd.start()  # same ports, empty registry
    assert await eventually(registered, timeout=REREGISTER_WITHIN)


async def test_pings_keep_the_registration_alive(make_nsqd: Callable[..., Any]) -> None:
    # lookupd forgets a producer silent for inactive_producer_timeout; nsqd's PINGs keep it
    # listed. Embedded: pings every 0.1 s, a silent nsqd pings every 60 s, a 0.5 s timeout.
    # Real: nsqd pings every 15 s (built in), so a 20 s timeout, and the silent nsqd is
    # frozen (SIGSTOP) once registered.
    binaries = own_server_binaries()
    timeout = 0.5 if binaries is None else 20.0
    async with (NSQLookupd(inactive_producer_timeout=timeout) if binaries is None
                else RealLookupdServer(binaries, inactive_producer_timeout=timeout)) as lookupd:
        fast, slow = ({"lookupd_ping_interval": 0.1}, {"lookupd_ping_interval": 60.0}) if binaries is None else ({}, {})
        pinging = await make_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address], **fast)
        silent = await make_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address], **slow)
        topic = unique()
        for nsqd in (pinging, silent):
            producer = await RawClient.connect(nsqd.tcp_address)
            await producer.publish(topic, b"x")

        async def ports() -> set[int]:
            status, data = await lookup(lookupd, f"/lookup?topic={topic}")
            return {p["tcp_port"] for p in data["producers"]} if status == 200 else set()

        assert await eventually(lambda: _equals(ports, {pinging.tcp_port, silent.tcp_port}))
        if binaries is not None:
            await silent.pause()
        await asyncio.sleep(timeout * 2)
        assert await ports() == {pinging.tcp_port}


async def _equals(check: Callable[[], Any], expected: Any) -> bool:
    return await check() == expected


async def test_new_topic_gets_the_channels_lookupd_knows(registered: Registered) -> None:
    topic = unique()
    first, second = registered.nsqds
    lookupd = registered.lookupd_http
    consumer = await first.connect()
    await consumer.subscribe(topic, "everywhere")

    async def known() -> Any:
        return (await lookup(lookupd, f"/channels?topic={topic}"))[1].get("channels") == ["everywhere"]

    assert await eventually(known)
    producer = await second.connect()
    await producer.publish(topic, b"for the channel that exists elsewhere")
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{second.http}/stats?format=json&topic={topic}") as response,
    ):
        data = json.loads(await response.read())
    (channel,) = data["topics"][0]["channels"]
    assert (channel["channel_name"], channel["depth"]) == ("everywhere", 1)


# ---- restarts (embedded) ---------------------------------------------------------------------


async def test_restart_keeps_messages_and_ports(make_nsqd: Callable[..., Any]) -> None:
    nsqd = await make_nsqd()
    tcp, http_address = nsqd.tcp_address, nsqd.http_address
    topic = unique()
    client = await RawClient.connect(tcp)
    await client.publish(topic, b"queued", b"in flight")
    consumer = await RawClient.connect(tcp)
    await consumer.subscribe(topic, "c", rdy=1)
    assert (await consumer.message()).body == b"queued"
    await nsqd.stop(keep_messages=True)
    await consumer.eof()
    await nsqd.start()
    assert (nsqd.tcp_address, nsqd.http_address) == (tcp, http_address)
    again = await RawClient.connect(tcp)
    await again.subscribe(topic, "c", rdy=2)
    got = await again.messages(2)
    # The in-flight message comes back after the queued one, with its attempts.
    assert [(m.body, m.attempts) for m in got] == [(b"in flight", 1), (b"queued", 2)]


async def test_restart_without_messages_keeps_topics_and_channels(make_nsqd: Callable[..., Any]) -> None:
    nsqd = await make_nsqd()
    topic = unique()
    consumer = await RawClient.connect(nsqd.tcp_address)
    await consumer.subscribe(topic, "c")
    await consumer.publish(topic, b"lost")
    await nsqd.stop(keep_messages=False)
    await nsqd.start()
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{nsqd.http_address}/stats?format=json&topic={topic}") as response,
    ):
        data = json.loads(await response.read())
    (channel,) = data["topics"][0]["channels"]
    assert (channel["channel_name"], channel["depth"], channel["message_count"]) == ("c", 0, 0)


# ---- pure helpers (no sockets) -------------------------------------------------------------


def test_go_quote_matches_go_percent_q() -> None:
    from fastnsq.testing._nsqd_parse import go_quote

    assert go_quote(b"bad*topic") == '"bad*topic"'
    assert go_quote(b'a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote(b"tab\there\n") == '"tab\\there\\n"'
    assert go_quote(b"\x01\xff") == '"\\x01\\xff"'  # a control byte, an invalid UTF-8 byte
    assert go_quote("é".encode()) == '"' + "é".encode().decode("latin-1") + '"'  # printable UTF-8 stays


def test_base10_is_nsqds_byte_to_base10() -> None:
    from fastnsq.testing._nsqd_parse import as_int64, base10

    assert base10(b"") == 0  # empty is 0, not an error
    assert base10(b"2500") == 2500
    assert base10(b"-1") is None and base10(b"1.5") is None and base10("٣".encode()) is None
    assert as_int64(base10(b"18446744073709551615")) == -1  # wraps like Go's uint64 -> int64


def test_parse_identify_like_go_json() -> None:
    from fastnsq.testing._nsqd_parse import parse_identify

    data = parse_identify(b'{"Heartbeat_Interval": 1000, "msg_timeout": null, "unknown": [1]}')
    assert (data["heartbeat_interval"], data["msg_timeout"], data["feature_negotiation"]) == (1000, 0, False)
    assert parse_identify(b"null")["client_id"] == ""
    for body in (
        b"[]",
        b'{"sample_rate": 2147483648}',
        b'{"tls_v1": "yes"}',
        b'{"msg_timeout": 1e3}',
        b"NaN",
    ):
        with pytest.raises(ValueError):
            parse_identify(body)
