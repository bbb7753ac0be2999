"""Busy polling for a lone publish's answer: the loop keeps polling a while instead of sleeping.

One task publishing in a loop (a script, a migration, a backfill) waits for each answer in turn.
When the loop sleeps in epoll meanwhile, nsqd's answer has to wake the thread, and on an idle VM
that wake-up costs more than nsqd's work: issue 62 measured one task at 10,300 msg/s sleeping and
16,000-22,000 polling (real nsqd 1.3.0, 2-core KVM guest), where go-nsq's one goroutine, whose
scheduler spins before it parks, made 12,200-13,700. So for up to ``busy_poll`` the task yields to
the loop, whose every pass then polls its sockets without sleeping (other tasks run as usual), and
then awaits the answer as before.

On a busy machine it is the other way round: a CPU that never idles wakes a sleeper at once, and the
kernel runs a woken sleeper before a CPU hog, which a polling loop is. With two CPU-bound processes
beside it the same task made 23,900-27,700 msg/s sleeping and 10,700-11,700 polling. So both ways
are timed: the answers' round trips from the write (clamped at :data:`CLAMP`), the other way tried
for :data:`TRIAL` answers, and the faster kept, polling only when it is :data:`POLL_GAIN` faster
(it costs CPU). A trial that confirms the way taken doubles the answers until the next (from
:data:`TRIAL_EVERY` up to :data:`MAX_TRIAL_EVERY`); one that changes it starts them over.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

__all__ = ["CLAMP", "FIRST_TRIAL", "MAX_TRIAL_EVERY", "POLL_GAIN", "TRIAL", "TRIAL_EVERY", "BusyPoll"]

#: Answers between two trials of the way not taken, at first and at most, and the answers of a trial.
TRIAL_EVERY = 256
MAX_TRIAL_EVERY = 4096
TRIAL = 32
#: The first trial comes after this many answers: a slow way is not kept long.
FIRST_TRIAL = 64
#: Polling is kept only when its round trips take at most this share of the sleeping ones.
POLL_GAIN = 0.9
#: A round trip counts at most this long (seconds): one stall (a GC pass, a descheduled
#: thread) does not condemn a way for long.
CLAMP = 0.002


class BusyPoll:
    """How one producer's lone publishes wait: ``limit`` is the option ``busy_poll`` (seconds,
    0: never poll). ``polled`` and ``slept`` count the answers that came while polling and those
    awaited asleep; ``polling`` is the way taken now; ``round_trips`` the mean round trips
    (seconds, asleep and polling) the last trial compared."""

    __slots__ = ("_answers", "_counts", "_sums", "_trial_left", "limit", "polled", "polling", "round_trips",
                 "slept", "trial_every")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.polling = limit > 0
        self.round_trips = (0.0, 0.0)
        self.trial_every = TRIAL_EVERY
        self.polled = 0
        self.slept = 0
        self._sums = [0.0, 0.0]  # since the last trial ended: [asleep, polling]
        self._counts = [0, 0]
        self._answers = TRIAL_EVERY - FIRST_TRIAL
        self._trial_left = 0

    async def answer(self, future: asyncio.Future[Any]) -> Any:
        """``future``'s result (or its exception), polled for first when polling is the way."""
        began = perf_counter()
        polling = self.polling
        if polling:
            end = began + self.limit
            try:
                while not future.done() and perf_counter() < end:
                    await asyncio.sleep(0)  # one loop pass: its poll of the sockets does not sleep
            except asyncio.CancelledError:
                future.cancel()  # as a cancelled ``await future`` would
                raise
            if future.done():
                self.polled += 1
                result = future.result()
                self.timed(True, perf_counter() - began)
                return result
        result = await future
        self.slept += 1
        self.timed(polling, perf_counter() - began)
        return result

    def timed(self, polling: bool, round_trip: float) -> None:
        """One answer ``round_trip`` seconds after its write, waited for polling or not."""
        self._sums[polling] += min(round_trip, CLAMP)
        self._counts[polling] += 1
        if not self.limit:
            return
        if self._trial_left:
            self._trial_left -= 1
            if not self._trial_left:
                self._choose(tried=polling)
            return
        self._answers += 1
        if self._answers >= self.trial_every:
            self._answers = 0
            self._trial_left = TRIAL
            self.polling = not self.polling

    def _choose(self, tried: bool) -> None:
        """After a trial of the way ``tried``: the faster of the two."""
        asleep, polled = (total / max(count, 1) for total, count in zip(self._sums, self._counts))
        self.round_trips = (asleep, polled)
        self.polling = polled < asleep * POLL_GAIN
        confirmed = self.polling != tried
        self.trial_every = min(self.trial_every * 2, MAX_TRIAL_EVERY) if confirmed else TRIAL_EVERY
        self._sums = [0.0, 0.0]
        self._counts = [0, 0]
