"""What the clients log says what happened: no ``None`` where a reason belongs (issue 36); a handler's
failure in one line, backoff, and a connection back (issue 47)."""

from __future__ import annotations

import logging
import re

import pytest

from fastnsq import Consumer, Message, Producer
from fastnsq.testing import NSQD
from fastnsq.testing.proxy import FaultProxy

from .helpers import Slack, eventually, unique


def lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lost" in r.getMessage() and "reconnecting" in r.getMessage()]


async def test_a_connection_the_server_closed_is_logged_as_such(caplog: pytest.LogCaptureFixture) -> None:
    """nsqd closing the connection (EOF, no error) was logged as ``lost (None)``."""
    nsqd = NSQD()
    await nsqd.start()
    try:
        async with Producer([nsqd.tcp_address], reconnect_delay=60) as producer:
            await producer.publish(unique("log"), b"one")
            with caplog.at_level(logging.INFO, logger="fastnsq"):
                await nsqd.stop()  # closes its clients' connections cleanly
                await eventually(lambda: lost_lines(caplog), timeout=5, what="the lost connection's line")
    finally:
        await nsqd.stop()
    assert lost_lines(caplog) == [f"connection to {nsqd.tcp_address} lost (closed by the server); reconnecting"]


async def test_a_connection_reset_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    async with NSQD() as nsqd, FaultProxy(nsqd.tcp_address) as proxy:
        address = proxy.address
        async with Producer([address], reconnect_delay=60) as producer:
            await producer.publish(unique("log"), b"one")
            with caplog.at_level(logging.INFO, logger="fastnsq"):
                proxy.cut()  # an RST: the reason is the socket's error
                await eventually(lambda: lost_lines(caplog), timeout=5, what="the lost connection's line")
    (line,) = lost_lines(caplog)
    assert line.startswith(f"connection to {address} lost (") and "None" not in line and "()" not in line, line


# ---- issue 47: the story of a consumer in its log -------------------------------------------------


def records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


async def test_a_failing_handler_is_one_warning_line_with_its_traceback_at_debug(
        caplog: pytest.LogCaptureFixture) -> None:
    """A raising handler logged an ERROR with a full traceback per failure (75 tracebacks for 500
    messages failing 10 %); now one WARNING line names the message, its attempts and the error."""
    topic = unique("log")
    async with NSQD() as nsqd:
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.publish(topic, b"poison")

        def handle(message: Message) -> None:
            raise ValueError(f"cannot parse {message.body!r}")

        with caplog.at_level(logging.DEBUG, logger="fastnsq"):
            async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle,
                                max_attempts=2, default_requeue_delay=0, max_backoff_duration=0,
                                hold_failed=False) as consumer:
                await eventually(lambda: consumer.snapshot().given_up == 1, what="the give-up")
    failures = records(caplog, "handler failed on message")
    assert [r.levelno for r in failures] == [logging.WARNING, logging.WARNING]
    assert all(r.exc_info is None for r in failures)  # no traceback at WARNING
    first, second = (r.getMessage() for r in failures)
    assert re.fullmatch(r"handler failed on message [0-9a-f]{16} \(attempt 1 of 2\): "
                        r"ValueError: cannot parse b'poison'; requeueing", first), first
    assert "(attempt 2 of 2)" in second
    tracebacks = records(caplog, "the handler's traceback for message")
    assert [r.levelno for r in tracebacks] == [logging.DEBUG, logging.DEBUG]
    assert all(r.exc_info is not None and r.exc_info[0] is ValueError for r in tracebacks)
    assert records(caplog, "gave up on message")[0].levelno == logging.WARNING


async def test_backoff_is_logged_at_info_with_its_duration(caplog: pytest.LogCaptureFixture) -> None:
    """Backoff was never logged, at any level (pynsq logs "backing off for X seconds" at INFO)."""
    topic = unique("log")
    async with NSQD() as nsqd:
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.mpublish(topic, [b"fail", b"ok", b"ok"])

        def handle(message: Message) -> None:
            if message.body == b"fail" and message.attempts == 1:
                message.requeue(0)  # with backoff, without a traceback
        with caplog.at_level(logging.INFO, logger="fastnsq"):
            async with Slack() as slack, \
                    Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle,
                             backoff_strategy="linear", backoff_multiplier=0.2, max_backoff_duration=8,
                             max_in_flight=1) as consumer:
                await eventually(lambda: consumer.snapshot().finished == 3, what="every message finished")
                await eventually(lambda: records(caplog, "backoff over"), what="the end of the backoff")
    (began,) = records(caplog, "backing off for")
    assert began.levelno == logging.INFO
    assert began.getMessage() == f"{topic}/c: backing off for 0.20 s (backoff level 1): a handler failed"
    (over,) = records(caplog, "backoff over")
    assert over.levelno == logging.INFO
    seconds = float(re.search(r"after ([0-9.]+) s", over.getMessage()).group(1))  # type: ignore[union-attr]
    # The 0.2 s wait and its probe, in seconds: plus the slack measured meanwhile (not level 8's wait).
    assert 0.2 <= seconds < 0.2 + slack.allowance(0.3), (over.getMessage(), slack)


async def test_a_step_down_after_a_success_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A success lowers the backoff level one step, with a wait of its own: that wait's line said
    "a handler failed" after a handler that had just succeeded (issue 58)."""
    topic = unique("log")
    async with NSQD() as nsqd:
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.mpublish(topic, [b"a", b"b", b"c", b"d"])
        calls = 0

        def handle(message: Message) -> None:
            nonlocal calls
            calls += 1
            if calls <= 2:
                message.requeue(0)  # the first two fail (levels 1 and 2), the probes after succeed
        with caplog.at_level(logging.INFO, logger="fastnsq"):
            async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle,
                                backoff_strategy="linear", backoff_multiplier=0.1, max_backoff_duration=8,
                                max_in_flight=1) as consumer:
                await eventually(lambda: consumer.snapshot().finished == 4, what="every message finished")
                await eventually(lambda: records(caplog, "backoff over"), what="the end of the backoff")
    reasons = [r.getMessage().rpartition("): ")[2] for r in records(caplog, "backing off for")]
    assert reasons[:2] == ["a handler failed", "a handler failed"], reasons
    assert reasons[2:] and all(why == "a handler succeeded, one level down" for why in reasons[2:]), reasons


async def test_a_connection_back_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """The producer logged a lost connection but never that it was back; the consumer neither."""
    topic = unique("log")
    async with NSQD() as nsqd, FaultProxy(nsqd.tcp_address) as proxy:
        address = proxy.address
        received: list[bytes] = []
        async with Producer([address], reconnect_delay=0.05) as producer, \
                Consumer(topic, "c", nsqd_tcp_addresses=[address], handler=lambda m: received.append(m.body),
                         reconnect_delay=0.05) as consumer:
            await producer.publish(topic, b"one")
            with caplog.at_level(logging.INFO, logger="fastnsq"):
                proxy.cut()
                await eventually(lambda: len(records(caplog, "re-established")) == 2 and consumer.reconnects == 1,
                                 what="both connections back")
            await producer.publish(topic, b"two")
            await eventually(lambda: len(received) == 2, what="the message published after the cut")
    lines = sorted((r.getMessage() for r in records(caplog, "re-established")), key=lambda line: "consuming" in line)
    assert all(r.levelno == logging.INFO for r in records(caplog, "re-established"))
    assert re.fullmatch(rf"connection to {address} re-established after [0-9.]+ s", lines[0]), lines  # the producer
    assert re.fullmatch(rf"connection to {address} re-established after [0-9.]+ s: consuming {topic}/c again",
                        lines[1]), lines
