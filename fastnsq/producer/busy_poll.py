"""Busy polling for a lone publish's answer: the loop keeps polling a while before it sleeps.

One task publishing in a loop (a script, a migration, a backfill) waits for each answer in turn.
When the loop sleeps in epoll meanwhile, nsqd's answer has to wake the thread, and on a VM the
wake-up of an idle CPU costs more than nsqd's work: issue 62 measured one task at 10,300 msg/s
sleeping and 16,000-22,000 polling (real nsqd 1.3.0, 2-core KVM guest), where go-nsq's one
goroutine, whose scheduler spins before it parks, made 12,200-13,700. So while the window lasts the
task yields to the loop, whose every pass then polls its sockets without sleeping, and other tasks
run as usual; then it awaits the answer as before.

The window adapts as Linux's haltpoll governor adapts its own (cpuidle-haltpoll): an answer that
came after the window but within ``busy_poll`` doubles it (from :data:`GROW_START`); one slower than
``busy_poll`` halves it, to none below :data:`GROW_START`. A slow nsqd, a long link or a busy
machine so costs no CPU spent polling in vain, and a fast answer stops the polling at once.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

__all__ = ["GROW_START", "BusyPoll"]

#: The window a widening starts from, and the narrowest kept (seconds).
GROW_START = 20e-6


class BusyPoll:
    """The adaptive window of one producer's lone publishes; ``limit`` is the option ``busy_poll``
    (seconds, 0: never poll). ``polled`` and ``slept`` count the answers that came while polling and
    those awaited asleep."""

    __slots__ = ("limit", "polled", "slept", "window")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.window = min(GROW_START, limit)
        self.polled = 0
        self.slept = 0

    async def answer(self, future: asyncio.Future[Any]) -> Any:
        """``future``'s result (or its exception), polled for up to the window first."""
        began = perf_counter()
        window = self.window
        if window:
            end = began + window
            try:
                while not future.done():
                    if perf_counter() >= end:
                        break
                    await asyncio.sleep(0)  # one loop pass: its poll of the sockets does not sleep
                else:
                    self.polled += 1
                    return future.result()
            except asyncio.CancelledError:
                future.cancel()  # as a cancelled ``await future`` would
                raise
        result = await future
        self.slept += 1
        self.adapt(perf_counter() - began, window)
        return result

    def adapt(self, waited: float, window: float) -> None:
        """After an answer that came ``waited`` seconds after the write, past a ``window``."""
        if waited <= self.limit:
            self.window = min(max(window * 2, GROW_START), self.limit)
        else:
            narrower = window / 2
            self.window = narrower if narrower >= GROW_START else 0.0
