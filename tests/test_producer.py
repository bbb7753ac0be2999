"""Producer against nsqd: publishing, coalescing, pools, failover, retries, the blocking facade."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from fastnsq import Producer, codec
from fastnsq.conn import Connection
from fastnsq.errors import (
    BadMessageError,
    ConnectionClosedError,
    InvalidValueError,
    NoConnectionError,
    NsqdDown,
    NSQError,
    PublishTimeoutError,
)
from fastnsq.producer.pool import FAIL_FAST_WAIT
from fastnsq.testing import NSQD

from .helpers import Slack, eventually, unique


async def drain(address: str, topic: str, expected: int | None = None, *, quiet: float = 0.3) -> list[bytes]:
    """Consume everything on ``topic`` (a fresh channel), finishing each message."""
    received: list = []
    conn = Connection(address, on_message=received.append)
    await conn.connect()
    await conn.subscribe(topic, "drain")
    conn.rdy(2500)
    loop = asyncio.get_running_loop()
    last, count = loop.time(), 0
    while True:
        await asyncio.sleep(0.05)
        for message in received[count:]:
            conn.fin(message)
        if len(received) != count:
            last, count = loop.time(), len(received)
        if expected is not None and count >= expected:
            break
        if expected is None and loop.time() - last > quiet:
            break
        if loop.time() - last > 10:
            break
    await conn.close()
    return [m.body for m in received]


async def test_publish_mpublish_and_the_answers(nsqd):
    topic = unique("pub")
    async with Producer([nsqd.tcp_address]) as producer:
        assert await producer.publish(topic, b"bytes") == b"OK"
        assert await producer.publish(topic, "str é") == b"OK"
        assert await producer.publish(topic, bytearray(b"bytearray")) == b"OK"
        assert await producer.publish(topic, memoryview(b"memoryview")) == b"OK"
        assert await producer.mpublish(topic, [b"m1", "m2", bytearray(b"m3")]) == b"OK"
    bodies = await drain(nsqd.tcp_address, topic, 7)
    assert sorted(bodies) == sorted([b"bytes", "str é".encode(), b"bytearray", b"memoryview", b"m1", b"m2", b"m3"])


@pytest.mark.parametrize("coalesce", [True, False])
async def test_node_stats_count_every_answered_command(nsqd, coalesce):
    """node_stats()'s ``answered`` counts the commands of every path (an MPUB once): the
    pipelined fast paths of a lone publish and a plain mpublish counted none, so a producer
    publishing from one task showed 1 answered (its first, validated by the slow path) for 21."""
    topic = unique("answered")
    async with Producer([nsqd.tcp_address], coalesce=coalesce) as producer:
        for index in range(20):
            await producer.publish(topic, b"one %d" % index)
        await producer.mpublish(topic, [b"a", b"b", b"c"])
        await asyncio.gather(*(producer.publish(topic, b"many %d" % index) for index in range(50)))
        answered = producer.node_stats()[nsqd.tcp_address].answered
        published = producer.snapshot().published
    assert published == 73
    # One per PUB or MPUB: the 50 concurrent ones coalesced into fewer MPUBs, or not coalesced.
    assert (21 + 1 <= answered < 21 + 50) if coalesce else answered == 21 + 50, answered


@pytest.mark.parametrize("coalesce", [True, False])
@pytest.mark.parametrize("command", ["publish", "mpublish"])
async def test_a_lone_publish_is_written_before_it_waits(nsqd, coalesce, command):
    """Nagle's rule, the producer's: a publish made while no other of the producer is unanswered has
    nothing to wait for, so it is written before the caller waits, not by a flush a loop pass later
    (one task publishing in a loop). Not the connection's: one with nothing unanswered may be about
    to get a thousand publishes from callers whose answers came in one read, and those share the
    pass's one write (shown here with one such caller, on the paths without the coalescer)."""
    topic = unique("lone")
    async with Producer([nsqd.tcp_address], coalesce=coalesce) as producer:
        await producer.publish(topic, b"first")  # the topic is checked and known
        (conn,) = producer.connections
        writes: list[int] = []
        transport = conn._transport
        original = transport.write
        transport.write = lambda data: (writes.append(len(data)), original(data))[1]
        scheduled: list[bool] = []
        schedule = conn._schedule_flush
        conn._schedule_flush = lambda: (scheduled.append(True), schedule())[1]
        send = producer.publish if command == "publish" else (lambda t, body: producer.mpublish(t, [body, body]))
        for round_no in range(3):
            lone = asyncio.ensure_future(send(topic, b"a"))
            await asyncio.sleep(0)  # its first step ran: a flush scheduled there has not
            assert len(writes) == round_no + 1
            assert scheduled == []  # nor was one: a moot flush still costs a loop pass and its poll
            assert await lone == b"OK"
        if command == "mpublish" or not coalesce:
            producer._active += 1  # a caller answered in the last read, not resumed yet
            behind = asyncio.ensure_future(send(topic, b"b"))
            await asyncio.sleep(0)
            assert len(writes) == 3 and conn.pending == 1 and scheduled  # the end of the pass writes it
            producer._active -= 1
            assert await behind == b"OK" and len(writes) == 4


async def test_a_plain_mpublish_takes_the_pipelined_path(nsqd, monkeypatch):
    """One MPUB of bytes under nsqd's limits goes straight to a connection, as a plain publish does:
    not through _call's routing coroutines (one task calling mpublish in a loop). Anything else
    (a batch to split, a str body, a timeout) still takes _call."""
    topic = unique("mpubfast")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"first")  # the topic is checked and known
        calls: list[str] = []
        routed = producer._call

        async def counted(*args, **kwargs):
            calls.append(args[0])
            return await routed(*args, **kwargs)

        monkeypatch.setattr(producer, "_call", counted)
        for _ in range(3):
            assert await producer.mpublish(topic, [b"a", b"b", b"c"]) == b"OK"
        assert calls == [] and producer.snapshot().published == 1 + 9
        assert await producer.mpublish(topic, [b"d", "e"]) == b"OK"  # a str body: the general path
        assert await producer.mpublish(topic, [b"f"], timeout=5) == b"OK"
        assert calls == [topic, topic] and producer.snapshot().published == 1 + 12
        with pytest.raises(InvalidValueError):
            await producer.mpublish(topic, [b"g", b""])  # an empty body is refused, as before
    assert sorted(await drain(nsqd.tcp_address, topic, 13)) == sorted(
        [b"first", *[b"a", b"b", b"c"] * 3, b"d", b"e", b"f"])


async def test_deferred_publish(nsqd):
    topic = unique("defer")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"later", defer=0.5)
        loop = asyncio.get_running_loop()
        start = loop.time()
        bodies = await drain(nsqd.tcp_address, topic, 1)
        assert bodies == [b"later"] and loop.time() - start >= 0.4


async def test_concurrent_publishes_are_coalesced_into_mpub(nsqd):
    topic = unique("coalesce")
    async with Producer([nsqd.tcp_address]) as producer:
        conn = producer.connections[0]
        sent_before = conn.bytes_sent
        results = await asyncio.gather(*(producer.publish(topic, b"%04d" % i) for i in range(1000)))
        assert results == [b"OK"] * 1000
        # The first PUB alone (nothing else was unanswered: it goes out at once), then the other 999
        # in MPUBs of at most 512: 1000 x (4-byte length + 4-byte body) + three headers, far less
        # than 1000 PUB lines.
        assert conn.bytes_sent - sent_before <= 1000 * 8 + 3 * (len("MPUB \n") + len(topic) + 8)
    assert sorted(await drain(nsqd.tcp_address, topic, 1000)) == [b"%04d" % i for i in range(1000)]


async def test_coalescing_off_pipelines_single_pubs(nsqd):
    topic = unique("pipeline")
    async with Producer([nsqd.tcp_address], coalesce=False) as producer:
        results = await asyncio.gather(*(producer.publish(topic, b"x") for i in range(500)))
        assert results == [b"OK"] * 500
    assert len(await drain(nsqd.tcp_address, topic, 500)) == 500


async def test_mpublish_is_chunked_under_max_body_size(nsqd):
    topic = unique("chunks")
    body = b"y" * 100_000
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [body] * 120)  # 12 MB: three MPUBs under nsqd's 5 MB
    bodies = await drain(nsqd.tcp_address, topic, 120)
    assert len(bodies) == 120 and set(bodies) == {body}


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda p: p.publish("bad topic", b"x"), "invalid topic name"),
        (lambda p: p.publish("t", b""), "empty message body"),
        (lambda p: p.publish("t", 42), "must be bytes"),
        (lambda p: p.publish("t", b"x" * 1048577), "exceeds max_msg_size"),
        (lambda p: p.mpublish("t", []), "at least one"),
        (lambda p: p.publish("t", b"x", defer=-1), "defer"),
    ],
)
async def test_bad_input_raises_before_sending(nsqd, call, words):
    async with Producer([nsqd.tcp_address]) as producer:
        conn = producer.connections[0]
        before = conn.bytes_sent
        with pytest.raises(InvalidValueError, match=words):
            await call(producer)
        await asyncio.sleep(0.01)
        assert conn.bytes_sent == before


def test_bad_options_name_the_option():
    with pytest.raises(InvalidValueError, match="pool_size"):
        Producer(["127.0.0.1:4150"], pool_size=0)
    with pytest.raises(InvalidValueError, match="unknown Producer option"):
        Producer(["127.0.0.1:4150"], max_in_flight=3)
    with pytest.raises(InvalidValueError, match="nsqd_tcp_addresses or lookupd"):
        Producer()
    with pytest.raises(InvalidValueError, match="invalid port"):
        Producer(["127.0.0.1:notaport"])


async def test_server_refusal_is_not_retried(nsqd):
    """E_BAD_MESSAGE cannot succeed on a retry: raised at once, and the pool recovers."""
    topic = unique("refused")
    async with Producer([nsqd.tcp_address], max_msg_size=2 * 1048576, max_retries=5) as producer:
        with pytest.raises(BadMessageError) as info:
            await producer.publish(topic, b"z" * 1048577)
        assert info.value.code == "E_BAD_MESSAGE"
        assert producer.snapshot().retried == 0
        await eventually(lambda: producer.connections, what="the pool to reconnect")
        assert await producer.publish(topic, b"fine") == b"OK"


async def test_no_server_at_start_is_a_clear_error_with_lazy_connect_false():
    with pytest.raises(NoConnectionError, match="no nsqd could be reached"):
        async with Producer(["127.0.0.1:1"], dial_timeout=0.5, lazy_connect=False):
            pass


async def test_a_waiting_publish_while_nsqd_is_down_names_it_and_why():
    """Started in the background with nsqd down, a publish that waits (fail_fast=False) and finds
    no connection within its timeout says which nsqd and what its connect attempts got."""
    producer = Producer(["127.0.0.1:1"], dial_timeout=0.5, fail_fast=False)
    await producer.start(background=True)
    try:
        attempt = producer.connecting()
        if attempt is not None:
            await asyncio.wait([attempt])  # the first attempt to connect has failed
        with pytest.raises(NoConnectionError, match=r"within the publish timeout: 127\.0\.0\.1:1 \(\[Errno"):
            await producer.publish("t", b"x", timeout=0.3)
    finally:
        await producer.close()


async def test_fail_fast_holds_when_connect_attempts_time_out():
    """fail_fast against an nsqd whose connects time out (a listener whose accept queue is full
    drops the SYNs, as a black-holed host does): each publish raises NsqdDown naming the
    timeout, within FAIL_FAST_WAIT of the attempt it hurried, not after the publish timeout (a
    failed attempt woke no waiting publish: each waited its whole publish_timeout; issue 57)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        host, port = listener.getsockname()
        address = f"{host}:{port}"
        with socket.create_connection(listener.getsockname()):  # fills the accept queue
            producer = Producer([address], dial_timeout=0.5, publish_timeout=30, fail_fast=True)
            await producer.start(background=True)
            try:
                with pytest.raises(NsqdDown, match="127.0.0.1"):  # the first attempt's outcome
                    await producer.publish("t", b"x")
                took = []
                async with Slack() as slack:
                    for _ in range(5):
                        began = time.monotonic()
                        with pytest.raises(NsqdDown):
                            await producer.publish("t", b"x")
                        took.append(time.monotonic() - began)
                assert max(took) < FAIL_FAST_WAIT + slack.allowance(0.05), (took, slack)
            finally:
                await producer.close()


async def test_publish_before_start_is_an_error():
    producer = Producer(["127.0.0.1:4150"])
    with pytest.raises(NSQError, match="start"):
        await producer.publish("t", b"x")


async def test_pool_round_robins_over_connections(nsqd):
    topic = unique("pool")
    async with Producer([nsqd.tcp_address], pool_size=3, coalesce=False) as producer:
        assert len(producer.connections) == 3
        await asyncio.gather(*(producer.publish(topic, b"p") for _ in range(30)))
        assert all(conn.bytes_sent > 60 for conn in producer.connections)


@pytest.mark.parametrize("coalesce", [True, False])
async def test_publish_timeout_when_nsqd_does_not_answer(coalesce):
    """A listener that completes the handshake and then never answers PUB (coalesce=False
    takes the pipelined fast path, whose timeout is the connection's expire_pending)."""

    async def mute(reader, writer):
        await reader.readexactly(4 + len(b"IDENTIFY\n"))
        size = int.from_bytes(await reader.readexactly(4), "big")
        await reader.readexactly(size)
        writer.write(codec.encode_response(b'{"max_rdy_count":2500,"version":"1.3.0"}'))
        await asyncio.sleep(10)  # reads nothing more, answers nothing

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with Producer([f"127.0.0.1:{port}"], publish_timeout=0.5, coalesce=coalesce) as producer:
        with pytest.raises(PublishTimeoutError):
            await producer.publish("t", b"x")
        with pytest.raises(PublishTimeoutError):
            await producer.publish("t", b"x", timeout=0.2)
        assert producer.snapshot().waiting == 0
    server.close()


async def test_two_nsqd_one_stopped_mid_run_loses_nothing_acknowledged():
    """Every publish is acknowledged or raised; every acknowledged one is consumed afterwards.

    nsqd B stops cleanly mid-run (keeping what it holds, as a real nsqd flushes to disk)
    and comes back on the same ports; acknowledged messages must all be in A or B.
    """
    async with NSQD() as a, NSQD() as b:
        topic = unique("failover")
        acked: list[bytes] = []
        failed: list[bytes] = []
        async with Producer([a.tcp_address, b.tcp_address], coalesce=False, reconnect_delay=0.05) as producer:

            async def one(i: int) -> None:
                body = b"msg-%06d" % i
                try:
                    await producer.publish(topic, body)
                    acked.append(body)
                except (ConnectionClosedError, NoConnectionError, PublishTimeoutError):
                    failed.append(body)

            first = [asyncio.create_task(one(i)) for i in range(2000)]
            await asyncio.sleep(0)
            await b.stop(keep_messages=True)
            rest = [asyncio.create_task(one(i)) for i in range(2000, 4000)]
            await asyncio.gather(*first, *rest)
            assert len(acked) + len(failed) == 4000
            assert len(acked) > 2000  # A kept taking publishes while B was down
        await b.start()
        consumed = set(await drain(a.tcp_address, topic)) | set(await drain(b.tcp_address, topic))
        # Acknowledged means stored: each one is in A or came back with B. (A publish that
        # raised may or may not have landed; the producer promised nothing for it.)
        assert set(acked) <= consumed, f"lost {len(set(acked) - consumed)} acknowledged messages"


async def test_sync_producer_from_many_threads(nsqd):
    from fastnsq.sync import Producer as SyncProducer

    topic = unique("sync")
    results: list = []

    def blocking_part() -> None:
        with SyncProducer([nsqd.tcp_address]) as producer:
            def worker(n: int) -> None:
                for i in range(50):
                    results.append(producer.publish(topic, b"%d-%d" % (n, i)))
            threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            results.append(producer.mpublish(topic, [b"a", b"b"]))
            with pytest.raises(InvalidValueError):
                producer.publish("bad topic", b"x")

    await asyncio.get_running_loop().run_in_executor(None, blocking_part)
    assert results == [b"OK"] * 401
    assert len(await drain(nsqd.tcp_address, topic, 402)) == 402


@pytest.mark.parametrize("kind", [bytes, bytearray])  # bytes: the one-pass check; bytearray: per item
def test_mpublish_chunks_at_the_exact_body_limit(kind):
    producer = Producer(["127.0.0.1:4150"], max_body_size=8 + 10 * (4 + 100), max_msg_size=100)
    fits = [kind(b"z" * 100)] * 10  # 4 + 4 + 10 * (4 + 100) bytes: exactly max_body_size
    assert [len(c) for c in producer._chunks(fits)] == [10]
    assert [len(c) for c in producer._chunks([*fits, kind(b"z")])] == [10, 1]
    with pytest.raises(InvalidValueError, match="exceeds max_msg_size 100"):
        producer._chunks([*fits[:3], kind(b"z" * 101)])
    with pytest.raises(InvalidValueError, match="empty message body"):
        producer._chunks([*fits[:3], kind(b"")])


async def test_a_lookupd_slower_than_the_publish_timeout_gives_a_publish_timeout():
    """The partitions are looked up within the publish's own deadline; running out of it
    there is a PublishTimeoutError like any other, not a bare asyncio timeout."""
    from aiohttp import web

    async def nodes(request: web.Request) -> web.Response:
        return web.json_response({"producers": []})

    async def lookup(request: web.Request) -> web.Response:
        await asyncio.sleep(30)  # a lookupd busy electing a partition's leader
        return web.json_response({"producers": []})

    app = web.Application()
    app.router.add_get("/nodes", nodes)
    app.router.add_get("/lookup", lookup)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with Producer(lookupd_http_addresses=[f"127.0.0.1:{port}"]) as producer:
            with pytest.raises(PublishTimeoutError):
                await producer.publish(unique("slow"), b"x", timeout=0.3)
            with pytest.raises(PublishTimeoutError):
                await producer.publish(unique("slow"), b"x", partition=0, timeout=0.3)
            assert producer.snapshot().failed == 2  # timeouts count as failed publishes too
    finally:
        await runner.cleanup()
