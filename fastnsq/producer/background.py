"""Publishing with background retry: a publish that fails waits in a bounded buffer and is retried.

One job: youzan/go-nsq's ``PublishAndRetryBackground`` / ``PublishWithExtAndRetryBackground``
(``producer.go`` handleBackgroundRetry; ``config.go`` PubMaxBackgroundRetry 15,
PubBackgroundBuffer 1000), without its silent ends:

* the first attempt is an ordinary publish (with the producer's own retries); if it
  succeeds the call returns True; an error no retry can fix (a bad body, a bad topic)
  is raised at once;
* otherwise the publish waits in a buffer of ``pub_background_buffer`` entries and the call
  returns False; a full buffer raises :class:`BackgroundBufferFullError` (go-nsq blocks);
* a worker retries what waits, oldest first, with a growing pause, each entry up to
  ``pub_max_background_retry`` times; an entry that runs out of retries is logged as an
  error, counted, and handed to ``background_failure_handler(topic, body, error)``;
* :meth:`BackgroundRetry.close` stops the worker and returns what was still unsent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import check_range
from ..errors import BackgroundBufferFullError, InvalidValueError, NSQError

__all__ = ["BackgroundBufferFullError", "BackgroundRetry", "Unsent"]

logger = logging.getLogger(__name__)

_FIRST_PAUSE = 0.05
_MAX_PAUSE = 2.0


@dataclass
class Unsent:
    """A background publish that did not reach nsqd: its arguments, retries and last error."""

    topic: str
    body: Any
    arguments: Mapping[str, Any] = field(default_factory=dict)
    retries: int = 0
    error: BaseException | None = None


class BackgroundRetry:
    """The retry buffer and its worker; ``publish`` is the producer's ``publish``."""

    def __init__(self, publish: Callable[..., Awaitable[Any]], settings: Mapping[str, Any],
                 retryable: Callable[[BaseException], bool]) -> None:
        self.max_retry = check_range("pub_max_background_retry", settings["pub_max_background_retry"], 1, 100,
                                     integer=True)
        self.capacity = check_range("pub_background_buffer", settings["pub_background_buffer"], 10, 10000,
                                    integer=True)
        handler = settings["background_failure_handler"]
        if handler is not None and not callable(handler):
            raise InvalidValueError("background_failure_handler must be callable (topic, body, error)")
        self._handler = handler
        self._publish = publish
        self._retryable = retryable
        self._waiting: deque[Unsent] = deque()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closing = False
        #: Publishes that went out on a retry, and those given up after ``max_retry`` retries.
        self.recovered = 0
        self.given_up = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def publish(self, topic: str, body: Any, arguments: dict[str, Any]) -> bool:
        """True: published now; False: it failed and waits for a background retry."""
        if self._closing:
            raise NSQError("the producer is closed")
        try:
            await self._publish(topic, body, **arguments)
            return True
        except NSQError as exc:
            if not self._retryable(exc):
                raise
            error: BaseException = exc
        if len(self._waiting) >= self.capacity:
            raise BackgroundBufferFullError(
                f"pub_background_buffer={self.capacity} publishes already wait for a background retry; this one "
                f"to {topic!r} was not taken (first attempt: {error})"
            ) from error
        self._waiting.append(Unsent(topic, body, arguments, 0, error))
        self._start()
        return False

    def _start(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        pause = _FIRST_PAUSE
        while not self._closing:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(pause)
            entry = self._waiting[0]
            entry.retries += 1
            try:
                await self._publish(entry.topic, entry.body, **entry.arguments)
            except NSQError as exc:
                entry.error = exc
                pause = min(pause * 2, _MAX_PAUSE)
                if entry.retries >= self.max_retry or not self._retryable(exc):
                    self._waiting.popleft()
                    self._give_up(entry)
                continue
            self._waiting.popleft()
            self.recovered += 1
            pause = _FIRST_PAUSE

    def _give_up(self, entry: Unsent) -> None:
        self.given_up += 1
        logger.error("giving up on a background publish to %s after %d retries (pub_max_background_retry=%d): %s",
                     entry.topic, entry.retries, self.max_retry, entry.error)
        if self._handler is not None:
            try:
                self._handler(entry.topic, entry.body, entry.error)
            except Exception:
                logger.exception("background_failure_handler failed")

    async def close(self) -> list[Unsent]:
        """Stop retrying; what was still waiting (logged as a warning when anything was)."""
        self._closing = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        unsent = list(self._waiting)
        self._waiting.clear()
        if unsent:
            logger.warning("closing with %d background publishes unsent (to %s)", len(unsent),
                           ", ".join(sorted({u.topic for u in unsent})))
        return unsent
