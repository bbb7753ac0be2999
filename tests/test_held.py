"""The worker's held batches (fastnsq/runner/held.py): a failure is charged to a message only
beside a success. Fake messages record their answers; the handler is a function of the batch."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from fastnsq.runner.held import MAX_PIECES, HeldBatches

from .helpers import eventually


class FakeMessage:
    def __init__(self, body: str) -> None:
        self.body = body
        self.answers: list[str] = []

    @property
    def has_responded(self) -> bool:
        return bool(self.answers)

    def finish(self) -> None:
        self.answers.append("FIN")

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        self.answers.append("REQ")

    def touch(self) -> None:
        pass


class FakeBatch(list[Any]):
    def finish(self) -> None:
        for message in self:
            if not message.has_responded:
                message.finish()


def messages(count: int, poison: frozenset[int] = frozenset()) -> FakeBatch:
    return FakeBatch(FakeMessage(f"poison-{i}" if i in poison else f"ok-{i}") for i in range(count))


def held_with(handler: Any) -> HeldBatches:
    async def run(batch: Any) -> None:
        handler(batch)

    return HeldBatches(run, lambda: 60.0, 3600.0, logging.getLogger("test"))


@pytest.fixture(autouse=True)
def finish_like_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Batch(...) of fake messages: FIN each not answered (what fastnsq's Batch.finish does).
    monkeypatch.setattr("fastnsq.runner.held.Batch", FakeBatch)


async def test_while_everything_fails_nothing_is_charged_and_the_first_success_ends_it() -> None:
    down = True
    calls: list[int] = []

    def handler(batch: Any) -> None:
        calls.append(len(batch))
        if down:
            raise ConnectionRefusedError("down")

    held = held_with(handler)
    batch = messages(400)
    assert held.add(batch, ConnectionRefusedError("down"))  # two halves failing: hold
    for _ in range(6):
        with pytest.raises(ConnectionRefusedError):
            await held.retry()
    # The pieces doubled each failing round, up to MAX_PIECES handler calls a round.
    assert calls[:2] == [200, 200] and calls[-MAX_PIECES:] == [400 // MAX_PIECES] * MAX_PIECES
    assert all(not m.answers for m in batch) and held.charged == 0
    down = False
    await held.retry()
    assert all(m.answers == ["FIN"] for m in batch) and len(held) == 0 and held.charged == 0


async def test_a_poison_message_is_charged_beside_the_others_that_succeed() -> None:
    def handler(batch: Any) -> None:
        if any(m.body.startswith("poison") for m in batch):
            raise ValueError("cannot parse")

    held = held_with(handler)
    batch = messages(100, poison=frozenset({37}))
    held.add(batch, ValueError("cannot parse"))
    await held.retry()
    assert [m.answers for m in batch if m.body.startswith("poison")] == [["REQ"]]
    assert all(m.answers == ["FIN"] for m in batch if m.body.startswith("ok"))
    assert held.charged == 1 and len(held) == 0
    assert held.tries <= 2 * 8  # halving: two calls a level, log2(100) levels


async def test_a_lone_failed_message_waits_for_a_success_beside_it() -> None:
    def handler(batch: Any) -> None:
        raise ValueError("cannot parse")

    held = held_with(handler)
    [poison] = batch = messages(1, poison=frozenset({0}))
    assert not held.add(batch, ValueError("cannot parse"))  # one message: no hold, traffic goes on
    with pytest.raises(ValueError):
        await held.retry()  # nothing succeeded since: not charged
    assert poison.answers == [] and len(held) == 1
    held.succeeded()  # another batch went through
    await eventually(lambda: poison.answers == ["REQ"], 5, "charged")
    assert held.charged == 1 and len(held) == 0


async def test_a_round_is_never_run_twice_at_once() -> None:
    release = asyncio.Event()
    running = 0
    most = 0

    async def run(batch: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1

    held = HeldBatches(run, lambda: 60.0, 3600.0, logging.getLogger("test"))
    held.add(messages(2), ValueError("x"))
    first = asyncio.ensure_future(held.retry())
    second = asyncio.ensure_future(held.retry())
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.gather(first, second)
    assert most == 1 and len(held) == 0


async def test_what_the_handler_answered_before_raising_is_not_held() -> None:
    held = held_with(lambda batch: None)
    batch = messages(4)
    batch[0].finish()  # the handler's own answer, then it raised
    assert held.add(batch, ValueError("x")) and len(held) == 3
    await held.retry()
    assert [m.answers for m in batch] == [["FIN"]] * 4  # one answer each
    answered = messages(1)
    answered[0].finish()
    assert not held.add(answered, ValueError("x")) and len(held) == 0
