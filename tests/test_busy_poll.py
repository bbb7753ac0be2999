"""A lone publish's loop polls for the answer a while before it sleeps (fastnsq/producer/busy_poll.py,
issue 62): which way is kept, what the poll hands back, and which of the producer's waits poll."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from fastnsq import InvalidValueError, Producer
from fastnsq.errors import ServerError
from fastnsq.producer.busy_poll import (
    CLAMP,
    FIRST_TRIAL,
    MAX_TRIAL_EVERY,
    POLL_GAIN,
    TRIAL,
    TRIAL_EVERY,
    BusyPoll,
)

from .helpers import unique

LIMIT = 200e-6


def time_answers(poll: BusyPoll, asleep: float, polling: float, answers: int) -> list[bool]:
    """``answers`` answers, each taking the round trip of the way the poll takes; the ways taken."""
    ways = []
    for _ in range(answers):
        ways.append(poll.polling)
        poll.timed(poll.polling, polling if poll.polling else asleep)
    return ways


def trials(ways: list[bool]) -> list[tuple[bool, int]]:
    """The runs of one way: (way, answers)."""
    return [(way, len(list(run))) for way, run in itertools.groupby(ways)]


def test_polling_is_kept_while_it_is_the_faster_way_and_the_trials_grow_rarer():
    poll = BusyPoll(LIMIT)
    runs = trials(time_answers(poll, asleep=100e-6, polling=45e-6, answers=20_000))
    assert runs[:4] == [(True, FIRST_TRIAL), (False, TRIAL), (True, 2 * TRIAL_EVERY), (False, TRIAL)]
    assert all(answers == TRIAL for way, answers in runs if not way)  # asleep only in trials
    assert max(answers for way, answers in runs if way) == MAX_TRIAL_EVERY
    assert poll.round_trips == (pytest.approx(100e-6), pytest.approx(45e-6))


def test_a_busy_machine_where_sleeping_is_faster_sleeps_and_tries_polling_now_and_then():
    poll = BusyPoll(LIMIT)
    runs = trials(time_answers(poll, asleep=40e-6, polling=90e-6, answers=20_000))
    # the first trial (asleep) changes the way: the next trial comes TRIAL_EVERY later, then later still
    assert runs[:4] == [(True, FIRST_TRIAL), (False, TRIAL + TRIAL_EVERY), (True, TRIAL), (False, 2 * TRIAL_EVERY)]
    assert all(answers == TRIAL for way, answers in runs[1:] if way)


def test_the_faster_way_is_found_again_when_the_machine_changes():
    poll = BusyPoll(LIMIT)
    time_answers(poll, asleep=100e-6, polling=45e-6, answers=20_000)  # idle: polling, trials rare
    ways = time_answers(poll, asleep=40e-6, polling=90e-6, answers=2 * (MAX_TRIAL_EVERY + TRIAL))  # busy now
    assert ways[-TRIAL_EVERY:] == [False] * TRIAL_EVERY


def test_polling_only_a_little_faster_is_not_worth_its_cpu():
    poll = BusyPoll(LIMIT)
    time_answers(poll, asleep=50e-6, polling=50e-6 * (POLL_GAIN + 0.05), answers=FIRST_TRIAL + TRIAL)
    assert poll.polling is False


def test_one_stall_counts_as_clamp():
    poll = BusyPoll(LIMIT)
    time_answers(poll, asleep=100e-6, polling=45e-6, answers=FIRST_TRIAL - 1)
    poll.timed(True, 5.0)  # the last answer before the trial: the mean of 64, one of them stalled
    time_answers(poll, asleep=100e-6, polling=45e-6, answers=TRIAL)
    assert poll.round_trips[1] == pytest.approx((45e-6 * (FIRST_TRIAL - 1) + CLAMP) / FIRST_TRIAL)


def test_no_polling_and_no_trials_when_the_option_is_zero():
    poll = BusyPoll(0.0)
    assert time_answers(poll, asleep=100e-6, polling=1e-6, answers=3 * TRIAL_EVERY) == [False] * 3 * TRIAL_EVERY


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
    poll.limit = 3600.0  # the answer comes while polling, however slow the machine
    future = asyncio.get_running_loop().create_future()
    passed: list[int] = []
    other = asyncio.ensure_future(answered_after(future, 5, passed))
    assert await poll.answer(future) == b"OK"
    assert len(passed) == 5 and (poll.polled, poll.slept) == (1, 0)
    await other


async def test_a_refusal_that_comes_while_polling_is_raised():
    poll = BusyPoll(LIMIT)
    poll.limit = 3600.0
    future = asyncio.get_running_loop().create_future()
    other = asyncio.ensure_future(answered_after(future, 3, [], ServerError("E_BAD_TOPIC", "bad topic")))
    with pytest.raises(ServerError, match="E_BAD_TOPIC"):
        await poll.answer(future)
    await other


async def test_a_call_cancelled_while_polling_cancels_its_answer_as_await_would():
    poll = BusyPoll(LIMIT)
    poll.limit = 3600.0
    future = asyncio.get_running_loop().create_future()
    call = asyncio.ensure_future(poll.answer(future))
    for _ in range(3):
        await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert future.cancelled()


async def test_without_polling_the_answer_is_awaited_asleep_and_counted():
    poll = BusyPoll(0.0)
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, future.set_result, b"OK")
    assert await poll.answer(future) == b"OK"
    assert (poll.polled, poll.slept, poll.polling) == (0, 1, False)


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
            assert poll.polled == 0 and poll.polling is False


@pytest.mark.parametrize("value", [-0.001, 0.5])
def test_the_option_is_checked_by_name(value):
    with pytest.raises(InvalidValueError, match="busy_poll"):
        Producer(["127.0.0.1:4150"], busy_poll=value)
