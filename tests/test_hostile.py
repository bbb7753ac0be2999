"""Hostile servers and careless callers: only ProtocolError and a closed connection, and
secrets and message bodies never reach logs or exception messages."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastnsq import Consumer, Producer, codec
from fastnsq.config import ConnectionOptions
from fastnsq.conn import Connection
from fastnsq.errors import InvalidValueError, NSQError, ProtocolError, ServerError
from fastnsq.testing import NSQD, AuthServer
from fastnsq.testing.auth import authorization

from .helpers import eventually

CORPUS = Path(__file__).parent / "corpus" / "server_bytes"
IDENTIFY_ANSWER = codec.encode_response(json.dumps({"max_rdy_count": 2500, "version": "1.3.0"}).encode())
SUB_OK = codec.encode_response(b"OK")


class HostileServer:
    """Answers IDENTIFY (and SUB) properly, then sends whatever the test says."""

    def __init__(self, payload: bytes, *, after_sub: bool = True) -> None:
        self.payload = payload
        self.after_sub = after_sub
        self.server: asyncio.base_events.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readexactly(4 + len(b"IDENTIFY\n"))
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
            writer.write(IDENTIFY_ANSWER)
            if self.after_sub:
                await reader.readline()
                writer.write(SUB_OK)
            writer.write(self.payload)
            await writer.drain()
            await asyncio.sleep(0.2)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def expose(payload: bytes) -> Connection:
    """Connect, subscribe, take ``payload`` from the server; return the connection after it closed."""
    received: list = []
    async with HostileServer(payload) as address:
        conn = Connection(address, ConnectionOptions(heartbeat_interval=1.0), on_message=received.append)
        conn.reader.delegate = None
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.rdy(100)
        await asyncio.wait_for(conn.wait_closed(), 5)
    assert conn.state == "closed"
    # Whatever the bytes, the client either decoded frames or closed with a ProtocolError
    # (or a fatal error frame the server chose to send) - never another exception.
    assert conn.close_error is None or isinstance(conn.close_error, (ProtocolError, ServerError, OSError)), repr(
        conn.close_error
    )
    return conn


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=600))
async def test_random_server_bytes_only_close_the_connection(garbage):
    await expose(garbage)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(st.sampled_from([b"OK", b"_heartbeat_", b"CLOSE_WAIT", b"{}", b"junk"]), max_size=5),
    cut=st.integers(0, 40),
    tail=st.binary(max_size=40),
)
async def test_truncated_and_spliced_frames(frames, cut, tail):
    data = b"".join(codec.encode_response(f) for f in frames)
    data += codec.encode_message(1, 1, b"0" * 16, b"body")[: max(0, 38 - cut)] + tail
    await expose(data)


async def test_a_huge_announced_frame_is_not_allocated():
    conn = await expose(struct.pack(">ii", 0x7FFFFFF0, 2) + b"x" * 100)
    assert isinstance(conn.close_error, ProtocolError)
    assert "above the maximum" in str(conn.close_error)
    assert conn.reader.capacity < 1 << 20


def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*.bin"))


def test_the_regression_corpus_is_there():
    assert len(corpus_files()) >= 8


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.stem)
async def test_regression_corpus(path):
    """Inputs kept from fuzz runs and hand-written hostile cases (tests/corpus/server_bytes)."""
    await expose(path.read_bytes())


@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.stem)
def test_regression_corpus_through_both_codecs(codec_impl_pair, path):
    data = path.read_bytes()
    for impl in codec_impl_pair:
        reader = impl.FrameReader(lambda m: None, lambda d: None, lambda c, d: None, layout=7)
        try:
            reader.feed(data)
        except ProtocolError:
            pass


@pytest.fixture
def codec_impl_pair():
    from fastnsq import _frame_py

    impls = [_frame_py]
    try:
        from fastnsq import _frame

        impls.append(_frame)
    except ImportError:  # pragma: no cover
        pass
    return impls


# ---- secrets and bodies stay out of logs and errors ---------------------------------------

SECRET = "tok-9f3e2a7c-never-log-me"
BODY = b"card=4111111111111111;cvv=123"


def assert_clean(texts: list[str]) -> None:
    for text in texts:
        assert SECRET not in text, f"the AUTH secret leaked: {text[:200]}"
        assert BODY.decode() not in text and "4111111111111111" not in text, f"a message body leaked: {text[:200]}"


async def test_secrets_and_bodies_never_reach_logs_or_errors(caplog):
    caplog.set_level(logging.DEBUG)
    messages: list[str] = []
    async with (
        AuthServer({SECRET: ("alice", [authorization("allowed.*")])}) as auth,
        NSQD(auth_http_addresses=[auth.address], max_msg_size=64) as nsqd,
    ):
        # Authenticated publishing, then a refused topic (fatal E_UNAUTHORIZED).
        producer = Producer([nsqd.tcp_address], auth_secret=SECRET, max_msg_size=1024, max_retries=0)
        await producer.start()
        await producer.publish("allowed_topic", BODY)
        for call in (
            producer.publish("forbidden_topic", BODY),
            producer.publish("allowed_topic", BODY * 10),  # over nsqd's 64 bytes: E_BAD_MESSAGE
        ):
            with pytest.raises(NSQError) as info:
                await call
            messages.append(str(info.value))
            messages.append(repr(info.value))
        with pytest.raises(InvalidValueError) as info:
            await producer.publish("allowed_topic", BODY * 100)  # over the client's max_msg_size
        messages.append(str(info.value))
        await producer.close()
        # A wrong secret.
        with pytest.raises(NSQError) as info:
            await Connection(nsqd.tcp_address, ConnectionOptions(auth_secret=SECRET + "x")).connect()
        messages.append(str(info.value))
        messages.append(repr(ConnectionOptions(auth_secret=SECRET)))
        # A handler that fails on the body.
        failures: list[str] = []

        def handler(message):
            failures.append(repr(message))
            raise RuntimeError("could not process")

        consumer = Consumer("allowed_topic", "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handler,
                            auth_secret=SECRET, max_attempts=1, default_requeue_delay=0, max_backoff_duration=0)
        await consumer.start()
        await eventually(lambda: consumer.stats_given_up == 1, what="the give-up path")
        await consumer.stop()
        messages += failures
    texts = messages + [record.getMessage() for record in caplog.records]
    texts += [str(record.exc_info[1]) for record in caplog.records if record.exc_info]
    assert len(caplog.records) > 3  # there was plenty to log
    assert_clean(texts)


# ---- a clear error, then a reconnect ----------------------------------------------------------------


class TwoFacedServer:
    """The first connection gets ``hostile`` after IDENTIFY (and SUB, for a consumer); later ones
    get a proper nsqd's answers: OK to SUB and PUB, one message after the first RDY."""

    def __init__(self, hostile: bytes, *, consumer: bool) -> None:
        self.hostile = hostile
        self.consumer = consumer
        self.accepted = 0
        self.published: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        first = self.accepted == 1
        delivered = False
        try:
            await reader.readexactly(4 + len(b"IDENTIFY\n"))
            await reader.readexactly(int.from_bytes(await reader.readexactly(4), "big"))
            writer.write(IDENTIFY_ANSWER)
            if first and not self.consumer:
                await asyncio.sleep(0.3)  # the producer has started; nothing is waiting for an answer
                writer.write(self.hostile)
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"SUB "):
                    writer.write(SUB_OK + (self.hostile if first else b""))
                elif line.startswith(b"RDY ") and not first and not delivered:
                    delivered = True
                    writer.write(codec.encode_message(1, 1, b"0123456789abcdef", b"after the reconnect"))
                elif line.startswith(b"PUB "):
                    self.published.append(await reader.readexactly(int.from_bytes(await reader.readexactly(4), "big")))
                    writer.write(SUB_OK)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


# (An id that is not hex is no error: ids are opaque, echoed back in FIN; fuzz_hostile.py sends them.)
HOSTILE_STREAMS = {
    "huge_size": struct.pack(">ii", 0x7FFFFFF0, 2),
    "negative_size": struct.pack(">ii", -8, 2),
    "unknown_frame_type": struct.pack(">ii", 6, 9) + b"??",
    "unsolicited_response": codec.encode_response(b"OK") * 3,
    "message_shorter_than_its_header": struct.pack(">ii", 10, codec.FRAME_MESSAGE) + b"\0" * 6,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_STREAMS))
async def test_a_consumer_reconnects_after_a_hostile_stream(kind, caplog):
    got: list[bytes] = []
    server = TwoFacedServer(HOSTILE_STREAMS[kind], consumer=True)
    async with server as address:
        consumer = Consumer("t", "c", nsqd_tcp_addresses=[address], handler=lambda m: got.append(m.body),
                            reconnect_delay=0.05, max_in_flight=5)
        await consumer.start()
        await eventually(lambda: got == [b"after the reconnect"], timeout=10, what="the message after the reconnect")
        await consumer.stop()
    assert server.accepted >= 2
    closing = [r.getMessage() for r in caplog.records if "closing connection" in r.getMessage()
               or "closed" in r.getMessage()]
    assert closing, "the hostile stream closed the first connection without a word"


@pytest.mark.parametrize("kind", ["unsolicited_response", "huge_size", "unknown_frame_type"])
async def test_a_producer_reconnects_after_a_hostile_stream(kind):
    server = TwoFacedServer(HOSTILE_STREAMS[kind], consumer=False)
    async with server as address, Producer([address], reconnect_delay=0.05, max_retries=3) as producer:
        await eventually(lambda: server.accepted >= 2 and producer.connections, timeout=10,
                         what="the producer to reconnect")
        await producer.publish("t", b"published after the reconnect")
    assert server.published == [b"published after the reconnect"]
