"""The consumer's ``ready_check``: hold while what the handler needs is down, resume the moment it is back.

One job: after a handler failure, ask the user's check at once and then every
``ready_check_interval`` until it passes (a sync check runs in a thread). While it fails the
consumer holds: RDY 0 on every connection (no probe message spends an attempt), the messages
it already has are neither handed out (``batches()``, ``async for``) nor left to time out in
nsqd (TOUCHed every third of ``msg_timeout``, which nsqd allows up to its
``--max-msg-timeout``, 15 min by default). The first check that passes ends the hold and any
backoff at once: full ``max_in_flight``, not a level stepped down per success. A check that
passes at once (a poison message, not a dependency) costs one RDY 0 and one RDY back, and
no log line.

Log lines: one WARNING when the hold begins (the check's own error, type and text), one
INFO when it ends (how long it lasted); the check's other failures at DEBUG.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from ..config import LoggerLike
from ..errors import InvalidValueError
from .dispatch import is_async_callable

__all__ = ["Readiness", "check_name"]

#: A check that takes longer than this (or than four intervals) counts as failed: a connect
#: to a host that drops packets must not stretch the poll to the kernel's TCP timeout.
MIN_CHECK_TIMEOUT = 1.0


class Readiness:
    """The hold of one consumer: ``failed()`` after a handler failure, ``wait()`` before handing out."""

    def __init__(
        self,
        check: Callable[[], Any],
        interval: float,
        hold: Callable[[bool], None],
        touch_held: Callable[[], float],
        log: LoggerLike,
        where: str,
        what: str = "ready_check",
        release: Callable[[], None] | None = None,
    ) -> None:
        if not callable(check):
            raise InvalidValueError(f"ready_check must be a callable (sync or async) or None, got {check!r}")
        self._check = check
        self._interval = interval
        self._hold = hold
        self._touch_held = touch_held  # TOUCHes what the consumer holds; returns seconds until the next is due
        self._log = log
        self._where = where
        self._what = what  # what the log line names as the check
        self._release = release  # the consumer stops: what the check holds goes back
        self._task: asyncio.Task[None] | None = None
        self._failed_again = False
        self._ready = asyncio.Event()
        self._ready.set()
        #: RDY 0 and nothing handed out: from a failure until a check passes.
        self.holding = False
        #: A check failed and the hold goes on (what /readyz and the metrics show: a hold that a
        #: passing first check ends within milliseconds is no outage).
        self.not_ready = False
        #: Holds begun (counted once each), for the snapshot and the tests.
        self.holds = 0
        self.since: float | None = None

    def failed(self) -> None:
        """A handler failed (a REQ with backoff): hold and ask the check, unless already doing so."""
        if self._task is not None:
            self._failed_again = True  # a check passing now may predate this failure: ask once more
            return
        self.holding = True
        self._ready.clear()
        self.since = time.monotonic()
        self._hold(True)
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def wait(self) -> None:
        """Until the consumer is not holding."""
        if self.holding:
            await self._ready.wait()

    def cancel(self) -> None:
        """The consumer stops: no more checks (its stop requeues what it holds)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.holding = self.not_ready = False  # RDY stays 0: the consumer is stopping
        self._ready.set()
        if self._release is not None:
            self._release()

    async def _poll(self) -> None:
        started, told, next_touch = time.monotonic(), False, 0.0
        try:
            while True:
                self._failed_again = False
                error = await self._ask()
                if error is None and not self._failed_again:
                    break
                if error is None:
                    continue
                if not told:
                    told = self.not_ready = True
                    self.holds += 1
                    self._log.warning("%s: not ready (%s: %s: %s): holding at RDY 0, checking every %.2f s",
                                      self._where, self._what, type(error).__name__, error, self._interval)
                else:
                    self._log.debug("%s: still not ready: %s: %s", self._where, type(error).__name__, error)
                if time.monotonic() >= next_touch:
                    next_touch = time.monotonic() + self._touch_held()
                await asyncio.sleep(self._interval)
        except asyncio.CancelledError:
            self._ready.set()  # stopping: the consumer's stop answers what is held; RDY stays 0
            raise
        self._task, self.holding, self.not_ready, self.since = None, False, False, None
        self._hold(False)
        self._ready.set()
        if told:
            self._log.info("%s: ready again after %.2f s held: consuming at full max_in_flight", self._where,
                           time.monotonic() - started)

    async def _ask(self) -> BaseException | None:
        """The check's error (False counts as one), or None when it passed. A sync check runs in a
        thread (a blocking ping must not stop the loop, nor the blocking facade's handlers' answers)."""
        limit = max(MIN_CHECK_TIMEOUT, 4 * self._interval)
        try:
            if is_async_callable(self._check):
                result = await asyncio.wait_for(self._check(), limit)
            else:
                result = await asyncio.wait_for(asyncio.to_thread(self._check), limit)
                if inspect.isawaitable(result):
                    result = await asyncio.wait_for(result, limit)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            return TimeoutError(f"took more than {limit:.2f} s")
        except Exception as error:  # noqa: BLE001 - the user's check: its failure is the answer
            return error
        if result is False:
            return RuntimeError("returned False")
        return None


def check_name(check: Any) -> str:
    """What the hold's log lines call the ready_check: "ready_check", or the ``check_name`` of
    the object whose method it is (the worker's held batches: their handler, called again)."""
    return str(getattr(getattr(check, "__self__", None), "check_name", "ready_check"))
