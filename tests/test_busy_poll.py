"""A lone publish's loop polls for the answer a while before it sleeps (fastnsq/producer/busy_poll.py,
issue 62): the window's rule, what the poll hands back, and which of the producer's waits poll."""

from __future__ import annotations

import asyncio

import pytest

from fastnsq import InvalidValueError, Producer
from fastnsq.errors import ServerError
from fastnsq.producer.busy_poll import GROW_START, BusyPoll

from .helpers import unique

LIMIT = 200e-6


@pytest.mark.parametrize("window, waited, after", [
    (0.0, 80e-6, GROW_START),  # asleep, but the answer came within the limit: start polling
    (GROW_START, 80e-6, 2 * GROW_START),  # came after the window, within the limit: wider
    (160e-6, 190e-6, LIMIT),  # never past the limit
    (160e-6, 300e-6, 80e-6),  # slower than the limit: narrower
    (GROW_START * 1.5, 1.0, 0.0),  # narrower than GROW_START: no polling
    (0.0, 1.0, 0.0),
])
def test_the_window_widens_for_answers_within_the_limit_and_narrows_for_slower(window, waited, after):
    poll = BusyPoll(LIMIT)
    poll.adapt(waited, window)
    assert poll.window == pytest.approx(after)


def test_no_window_when_the_option_is_zero():
    poll = BusyPoll(0.0)
    poll.adapt(1e-6, 0.0)
    assert poll.window == 0.0


async def answered_after(future: asyncio.Future, passes: int, passed: list[int], error: Exception | None = None):
    for _ in range(passes):
        await asyncio.sleep(0)
        passed.append(1)
    if error is None:
        future.set_result(b"OK")
    else:
        future.set_exception(error)


async def test_an_answer_that_comes_while_polling_is_returned_and_other_tasks_ran_meanwhile():
    poll = BusyPoll(LIMIT)
    poll.window = 3600.0  # the answer comes within the window, however slow the machine
    future = asyncio.get_running_loop().create_future()
    passed: list[int] = []
    other = asyncio.ensure_future(answered_after(future, 5, passed))
    assert await poll.answer(future) == b"OK"
    assert len(passed) == 5 and (poll.polled, poll.slept) == (1, 0)
    assert poll.window == 3600.0  # an answer within the window leaves it as it is
    await other


async def test_a_refusal_that_comes_while_polling_is_raised():
    poll = BusyPoll(LIMIT)
    poll.window = 3600.0
    future = asyncio.get_running_loop().create_future()
    other = asyncio.ensure_future(answered_after(future, 3, [], ServerError("E_BAD_TOPIC", "bad topic")))
    with pytest.raises(ServerError, match="E_BAD_TOPIC"):
        await poll.answer(future)
    await other


async def test_a_call_cancelled_while_polling_cancels_its_answer_as_await_would():
    poll = BusyPoll(LIMIT)
    poll.window = 3600.0
    future = asyncio.get_running_loop().create_future()
    call = asyncio.ensure_future(poll.answer(future))
    for _ in range(3):
        await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert future.cancelled()


async def test_with_no_window_the_answer_is_awaited_asleep_and_counted():
    poll = BusyPoll(0.0)
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, future.set_result, b"OK")
    assert await poll.answer(future) == b"OK"
    assert (poll.polled, poll.slept, poll.window) == (0, 1, 0.0)


@pytest.mark.parametrize("busy_poll", [0.0, 0.0002])
async def test_only_the_lone_publishes_wait_through_the_poll(nsqd, busy_poll):
    """Each lone publish and mpublish (nothing else of the producer unanswered) is counted once,
    polled or asleep; publishes made beside others wait as before (their loop has work)."""
    topic = unique("poll")
    async with Producer([nsqd.tcp_address], busy_poll=busy_poll, coalesce=False) as producer:
        await producer.publish(topic, b"first")  # the slow path: checks the topic
        poll = producer._busy_poll
        counted = poll.polled + poll.slept
        for index in range(30):
            await producer.publish(topic, b"lone %d" % index)
        await producer.mpublish(topic, [b"a", b"b"])
        assert poll.polled + poll.slept == counted + 31
        await asyncio.gather(*(producer.publish(topic, b"many %d" % index) for index in range(50)))
        assert poll.polled + poll.slept <= counted + 31 + 1  # at most the first of the 50, then alone
        if busy_poll == 0.0:
            assert poll.polled == 0 and poll.window == 0.0


@pytest.mark.parametrize("value", [-0.001, 0.5])
def test_the_option_is_checked_by_name(value):
    with pytest.raises(InvalidValueError, match="busy_poll"):
        Producer(["127.0.0.1:4150"], busy_poll=value)
