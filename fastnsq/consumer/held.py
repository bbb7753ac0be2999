"""A handler's failed messages, held and retried in-process (``hold_failed``, the default).

The rule, the worker's for batches applied to messages: a failure is charged to a message (a
REQ, one of nsqd's attempts towards ``max_attempts`` and the dead letter) only when something
succeeded beside it. A message whose handler failed is not requeued: it is held (TOUCHed, in
flight in nsqd) and its handler is called again every ``ready_check_interval`` (0.25 s).

- A lone failure (a success came since the last one): the traffic goes on beside it; if it
  fails again after other messages succeeded, it is charged (REQ with the usual delay).
- A second failure with no success between them, or no room left for another message: the
  failures are a dependency's. The consumer holds (RDY 0, the held messages' retry is its
  ``ready_check``): each round retries the oldest :data:`TRIES_PER_ROUND` messages; the first
  that succeeds ends the hold at once (full ``max_in_flight``) and the rest are retried then.
- A poison message while holding: now and then (after :data:`FIRST_PROBE` s, doubling up to
  :data:`MAX_PROBE`) one fresh message is let in beside the held ones; its success shows the
  held failures are their own, and they are charged. A probe that brings nothing (the channel
  has nothing else) charges the oldest held message: it comes again after its requeue delay.
- Held :data:`HOLD_LIMIT` s: charged anyway (nsqd's ``--max-msg-timeout``, 15 min by default,
  bounds what TOUCH can extend). The consumer's stop requeues what is held.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..config import LoggerLike

__all__ = ["FIRST_PROBE", "HOLD_LIMIT", "MAX_PROBE", "TRIES_PER_ROUND", "HeldMessages", "probe_one"]

#: Held messages retried per round while the consumer holds (a dependency down costs this many calls).
TRIES_PER_ROUND = 4
#: Seconds of holding before a fresh message is let in beside the held ones, doubling up to MAX_PROBE.
FIRST_PROBE = 1.0
MAX_PROBE = 30.0
#: Seconds a message is held before its failure is charged anyway.
HOLD_LIMIT = 600.0


@dataclass
class _Held:
    successes: int  # the consumer's successes when it failed: more since, and its next failure is its own
    since: float = field(default_factory=time.monotonic)


class HeldMessages:
    """The consumer's held failures; :meth:`retry` is its ``ready_check`` while it holds."""

    def __init__(
        self,
        call: Callable[[Any], Awaitable[BaseException | None]],
        successes: Callable[[], int],
        received: Callable[[], int],
        room: Callable[[], int],
        probe: Callable[[], bool],
        msg_timeout: Callable[[], float],
        interval: float,
        log: LoggerLike,
    ) -> None:
        self._call = call  # the handler again: its error, or None when it succeeded
        self._successes = successes  # messages finished by the consumer so far
        self._received = received  # messages received by the consumer so far
        self._probed_at: int | None = None  # received() when the last probe was sent
        self._probe_mark: int | None = None  # successes() then: more since, and the probe succeeded
        self._room = room  # max_in_flight: held messages beyond it leave no room for another
        self._probe = probe  # RDY for one fresh message beside the held ones; False: no connection
        self._msg_timeout = msg_timeout
        self._interval = interval
        self._log = log
        self._held: dict[Any, _Held] = {}
        self._round: asyncio.Task[BaseException | None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._last_failure_at = -1  # successes() at the last failure (-1: none yet)
        self._next_touch = 0.0
        self._last_probe = 0.0
        self._probe_wait = FIRST_PROBE
        #: The consumer holds (RDY 0) for these messages: from the failure that began it to a success.
        self.holding = False
        #: Holds the consumer (its Readiness.failed); set by the consumer.
        self.hold: Callable[[], None] = lambda: None
        #: Messages charged (REQ): failed again beside a success, or held past HOLD_LIMIT.
        self.charged = 0
        #: Handler calls on held messages.
        self.tries = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, message: object) -> bool:
        return message in self._held

    def holds_next(self) -> bool:
        """Whether a failure now holds the consumer (or it holds already): the hold's line says why."""
        return self.holding or self._successes() == self._last_failure_at or len(self._held) + 1 >= self._room()

    def add(self, message: Any) -> None:
        """A handler failed on ``message`` (unanswered): held; the consumer holds on a second
        failure with no success between them, or when the held messages fill max_in_flight."""
        now = self._successes()
        consecutive = now == self._last_failure_at
        self._last_failure_at = now
        self._held[message] = _Held(now)
        if self.holding:
            return
        if consecutive or len(self._held) >= self._room():
            self._hold()
        elif self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def _hold(self) -> None:
        self.holding, self._last_probe, self._probe_wait = True, time.monotonic(), FIRST_PROBE
        self._probed_at = self._probe_mark = None
        self.hold()

    async def retry(self) -> None:
        """The consumer's ready_check: the oldest held messages again; raise while they all fail."""
        # Shielded: the check's timeout must not cancel a round halfway (the next check awaits it).
        error = await asyncio.shield(self._start_round(TRIES_PER_ROUND))
        if error is None:
            self.holding = False
            if self._held:
                self._start_round(None, proven=True)  # the rest, now that something passes: what fails is charged
            return
        if time.monotonic() - self._last_probe >= self._probe_wait:
            self._next_probe()
        raise error

    def _next_probe(self) -> None:
        """One fresh message beside the held ones. When the last probe brought none (the channel has
        nothing else: no success can tell a poison message from an outage), the oldest held message is
        charged: it goes back to nsqd and comes again after its requeue delay."""
        if self._probed_at is not None and self._received() == self._probed_at and self._held:
            self._charge(next(iter(self._held)))
        self._probed_at = self._received() if self._probe() else None
        self._probe_mark = self._successes() if self._probed_at is not None else None
        self._last_probe, self._probe_wait = time.monotonic(), min(MAX_PROBE, 2 * self._probe_wait)

    def release(self) -> None:
        """The consumer stops: what is held goes back to nsqd now (REQ without delay)."""
        for task in (self._round, self._keeper):
            if task is not None:
                task.cancel()
        held, self._held, self.holding = self._held, {}, False
        for message in held:
            if not message.has_responded:
                message.requeue(0, backoff=False)

    async def _keep(self) -> None:
        """Lone failures, the traffic going on beside them: retried at the check's pace."""
        while self._held and not self.holding:
            await asyncio.sleep(self._interval)
            if not self.holding and await asyncio.shield(self._start_round(None)) is not None:
                self._hold()  # failed again with no success since: a dependency, not the message

    def _start_round(self, tries: int | None, proven: bool = False) -> asyncio.Task[BaseException | None]:
        """The round running, else a new one: a message is never retried twice at once."""
        if self._round is None or self._round.done():
            self._round = asyncio.get_running_loop().create_task(self._retry_round(tries, proven))
        return self._round

    async def _retry_round(self, tries: int | None, proven: bool) -> BaseException | None:
        """Retry ``tries`` held messages (None: all); None when one succeeded (or none is held),
        else the last error. A failure that a success shows to be the message's own is charged
        (``proven``: a retry just succeeded)."""
        self._touch_due()
        error: BaseException | None = None
        passed, calls = False, 0
        for message in list(self._held):
            held = self._held.get(message)
            if held is None:
                continue
            if message.has_responded or _connection_closed(message):
                del self._held[message]  # answered by the handler, or nsqd gives it out again
                continue
            if tries is not None and calls == tries:
                break
            calls += 1
            self.tries += 1
            failure = await self._call(message)
            if failure is None:
                del self._held[message]
                if not message.has_responded and message.auto_response:
                    message.finish()
                passed = proven = True
            elif proven or self._proven(held) or time.monotonic() - held.since >= HOLD_LIMIT:
                self._charge(message)
            else:
                error = failure
        return None if passed or not self._held else error

    def _proven(self, held: _Held) -> bool:
        """Whether a success shows a failure to be the message's own. While the consumer holds only
        the probe's counts (a handler that began before the outage and ended after it proves
        nothing: 99 of 200 in flight were charged so); else any success since it failed."""
        if self.holding:
            return self._probe_mark is not None and self._successes() > self._probe_mark
        return self._successes() > held.successes

    def _charge(self, message: Any) -> None:
        del self._held[message]
        if not message.has_responded:
            self.charged += 1
            message.requeue(backoff=False)  # its own failure: one attempt, the usual delay

    def _touch_due(self) -> None:
        """TOUCH what is held every third of msg_timeout: nsqd must not give it out meanwhile."""
        now = time.monotonic()
        if now < self._next_touch:
            return
        self._next_touch = now + self._msg_timeout() / 3
        for message in self._held:
            if not message.has_responded and not _connection_closed(message):
                message.touch()


def _connection_closed(message: Any) -> bool:
    link = getattr(message, "delegate", None)
    return bool(getattr(link, "closed", False))


def probe_one(links: Iterable[Any]) -> bool:
    """RDY for one fresh message beside what a connection of the consumer holds (False: none open)."""
    open_links = [link for link in links if not link.closed and link.conn.is_open]
    if open_links:
        link = random.choice(open_links)
        link.conn.rdy(len(link.in_flight) + 1)
    return bool(open_links)
