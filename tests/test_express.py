"""The consumer's express lane (fastnsq/consumer/express.py), on the embedded nsqd or a real one.

nsqd holds a connection's messages in its output buffer until it is full or its
output_buffer_timeout (250 ms) ticks; the express lane is an unbuffered second
connection per nsqd that carries the messages while they come slowly. These tests
check what a user sees: slow messages arrive at once with the defaults, a backlog
still goes through the buffered connection, small max_in_flight and unbuffered
consumers get no second connection, and a lost express connection comes back.
They also check that the server buffers as nsqd does (the embedded one must).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from fastnsq import Consumer, Producer
from tests.apps_support import create_channels
from tests.helpers import Slack, eventually, unique
from tests.test_consumer import channel_stats, publish_spread

ROOT = Path(__file__).resolve().parent.parent

MIF = 2500  # a consumer sized for throughput: nsqd's buffer, not RDY, decides when it writes


async def _latencies(nsqd, consumer_options: dict, count: int = 25, spacing: float = 0.02,
                     connections: list | None = None) -> list[float]:
    """Publish ``count`` messages one at a time, ``spacing`` apart; seconds from publish to handler
    (and the consumer's connections' stats at the end into ``connections``)."""
    topic = unique("express")
    published: dict[bytes, float] = {}
    latencies: list[float] = []

    def handle(message) -> None:
        latencies.append(time.monotonic() - published[message.body])

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=MIF,
                        **consumer_options)
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"first")  # creates the topic
        published[b"first"] = time.monotonic()
        await consumer.start()
        await eventually(lambda: len(latencies) == 1, timeout=5, what="the first message")
        if consumer_options.get("express_lane", True):
            # Quiet now: the express lane opens and takes the RDY (counted, not a fixed wait: on a
            # busy machine the consumer's ticks come late).
            await eventually(lambda: any(c.express and c.rdy > 0 for c in consumer.snapshot().connections),
                             timeout=5, what="the express lane holding RDY")
        else:
            await asyncio.sleep(0.3)
        for i in range(count):
            body = b"m%d" % i
            published[body] = time.monotonic()
            await producer.publish(topic, body)
            await asyncio.sleep(spacing)
    await eventually(lambda: len(latencies) == count + 1, timeout=5, what="every message")
    if connections is not None:
        connections.extend(consumer.snapshot().connections)
    await consumer.stop()
    return latencies[1:]


async def test_slow_messages_arrive_at_once_with_the_defaults(nsqd) -> None:
    connections: list = []
    async with Slack() as slack:
        latencies = await _latencies(nsqd, {}, connections=connections)
    # They came the express way (counted), not through nsqd's buffer: no message waited for the
    # 250 ms flush tick (125 ms on average) beyond the slack this machine showed meanwhile.
    [express] = [c for c in connections if c.express]
    assert express.received == len(latencies), connections
    assert statistics.median(latencies) < 0.05 + 3 * slack.worst, (latencies, slack)


async def test_the_server_buffers_them_without_the_express_lane(nsqd) -> None:
    """nsqd's (and the embedded server's) output buffer: held until the 250 ms tick."""
    latencies = await _latencies(nsqd, {"express_lane": False})
    assert statistics.median(latencies) > 0.05, latencies  # ~125 ms: half the tick, on average


async def test_a_backlog_goes_through_the_buffered_connection(nsqd) -> None:
    topic = unique("backlog")
    async with Producer([nsqd.tcp_address]) as producer:
        for start in range(0, 20_000, 500):
            await producer.mpublish(topic, [b"%d" % i for i in range(start, start + 500)])
    got = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=got.append, max_in_flight=MIF)
    await consumer.start()
    await eventually(lambda: len(got) == 20_000, timeout=30, what="the backlog", progress=lambda: len(got))
    await eventually(lambda: len(consumer.connections) == 2, timeout=5, what="the express lane, once quiet")
    stats = sorted(consumer.snapshot().connections, key=lambda c: c.received)
    # The consumer starts on its buffered connection: the backlog never went the express way.
    assert stats[-1].received == 20_000 and stats[0].received == 0
    await consumer.stop()


async def test_a_burst_moves_back_to_the_buffered_connection(nsqd) -> None:
    topic = unique("burst")
    got = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=got.append, max_in_flight=MIF)
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"first")
        await consumer.start()
        await eventually(lambda: len(consumer.connections) == 2, timeout=5, what="the express lane")
        await asyncio.sleep(0.1)  # and its RDY
        for start in range(0, 50_000, 1000):  # far above express_max_rate
            await producer.mpublish(topic, [b"%d" % i for i in range(start, start + 1000)])
    await eventually(lambda: len(got) == 50_001, timeout=30, what="the burst", progress=lambda: len(got))
    express, bulk = sorted(consumer.snapshot().connections, key=lambda c: c.received)
    assert bulk.received > express.received, (bulk, express)
    await consumer.stop()


async def test_no_express_lane_with_a_small_max_in_flight_or_an_unbuffered_consumer(nsqd) -> None:
    for options in ({"max_in_flight": 100}, {"max_in_flight": MIF, "output_buffer_size": -1},
                    {"max_in_flight": MIF, "express_lane": False}):
        got = []
        consumer = Consumer(unique("noexp"), "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=got.append,
                            **options)
        await consumer.start()
        await asyncio.sleep(0.4)  # well past the quiet time after which an express lane would open
        assert len(consumer.connections) == 1, options
        await consumer.stop()


async def test_a_lost_express_connection_is_opened_again(nsqd) -> None:
    topic = unique("reopen")
    got = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=got.append, max_in_flight=MIF)
    await consumer.start()
    await eventually(lambda: len(consumer.connections) == 2, timeout=5, what="the express lane")
    await consumer.connections[-1].close()  # the express lane's comes last
    await eventually(lambda: len(consumer.connections) == 1, timeout=5, what="the loss seen")
    await eventually(lambda: len(consumer.connections) == 2, timeout=10, what="the express lane again")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"after")
    await eventually(lambda: got and got[-1].body == b"after", timeout=5, what="a message after")
    assert consumer.reconnects == 0  # the buffered connection never went
    await consumer.stop()


# ---- a busy consumer and a backlog -------------------------------------------------------------


class _BusyConsumer:
    """A consumer process whose handler spins ``handler_us`` of CPU (tests/express_consumer.py)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, address: str, topic: str, handler_us: int, max_in_flight: int) -> _BusyConsumer:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.express_consumer", address, topic, "ch", str(handler_us), str(max_in_flight),
            cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 30) == b"started\n"
        return cls(process)

    async def stop(self) -> dict:
        """Its handled count and its connections (``express``, ``received``) as it stopped."""
        out, _ = await asyncio.wait_for(self.process.communicate(b""), 30)
        assert self.process.returncode == 0, out
        return json.loads(out.splitlines()[-1])


async def _consumed(nsqd, topic: str, count: int) -> bool:
    stats = await channel_stats([nsqd.http_address], topic, "ch")
    return bool(stats) and stats[0]["message_count"] == count and stats[0]["depth"] == 0 \
        and stats[0]["in_flight_count"] == 0


async def test_busy_consumers_drain_a_backlog_on_the_buffered_lane(nsqd) -> None:
    """Two consumers of one channel, each slower than half of express_max_rate (a 150 us handler,
    and they share the cores with nsqd), drain a backlog: a low rate there is the consumers' own,
    not a quiet topic, so the backlog stays on the buffered connections. (They went to the express
    lane, at most 20 in flight and a write per message, and stayed there: issue 51.)"""
    topic, count = unique("busy"), 40_000
    await create_channels(nsqd.http_address, topic, "ch")
    await publish_spread([nsqd.tcp_address], topic, count)
    consumers = [await _BusyConsumer.start(nsqd.tcp_address, topic, 150, 500) for _ in range(2)]
    with contextlib.suppress(AssertionError):  # a trapped pair would take minutes: judged by the lanes below
        await eventually(lambda: _consumed(nsqd, topic, count), timeout=60, what="the backlog drained")
    reports = [await consumer.stop() for consumer in consumers]
    express = sum(c["received"] for r in reports for c in r["connections"] if c["express"])
    handled = sum(r["handled"] for r in reports)
    assert handled >= count, reports
    assert express <= count // 50, reports  # a moment on the express lane at most


async def test_a_backlog_takes_a_busy_consumer_off_the_express_lane(nsqd) -> None:
    """A consumer on the express lane (a quiet topic) meets a burst it cannot keep up with, below
    express_max_rate: it leaves the express lane at once instead of draining the burst there."""
    topic, burst = unique("busy"), 20_000
    await create_channels(nsqd.http_address, topic, "ch")
    consumer = await _BusyConsumer.start(nsqd.tcp_address, topic, 150, 2500)
    async with Producer([nsqd.tcp_address]) as producer:
        for i in range(30):  # 30 messages 20 ms apart: quiet, the express lane carries them
            await producer.publish(topic, b"quiet %d" % i)
            await asyncio.sleep(0.02)
    await publish_spread([nsqd.tcp_address], topic, burst)
    with contextlib.suppress(AssertionError):
        await eventually(lambda: _consumed(nsqd, topic, burst + 30), timeout=60, what="the burst drained")
    report = await consumer.stop()
    [express] = [c["received"] for c in report["connections"] if c["express"]]
    assert report["handled"] == burst + 30, report
    assert express >= 15, report  # it was on the express lane for the quiet part
    assert express <= 30 + burst // 20, report  # and left it early in the burst
