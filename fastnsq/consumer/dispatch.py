"""The Python path of a consumer's messages: arrival, handler, answers, give-up.

The C link (:mod:`fastnsq._delivery`) handles the common case of a message itself and
calls the :class:`Dispatcher` for everything else: backoff, the refill of RDY, give-up,
ordered and traced consumption, requeue, touch, a closed connection, a stopping
consumer. On the pure-Python twin every message comes here. The dispatcher is the
link's owner (``fastnsq._delivery.LinkOwner``); it knows the RDY controller, the
handler and the partitions, not the connections or lookupd.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import codec, tracing
from ..config import LoggerLike
from ..errors import InvalidValueError
from ..rdy import Outcome, RdyController, RdyUpdate
from .held import HeldMessages
from .partitions import Partitions

__all__ = ["DispatchSettings", "Dispatcher", "is_async_callable"]

logger = logging.getLogger(__name__)

_EAGER_TASKS = sys.version_info >= (3, 12)

#: One subscribed connection of the consumer and the delegate of its messages.
Link = codec.Link


@dataclass(frozen=True)
class DispatchSettings:
    """The consumer's options that decide what happens to a message."""

    topic: str
    channel: str
    handler: Callable[[Any], Any] | None
    max_attempts: int
    default_requeue_delay: float
    max_requeue_delay: float
    ordered: bool
    ordered_give_up: str
    give_up_handler: Callable[[Any], Any] | None
    log: LoggerLike = logger
    #: Past max_attempts: published here, then finished (None: finished and logged, or the hook).
    dead_letter_topic: str | None = None
    #: A ready_check decides when to retry: a failed message is requeued without delay.
    requeue_at_once: bool = False

    @property
    def handler_is_async(self) -> bool:
        return self.handler is not None and is_async_callable(self.handler)


class Dispatcher:
    """What happens to each message on the Python path, and the counts it keeps.

    ``apply`` sends RDY updates (the consumer's connections); ``pause`` sets max_in_flight
    to 0 (ordered_give_up="stop"). Counters: ``given_up``, ``closed_counts`` (received,
    finished, requeued on connections already closed; the live ones count on their links),
    and ``finish_dropped`` / ``requeue_dropped``: answers given after their connection had
    closed, so never sent (nsqd gives those messages out again after msg_timeout).
    """

    def __init__(
        self,
        settings: DispatchSettings,
        rdy: RdyController,
        partitions: Partitions,
        inbox: Any,
        apply: Callable[[list[RdyUpdate]], None],
        pause: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._log = settings.log
        self._handler = settings.handler
        self._handler_is_async = settings.handler_is_async
        self._rdy = rdy
        self._partitions = partitions
        self._inbox = inbox
        self._apply = apply
        self._pause = pause
        self._loop: asyncio.AbstractEventLoop | None = None
        self._now: Callable[[], float] = _no_loop_time
        self.tasks: set[asyncio.Future[Any]] = set()
        self.given_up = 0
        self.dead_lettered = 0
        #: The consumer's ready_check: told of each failure (a REQ with backoff); holding.
        self.on_failure: Callable[[], None] | None = None
        self.holding: Callable[[], bool] = lambda: False
        #: hold_failed: a failed message is held and retried in-process (consumer/held.py), not requeued.
        self.held: HeldMessages | None = None
        self.closed_counts = [0, 0, 0]  # received, finished, requeued
        self.closed_timed_out = 0
        # Not finished or requeued as far as nsqd knows: counting them as such hid the loss.
        self.finish_dropped = 0
        self.requeue_dropped = 0
        #: Called after each answer while the consumer stops (it watches the drain).
        self.on_answer_while_stopping: Callable[[], None] | None = None
        #: HA (``consumer.ha``): checks a message before the handler; False when it answered it.
        self.ha_check: Callable[[Link, Any], bool] | None = None
        self._backoff_since: dict[Any, float] = {}  # backoff scope -> when its backoff began
        self._backoff_levels: dict[Any, int] = {}  # backoff scope -> its level at the last change
        self._clock: Callable[[], float] = time.monotonic

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._now = loop.time

    def configure(self, link: Link) -> None:
        """Set a new link up to dispatch as this consumer does."""
        link.configure(
            handler=self._handler,
            is_async=self._handler_is_async,
            inbox=self._inbox if self._handler is None else None,
            max_attempts=self.settings.max_attempts,
            async_dispatch=self.run_async_handler,
        )

    def link_closed(self, link: Link) -> None:
        """Its counts stay in the totals; answers after this (nothing sent) count as dropped."""
        self.closed_counts[0] += link.received
        self.closed_counts[1] += link.finished
        self.closed_counts[2] += link.requeued
        self.closed_timed_out += link.timed_out
        link.received = link.finished = link.requeued = link.timed_out = 0

    # ---- LinkOwner: what the link calls --------------------------------------------------

    def on_message(self, link: Link, message: Any) -> None:
        settings = self.settings
        if settings.ordered:
            state = self._partitions.state(link.endpoint.partition)
            last = state.last_delivered
            if last is not None and message.attempts == last.attempts and message.id == last.id:
                self._repeated(link, last, message)
                return
            state.last_delivered = message
            state.last_finished = False
        link.in_flight[message] = self._now()
        link.received += 1
        updates = self._rdy.on_message(link, message)
        if updates:
            self._apply(updates)
        if settings.ordered:
            problem = self._partitions.state(link.endpoint.partition).check_order(message)
            if problem is not None:
                self._log.error("ordering regression: %s", problem)
        if tracing.LOG_ENABLED:
            transport = link.conn._transport
            tracing.consumed(
                settings.topic, link.endpoint.partition, message,
                transport.get_extra_info("sockname") if transport else None,
                transport.get_extra_info("peername") if transport else None,
            )
        if self.ha_check is not None and not self.ha_check(link, message):
            return
        if settings.max_attempts and message.attempts > settings.max_attempts:
            self._give_up(link, message)
            return
        handler = self._handler
        if handler is None:
            self._inbox.push(message)
        elif self._handler_is_async:
            if tracing.HOOKED:
                # A task from the start: the hooks' context is entered and left in the task's own
                # context (the inline first step would enter it in the caller's).
                assert self._loop is not None
                self._watch_task(self._loop.create_task(self._traced_async(message)), message)
            else:
                self.run_async_handler(handler, message)
        else:
            try:
                if tracing.HOOKED:
                    with tracing.handling(settings.topic, settings.channel, message):
                        handler(message)
                else:
                    handler(message)
            except Exception:  # noqa: BLE001 - a user handler; on_handler_failed logs the traceback
                self.on_handler_failed(message)
            else:
                self._auto_answer(message, failed=False)

    async def _traced_async(self, message: Any) -> Any:
        """The async handler inside the tracing hooks' context (their spans cover its awaits)."""
        assert self._handler is not None
        with tracing.handling(self.settings.topic, self.settings.channel, message):
            return await self._handler(message)

    def on_handler_failed(self, message: Any) -> None:
        """A sync handler raised (call it in the except block: the error is read from there)."""
        error = sys.exc_info()[1]
        self.log_failure(message, error if error is not None else RuntimeError("the handler failed"))
        self._auto_answer(message, failed=True)

    def log_failure(self, message: Any, error: BaseException) -> None:
        """A handler's failure: one WARNING line (the message, its attempts, the error's type and
        text), and the traceback at DEBUG. A requeue is what a failing handler asks for: a traceback
        per message at WARNING drowned the rest (75 of them for 500 messages failing 10 %)."""
        limit = self.settings.max_attempts
        attempts = f"attempt {message.attempts} of {limit}" if limit else f"attempt {message.attempts}"
        if not message.auto_response or message.has_responded:
            answer = "answered by the handler"
        elif self.held is not None:
            answer = "held, its handler called again in-process"
        else:
            answer = "requeueing"
        # While the consumer holds (its ready_check failing), the hold's line said why: DEBUG.
        holding = self.holding() or (self.held is not None and answer.startswith("held") and self.held.holds_next())
        log = self._log.debug if holding else self._log.warning
        log("handler failed on message %s (%s): %s: %s; %s", _id_text(message), attempts, type(error).__name__, error,
            answer)
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("the handler's traceback for message %s", _id_text(message), exc_info=error)

    def backoff_changed(self, scope: Any, level: int, wait: float | None) -> None:
        """Backoff at INFO (the RDY controller's ``on_backoff``): each wait begun, with its length,
        and the return to normal consumption, with how long the backoff lasted."""
        where = "" if scope is None else f" (partition {scope})"
        topic = f"{self.settings.topic}/{self.settings.channel}"
        previous, self._backoff_levels[scope] = self._backoff_levels.get(scope, 0), level
        if wait is not None:
            self._backoff_since.setdefault(scope, self._clock())
            # A success steps the level down one (go-nsq's rule), with a wait of its own: say so.
            why = "a handler failed" if level > previous else "a handler succeeded, one level down"
            self._log.info("%s%s: backing off for %.2f s (backoff level %d): %s", topic, where, wait, level, why)
        elif level == 0 and scope in self._backoff_since:
            lasted = self._clock() - self._backoff_since.pop(scope)
            self._log.info("%s%s: backoff over after %.2f s: consuming at full max_in_flight again", topic, where,
                           lasted)

    def on_finish(self, link: Link, message: Any) -> None:
        """``message.finish()``: FIN, and tell the RDY controller."""
        if self.settings.ordered:
            state = self._partitions.state(link.endpoint.partition)
            if message is state.last_delivered:
                state.last_finished = True
        self._done(link, message, Outcome.SUCCESS)
        if link.closed:
            self.finish_dropped += 1
            self._log.debug("FIN of %r dropped: connection to %s closed", message, link.endpoint.address)
        else:
            link.finished += 1
            link.conn.fin(message)

    def on_requeue(self, link: Link, message: Any, delay: float | None, backoff: bool) -> None:
        """``message.requeue()``: REQ after ``delay`` (None: the default backoff delay)."""
        delay_ms = self._requeue_delay_ms(message, delay)
        self._done(link, message, Outcome.FAILURE if backoff else Outcome.NEUTRAL)
        if link.closed:
            self.requeue_dropped += 1
            self._log.debug("REQ of %r dropped: connection to %s closed", message, link.endpoint.address)
        else:
            link.requeued += 1
            link.conn.req(message, delay_ms)
        if backoff and self.on_failure is not None:
            self.on_failure()

    def on_touch(self, link: Link, message: Any) -> None:
        if message in link.in_flight or link.current_delivery(message) is not None:
            link.touched[message] = self._now()
        if not link.closed:
            link.conn.touch(message)

    # ---- answers ------------------------------------------------------------------------

    def _done(self, link: Link, message: Any, outcome: Outcome) -> None:
        delivered = link.in_flight.pop(message, None)
        if delivered is None:
            delivered = link.current_delivery(message)  # a sync handler on the C path answers it inline
        if link.touched:
            link.touched.pop(message, None)
        elif delivered is not None and self._now() - delivered > link.msg_timeout:
            # nsqd gave it to someone else already
            if link.closed:
                self.closed_timed_out += 1
            else:
                link.timed_out += 1
        updates = self._rdy.on_message_done(link, message, outcome)
        if updates:
            self._apply(updates)
        if self.on_answer_while_stopping is not None:
            self.on_answer_while_stopping()

    def _repeated(self, link: Link, first: Any, copy: Any) -> None:
        """Ordered: the same message again, same attempts (any redelivery counts one).

        A youzan channel that turns ordered (its first SUB_ORDERED) resets its reader to
        the last confirmed message while the one it had read is sent anyway: the same
        message twice in a row, and nsqd holds one of the two in flight. Handling it again
        would break the order. While the first copy is unanswered its answer covers both;
        once it was finished, nsqd may be holding this copy instead (that FIN then failed
        with E_FIN_FAILED), so the copy is finished too, or the partition would wait out
        msg_timeout. A first copy that was requeued comes back anyway.
        """
        state = self._partitions.state(link.endpoint.partition)
        state.duplicates_dropped += 1
        self._log.debug("%s: the repeated delivery of %r", link.endpoint.address, copy)
        if first.has_responded and state.last_finished and not link.closed:
            state.finished_twice = bytes(copy.id)
            link.conn.fin(copy)

    def expected_error(self, link: Link, error: Any) -> bool:
        """Whether nsqd's ``error`` is the E_FIN_FAILED of a repeated head finished twice
        (:meth:`_repeated`): nsqd held one copy, so one of the two FINs was bound to fail. That
        is the documented duplicate (counted in ``duplicates_dropped``), not an error."""
        partition = link.endpoint.partition
        if error.code != "E_FIN_FAILED" or not self.settings.ordered or partition not in self._partitions:
            return False
        state = self._partitions[partition]
        if state.finished_twice is None or _fin_failed_id(error.description) != state.finished_twice:
            return False
        state.finished_twice = None  # only one of the two fails
        self._log.debug("%s: %s: the repeated head's other FIN went through", link.endpoint.address, error)
        return True

    def _auto_answer(self, message: Any, *, failed: bool) -> None:
        if message.has_responded or not message.auto_response:
            return
        if failed and self.held is not None:
            self.held.add(message)
        elif failed:
            message.requeue()
        else:
            message.finish()

    def _requeue_delay_ms(self, message: Any, delay: float | None) -> int:
        settings = self.settings
        if settings.ordered:
            return 0  # HA ignores REQ delays on ordered channels: redeliver at once
        if delay is None and settings.requeue_at_once:
            delay = 0  # the ready_check holds RDY at 0 until the dependency is back: no wait after that
        if delay is None:
            delay = min(settings.default_requeue_delay * message.attempts, settings.max_requeue_delay)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise InvalidValueError(f"requeue delay must be seconds >= 0, got {delay!r}")
        return min(round(delay * 1000), 3600 * 1000)

    async def call_again(self, message: Any) -> BaseException | None:
        """A held message's handler once more (consumer/held.py): its error, or None."""
        assert self._handler is not None
        try:
            result = self._handler(message)
            if inspect.isawaitable(result):
                await result
        except Exception as error:  # noqa: BLE001 - a user handler: the error is the answer
            return error
        return None

    # ---- async handlers -----------------------------------------------------------------

    def run_async_handler(self, handler: Callable[[Any], Any], message: Any) -> None:
        """An async handler in a task of its own from its first step: ``asyncio.timeout()``,
        ``current_task()`` and the libraries built on them (asyncpg's connect, aiohttp's timeouts)
        need one. On 3.12+ the task starts eagerly (no loop pass when the handler never awaits);
        3.11's first step once ran inline without a task, and such a handler failed every time."""
        assert self._loop is not None
        coro = handler(message)
        if _EAGER_TASKS:
            task: asyncio.Task[Any] = asyncio.Task(coro, loop=self._loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
            if task.done():
                self._async_done(message, task)
                return
        else:
            task = self._loop.create_task(coro)
        self._watch_task(task, message)

    def _watch_task(self, task: asyncio.Task[Any], message: Any) -> None:
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._async_finished(message, t))

    def _async_finished(self, message: Any, task: asyncio.Future[Any]) -> None:
        self.tasks.discard(task)
        self._async_done(message, task)

    def _async_done(self, message: Any, task: asyncio.Future[Any]) -> None:
        if task.cancelled():
            if not message.has_responded:
                message.requeue(0, backoff=False)
            return
        error = task.exception()
        if error is not None:
            self.log_failure(message, error)
        self._auto_answer(message, failed=error is not None)

    def cancel_tasks(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    # ---- give-up ------------------------------------------------------------------------

    def _give_up(self, link: Link, message: Any) -> None:
        """Past max_attempts: to the dead-letter topic, or FIN it (or, ordered, per ordered_give_up); then
        the give-up hook (or a WARNING line: nothing is dropped without one)."""
        settings = self.settings
        self.given_up += 1
        if settings.ordered and settings.ordered_give_up == "requeue":
            message.requeue(0, backoff=True)
        elif settings.ordered and settings.ordered_give_up == "stop":
            self._log.error("ordered message %r is past max_attempts; pausing the consumer", message)
            message.requeue(0, backoff=False)
            self._pause()
        elif settings.dead_letter_topic is not None:
            self._dead_letter(link, message, settings.dead_letter_topic)
            return
        else:
            message.finish()
        self._after_give_up(message, None)

    def _dead_letter(self, link: Link, message: Any, topic: str) -> None:
        """PUB the body, as it came, to ``topic`` on the message's own connection (the nsqd it came from);
        FIN only on nsqd's OK. A failed publish requeues it: the next delivery tries again."""
        try:
            answer = link.conn.publish(topic, bytes(message.body))
        except Exception as error:  # noqa: BLE001 - a closed connection: nsqd redelivers it after msg_timeout
            self._dead_letter_failed(message, topic, error)
            return
        answer.add_done_callback(lambda done: self._dead_letter_answered(message, topic, done))

    def _dead_letter_answered(self, message: Any, topic: str, answer: asyncio.Future[Any]) -> None:
        error = asyncio.CancelledError() if answer.cancelled() else answer.exception()
        if error is not None:
            self._dead_letter_failed(message, topic, error)
            return
        self.dead_lettered += 1
        if not message.has_responded:
            message.finish()
        self._after_give_up(message, topic)

    def _dead_letter_failed(self, message: Any, topic: str, error: BaseException) -> None:
        self._log.warning("message %s past max_attempts: publishing it to the dead-letter topic %s failed (%s: %s); "
                          "not finished: requeued (or, its connection closed, given out again after msg_timeout)",
                          _id_text(message), topic, type(error).__name__, error)
        if not message.has_responded:
            message.requeue(self.settings.default_requeue_delay, backoff=False)

    def _after_give_up(self, message: Any, dead_letter_topic: str | None) -> None:
        settings = self.settings
        hook = settings.give_up_handler
        if hook is None:
            where = (f"published to the dead-letter topic {dead_letter_topic}" if dead_letter_topic
                     else "finished and dropped (set dead_letter_topic or give_up_handler to keep it)")
            self._log.warning("gave up on message %s after %d attempts (max_attempts=%d): %s", _id_text(message),
                              message.attempts - 1, settings.max_attempts, where)
            return
        try:
            result = hook(message)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        except Exception:  # noqa: BLE001 - the user's give-up hook: logged with its traceback
            self._log.exception("give_up_handler failed for message %r", message)


def is_async_callable(func: Any) -> bool:
    # An object whose __call__ is a coroutine function is an async handler too.
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


#: An HA nsqd's FIN error names the full id as Go prints a byte array: ``FIN [0 0 ... 7] failed ...``.
_FIN_FAILED_ID = re.compile(r"FIN \[([0-9 ]+)\]")


def _fin_failed_id(description: str) -> bytes | None:
    match = _FIN_FAILED_ID.match(description)
    if match is None:
        return None
    try:
        return bytes(int(b) for b in match.group(1).split())
    except ValueError:  # a number above 255: not a byte array
        return None


def _id_text(message: Any) -> str:
    """A message id for a log line: nsqd's 16 ASCII characters, or the hex of a binary (HA) id."""
    raw = bytes(message.id)
    return raw.decode("ascii") if raw.isascii() and raw.isalnum() else raw.hex()


def _no_loop_time() -> float:
    raise RuntimeError("the consumer is not started")
