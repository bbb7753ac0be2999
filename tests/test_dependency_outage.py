"""A handler's dependency that goes away (issue 58): the consumer holds while its ``ready_check``
fails, nothing is given up meanwhile, and it resumes at full ``max_in_flight`` on the first
check that passes; a poison message still reaches ``max_attempts`` and lands on the
``dead_letter_topic`` with its body intact.

The dependency is a real TCP listener (closed: connections refused; open again: accepted),
the handler and the check connect to it. Events are counted, never timed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from fastnsq import Consumer, Message, Producer

from .helpers import eventually, stats_json, unique


class Dependency:
    """A TCP service that can go down (its listener closed: connections refused) and come back."""

    def __init__(self) -> None:
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.checks = 0

    async def up(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()
        self.server = None

    @staticmethod
    async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()

    async def call(self) -> None:
        """One round trip; ConnectionRefusedError while down."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            assert await reader.readline() == b"ok\n"
        finally:
            writer.close()

    async def ready(self) -> None:
        self.checks += 1
        await self.call()


async def publish(address: str, topic: str, count: int) -> list[bytes]:
    bodies = [b"event-%05d" % i for i in range(count)]
    async with Producer([address]) as producer:
        await producer.mpublish(topic, bodies)
    return bodies


async def channel_depth(http_address: str, topic: str, channel: str) -> tuple[int, int]:
    stats = await stats_json(http_address, topic)
    for entry in stats["topics"]:
        if entry["topic_name"] == topic:
            for ch in entry["channels"]:
                if ch["channel_name"] == channel:
                    return ch["depth"], ch["in_flight_count"]
    return 0, 0


async def test_an_outage_holds_the_consumer_gives_nothing_up_and_flow_resumes_when_the_check_passes(
        nsqd: Any) -> None:
    """Before: every failed probe and message spent an attempt (50 of 50 given up with max_attempts=2)
    and the consumer came back through backoff's steps; now it holds at RDY 0 while the check fails."""
    topic = unique("outage")
    dependency = Dependency()
    await dependency.up()
    await dependency.down()  # down before the first message
    bodies = await publish(nsqd.tcp_address, topic, 200)
    done: list[bytes] = []
    failures = 0

    async def handle(message: Message) -> None:
        nonlocal failures
        try:
            await dependency.call()
        except OSError:
            failures += 1
            raise
        done.append(bytes(message.body))

    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=20,
                        max_attempts=2, ready_check=dependency.ready, ready_check_interval=0.02)
    async with consumer:
        await eventually(lambda: consumer.holding and dependency.checks >= 5, timeout=10, what="the hold")
        failed_when_held = failures
        await eventually(lambda: dependency.checks >= 30, timeout=10, what="the checks while down")
        assert failures == failed_when_held <= 20  # held: no message handed out, no attempt spent
        assert consumer.snapshot().connections[0].rdy == 0 and consumer.snapshot().holding == 1
        await dependency.up()
        await eventually(lambda: len(done) == len(bodies), timeout=20, what="every message after the return")
        assert not consumer.holding and consumer.snapshot().connections[0].rdy == 20  # full RDY at once
        assert sorted(done) == bodies
        assert consumer.snapshot().given_up == 0 and consumer.backoff_level == 0
    assert await channel_depth(nsqd.http_address, topic, "c") == (0, 0)
    await dependency.down()


async def test_batches_are_held_while_not_ready_and_none_is_given_up(nsqd: Any) -> None:
    """batches(): the batch that failed is requeued (at once: the check decides when), the messages
    already queued are not handed out while the check fails; all come through after it passes."""
    topic = unique("outage")
    dependency = Dependency()
    await dependency.up()
    bodies = await publish(nsqd.tcp_address, topic, 300)
    written: list[bytes] = []
    batches_failed = 0
    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=100, max_attempts=2,
                        ready_check=dependency.ready, ready_check_interval=0.02)
    await dependency.down()
    async with consumer:
        async def run() -> None:
            nonlocal batches_failed
            async for batch in consumer.batches(25, 0.05):
                try:
                    await dependency.call()
                except OSError:
                    batches_failed += 1
                    batch.requeue()
                    continue
                written.extend(bytes(m.body) for m in batch)
                batch.finish()

        task = asyncio.create_task(run())
        await eventually(lambda: consumer.holding and dependency.checks >= 5, timeout=10, what="the hold")
        failed_when_held = batches_failed
        await eventually(lambda: dependency.checks >= 30, timeout=10, what="the checks while down")
        assert batches_failed == failed_when_held == 1  # the queued batches were held, not failed
        await dependency.up()
        await eventually(lambda: len(written) >= len(bodies), timeout=20, what="every message after the return")
        assert sorted(written) == bodies and consumer.snapshot().given_up == 0
    await asyncio.wait_for(task, 10)


async def test_a_poison_message_lands_on_the_dead_letter_topic_with_its_body_intact(nsqd: Any) -> None:
    topic, dead = unique("poison"), unique("dead")
    poison = b"\x00\xffnot json {" + bytes(range(256))
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [poison, b"fine"])
    seen: list[bytes] = []

    def handle(message: Message) -> None:
        if bytes(message.body) != b"fine":
            raise ValueError("cannot parse")
        seen.append(bytes(message.body))

    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=5,
                        max_attempts=2, default_requeue_delay=0, max_backoff_duration=0, dead_letter_topic=dead)
    async with consumer:
        await eventually(lambda: consumer.snapshot().dead_lettered == 1, timeout=10, what="the dead letter")
        assert consumer.snapshot().given_up == 1 and seen == [b"fine"]
    assert await channel_depth(nsqd.http_address, topic, "c") == (0, 0)  # finished after the publish
    letters: list[tuple[bytes, int]] = []
    async with Consumer(dead, "replay", nsqd_tcp_addresses=[nsqd.tcp_address],
                        handler=lambda m: letters.append((bytes(m.body), m.attempts))):
        await eventually(lambda: letters, timeout=10, what="the dead-letter topic's message")
    assert letters == [(poison, 1)]


async def test_a_failed_dead_letter_publish_finishes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """nsqd refuses the dead-letter PUB (the embedded nsqd's fault; nsqd then closes the connection):
    the message is not finished, nsqd gives it out again after msg_timeout, and the next give-up
    publishes it: one copy on the dead-letter topic."""
    from fastnsq.testing import NSQD

    topic, dead = unique("poison"), unique("dead")
    async with NSQD() as nsqd:
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.publish(topic, b"poison")
        nsqd.faults.fail_next("PUB", "E_PUB_FAILED", "disk full", fatal=False)

        def handle(message: Message) -> None:
            raise ValueError("cannot parse")

        consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=5,
                            max_attempts=1, default_requeue_delay=0, max_backoff_duration=0,
                            dead_letter_topic=dead, msg_timeout=1.0)
        with caplog.at_level(logging.WARNING, logger="fastnsq"):
            async with consumer:
                await eventually(lambda: consumer.snapshot().dead_lettered == 1, timeout=20, what="the retry")
                assert consumer.snapshot().given_up == 2  # the first one's publish failed: requeued
        assert await channel_depth(nsqd.http_address, topic, "c") == (0, 0)
        assert await channel_depth(nsqd.http_address, dead, "x") == (0, 0)
        stats = await stats_json(nsqd.http_address, dead)
        assert [t["message_count"] for t in stats["topics"] if t["topic_name"] == dead] == [1]
    failed = [r.getMessage() for r in caplog.records if "publishing it to the dead-letter topic" in r.getMessage()]
    assert len(failed) == 1 and "E_PUB_FAILED" in failed[0] and "not finished" in failed[0], failed


def test_an_invalid_dead_letter_topic_is_refused_at_once() -> None:
    from fastnsq.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="invalid dead_letter_topic 'bad topic!'"):
        Consumer("t", "c", nsqd_tcp_addresses=[], dead_letter_topic="bad topic!")


async def test_the_hold_is_one_line_in_and_one_line_out_without_a_traceback(
        nsqd: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("outage")
    dependency = Dependency()
    await dependency.up()
    await dependency.down()
    await publish(nsqd.tcp_address, topic, 50)
    done: list[bytes] = []

    async def handle(message: Message) -> None:
        await dependency.call()
        done.append(bytes(message.body))

    with caplog.at_level(logging.INFO, logger="fastnsq"):
        async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=10,
                            ready_check=dependency.ready, ready_check_interval=0.02) as consumer:
            await eventually(lambda: consumer.holding and dependency.checks >= 20, timeout=10, what="the hold")
            await dependency.up()
            await eventually(lambda: len(done) == 50, timeout=20, what="the flow after the return")
    messages = [r.getMessage() for r in caplog.records]
    held = [m for m in messages if "not ready (ready_check: ConnectionRefusedError" in m]
    back = [m for m in messages if "ready again after" in m]
    assert len(held) == 1 and len(back) == 1, messages
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None for r in warnings)
    # The messages in flight when the dependency went away: at most one WARNING line before the
    # hold (the first failure), the rest at DEBUG while holding.
    assert len([m for m in messages if "handler failed on message" in m]) <= 1
    await dependency.down()


def test_ready_check_must_be_callable() -> None:
    from fastnsq.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="ready_check must be a callable"):
        Consumer("t", "c", nsqd_tcp_addresses=[], ready_check="mod:fn")  # type: ignore[arg-type]




async def test_the_blocking_facade_holds_on_a_sync_check_and_gives_nothing_up(nsqd: Any) -> None:
    """fastnsq.sync.Consumer: its handlers in threads, a sync check (run in a thread too)."""
    import threading
    import time

    from fastnsq.sync import Consumer as BlockingConsumer

    topic = unique("outage")
    bodies = await publish(nsqd.tcp_address, topic, 100)
    up = threading.Event()
    checks: list[bool] = []
    done: list[bytes] = []

    def ready() -> bool:
        checks.append(up.is_set())
        return up.is_set()

    def handle(message: Message) -> None:
        if not up.is_set():
            raise ConnectionRefusedError("the database is down")
        done.append(bytes(message.body))

    consumer = BlockingConsumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, workers=4,
                                max_attempts=2, ready_check=ready, ready_check_interval=0.02)

    def blocking() -> Any:
        runner = threading.Thread(target=consumer.run)
        runner.start()
        deadline = time.monotonic() + 20
        while (len(checks) < 30 or not consumer.snapshot().holding) and time.monotonic() < deadline:
            time.sleep(0.01)
        held = consumer.snapshot()
        up.set()
        while len(done) < len(bodies) and time.monotonic() < deadline:
            time.sleep(0.01)
        consumer.stop()
        runner.join(10)
        return held, consumer.snapshot()

    held, final = await asyncio.get_running_loop().run_in_executor(None, blocking)
    assert held.holding == 1 and held.requeued <= 4  # the messages in the 4 handlers, then held
    assert sorted(done) == bodies and final.given_up == 0 and final.holding == 0
