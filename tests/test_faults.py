"""Adversity: servers die, networks misbehave, handlers run late; nothing acknowledged is lost.

Each scenario keeps a ledger: publishes attempted, acknowledged and raised; messages
consumed (unique) and duplicated; and the recovery time (from the moment the fault ends
to the first message published after it being consumed). The invariant, asserted with
those counts: every publish is acknowledged or raised (none silently dropped), every
acknowledged message is consumed at least once (lost == 0), the client recovers without
a restart, and its bookkeeping drains back to empty.

The network faults come from :class:`fastnsq.testing.proxy.FaultProxy` between the
clients and nsqd (or nsqlookupd). The servers are the embedded ones in this process, or,
in the real pass (``dev.py test --real BIN_DIR``), real nsqd and nsqlookupd processes the
test starts from those binaries (``FASTNSQ_TEST_REAL_BIN``) so that it can restart and
kill them. With ``FASTNSQ_FAULT_TABLE=path.json`` the rows of the table are written there
(``bench/faults.py`` does that and writes the markdown).

The network scenarios of about 5 s each are marked ``slow``: the suite's main pass runs
them; the pure-Python codec pass and the other Pythons' smoke pass run the rest.

Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from fastnsq import Consumer, Producer
from fastnsq.errors import ConnectionClosedError, NoConnectionError, PublishTimeoutError
from fastnsq.testing import NSQD, NSQLookupd, external_servers_configured
from fastnsq.testing.proxy import FaultProxy
from fastnsq.testing.real import RealLookupdServer, RealNSQDServer, real_bin_dir

from .helpers import due_within, eventually, unique

logger = logging.getLogger(__name__)

pytestmark = pytest.mark.timeout(180)

#: In the real pass: the binaries the scenarios start their own nsqd and nsqlookupd from.
REAL_BIN = real_bin_dir() if external_servers_configured() else None
#: How long every acknowledged message may take to come back: msg_timeout (2 s) plus a real
#: nsqd's queue-scan lateness for a young channel (up to 5 s), plus a loaded machine's share.
CONSUMED_WITHIN = 40.0
HEARTBEAT = 1.0  # nsqd's smallest: a dead link is noticed after two of them
TABLE: list[dict[str, Any]] = []
#: A real nsqd that has on disk, findable after a SIGKILL, everything it acknowledged (see Server).
DISK_ONLY = ["--mem-queue-size=0", "--sync-every=1"]


@dataclass
class Ledger:
    published: int = 0
    acknowledged: set[bytes] = field(default_factory=set)
    raised: int = 0
    deliveries: Counter[bytes] = field(default_factory=Counter)
    acked_at: dict[bytes, float] = field(default_factory=dict)
    consumed_at: dict[bytes, float] = field(default_factory=dict)
    healed_at: float | None = None

    @property
    def consumed(self) -> int:
        return len(self.deliveries)

    @property
    def duplicated(self) -> int:
        return sum(self.deliveries.values()) - len(self.deliveries)

    @property
    def lost(self) -> int:
        return len(self.acknowledged - set(self.deliveries))

    def recovery(self) -> float | None:
        """Seconds from the end of the fault to the first message acknowledged after it being consumed."""
        if self.healed_at is None:
            return None
        after = [self.consumed_at[b] for b, t in self.acked_at.items() if t >= self.healed_at and b in self.consumed_at]
        return round(min(after) - self.healed_at, 3) if after else None

    def counts(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "acknowledged": len(self.acknowledged),
            "raised": self.raised,
            "consumed": self.consumed,
            "duplicated": self.duplicated,
            "lost": self.lost,
            "recovery_s": self.recovery(),
        }

    def handler(self, message: Any) -> None:
        self.deliveries[message.body] += 1
        self.consumed_at.setdefault(message.body, time.monotonic())

    def heal(self) -> None:
        self.healed_at = time.monotonic()

    def check(self, scenario: str, server: str = "embedded nsqd", *, may_lose: int = 0, **notes: Any) -> None:
        """Record the table's row, then assert the invariant. ``may_lose``: how many messages
        the server itself may lose in this scenario (only a real nsqd's SIGKILL, see Server)."""
        counts = self.counts()
        print(f"\n{scenario} ({server}): {counts} {notes or ''}")
        TABLE.append({"scenario": scenario, "server": server, **counts, **notes})
        _write_table()
        assert counts["acknowledged"] + counts["raised"] == counts["published"], "a publish was dropped silently"
        assert counts["lost"] <= may_lose, f"{counts['lost']} acknowledged messages were never consumed"
        assert counts["acknowledged"] > 0


def _write_table() -> None:
    path = os.environ.get("FASTNSQ_FAULT_TABLE", "").strip()
    if path:
        with open(path, "w") as out:
            json.dump(TABLE, out, indent=1)


async def publish_until(producer: Producer, topic: str, ledger: Ledger, stop: asyncio.Event, *,
                        concurrency: int = 10, pause: float = 0.01) -> None:
    """Unique messages from ``concurrency`` publishers until ``stop``; each acknowledged or raised."""

    async def worker() -> None:
        while not stop.is_set():
            body = b"%s-%07d" % (topic.encode(), ledger.published)  # unique across calls
            ledger.published += 1
            try:
                await producer.publish(topic, body)
                ledger.acknowledged.add(body)
                ledger.acked_at[body] = time.monotonic()
            except (ConnectionClosedError, NoConnectionError, PublishTimeoutError) as exc:
                logger.debug("publish raised: %s", exc)
                ledger.raised += 1
            await asyncio.sleep(pause)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def publish_many(producer: Producer, topic: str, ledger: Ledger, count: int) -> None:
    """``count`` unique messages (no fault running), each acknowledged or raised."""
    for _ in range(count):
        body = b"%s-%07d" % (topic.encode(), ledger.published)
        ledger.published += 1
        try:
            await producer.publish(topic, body)
            ledger.acknowledged.add(body)
            ledger.acked_at[body] = time.monotonic()
        except (ConnectionClosedError, NoConnectionError, PublishTimeoutError):
            ledger.raised += 1


async def all_consumed(ledger: Ledger, timeout: float = CONSUMED_WITHIN) -> None:
    """Until every acknowledged message was consumed, or ``timeout``: then ``check`` reports
    (and fails on) what was lost."""
    with contextlib.suppress(AssertionError):
        await eventually(lambda: ledger.acknowledged <= set(ledger.deliveries), timeout=timeout,
                         what="every acknowledged message to be consumed")


def assert_drained(consumer: Consumer, producer: Producer | None = None) -> None:
    """Nothing grows without bound: in-flight bookkeeping and tasks are back to empty."""
    assert all(not link.in_flight for link in consumer._all_links())
    assert not consumer._dispatch.tasks
    assert consumer.snapshot().in_flight == 0
    if producer is not None:
        assert producer.snapshot().waiting == 0
        # When commands went out is kept per write, and only until they are answered.
        assert all(len(conn._write_marks) <= 1000 for conn in producer.connections)


# ---- the servers ------------------------------------------------------------------------------------


class Server:
    """The nsqd a scenario runs against and may restart or kill: embedded (in this process)
    or real (a child process from ``REAL_BIN``).

    ``disk_only``: a real nsqd keeps every message on disk (``--mem-queue-size=0``) and
    syncs its disk queue's metadata after every write (``--sync-every=1``). Without the
    latter, nsqd 1.3.0 loses what it acknowledged if it is killed before the queue's first
    sync (every 2 s or 2,500 writes): with no metadata file yet, go-diskqueue starts
    writing again at offset 0 of the data file (measured: 10 messages acknowledged, SIGKILL
    0.2 s later, depth 0 after the restart; 2.5 s later, or with --sync-every=1, all 10
    back). Even so, what nsqd has in flight (read from disk, sent or about to be sent to a
    consumer) lives in its memory only: a SIGKILL loses what the consumer had not received
    (measured: 300 on disk, RDY 50 into a link that delivers nothing, SIGKILL, restart: 250
    come back). The embedded one has no disk: its "kill" is a stop that keeps everything.
    """

    def __init__(self, *, disk_only: bool = False, lookupd_tcp_addresses: list[str] | None = None) -> None:
        lookupds = {"lookupd_tcp_addresses": lookupd_tcp_addresses} if lookupd_tcp_addresses else {}
        if REAL_BIN is None:
            self.nsqd: Any = NSQD(**lookupds)
            self.describe = "embedded nsqd"
        else:
            flags = DISK_ONLY if disk_only else []
            self.nsqd = RealNSQDServer(REAL_BIN, *flags, **lookupds)
            self.describe = " ".join([f"real nsqd ({REAL_BIN})", *flags])

    @property
    def tcp_address(self) -> str:
        return str(self.nsqd.tcp_address)

    async def start(self) -> None:
        await self.nsqd.start()

    async def close(self) -> None:
        await (self.nsqd.stop() if REAL_BIN is None else self.nsqd.close())

    async def down(self, *, kill: bool) -> None:
        """SIGTERM (clean: a real nsqd writes what it holds to disk), or SIGKILL."""
        if REAL_BIN is None:
            await self.nsqd.stop(keep_messages=True)
        elif kill:
            await self.nsqd.kill()
        else:
            await self.nsqd.stop()


@pytest.fixture
async def make_server() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    started: list[Server] = []

    async def make(**options: Any) -> Server:
        server = Server(**options)
        started.append(server)
        await server.start()
        return server

    yield make
    for server in reversed(started):
        await server.close()


@dataclass
class Clients:
    """A producer and a consumer, each through its own FaultProxy to the server."""

    topic: str
    producer: Producer
    consumer: Consumer
    to_producer: FaultProxy
    to_consumer: FaultProxy
    ledger: Ledger


@pytest.fixture
async def clients(make_server: Callable[..., Awaitable[Server]]) -> AsyncIterator[Callable[..., Awaitable[Clients]]]:
    opened: list[Clients] = []

    async def open_clients(server: Server, name: str) -> Clients:
        ledger = Ledger()
        to_producer, to_consumer = FaultProxy(server.tcp_address), FaultProxy(server.tcp_address)
        await to_producer.start()
        await to_consumer.start()
        topic = unique(name)
        producer = Producer([to_producer.address], heartbeat_interval=HEARTBEAT, reconnect_delay=0.05,
                            publish_timeout=4.0)
        # Messages nsqd wrote into a link that then died stay in flight on nsqd until
        # msg_timeout: keep it short so that they come back within the test.
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[to_consumer.address], handler=ledger.handler,
                            heartbeat_interval=HEARTBEAT, msg_timeout=2.0, max_in_flight=50, reconnect_delay=0.05)
        await producer.start()
        await consumer.start()
        made = Clients(topic, producer, consumer, to_producer, to_consumer, ledger)
        opened.append(made)
        return made

    yield open_clients
    for made in opened:
        await made.consumer.stop()
        await made.producer.close()
        await made.to_producer.stop()
        await made.to_consumer.stop()


async def run_scenario(c: Clients, fault: Callable[[], Awaitable[None]], scenario: str, server: str, *,
                       settle: float = 1.5, may_lose: int = 0) -> None:
    """Traffic, then ``fault`` (which returns once it is over), then traffic; every message consumed."""
    stop = asyncio.Event()
    publishing = asyncio.create_task(publish_until(c.producer, c.topic, c.ledger, stop))
    try:
        await eventually(lambda: c.ledger.consumed > 100, timeout=20, what="traffic before the fault")
        await fault()
        c.ledger.heal()
        await asyncio.sleep(settle)
        await eventually(lambda: c.ledger.recovery() is not None, timeout=CONSUMED_WITHIN,
                         what="a message published after the fault to be consumed")
    finally:
        stop.set()
        await publishing
    await all_consumed(c.ledger)
    c.ledger.check(scenario, server, may_lose=may_lose)  # the table's row; fails on a loss
    assert c.consumer.connections and c.producer.connections  # recovered by itself
    await c.consumer.stop()
    assert_drained(c.consumer, c.producer)


# ---- the network --------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_latency_and_jitter(make_server, clients) -> None:
    server = await make_server()
    c = await clients(server, "latency")

    async def fault() -> None:
        for proxy in (c.to_producer, c.to_consumer):
            proxy.delay, proxy.jitter = 0.05, 0.1  # 50-150 ms each way, per chunk
        await asyncio.sleep(3.0)
        for proxy in (c.to_producer, c.to_consumer):
            proxy.heal()

    await run_scenario(c, fault, "latency 50 ms + jitter 0-100 ms each way, 3 s", server.describe)
    assert c.to_producer.accepted == 1 and c.to_consumer.accepted == 1  # slow, not broken: no reconnect


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["down", "up"])
async def test_connection_reset_mid_frame(make_server, clients, direction: str) -> None:
    server = await make_server()
    c = await clients(server, f"reset_{direction}")
    # Down: nsqd's messages to the consumer; up: the producer's PUBs to nsqd.
    proxy = c.to_consumer if direction == "down" else c.to_producer

    async def fault() -> None:
        await proxy.reset_mid_frame(direction)

    what = "server to client" if direction == "down" else "client to server"
    await run_scenario(c, fault, f"connection reset mid-frame ({what})", server.describe)
    assert proxy.accepted >= 2  # it reconnected


@pytest.mark.slow
async def test_blackhole_longer_than_the_heartbeat_deadline(make_server, clients) -> None:
    """Bytes silently dropped both ways for 3 s (heartbeats every 1 s): both ends declare the
    link dead, the client reconnects, what was in flight comes back after msg_timeout."""
    server = await make_server()
    c = await clients(server, "blackhole")

    async def fault() -> None:
        await asyncio.gather(c.to_producer.blackhole(3.0), c.to_consumer.blackhole(3.0))

    await run_scenario(c, fault, "blackhole 3 s (heartbeat 1 s)", server.describe)
    assert c.to_consumer.accepted >= 2 and c.to_producer.accepted >= 2


@pytest.mark.slow
@pytest.mark.parametrize("dead_side", ["server", "client"])
async def test_half_open_connection(make_server, clients, dead_side: str) -> None:
    """One end of every link is reset, the other stays open and hears nothing: it must find
    out by its own deadline (the client by heartbeats, nsqd by its read deadline)."""
    server = await make_server()
    c = await clients(server, f"halfopen_{dead_side}")

    async def fault() -> None:
        assert c.to_producer.half_open(dead_side) + c.to_consumer.half_open(dead_side) == 2  # type: ignore[arg-type]

    await run_scenario(c, fault, f"half-open connection ({dead_side} side gone, the other silent)", server.describe)
    assert c.to_consumer.accepted >= 2 and c.to_producer.accepted >= 2


async def test_a_server_that_stops_reading(make_server, clients) -> None:
    """nsqd stops reading the producer's bytes for 3 s: nothing is acknowledged, nsqd's read
    deadline closes the link, and every publish is retried or raised, never dropped."""
    server = await make_server()
    c = await clients(server, "deaf")

    async def fault() -> None:
        await c.to_producer.stall(3.0, direction="up")

    await run_scenario(c, fault, "server stops reading for 3 s", server.describe)
    assert c.producer.snapshot().retried + c.ledger.raised + c.producer.snapshot().reconnects > 0  # the fault was felt


@pytest.mark.slow
async def test_network_stall_longer_than_the_heartbeat_deadline(make_server, clients) -> None:
    """Both directions held for 3 s, then released: the links were declared dead meanwhile."""
    server = await make_server()
    c = await clients(server, "stall")

    async def fault() -> None:
        await asyncio.gather(c.to_consumer.stall(3.0), c.to_producer.stall(3.0))

    await run_scenario(c, fault, "stall 3 s both ways (heartbeat 1 s)", server.describe)
    assert c.to_consumer.accepted >= 2 and c.to_producer.accepted >= 2


@pytest.mark.slow
async def test_throttled_link(make_server, clients) -> None:
    server = await make_server()
    c = await clients(server, "throttled")

    async def fault() -> None:
        for proxy in (c.to_producer, c.to_consumer):
            proxy.bandwidth = 8_000  # bytes per second each way
        await asyncio.sleep(3.0)
        for proxy in (c.to_producer, c.to_consumer):
            proxy.heal()

    await run_scenario(c, fault, "throttled link, 8 kB/s each way for 3 s", server.describe)


# ---- the servers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sigterm", "sigkill", "sigkill_nothing_in_flight"])
async def test_nsqd_restarted_mid_stream(make_server, clients, how: str) -> None:
    """nsqd goes down (SIGTERM, or SIGKILL with every message on disk) for 1 s and comes back
    on its ports; the clients reconnect through their proxies by themselves. The last case
    pauses the consumer (RDY 0) before the kill: nothing is in flight, so nothing may be lost."""
    kill = how != "sigterm"
    server = await make_server(disk_only=kill)
    c = await clients(server, how)

    async def fault() -> None:
        if how == "sigkill_nothing_in_flight":
            c.consumer.set_max_in_flight(0)
            await eventually(lambda: c.consumer.snapshot().in_flight == 0, timeout=10, what="nothing in flight")
            await asyncio.sleep(0.5)  # what nsqd sent before it saw RDY 0 has arrived and been answered
        await server.down(kill=kill)
        await asyncio.sleep(1.0)
        await server.start()
        if how == "sigkill_nothing_in_flight":
            c.consumer.set_max_in_flight(50)

    what = {"sigterm": "nsqd restarted (SIGTERM), back after 1 s", "sigkill": "nsqd killed (SIGKILL), back after 1 s",
            "sigkill_nothing_in_flight": "nsqd killed (SIGKILL) with the consumer paused, back after 1 s"}[how]
    # A real nsqd's SIGKILL loses what it had in flight and the consumer had not received:
    # at most the consumer's max_in_flight (see Server). Everything else must come back.
    window = c.consumer.max_in_flight if how == "sigkill" and REAL_BIN is not None else 0
    await run_scenario(c, fault, what, server.describe, may_lose=window)
    assert len(c.producer.connections) == 1


async def test_lookupd_down_for_longer_than_a_poll_interval(make_server) -> None:
    """The consumer's nsqlookupd (behind a FaultProxy) goes away for 2 s (polls every 0.3 s):
    consumption goes on through the open connections; once it is back, a new nsqd is found."""
    ledger = Ledger()
    lookupd: Any = NSQLookupd() if REAL_BIN is None else RealLookupdServer(REAL_BIN)
    await lookupd.start()
    try:
        first = await make_server(lookupd_tcp_addresses=[lookupd.tcp_address])
        async with FaultProxy(lookupd.http_address) as to_lookupd:
            topic = unique("lookupd")
            async with Producer([first.tcp_address]) as producer:
                await publish_many(producer, topic, ledger, 100)
                consumer = Consumer(topic, "ch", lookupd_http_addresses=[to_lookupd.address], handler=ledger.handler,
                                    max_in_flight=50, lookupd_poll_interval=0.3)
                await consumer.start()
                await all_consumed(ledger)
                await lookupd.stop()
                await publish_many(producer, topic, ledger, 300)
                await asyncio.sleep(2.0)
                await all_consumed(ledger)  # lookupd is down: the open connection carries on
                await lookupd.start()
                ledger.heal()
                second = await make_server(lookupd_tcp_addresses=[lookupd.tcp_address])
            async with Producer([second.tcp_address]) as producer:
                await publish_many(producer, topic, ledger, 100)
            await all_consumed(ledger)  # the new node, found once lookupd is back
            assert {c.address for c in consumer.connections} >= {first.tcp_address, second.tcp_address}
            await consumer.stop()
            assert_drained(consumer)
    finally:
        await (lookupd.stop() if REAL_BIN is None else lookupd.close())
    ledger.check("nsqlookupd down 2 s (poll interval 0.3 s), a new nsqd after", first.describe)


# ---- the handler -------------------------------------------------------------------------------------


@pytest.mark.parametrize("touch", [False, True], ids=["without_touch", "with_auto_touch"])
async def test_slow_handler_past_msg_timeout(make_server, touch: bool) -> None:
    """A handler running past msg_timeout (1 s): without TOUCH nsqd redelivers (duplicates, no
    loss); with auto_touch it does not. 1.6 s on the embedded nsqd; on a real one, long enough
    for its queue scan to notice the timeout (up to 5 s late on a young channel)."""
    ledger = Ledger()
    server = await make_server()
    topic = unique("slow")
    async with Producer([server.tcp_address]) as producer:
        await publish_many(producer, topic, ledger, 5)

    async def slow(message: Any) -> None:
        ledger.deliveries[message.body] += 1
        if message.attempts == 1:
            await asyncio.sleep(1.6 if REAL_BIN is None else due_within(1.0))

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[server.tcp_address], handler=slow, max_in_flight=10,
                        msg_timeout=1.0, auto_touch=touch, max_attempts=0)
    await consumer.start()
    await all_consumed(ledger)
    # Let any redelivery happen (a real nsqd notices the timeout in its queue scan: up to 5 s late).
    await asyncio.sleep(2.0 if REAL_BIN is None else 7.0)
    await consumer.stop()
    assert_drained(consumer)
    ledger.check(f"slow handler, auto_touch={touch}", server.describe)
    if touch:
        assert ledger.duplicated == 0
    else:
        assert ledger.duplicated == 5
