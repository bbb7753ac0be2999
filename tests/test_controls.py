"""The controls go-nsq users rely on: lookupd Authorization from the consumer, a discovery filter,
nsqd and lookupd added and removed at run time, read/write timeouts, local_addr, the lookupd poll
timeout, options from strings, a logger per instance.

On the embedded servers, or the real ones through FASTNSQ_TEST_*: the lookupd whose requests are
recorded is the suite's own behind a recording HTTP proxy, so a real nsqlookupd answers there too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp
import pytest
from aiohttp import web

from fastnsq import Consumer, Producer
from fastnsq.config import ConnectionOptions
from fastnsq.conn import Connection
from fastnsq.errors import ConnectionClosedError, InvalidValueError
from fastnsq.options import parse_options
from fastnsq.testing.proxy import FaultProxy

from .helpers import Slack, eventually, unique
from .test_consumer import publish_spread

if TYPE_CHECKING:
    from typing_extensions import Self


class RecordingLookupd:
    """An HTTP proxy in front of a lookupd that records each request's path and headers."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None
        self.address = ""

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.headers)))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("accept", "authorization")}
        async with aiohttp.ClientSession() as session, session.get(
            f"http://{self.upstream}{request.path_qs}", headers=headers
        ) as answer:
            body = await answer.read()
            keep = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "x-nsq-content-type")}
            return web.Response(status=answer.status, body=body, headers=keep)


async def test_lookupd_requests_carry_the_auth_secret_from_consumer_and_producer(nsq_cluster) -> None:
    topic = unique("auth")
    await publish_spread(nsq_cluster.tcp_addresses[:1], topic, 3)
    async with RecordingLookupd(nsq_cluster.lookupd_http_addresses[0]) as lookupd:
        got: list[bytes] = []
        # auth_secret is also sent to nsqd in AUTH only when nsqd asks for it (auth_required): these don't.
        consumer = Consumer(topic, "ch", lookupd_http_addresses=[lookupd.address], handler=lambda m: got.append(m.body),
                            auth_secret="s3cret", max_in_flight=10)
        await consumer.start()
        try:
            await eventually(lambda: len(got) == 3, timeout=20, what="3 messages through lookupd discovery")
        finally:
            await consumer.stop()
        async with Producer(lookupd_http_addresses=[lookupd.address], auth_secret="s3cret") as producer:
            await producer.publish(topic, b"more")
    paths = [path for path, _ in lookupd.requests]
    assert "/lookup" in paths and "/nodes" in paths  # the consumer's lookup, the producer's discovery
    for path, headers in lookupd.requests:
        assert headers.get("Authorization") == "Bearer s3cret", (path, headers)


async def test_discovery_filter_chooses_among_the_nsqd_lookupd_lists(nsq_cluster) -> None:
    topic = unique("filter")
    addresses = nsq_cluster.tcp_addresses
    await publish_spread(addresses, topic, 30)
    chosen = addresses[1]
    offered: list[list[str]] = []

    def only_one(found: list[str]) -> list[str]:
        offered.append(found)
        return [chosen]

    got: list[bytes] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
                        handler=lambda m: got.append(m.body), discovery_filter=only_one, max_in_flight=30)
    await consumer.start()
    try:
        await eventually(lambda: len(got) == 10, timeout=20, what="the chosen nsqd's 10 messages")
        await asyncio.sleep(0.3)
        assert len(got) == 10 and {c.address for c in consumer.connections} == {chosen}
        assert sorted(offered[0]) == sorted(addresses)
    finally:
        await consumer.stop()


async def test_nsqd_added_and_removed_at_run_time_with_rdy_within_max_in_flight(nsq_cluster) -> None:
    first, second = nsq_cluster.tcp_addresses[:2]
    topic = unique("runtime")
    got: list[bytes] = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[first], handler=lambda m: got.append(m.body),
                        max_in_flight=10)
    await consumer.start()
    try:
        assert [c.rdy for c in consumer.snapshot().connections] == [10]
        await consumer.connect_to_nsqd(second)
        rdy = {c.address: c.rdy for c in consumer.snapshot().connections}
        assert set(rdy) == {first, second} and sum(rdy.values()) <= 10
        await eventually(lambda: sorted(c.rdy for c in consumer.snapshot().connections) == [5, 5],
                         what="max_in_flight split over both")
        await publish_spread([first, second], topic, 40)
        await eventually(lambda: len(got) == 40, timeout=20, what="messages from both nsqd")
        with pytest.raises(InvalidValueError, match="already consuming"):
            await consumer.connect_to_nsqd(second)
        await consumer.disconnect_from_nsqd(first)
        assert [(c.address, c.rdy) for c in consumer.snapshot().connections] == [(second, 10)]
        await publish_spread([first, second], topic, 10)
        await eventually(lambda: len(got) == 45, timeout=20, what="the second nsqd's 5 more")
        await asyncio.sleep(0.5)
        assert len(got) == 45 and consumer.snapshot().reconnects == 0  # the first one stays away
        with pytest.raises(InvalidValueError, match="not consuming from nsqd"):
            await consumer.disconnect_from_nsqd(first)
    finally:
        await consumer.stop()


async def test_producer_nsqd_added_and_removed_at_run_time(nsq_cluster) -> None:
    first, second = nsq_cluster.tcp_addresses[:2]
    async with Producer([first]) as producer:
        await producer.connect_to_nsqd(second)
        assert {c.address for c in producer.connections} == {first, second}
        await producer.disconnect_from_nsqd(first)
        assert {c.address for c in producer.connections} == {second}
        await producer.publish(unique("runtime"), b"x")
        assert producer.snapshot().reconnects == 0


async def test_lookupd_added_and_removed_at_run_time(nsq_cluster) -> None:
    topic = unique("lookupds")
    await publish_spread(nsq_cluster.tcp_addresses, topic, 6)
    got: list[bytes] = []
    direct = nsq_cluster.tcp_addresses[0]
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[direct], handler=lambda m: got.append(m.body), max_in_flight=10)
    await consumer.start()
    try:
        await eventually(lambda: len(got) == 2, what="the direct nsqd's messages")
        await consumer.connect_to_lookupd(nsq_cluster.lookupd_http_addresses[0])  # starts discovery
        await eventually(lambda: len(got) == 6, timeout=20, what="the other nsqd through the new lookupd")
        with pytest.raises(InvalidValueError, match="only nsqlookupd"):
            consumer.disconnect_from_lookupd(nsq_cluster.lookupd_http_addresses[0])
        with pytest.raises(InvalidValueError, match="not using nsqlookupd"):
            consumer.disconnect_from_lookupd("127.0.0.1:1")
    finally:
        await consumer.stop()


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """A TCP server that accepts and never answers (a hung lookupd, a dead nsqd)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_lookupd_poll_timeout_bounds_a_hung_lookupd(nsq_cluster, silent_server) -> None:
    topic = unique("polltimeout")
    await publish_spread(nsq_cluster.tcp_addresses, topic, 3)
    got: list[bytes] = []
    loop = asyncio.get_running_loop()
    consumer = Consumer(topic, "ch", lookupd_http_addresses=[silent_server, *nsq_cluster.lookupd_http_addresses],
                        handler=lambda m: got.append(m.body), lookupd_poll_timeout=0.5, max_in_flight=10)
    async with Slack() as slack:
        started = loop.time()
        await consumer.start()
        took = loop.time() - started
    try:
        # The hung lookupd cost one poll timeout (0.5 s), not go's minute: plus the connections'
        # own time and the slack measured meanwhile.
        assert took < 0.5 + slack.allowance(1.0), (took, slack)
        await eventually(lambda: len(got) == 3, timeout=20, what="messages found through the answering lookupd")
    finally:
        await consumer.stop()


async def test_read_timeout_closes_a_silent_connection(nsqd) -> None:
    async with FaultProxy(nsqd.tcp_address) as proxy:
        conn = Connection(proxy.address, ConnectionOptions(heartbeat_interval=1.0, read_timeout=2.1))
        await conn.connect()
        loop = asyncio.get_running_loop()
        async with Slack() as slack:
            started = loop.time()
            proxy.pause("down")  # nsqd's heartbeats stop reaching us
            await asyncio.wait_for(conn.wait_closed(), 10)
            took = loop.time() - started
        # read_timeout, plus the slack: at the bound, not at the next check of a silence watch
        # that looked every heartbeat interval (3.0 s here; issue 57).
        assert 2.0 < took < 2.1 + slack.allowance(0.15), (took, slack)
        assert "read_timeout" in str(conn.close_error)


async def test_write_timeout_closes_a_connection_nsqd_stopped_reading(nsqd) -> None:
    async with FaultProxy(nsqd.tcp_address) as proxy:
        conn = Connection(proxy.address, ConnectionOptions(write_timeout=0.5))
        await conn.connect()
        proxy.pause("up")  # nothing we write is read any more
        body = b"x" * (1024 * 1024 - 1)
        futures = []
        with pytest.raises(ConnectionClosedError):
            for _ in range(2000):  # until the kernel's buffers are full and writing pauses
                futures.append(conn.publish("writes", body))
                conn.flush()
                await asyncio.sleep(0.01)
        assert "write_timeout" in str(conn.close_error)
        await asyncio.gather(*futures, return_exceptions=True)


async def test_local_addr_is_where_connections_come_from(nsqd) -> None:
    with socket.socket() as probe:  # a free local port to bind to
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = Connection(nsqd.tcp_address, ConnectionOptions(local_addr=f"127.0.0.1:{port}"))
    await conn.connect()
    try:
        assert conn._transport is not None
        assert conn._transport.get_extra_info("sockname")[:2] == ("127.0.0.1", port)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"read_timeout": 4.0}, "read_timeout=4.0 must be above heartbeat_interval=5.0"),
        ({"read_timeout": 0}, "read_timeout=0 is outside"),
        ({"write_timeout": -1}, "write_timeout=-1 is outside"),
        ({"local_addr": "127.0.0.1:99999"}, "invalid port"),
    ],
)
def test_bad_timeouts_and_addresses_are_named(options: dict, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        ConnectionOptions(**options)


def test_options_from_strings_build_a_consumer_and_a_producer() -> None:
    consumer_options = parse_options(
        ["max_in_flight=250", "lookupd_poll_interval=15s", "msg_timeout,2m", "snappy=true", "output_buffer_timeout=-1",
         "backoff_strategy=full_jitter", "read_timeout=90s", "local_addr=127.0.0.1"],
        for_="consumer",
    )
    assert consumer_options == {
        "max_in_flight": 250, "lookupd_poll_interval": 15.0, "msg_timeout": 120.0, "snappy": True,
        "output_buffer_timeout": -1.0, "backoff_strategy": "full_jitter", "read_timeout": 90.0,
        "local_addr": "127.0.0.1",
    }
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], **consumer_options)
    assert consumer.max_in_flight == 250 and consumer.options.msg_timeout == 120.0
    producer = Producer(["127.0.0.1:4150"], **parse_options({"pool_size": "2", "coalesce": "no"}, for_="producer"))
    assert producer.pool_size == 2 and producer.coalesce is False


@pytest.mark.parametrize(
    ("pairs", "for_", "message"),
    [
        (["max_in_flight=lots"], "consumer", "max_in_flight='lots': takes a whole number"),
        (["msg_timeout=soon"], "consumer", "msg_timeout='soon': 'soon' is not a duration"),
        (["snappy=maybe"], "consumer", "snappy='maybe': use true or false"),
        (["max_in_flight=1"], "producer", "unknown Producer option max_in_flight: a Consumer option, not a Producer one"),
        (["logger=root"], "consumer", "'logger' takes a Python object"),
        (["max_in_flight"], "consumer", "'name=value'"),
    ],
)
def test_bad_option_strings_are_named(pairs: list[str], for_: str, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        parse_options(pairs, for_=for_)  # type: ignore[arg-type]


async def test_a_logger_per_instance(caplog: pytest.LogCaptureFixture) -> None:
    mine = logging.LoggerAdapter(logging.getLogger("app.ingest"), {"component": "ingest"})
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:1"], handler=lambda m: None, logger=mine,
                        reconnect_delay=60)
    with caplog.at_level(logging.WARNING):
        await consumer.start()  # nothing listens there: the warning goes to the instance's logger
        await consumer.stop()
    records = [r for r in caplog.records if "cannot consume from 127.0.0.1:1" in r.getMessage()]
    assert records and {r.name for r in records} == {"app.ingest"}
    assert all(getattr(r, "component", None) == "ingest" for r in records)
    with pytest.raises(InvalidValueError, match="logger must be a logging.Logger"):
        Producer(["127.0.0.1:4150"], logger="app")
