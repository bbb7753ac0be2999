"""What the clients log says what happened (issue 36): no ``None`` where a reason belongs."""

from __future__ import annotations

import logging

import pytest

from fastnsq import Producer
from fastnsq.testing import NSQD
from fastnsq.testing.proxy import FaultProxy

from .helpers import eventually, unique


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
