"""One connection against nsqd: handshake, upgrades, AUTH, heartbeats, errors, pipelining.

Every test talks TCP to a server speaking the real protocol: the embedded nsqd, or a
real nsqd 1.3 named by FASTNSQ_TEST_NSQD. Tests that must configure the server
(TLS certificates, an auth endpoint, limits) say so and skip against a real one.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fastnsq import codec
from fastnsq.config import ConnectionOptions
from fastnsq.conn import Connection
from fastnsq.errors import (
    BadMessageError,
    ConnectionClosedError,
    FinFailedError,
    InvalidValueError,
    NSQError,
    ServerError,
)
from fastnsq.testing import NSQD, AuthServer
from fastnsq.testing.auth import authorization

from .helpers import eventually, is_tls_failure, tls_files, unique

SECRET = "s3cret-token"


async def round_trip(address: str, options: ConnectionOptions, topic: str) -> tuple[dict, list[bytes]]:
    """Publish two messages on one connection and consume them on another, same options."""
    producer = Connection(address, options)
    info = await producer.connect()
    assert await producer.publish(topic, b"first") == b"OK"
    assert await producer.mpublish(topic, [b"second", b"third" * 1000]) == b"OK"
    await producer.close()

    received: list = []
    consumer = Connection(address, options, on_message=received.append)
    consumer.reader.delegate = None
    await consumer.connect()
    await consumer.subscribe(topic, "ch")
    consumer.rdy(10)
    await eventually(lambda: len(received) == 3, what="three messages")
    for message in received:
        consumer.fin(message)
    await consumer.cls()
    await consumer.close()
    return info, [m.body for m in received]


UPGRADES = {
    "plain": {},
    "tls": {"tls_v1": True},
    "tls+snappy": {"tls_v1": True, "snappy": True},
    "tls+deflate": {"tls_v1": True, "deflate": True, "deflate_level": 3},
    "snappy": {"snappy": True},
    "deflate": {"deflate": True},
}


@pytest.fixture
async def secured_nsqd():
    """An nsqd with a TLS certificate and an auth endpoint (embedded: real ones can't be configured here)."""
    files = tls_files()
    async with (
        AuthServer({SECRET: ("tester", [authorization()])}) as auth,
        NSQD(tls_cert=files.server_cert, tls_key=files.server_key, auth_http_addresses=[auth.address]) as nsqd,
    ):
        yield nsqd


@pytest.fixture
async def tls_nsqd():
    files = tls_files()
    async with NSQD(tls_cert=files.server_cert, tls_key=files.server_key) as nsqd:
        yield nsqd


@pytest.mark.parametrize("upgrade", list(UPGRADES))
@pytest.mark.parametrize("auth", [False, True], ids=["noauth", "auth"])
async def test_every_upgrade_combination(upgrade, auth, tls_nsqd, secured_nsqd):
    server = secured_nsqd if auth else tls_nsqd
    options = ConnectionOptions(
        tls_root_ca_file=tls_files().ca,
        auth_secret=SECRET if auth else None,
        **UPGRADES[upgrade],
    )
    info, bodies = await round_trip(server.tcp_address, options, unique("upg"))
    assert bodies == [b"first", b"second", b"third" * 1000]
    assert info["tls_v1"] is ("tls" in upgrade)
    assert info["snappy"] is ("snappy" in upgrade)
    assert info["deflate"] is ("deflate" in upgrade)
    assert info["auth_required"] is auth


async def test_auth_required_without_secret_is_a_clear_error(secured_nsqd):
    conn = Connection(secured_nsqd.tcp_address, ConnectionOptions())
    with pytest.raises(NSQError, match="requires AUTH and no auth_secret is configured"):
        await conn.connect()
    assert conn.state == "closed"


async def test_wrong_auth_secret_fails_with_the_server_code(secured_nsqd):
    conn = Connection(secured_nsqd.tcp_address, ConnectionOptions(auth_secret="wrong"))
    with pytest.raises(ServerError) as info:
        await conn.connect()
    assert info.value.code == "E_AUTH_FAILED" and info.value.fatal


async def test_client_certificates():
    files = tls_files()
    async with NSQD(
        tls_cert=files.server_cert,
        tls_key=files.server_key,
        tls_client_auth_policy="require-verify",
        tls_root_ca_file=files.ca,
    ) as nsqd:
        with_cert = ConnectionOptions(
            tls_v1=True, tls_root_ca_file=files.ca, tls_cert=files.client_cert, tls_key=files.client_key
        )
        _, bodies = await round_trip(nsqd.tcp_address, with_cert, unique("cert"))
        assert bodies[0] == b"first"
        without = Connection(nsqd.tcp_address, ConnectionOptions(tls_v1=True, tls_root_ca_file=files.ca))
        with pytest.raises((OSError, NSQError, asyncio.TimeoutError)):
            await without.connect()
            await without.publish(unique("cert"), b"x")


async def test_tls_verifies_the_certificate_by_default(tls_nsqd):
    files = tls_files()
    unknown_ca = Connection(tls_nsqd.tcp_address, ConnectionOptions(tls_v1=True, tls_root_ca_file=files.other_ca))
    with pytest.raises(Exception) as info:
        await unknown_ca.connect()
    assert is_tls_failure(info.value)
    wrong_name = Connection(
        tls_nsqd.tcp_address, ConnectionOptions(tls_v1=True, tls_root_ca_file=files.ca, tls_server_hostname="nsqd.example")
    )
    with pytest.raises(Exception) as info:
        await wrong_name.connect()
    assert is_tls_failure(info.value)
    # Turning verification off has to be explicit, and then it connects.
    insecure = Connection(tls_nsqd.tcp_address, ConnectionOptions(tls_v1=True, tls_insecure_skip_verify=True))
    await insecure.connect()
    assert insecure.identify_response["tls_v1"] is True
    await insecure.close()


def test_tls_context_minimum_is_tls_1_2():
    import ssl

    assert ConnectionOptions(tls_v1=True).ssl_context().minimum_version >= ssl.TLSVersion.TLSv1_2
    with pytest.raises(InvalidValueError, match="tls_min_version"):
        ConnectionOptions(tls_min_version="1.0")


async def test_heartbeats_keep_the_connection_alive(nsqd):
    conn = Connection(nsqd.tcp_address, ConnectionOptions(heartbeat_interval=1.0))
    await conn.connect()
    await asyncio.sleep(5.2)  # nsqd closes a client silent for two intervals; NOPs answer for us
    assert conn.is_open
    assert await conn.publish(unique("hb"), b"still here") == b"OK"
    await conn.close()


async def test_a_silent_server_is_declared_dead():
    """A listener that accepts and then says nothing, not even heartbeats."""
    handshake = asyncio.Event()

    async def silent(reader, writer):
        await reader.read(100)
        writer.write(codec.encode_response(json.dumps({"max_rdy_count": 2500, "version": "1.3.0"}).encode()))
        handshake.set()
        await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = Connection(f"127.0.0.1:{port}", ConnectionOptions(heartbeat_interval=1.0))
    await conn.connect()
    await eventually(lambda: conn.state == "closed", timeout=4, what="the dead connection to be closed")
    assert "two heartbeat intervals" in str(conn.close_error)
    server.close()


async def test_fatal_error_fails_pending_publishes_with_the_server_code(nsqd):
    """nsqd refuses an oversized message fatally; what was behind it fails with the cause attached."""
    big = b"x" * (codec.DEFAULT_MAX_MSG_SIZE + 1)
    conn = Connection(nsqd.tcp_address, ConnectionOptions(max_msg_size=2 * codec.DEFAULT_MAX_MSG_SIZE))
    await conn.connect()
    topic = unique("fatal")
    futures = [conn.publish(topic, b"a"), conn.publish(topic, b"b"), conn.publish(topic, big)]
    futures += [conn.publish(topic, b"c"), conn.publish(topic, b"d")]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[:2] == [b"OK", b"OK"]
    assert isinstance(results[2], BadMessageError)
    assert results[2].code == "E_BAD_MESSAGE" and results[2].fatal
    for later in results[3:]:
        assert isinstance(later, ConnectionClosedError)
        assert later.__cause__ is results[2] and "E_BAD_MESSAGE" in str(later)
    await eventually(lambda: conn.state == "closed", what="the connection to close")
    with pytest.raises(ConnectionClosedError, match="closed"):
        conn.publish(topic, b"e")


async def test_non_fatal_errors_keep_the_connection(nsqd):
    errors: list[ServerError] = []
    received: list = []
    conn = Connection(nsqd.tcp_address, ConnectionOptions(), on_message=received.append,
                      on_error=lambda c, e: errors.append(e))
    await conn.connect()
    topic = unique("nonfatal")
    await conn.subscribe(topic, "ch")
    conn.fin(b"0" * 16)  # not in flight: E_FIN_FAILED, non-fatal
    conn.req(b"1" * 16, 0)  # E_REQ_FAILED
    conn.touch(b"2" * 16)  # E_TOUCH_FAILED
    await eventually(lambda: len(errors) == 3, what="three non-fatal errors")
    assert type(errors[0]) is FinFailedError
    assert [e.code for e in errors] == ["E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"]
    assert not any(e.fatal for e in errors)
    assert conn.is_open
    publisher = Connection(nsqd.tcp_address)
    await publisher.connect()
    await publisher.publish(topic, b"after the errors")
    conn.rdy(1)
    await eventually(lambda: received, what="a message after the errors")
    assert received[0].body == b"after the errors"
    conn.fin(received[0])
    await asyncio.gather(publisher.close(), conn.close())


async def test_ten_thousand_publishes_in_flight_resolve_in_order(nsqd):
    conn = Connection(nsqd.tcp_address)
    await conn.connect()
    topic = unique("order")
    completed: list[int] = []
    futures = []
    for i in range(10_000):
        future = conn.publish(topic, b"%d" % i)
        future.add_done_callback(lambda f, i=i: completed.append(i))
        futures.append(future)
    assert conn.pending == 10_000
    assert await asyncio.gather(*futures) == [b"OK"] * 10_000
    assert completed == list(range(10_000))
    await conn.close()


async def test_commands_of_one_loop_pass_go_out_in_one_write(nsqd):
    conn = Connection(nsqd.tcp_address)
    await conn.connect()
    writes: list[int] = []
    transport = conn._transport
    original = transport.write
    transport.write = lambda data: (writes.append(len(data)), original(data))[1]
    topic = unique("coalesce")
    futures = [conn.publish(topic, b"m%d" % i) for i in range(100)]
    await asyncio.gather(*futures)
    assert len(writes) == 1 and writes[0] == sum(len(f"PUB {topic}\n") + 4 + len(b"m%d" % i) for i in range(100))
    await conn.close()


class RecordingAnswer:
    """A command's answer that is not a future (conn.Answer): records what it got, and whether the
    connection was still inside the read of nsqd's answer then (no loop pass in between)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.outcomes: list[object] = []
        self.in_read: list[bool] = []

    def done(self) -> bool:
        return bool(self.outcomes)

    def set_result(self, result: object) -> None:
        self.outcomes.append(result)
        self.in_read.append(self.conn._in_read)

    def set_exception(self, exception: BaseException) -> None:
        self.set_result(exception)


async def test_an_answer_object_is_answered_in_the_read(nsqd):
    conn = Connection(nsqd.tcp_address)
    await conn.connect()
    topic = unique("answer")
    one, many = RecordingAnswer(conn), RecordingAnswer(conn)
    assert conn.publish(topic, b"one", answer=one) is one
    assert conn.mpublish(topic, [b"a", b"b"], answer=many) is many
    await eventually(lambda: one.done() and many.done(), what="both answers")
    assert one.outcomes == [b"OK"] and many.outcomes == [b"OK"]
    assert one.in_read == [True] and many.in_read == [True]
    lost = RecordingAnswer(conn)
    conn.publish(topic, b"never answered", answer=lost)
    conn.abort()  # before the write: the answer gets the connection's error
    assert len(lost.outcomes) == 1 and isinstance(lost.outcomes[0], ConnectionClosedError)


async def test_held_writes_go_out_in_one_write_at_the_release(nsqd):
    conn = Connection(nsqd.tcp_address)
    await conn.connect()
    writes: list[int] = []
    transport = conn._transport
    original = transport.write
    transport.write = lambda data: (writes.append(len(data)), original(data))[1]
    topic = unique("held")
    assert conn.hold_writes()
    futures = [conn.publish(topic, b"m%d" % i) for i in range(3)]
    assert writes == []
    conn.release_writes()
    assert len(writes) == 1  # at the release itself, not a loop pass later
    assert await asyncio.gather(*futures) == [b"OK"] * 3
    assert len(writes) == 1  # and no second, empty one
    await conn.close()


async def test_cls_answers_close_wait_and_keeps_fin_legal(nsqd):
    received: list = []
    conn = Connection(nsqd.tcp_address, on_message=received.append)
    await conn.connect()
    topic = unique("cls")
    publisher = Connection(nsqd.tcp_address)
    await publisher.connect()
    await publisher.publish(topic, b"m")
    await conn.subscribe(topic, "ch")
    conn.rdy(1)
    await eventually(lambda: received, what="a message")
    await conn.cls()
    assert conn.state == "closing" and conn.is_open
    conn.fin(received[0])  # still legal after CLS
    await asyncio.sleep(0.1)
    assert conn.is_open
    await asyncio.gather(conn.close(), publisher.close())


async def test_unreachable_address_raises_connection_error():
    conn = Connection("127.0.0.1:1", ConnectionOptions(dial_timeout=1.0))
    with pytest.raises(OSError):
        await conn.connect()


async def test_http_port_is_recognised(nsqd):
    conn = Connection(nsqd.http_address)
    with pytest.raises(Exception) as info:
        await conn.connect()
    assert "is this nsqd's HTTP port?" in str(info.value)


def test_bad_options_name_the_option():
    for kwargs, words in [
        ({"heartbeat_interval": 0.5}, "heartbeat_interval=0.5"),
        ({"sample_rate": 100}, "sample_rate=100"),
        ({"deflate_level": 0}, "deflate_level=0"),
        ({"msg_timeout": 0.1}, "msg_timeout"),
        ({"snappy": True, "deflate": True}, "snappy and deflate"),
        ({"output_buffer_size": 10}, "output_buffer_size"),
        ({"tls_cert": "a.pem"}, "tls_cert and tls_key"),
    ]:
        with pytest.raises(InvalidValueError, match=words):
            ConnectionOptions(**kwargs)


async def test_failed_tls_handshake_leaves_no_unretrieved_future(tls_nsqd):
    """A refused certificate raises from connect() and nothing else: no stray
    'Future exception was never retrieved' from the pending upgrade answer."""
    import gc

    loop = asyncio.get_running_loop()
    reported: list = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        conn = Connection(tls_nsqd.tcp_address, ConnectionOptions(tls_v1=True, tls_root_ca_file=tls_files().other_ca))
        with pytest.raises(Exception) as info:
            await conn.connect()
        assert is_tls_failure(info.value)
        del conn, info
        gc.collect()
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported


async def test_a_connect_abandoned_with_its_loop_closes_its_socket_quietly() -> None:
    """A connect still waiting for nsqd's answer when its loop goes away (a producer's connect
    pending at the end of a test): the coroutine is closed with GeneratorExit. It must close
    its socket and end, not await again ("coroutine ... ignored GeneratorExit")."""
    answered: list[asyncio.StreamWriter] = []

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered.append(writer)

    before = asyncio.all_tasks()
    server = await asyncio.start_server(never_answers, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = Connection(f"127.0.0.1:{port}", ConnectionOptions())
    connecting = conn.connect()
    try:
        # Stepped by hand, as a task would step it, until it waits for the IDENTIFY answer.
        waiting_on = connecting.send(None)
        while (await asyncio.wait([waiting_on], timeout=0.3))[0]:
            waiting_on = connecting.send(None)
        assert answered and conn._transport is not None
        connecting.close()  # what the garbage collector does to a coroutine whose loop is gone
        assert conn._transport is None or conn._transport.is_closing()
    finally:
        leftovers = asyncio.all_tasks() - before
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)
        for writer in answered:
            writer.close()
        server.close()
        await server.wait_closed()
