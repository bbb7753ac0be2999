"""The embedded nsqd's fault injection does what it says, in both dialects.

``nsqd.faults`` (cut, stall, send_malformed, fail_next, clear) and
``nsqd.refuse_connections``, plus ``stop``/``start`` with and without the queued
messages, each checked from the client's side of a real TCP connection (a raw
client on the codec). Embedded servers only: a real nsqd cannot be told to misbehave.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fastnsq import codec
from fastnsq.errors import InvalidValueError, ProtocolError
from fastnsq.testing import NSQD
from fastnsq.testing._nsqd_faults import MALFORMED_FRAMES, default_fatality

from .test_embedded_ha import HAClient

pytestmark = pytest.mark.timeout(60)


def unique() -> str:
    return f"f{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["upstream", "ha"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[NSQD]:
    async with NSQD(ha=request.param == "ha", msg_timeout=1.0) as nsqd:
        yield nsqd


async def connect(nsqd: NSQD, **identify: Any) -> HAClient:
    client: HAClient = await HAClient.connect(nsqd.tcp_address)  # type: ignore[assignment]
    if identify:
        answer = await client.identify(**identify)
        assert isinstance(answer, dict) or answer == b"OK", answer
    return client


def make_topic(nsqd: NSQD) -> str:
    name = unique()
    if nsqd.ha:
        nsqd.create_topic(name, 1)
    return name


async def consumer_on(nsqd: NSQD, topic: str, rdy: int = 10, **identify: Any) -> HAClient:
    client = await connect(nsqd, heartbeat_interval=1000, **identify)
    client.out.sub(topic, "c", 0 if nsqd.ha else None)
    if nsqd.ha:
        client.reader.layout = codec.LAYOUT_HA_ID
    client.flush()
    await client.ok()
    client.rdy(rdy)
    return client


async def publish(nsqd: NSQD, topic: str, *bodies: bytes) -> None:
    client = await connect(nsqd)
    for body in bodies:
        client.out.pub(topic, body, 0 if nsqd.ha else None)
    client.flush()
    for _ in bodies:
        await client.ok()
    client.close()


# ---- cut ---------------------------------------------------------------------------------------------


async def test_cut_now_drops_every_connection_without_an_error_frame(server: NSQD) -> None:
    clients = [await connect(server) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert server.faults.cut() == 2
    for client in clients:
        await client.eof()  # no error frame before the EOF


async def test_cut_where_picks_the_connections(server: NSQD) -> None:
    topic = make_topic(server)
    consumer = await consumer_on(server, topic)
    producer = await connect(server)
    assert server.faults.cut(where=lambda c: c.channel is not None) == 1
    await consumer.eof()
    producer.out.pub(topic, b"still here", 0 if server.ha else None)
    producer.flush()
    await producer.ok()


@pytest.mark.parametrize("compression", [None, "deflate", "snappy"])
async def test_cut_after_frames_lets_exactly_that_many_frames_out(
    server: NSQD, compression: str | None
) -> None:
    topic = make_topic(server)
    identify = {"feature_negotiation": True, compression: True} if compression else {}
    consumer = await consumer_on(server, topic, **identify)
    server.faults.cut(after_frames=3, where=lambda c: c.channel is not None)
    await publish(server, topic, *(b"m%d" % i for i in range(6)))
    messages = await consumer.messages(3)
    assert [m.body for m in messages] == [b"m0", b"m1", b"m2"]
    await consumer.eof()


async def test_cut_new_connections(server: NSQD) -> None:
    topic = make_topic(server)
    server.faults.cut(after_frames=2, new_connections=1)
    first = await connect(server)
    await first.identify(feature_negotiation=True)  # frame 1
    first.out.pub(topic, b"x", 0 if server.ha else None)
    first.flush()
    await first.ok()  # frame 2
    await first.eof()
    second = await connect(server)
    for _ in range(3):
        second.out.pub(topic, b"y", 0 if server.ha else None)
    second.flush()
    for _ in range(3):
        await second.ok()


async def test_cut_new_connection_at_once(server: NSQD) -> None:
    server.faults.cut(new_connections=1)
    client = await connect(server)
    await client.eof()


# ---- stall ----------------------------------------------------------------------------------------------


async def test_write_stall_holds_every_frame_then_releases_them_in_order(server: NSQD) -> None:
    topic = make_topic(server)
    client: HAClient = await HAClient.connect(server.tcp_address, keep_heartbeats=True)  # type: ignore[assignment]
    await client.identify(heartbeat_interval=1000)
    server.faults.stall(1.6)
    started = time.monotonic()
    for i in range(3):
        client.out.pub(topic, b"s%d" % i, 0 if server.ha else None)
    client.flush()
    await client.nothing(1.2)  # no OK and no heartbeat while the server hangs
    events = [await client.event() for _ in range(4)]
    assert time.monotonic() - started >= 1.5
    assert [e[1] for e in events if e[0] == "response" and e[1] == b"OK"] == [b"OK"] * 3
    assert (b"_heartbeat_" in [e[1] for e in events]) or await client.response(1.5) == b"_heartbeat_"


async def test_read_stall_leaves_commands_unread_for_a_while(server: NSQD) -> None:
    topic = make_topic(server)
    client = await connect(server)
    server.faults.stall(0.5, "read")
    started = time.monotonic()
    client.out.pub(topic, b"late", 0 if server.ha else None)
    client.flush()
    await client.ok()
    assert time.monotonic() - started >= 0.45


async def test_stall_until_resume_and_new_connections_stall_too(server: NSQD) -> None:
    topic = make_topic(server)
    server.faults.stall(None, "both")
    client = await connect(server)  # opened during the stall
    client.out.pub(topic, b"held", 0 if server.ha else None)
    client.flush()
    await client.nothing(0.3)
    server.faults.resume()
    await client.ok()


async def test_a_stalled_server_does_not_time_its_clients_out(server: NSQD) -> None:
    client = await connect(server, heartbeat_interval=1000)
    server.faults.stall(3.5, "read")  # longer than the read deadline (2-3 heartbeats)
    await asyncio.sleep(3.6)
    client.send_raw(b"NOP\n")
    server.faults.resume()
    await client.nothing(0.3)  # still open: no EOF


# ---- malformed frames ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(MALFORMED_FRAMES))
async def test_send_malformed_breaks_the_frame_stream(server: NSQD, kind: str) -> None:
    host, port = server.tcp_address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(codec.MAGIC_V2)
    await asyncio.sleep(0.05)
    assert server.faults.send_malformed(kind) == 1
    data = await asyncio.wait_for(reader.read(65536), 3)
    frames = codec.FrameReader(lambda m: None, lambda r: None, lambda c, d: None)
    with pytest.raises(ProtocolError):
        frames.feed(data)
    # The server keeps the connection: closing it is the client's job.
    writer.write(b"NOP\n")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.2)
    writer.close()


async def test_send_malformed_rejects_an_unknown_kind(server: NSQD) -> None:
    with pytest.raises(InvalidValueError, match="kind must be one of"):
        server.faults.send_malformed("nonsense")


# ---- injected errors ---------------------------------------------------------------------------------


async def test_fail_next_answers_the_command_with_the_error(server: NSQD) -> None:
    topic = make_topic(server)
    consumer = await consumer_on(server, topic)
    server.faults.fail_next("PUB", "E_PUB_FAILED", "boom")
    producer = await connect(server)
    producer.out.pub(topic, b"refused", 0 if server.ha else None)
    producer.flush()
    assert await producer.error() == "E_PUB_FAILED boom"
    if server.ha:  # HA: E_PUB_FAILED is not fatal; upstream: it is
        producer.out.pub(topic, b"accepted", 0)
        producer.flush()
        await producer.ok()
        assert (await consumer.message()).body == b"accepted"
    else:
        await producer.eof()
    await consumer.nothing(0.2)  # the refused message was never published


async def test_fail_next_with_an_explicit_fatality_and_a_count(server: NSQD) -> None:
    topic = make_topic(server)
    server.faults.fail_next("PUB", "E_FAILED_ON_NOT_WRITABLE", count=2, fatal=False)
    producer = await connect(server)
    for _ in range(3):
        producer.out.pub(topic, b"x", 0 if server.ha else None)
    producer.flush()
    assert [await producer.error() for _ in range(2)] == ["E_FAILED_ON_NOT_WRITABLE "] * 2
    await producer.ok()
    server.faults.fail_next("NOP", "E_INVALID", "nope", fatal=True)
    producer.send_raw(b"NOP\n")
    await producer.fatal("E_INVALID nope")


async def test_fail_next_fin_leaves_the_message_in_flight(server: NSQD) -> None:
    topic = make_topic(server)
    consumer = await consumer_on(server, topic, rdy=1)
    await publish(server, topic, b"keep me")
    message = await consumer.message()
    server.faults.fail_next("FIN", "E_FIN_FAILED", "injected")
    consumer.fin(message.id)
    assert await consumer.error() == "E_FIN_FAILED injected"  # not fatal
    consumer.fin(message.id)  # still in flight: this FIN works
    await consumer.nothing(1.3)  # and it does not come back after msg_timeout


async def test_clear_disarms_everything(server: NSQD) -> None:
    topic = make_topic(server)
    client = await connect(server)
    server.faults.fail_next("PUB", "E_PUB_FAILED")
    server.faults.cut(after_frames=1)
    server.faults.cut(after_frames=1, new_connections=3)
    server.faults.stall(None)
    server.faults.clear()
    for _ in range(3):
        client.out.pub(topic, b"fine", 0 if server.ha else None)
    client.flush()
    for _ in range(3):
        await client.ok()
    other = await connect(server)
    other.send_raw(b"NOP\n")
    await other.nothing(0.2)


async def test_fault_arguments_are_checked(server: NSQD) -> None:
    with pytest.raises(InvalidValueError, match="after_frames"):
        server.faults.cut(after_frames=-1)
    with pytest.raises(InvalidValueError, match="direction"):
        server.faults.stall(1.0, "sideways")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="code"):
        server.faults.fail_next("PUB", "E_PUB FAILED")


# ---- refusing connections, restarts -------------------------------------------------------------------


async def test_refuse_connections_and_listen_again_on_the_same_port(server: NSQD) -> None:
    topic = make_topic(server)
    open_client = await connect(server)
    host, port = server.tcp_address.rsplit(":", 1)
    server.refuse_connections = True
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(host, int(port))
    open_client.out.pub(topic, b"open connections stay", 0 if server.ha else None)
    open_client.flush()
    await open_client.ok()
    server.refuse_connections = False
    assert server.tcp_address == f"{host}:{port}"
    again = await connect(server)
    again.out.pub(topic, b"back", 0 if server.ha else None)
    again.flush()
    await again.ok()


@pytest.mark.parametrize("keep", [True, False])
async def test_restart_keeps_or_drops_what_is_queued(server: NSQD, keep: bool) -> None:
    topic = make_topic(server)
    consumer = await consumer_on(server, topic, rdy=1)
    await publish(server, topic, b"queued-1", b"queued-2")
    await consumer.message()  # one in flight, one queued
    address = server.tcp_address
    await server.stop(keep_messages=keep)
    await consumer.eof()
    await server.start()
    assert server.tcp_address == address
    consumer = await consumer_on(server, topic, rdy=5)  # the topic (and its partition) survive
    if keep:
        bodies = sorted(m.body for m in await consumer.messages(2))
        assert bodies == [b"queued-1", b"queued-2"]
    else:
        await consumer.nothing(0.3)


async def test_ha_id_counters_survive_a_restart() -> None:
    async with NSQD(ha=True) as nsqd:
        nsqd.create_topic("counted", 1)
        consumer = await consumer_on(nsqd, "counted", rdy=5)
        await publish(nsqd, "counted", b"a")
        first = await consumer.message()
        await nsqd.stop()
        await nsqd.start()
        consumer = await consumer_on(nsqd, "counted", rdy=5)
        again = await consumer.message()  # redelivered after the restart
        assert again.id == first.id
        await publish(nsqd, "counted", b"b")
        later = await consumer.message()
        assert later.internal_id > first.internal_id


def test_frame_counting_is_on_plain_frames() -> None:
    """count_frames splits concatenated frames at frame boundaries (no sockets)."""
    from fastnsq.testing._nsqd_faults import Faults

    class Conn:
        frames_left: int | None = 2

    frames = codec.encode_response(b"OK") + codec.encode_error(b"E_X y") + codec.encode_response(b"OK")
    conn = Conn()
    data, cut = Faults.count_frames(conn, frames)  # type: ignore[arg-type]
    assert cut and data == frames[: len(codec.encode_response(b"OK")) + len(codec.encode_error(b"E_X y"))]
    conn.frames_left = 5
    data, cut = Faults.count_frames(conn, frames)  # type: ignore[arg-type]
    assert not cut and data == frames and conn.frames_left == 2
    assert struct.unpack_from(">i", MALFORMED_FRAMES["negative_size"])[0] < 0


@pytest.mark.parametrize(
    ("code", "command", "ha", "fatal"),
    [
        ("E_PUB_FAILED", b"PUB", False, True),
        ("E_PUB_FAILED", b"PUB", True, False),
        ("E_MPUB_FAILED", b"MPUB", True, False),
        ("E_FIN_FAILED", b"FIN", False, False),
        ("E_FAILED_ON_NOT_LEADER", b"PUB_TRACE", True, False),
        ("E_FAILED_ON_NOT_LEADER", b"SUB", True, True),
        ("E_FAILED_ON_NOT_WRITABLE", b"FIN", True, True),
        ("E_PUB_TOO_MUCH_WAITING", b"PUB", True, True),
        ("INVALID_TRACE_ID", b"PUB_EXT", True, False),
        ("E_TOPIC_NOT_EXIST", b"MPUB", True, True),
    ],
)
def test_injected_errors_close_the_connection_as_nsqd_would(
    code: str, command: bytes, ha: bool, fatal: bool
) -> None:
    assert default_fatality(code, command, ha) is fatal


async def test_an_injected_fatal_ha_publish_error_closes_the_connection() -> None:
    async with NSQD(ha=True) as nsqd:
        nsqd.create_topic("waiting", 1)
        nsqd.faults.fail_next("PUB", "E_PUB_TOO_MUCH_WAITING")
        client = await connect(nsqd)
        client.out.pub("waiting", b"x", 0)
        client.flush()
        await client.fatal("E_PUB_TOO_MUCH_WAITING ")
