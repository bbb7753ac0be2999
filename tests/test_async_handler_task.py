"""An async handler runs in a task of its own from its first step, on every Python.

Python 3.11 has no eager tasks, and its first step once ran inline, outside any task:
``asyncio.timeout()`` raised "Timeout should be used inside a task" there, and so did what is
built on it or on ``current_task()`` (asyncpg's connect, aiohttp's timeouts, anyio's cancel
scopes): such a handler failed on every delivery. Seen from a handler writing to PostgreSQL
with asyncpg after the database came back (the pool reconnecting in the handler's first step).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fastnsq import Consumer, Message

from .helpers import eventually, unique
from .test_dependency_outage import publish


async def test_asyncio_timeout_and_current_task_work_in_an_async_handlers_first_step(nsqd: Any) -> None:
    topic = unique("task")
    await publish(nsqd.tcp_address, topic, 20)
    seen: list[tuple[bool, bool]] = []
    errors: list[BaseException] = []

    async def handle(message: Message) -> None:
        task = asyncio.current_task()
        try:
            if hasattr(asyncio, "timeout"):  # 3.11+
                async with asyncio.timeout(5):  # type: ignore[attr-defined,unused-ignore]  # the first step
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(0)
        except BaseException as error:
            errors.append(error)
            raise
        seen.append((task is not None, task is asyncio.current_task()))  # the same task throughout

    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=5,
                        hold_failed=False) as consumer:
        await eventually(lambda: len(seen) == 20 or errors, timeout=20, what="every message",
                         progress=lambda: len(seen))
        assert errors == [] and seen == [(True, True)] * 20
        assert consumer.snapshot().requeued == 0


@pytest.mark.skipif(not hasattr(asyncio, "timeout"), reason="asyncio.timeout is 3.11+")
async def test_a_timeout_in_the_first_step_expires_as_a_timeout_error(nsqd: Any) -> None:
    """The timeout cancels the handler's own task and turns into TimeoutError inside it."""
    topic = unique("task")
    await publish(nsqd.tcp_address, topic, 1)
    outcome: list[str] = []

    async def handle(message: Message) -> None:
        try:
            async with asyncio.timeout(0.01):  # type: ignore[attr-defined,unused-ignore]
                await asyncio.sleep(30)
        except TimeoutError:
            outcome.append("timed out")

    async with Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle):
        await eventually(lambda: outcome, timeout=20, what="the timeout")
    assert outcome == ["timed out"]
