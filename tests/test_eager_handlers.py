"""The Python 3.11 path for async handlers: run inline first, get a task only when they await."""

from __future__ import annotations

import asyncio

import pytest

from fastnsq.consumer.dispatch import resume as _resume


async def start_eagerly(coro):
    """What the consumer does: first step inline, the rest in a task (or no task at all)."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return "inline", stop.value
    task = asyncio.get_running_loop().create_task(_resume(coro, yielded))
    return "task", task


async def test_a_coroutine_that_never_awaits_finishes_inline():
    async def handler():
        return 7

    assert await start_eagerly(handler()) == ("inline", 7)


async def test_awaits_sleeps_and_bare_yields_complete_in_a_task():
    async def handler():
        await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, 3)
        return await fut + 1

    kind, task = await start_eagerly(handler())
    assert kind == "task" and await task == 4


async def test_exceptions_of_awaited_futures_reach_the_coroutine():
    async def handler():
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_exception, KeyError("boom"))
        try:
            await fut
        except KeyError:
            return "caught"

    _, task = await start_eagerly(handler())
    assert await task == "caught"


async def test_an_error_raised_after_awaiting_fails_the_task():
    async def handler():
        await asyncio.sleep(0)
        raise ValueError("handler failed")

    _, task = await start_eagerly(handler())
    with pytest.raises(ValueError, match="handler failed"):
        await task


async def test_cancelling_the_task_throws_into_the_coroutine():
    cleaned = []

    async def handler():
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(True)

    _, task = await start_eagerly(handler())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


async def test_a_cancelled_inner_future_is_seen_by_the_coroutine():
    async def handler():
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.cancel)
        try:
            await fut
        except asyncio.CancelledError:
            return "inner cancelled"

    _, task = await start_eagerly(handler())
    assert await task == "inner cancelled"
