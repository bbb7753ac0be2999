"""A plain Consumer's handler whose dependency goes away, with the defaults (hold_failed, issue 58):
the failed messages are held and their handler called again in-process, no attempt is spent in
nsqd, and the flow resumes at the first retry that passes; a poison message is still charged
and reaches the dead letter. Events are counted, never timed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from fastnsq import Consumer, Message, Producer

from .helpers import eventually, unique
from .test_dependency_outage import Dependency, channel_depth, publish


@pytest.mark.parametrize("max_in_flight", [1, 20])
async def test_an_outage_spends_no_attempt_and_every_message_comes_once_the_dependency_is_back(
        nsqd: Any, max_in_flight: int) -> None:
    """Before: each failure was a REQ (attempt 2, 3, ... and, past max_attempts=2, given up)."""
    topic = unique("held")
    dependency = Dependency()
    await dependency.up()
    await dependency.down()
    bodies = await publish(nsqd.tcp_address, topic, 60)
    done: list[tuple[bytes, int]] = []
    failures = 0

    async def handle(message: Message) -> None:
        nonlocal failures
        try:
            await dependency.call()
        except OSError:
            failures += 1
            raise
        done.append((bytes(message.body), message.attempts))

    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle,
                        max_in_flight=max_in_flight, max_attempts=2, ready_check_interval=0.02)
    async with consumer:
        await eventually(lambda: consumer.holding and failures >= 30, timeout=10, what="the retries while down",
                         progress=lambda: failures)
        assert consumer.snapshot().requeued == 0 and consumer.snapshot().given_up == 0
        assert consumer.snapshot().connections[0].rdy <= len(consumer.held or ())  # nothing new handed out
        await dependency.up()
        await eventually(lambda: len(done) == len(bodies), timeout=20, what="every message after the return",
                         progress=lambda: len(done))
        assert not consumer.holding and consumer.snapshot().connections[0].rdy == max_in_flight
        assert sorted(done) == [(body, 1) for body in bodies]  # each handled once, on its first delivery
        assert consumer.snapshot().requeued == 0 and consumer.snapshot().given_up == 0
    assert await channel_depth(nsqd.http_address, topic, "c") == (0, 0)
    await dependency.down()


@pytest.mark.parametrize("max_in_flight", [1, 5])
async def test_a_poison_message_is_still_charged_and_dead_lettered_with_the_defaults(
        nsqd: Any, max_in_flight: int) -> None:
    """Beside messages that succeed (or alone in the channel: a probe brings nothing), a message that
    always fails is requeued, attempt by attempt, to max_attempts and the dead-letter topic."""
    topic, dead = unique("poison"), unique("dead")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b"poison"] + [b"fine-%d" % i for i in range(20)])
    seen: list[bytes] = []

    def handle(message: Message) -> None:
        if bytes(message.body) == b"poison":
            raise ValueError("cannot parse")
        seen.append(bytes(message.body))

    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle,
                        max_in_flight=max_in_flight, max_attempts=2, default_requeue_delay=0,
                        ready_check_interval=0.02, dead_letter_topic=dead)
    async with consumer:
        await eventually(lambda: consumer.snapshot().dead_lettered == 1, timeout=30, what="the dead letter",
                         progress=lambda: (len(seen), consumer.held.tries if consumer.held else 0))
        assert consumer.snapshot().given_up == 1 and sorted(seen) == sorted(b"fine-%d" % i for i in range(20))
        assert consumer.held is not None and consumer.held.charged == 2  # attempts 1 and 2, each charged once
    assert await channel_depth(nsqd.http_address, topic, "c") == (0, 0)


async def test_hold_failed_false_requeues_with_backoff_as_go_nsq(nsqd: Any) -> None:
    topic = unique("held")
    await publish(nsqd.tcp_address, topic, 1)
    attempts: list[int] = []

    def handle(message: Message) -> None:
        attempts.append(message.attempts)
        if len(attempts) < 3:
            raise RuntimeError("not yet")

    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, hold_failed=False,
                        default_requeue_delay=0, backoff_multiplier=0.01) as consumer:
        await eventually(lambda: len(attempts) == 3, timeout=10, what="the third delivery")
        assert consumer.held is None
    assert attempts == [1, 2, 3]  # each failure a REQ: a delivery of its own


async def test_a_lone_failure_among_successes_is_retried_once_in_process(nsqd: Any) -> None:
    """A transient failure beside a flowing channel: its handler is called again in-process and the
    message is finished on its first delivery; the consumer never holds."""
    topic = unique("held")
    bodies = await publish(nsqd.tcp_address, topic, 50)
    calls: dict[bytes, int] = {}

    def handle(message: Message) -> None:
        body = bytes(message.body)
        calls[body] = calls.get(body, 0) + 1
        if body == bodies[10] and calls[body] == 1:
            raise ConnectionResetError("a blip")

    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=10,
                        ready_check_interval=0.02) as consumer:
        await eventually(lambda: consumer.snapshot().finished == 50, timeout=10, what="every message",
                         progress=lambda: consumer.snapshot().finished)
        assert calls[bodies[10]] == 2 and consumer.snapshot().requeued == 0
        assert consumer.held is not None and consumer.held.charged == 0 and consumer.held.tries == 1
        assert consumer._readiness is not None and consumer._readiness.holds == 0  # never held


async def test_the_blocking_facade_holds_with_the_defaults_and_gives_nothing_up(nsqd: Any) -> None:
    from fastnsq.sync import Consumer as BlockingConsumer

    topic = unique("held")
    bodies = await publish(nsqd.tcp_address, topic, 40)
    up = threading.Event()
    failures: list[int] = []
    done: list[tuple[bytes, int]] = []

    def handle(message: Message) -> None:
        if not up.is_set():
            failures.append(message.attempts)
            raise ConnectionRefusedError("the database is down")
        done.append((bytes(message.body), message.attempts))

    consumer = BlockingConsumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, workers=4,
                                max_attempts=2, ready_check_interval=0.02)

    def blocking() -> Any:
        runner = threading.Thread(target=consumer.run)
        runner.start()
        while len(failures) < 40 or not consumer.snapshot().holding:
            threading.Event().wait(0.01)
        held = consumer.snapshot()
        up.set()
        while len(done) < len(bodies):
            threading.Event().wait(0.01)
        consumer.stop()
        runner.join(10)
        return held, consumer.snapshot()

    held, final = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, blocking), 60)
    assert held.holding == 1 and held.requeued == 0 and set(failures) == {1}
    assert sorted(done) == [(body, 1) for body in bodies] and final.given_up == 0 and final.requeued == 0


async def test_the_outage_is_one_warning_in_and_one_line_out_without_a_traceback(
        nsqd: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("held")
    dependency = Dependency()
    await dependency.up()
    await dependency.down()
    await publish(nsqd.tcp_address, topic, 30)
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

    with caplog.at_level(logging.INFO, logger="fastnsq"):
        async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=10,
                            ready_check_interval=0.02) as consumer:
            await eventually(lambda: consumer.holding and failures >= 20, timeout=10, what="the hold",
                             progress=lambda: failures)
            await dependency.up()
            await eventually(lambda: len(done) == 30, timeout=20, what="the flow after the return",
                             progress=lambda: len(done))
    messages = [r.getMessage() for r in caplog.records]
    held = [m for m in messages if "not ready (the failed message's handler again: ConnectionRefusedError" in m]
    back = [m for m in messages if "ready again after" in m]
    assert len(held) == 1 and len(back) == 1, messages
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None for r in warnings)
    assert len([m for m in messages if "handler failed on message" in m]) <= 1, messages
    await dependency.down()
