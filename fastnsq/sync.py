"""Blocking facade for code that is not async: scripts, WSGI apps, worker processes.

Each object runs fastnsq's asyncio client on its own event loop in a daemon
thread; calls from any number of threads are handed to that loop (concurrent ones
share its connections and are coalesced), except the producer's plain ``publish()``,
which the calling thread writes and reads itself on a connection it holds for the
call (``thread_connections``), as that costs no thread switch.

>>> from fastnsq.sync import Producer                       # doctest: +SKIP
>>> with Producer(["127.0.0.1:4150"]) as producer:
...     producer.publish("events", b"hello")

A :class:`Consumer` runs a plain function handler in worker threads (``workers``,
default 1), so a slow handler never blocks the connection's heartbeats. In the
handler, return to finish the message and raise to have it held and handled again
(``hold_failed``, as :class:`fastnsq.Consumer`); the message's
``finish``/``requeue``/``touch`` are safe to call from the handler's thread. Made
without a handler, it hands out :meth:`Consumer.batches` to plain threads instead.
``Consumer.run()`` drains on SIGINT/SIGTERM; a second signal hurries the drain.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from ._loop_thread import LoopThread
from ._sync_publish import CALL, FORKS, PUBLISH, SEND, Bridge, close_producer, settle_future
from ._thread_publish import NOT_TAKEN, ThreadPublisher
from .codec import Message, TracedResponse
from .config import check_range
from .consumer import Batch as AsyncBatch
from .consumer import Consumer as AsyncConsumer
from .consumer import StopReport
from .errors import ConnectionClosedError, InvalidValueError
from .producer import Producer as AsyncProducer
from .producer.ha import CloseReport
from .producer.load import NodeStats
from .stats import ConsumerStats, ProducerStats, deprecated_spelling

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from .typed_options import Body, ConsumerOptions, SyncHandler, SyncProducerOptions

__all__ = ["Batch", "Consumer", "Producer"]

T = TypeVar("T")
_RESULT_MARGIN = 5.0  # seconds added to a call's own timeout before the caller stops waiting
_LATE = 0.25  # seconds a publish with its own timeout waits past it for the loop's answer (or error)


class Producer:
    """A blocking :class:`fastnsq.Producer`, safe to call from many threads.

    Same arguments and options as the async producer (the HA ones included); ``publish``
    and ``mpublish`` take the same keyword arguments as the async ones and block until nsqd
    has the message(s), returning its answer; ``publish_async`` returns at once with a
    ``concurrent.futures.Future`` of that answer (go-nsq's ``PublishAsync``).

    The constructor returns at once and connects in the background (go-nsq's
    ``NewProducer``): a publish waits for that first attempt; while no connection is open
    and the attempts failed, a publish raises ``NoConnectionError`` at once, naming each
    nsqd and why (the cause of an attempt made for it, or within the last 0.2 s), and the
    producer reconnects behind the scenes, every 0.2-0.4 s. ``lazy_connect=False``
    connects in the constructor instead and raises ``NoConnectionError`` there when no nsqd
    answers. After ``os.fork()`` the child gets a loop, a thread and connections of its own
    at its first call (gunicorn ``--preload``, ``multiprocessing``); the parent's are never
    touched there.

    A plain ``publish()`` (no ``defer`` or HA argument) is written and answered in the
    calling thread on a connection it holds for the call, up to ``thread_connections`` (64)
    such connections; 0 sends every call through the loop thread. Calls this path cannot
    serve as the loop would (TLS, compression, AUTH, HA, lookupd, tracing, nsqd down) go
    through the loop.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        *,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        lazy_connect: bool = True,
        thread_connections: int = 64,
        **options: Unpack[SyncProducerOptions],
    ) -> None:
        self._thread_connections = check_range("thread_connections", thread_connections, 0, 1024, integer=True)
        self._arguments = (nsqd_tcp_addresses, lookupd_http_addresses, options)
        self._observer: Callable[[float], object] | None = None
        self._closed = False
        self._start(background=bool(lazy_connect))

    def _start(self, background: bool) -> None:
        # Built here, in the caller's thread, so bad options raise at once.
        nsqd, lookupd, options = self._arguments
        producer = AsyncProducer(nsqd, lookupd_http_addresses=lookupd, lazy_connect=background, **options)
        thread = LoopThread("fastnsq-producer")
        try:
            thread.call(producer.start(background=background))
        except BaseException:
            thread.stop()
            raise
        self._producer, self._thread = producer, thread
        if self._observer is not None:  # a fork's child: the parent's producer had it
            thread.call(_call_async(producer.set_round_trip_observer, self._observer), 10)
        self._threads = ThreadPublisher(producer, self._thread_connections)
        self._bridge = Bridge(thread.loop, producer, thread._thread.ident or 0)

    def _current(self) -> Bridge:
        """The bridge to this process's loop: after a fork, the child builds its own (the
        parent's loop, thread and connections were left alone at the fork)."""
        bridge = self._bridge
        if bridge.generation != FORKS.generation:
            with FORKS.lock:
                if self._closed:
                    raise ConnectionClosedError("the producer is closed")
                if self._bridge.generation != FORKS.generation:
                    self._start(background=True)
            bridge = self._bridge
        return bridge

    def _wait(self, timeout: float | None) -> float:
        """How long a caller waits for a publish or mpublish: its own timeout, or publish_timeout
        (the loop's publish ends by it, retries included; the wait is the same, from the call's start)."""
        return timeout + _LATE if timeout is not None else self._producer.publish_timeout

    @overload
    def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: None = None, ext: None = None,
    ) -> bytes: ...
    @overload
    def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: int, ext: None = None,
    ) -> TracedResponse: ...
    @overload
    def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> bytes | TracedResponse: ...

    def publish(
        self,
        topic: str,
        body: Body,
        *,
        defer: float | None = None,
        timeout: float | None = None,
        partition: int | None = None,
        sharding_key: Any = None,
        trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> Any:
        """Publish one message and block until nsqd acknowledged it (or raise); the arguments are
        :meth:`fastnsq.Producer.publish`'s. With ``timeout``, returns or raises within it."""
        bridge = self._current()
        if defer is None and partition is None and sharding_key is None and trace_id is None and ext is None:
            limit = self._producer.publish_timeout if timeout is None else check_range("timeout", timeout, 0, 1e6)
            deadline = time.monotonic() + limit  # the call's one deadline, whichever path answers it
            answer = self._threads.publish(topic, body, limit)
            if answer is not NOT_TAKEN:
                return answer
            # Coalesced with the other threads' publishes, until the call's deadline (then
            # PublishTimeoutError; the message may still arrive, as for the async one).
            return bridge.publish(topic, body, max(deadline - time.monotonic(), 0.0), limit)
        send = functools.partial(self._producer.publish, topic, body, defer=defer, timeout=timeout,
                                 partition=partition, sharding_key=sharding_key, trace_id=trace_id, ext=ext)
        return bridge.run(SEND, send, self._wait(timeout), self._producer.publish_timeout if timeout is None else None)

    def publish_async(
        self, topic: str, body: Body, **arguments: Any
    ) -> concurrent.futures.Future[bytes | TracedResponse]:
        """:meth:`publish` without waiting: a future of nsqd's answer (or of the error)."""
        bridge = self._current()
        future: concurrent.futures.Future[bytes | TracedResponse] = concurrent.futures.Future()
        done = functools.partial(settle_future, future)
        if not arguments:
            bridge.put(PUBLISH, topic, body, done)
        else:
            bridge.put(SEND, functools.partial(self._producer.publish, topic, body, **arguments), None, done)
        return future

    @overload
    def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: None = None, exts: None = None,
    ) -> bytes: ...
    @overload
    def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: Sequence[int], exts: None = None,
    ) -> TracedResponse: ...
    @overload
    def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any]] | None = None,
    ) -> bytes | TracedResponse: ...

    def mpublish(
        self,
        topic: str,
        bodies: Sequence[Body],
        *,
        timeout: float | None = None,
        partition: int | None = None,
        sharding_key: Any = None,
        trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any]] | None = None,
    ) -> Any:
        """Publish a batch and block until nsqd acknowledged it (or raise); the arguments are
        :meth:`fastnsq.Producer.mpublish`'s."""
        bridge = self._current()
        send = functools.partial(self._producer.mpublish, topic, bodies, timeout=timeout, partition=partition,
                                 sharding_key=sharding_key, trace_ids=trace_ids, exts=exts)
        return bridge.run(SEND, send, self._wait(timeout), self._producer.publish_timeout if timeout is None else None)

    def publish_and_retry_background(self, topic: str, body: Body, **arguments: Any) -> bool:
        """:meth:`fastnsq.Producer.publish_and_retry_background`: True if nsqd has it, False if it
        waits for a background retry (the retries run on the facade's loop)."""
        bridge = self._current()
        call = functools.partial(self._producer.publish_and_retry_background, topic, body, **arguments)
        # Its answer is the loop's (True, or False once kept for a retry): wait past the timeout for it.
        return bool(bridge.run(CALL, call, self._producer.publish_timeout + _RESULT_MARGIN))

    def node_stats(self) -> dict[str, NodeStats]:
        """:meth:`fastnsq.Producer.node_stats`, taken on its loop, with the publishes the calling
        threads made on their own connections (answered, connections, calls on them now)."""
        if self._closed:
            return self._threads.added_to_nodes(self._producer.node_stats())
        self._current()
        return self._threads.added_to_nodes(self._thread.call(_call_async(self._producer.node_stats), 10))

    def snapshot(self) -> ProducerStats:
        """The async producer's :meth:`~fastnsq.Producer.snapshot`, taken on its loop, with the
        publishes the calling threads made on their own connections."""
        if self._closed:
            return self._threads.added_to(self._producer.snapshot())
        self._current()
        return self._threads.added_to(self._thread.call(_call_async(self._producer.snapshot), 10))

    def set_round_trip_observer(self, observer: Callable[[float], object] | None) -> None:
        """:meth:`fastnsq.Producer.set_round_trip_observer`, the calling threads' own publishes
        included: :meth:`fastnsq.metrics.NSQMetrics.track` uses it for its histogram."""
        self._observer = observer
        if not self._closed:
            self._current()
            self._thread.call(_call_async(self._producer.set_round_trip_observer, observer), 10)

    def close(self, timeout: float = 5.0) -> CloseReport:
        """Wait for publishes in flight (up to ``timeout``), close connections, stop the thread;
        returns what was left unsent (background retries). Publishes queued before it are sent."""
        if self._closed:
            return CloseReport()
        if self._bridge.generation != FORKS.generation:  # a fork's child that never used it
            self._closed = True
            return CloseReport()
        bridge = self._current()
        self._closed = True
        self._threads.close()
        try:
            close = functools.partial(close_producer, self._producer, timeout)
            report = bridge.run(CALL, close, 2 * timeout + _RESULT_MARGIN)
        finally:
            self._thread.stop()
            bridge.fail_leftovers()  # calls that raced with this one, publishes held for a connect given up
        return report

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _ThreadSafeMessage:
    """A message handed to a worker thread: answers are forwarded to the loop thread."""

    __slots__ = ("_loop", "_message")

    def __init__(self, message: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._message = message
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)

    def __repr__(self) -> str:
        return repr(self._message)

    def finish(self) -> None:
        _answer_on_loop(self._loop, self._message.finish)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        _answer_on_loop(self._loop, self._message.requeue, delay, backoff)

    def touch(self) -> None:
        _answer_on_loop(self._loop, self._message.touch)

    def disable_auto_response(self) -> None:
        _answer_on_loop(self._loop, self._message.disable_auto_response)


class Batch(Sequence[Message]):
    """A :class:`fastnsq.Batch` handed to a plain thread (what :meth:`Consumer.batches` yields): its
    messages are thread-safe stand-ins of :class:`~fastnsq.Message` (the same attributes; their
    answers are written by the loop thread), and so are ``finish``/``requeue`` (still one write
    per connection)."""

    __slots__ = ("_batch", "_loop")

    def __init__(self, batch: AsyncBatch, loop: asyncio.AbstractEventLoop) -> None:
        self._batch = batch
        self._loop = loop

    def __len__(self) -> int:
        return len(self._batch)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return [_thread_safe(message, self._loop) for message in self._batch.messages[index]]
        return _thread_safe(self._batch[index], self._loop)

    def __iter__(self) -> Iterator[Message]:
        return (_thread_safe(message, self._loop) for message in self._batch.messages)

    @property
    def messages(self) -> list[Message]:
        return list(self)

    def finish(self) -> None:
        """FIN every message not answered yet."""
        _answer_on_loop(self._loop, self._batch.finish)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ every message not answered yet (backoff counts once per batch)."""
        _answer_on_loop(self._loop, self._batch.requeue, delay, backoff)


def _thread_safe(message: Message, loop: asyncio.AbstractEventLoop) -> Message:
    """``message`` for a thread other than the loop's: typed as the Message it stands for."""
    return cast(Message, _ThreadSafeMessage(message, loop))


def _answer_on_loop(loop: asyncio.AbstractEventLoop, answer: Callable[..., None], *args: Any) -> None:
    """Run a message's or a batch's answer on the loop thread, which owns the connections;
    block until it ran and raise what it raised."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def call() -> None:
        try:
            answer(*args)
            done.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            done.set_exception(exc)

    try:
        loop.call_soon_threadsafe(call)
    except RuntimeError:
        # The loop is closed: the consumer has stopped and requeued everything in flight, so
        # no connection is touched (a batch skips answered messages; a message raises).
        call()
    done.result(30)


class Consumer:
    """A blocking consumer: ``handler(message)`` runs in ``workers`` threads.

    >>> def handle(message):                                 # doctest: +SKIP
    ...     print(message.body)
    >>> consumer = Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"],
    ...                     handler=handle, workers=4, max_in_flight=8)
    >>> consumer.run()          # blocks until stop() is called or SIGINT/SIGTERM arrives

    ``start()`` returns at once (the consumer runs in the background); ``stop()``
    drains as :meth:`fastnsq.Consumer.stop` does and returns its report. Without a
    ``handler``, iterate the consumer (``for message in consumer``) or :meth:`batches`, from any thread.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        handler: SyncHandler | None = None,
        workers: int = 1,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if handler is not None and not callable(handler):
            raise InvalidValueError("handler must be a callable taking one message")
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1024:
            raise InvalidValueError(f"workers must be an int in 1..1024, got {workers!r}")
        options.setdefault("max_in_flight", workers)
        self._user_handler = handler
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="fastnsq-handler")
        self._consumer = AsyncConsumer(
            topic,
            channel,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            handler=None if handler is None else self._handle,
            **options,
        )
        self._thread: LoopThread | None = None
        self._stopped = threading.Event()  # run() returns: stop() was called or a signal came
        self._stop_lock = threading.Lock()  # one drain; a second stop() waits for its report
        self._closed = False  # the loop is gone: calls read the consumer directly
        self._report: StopReport | None = None
        # A second signal hurries the drain (run()); the loop thread owns these three.
        self._hurrying = False
        self._held: set[Any] = set()  # messages handed to a handler, not answered yet (a superset)
        self._prune_at = 64  # _held's size at which its answered messages are dropped
        self._abandoned = 0  # held messages requeued when the hurried drain ended
        self._hurry_timeout = 1.0

    async def _handle(self, message: Any) -> None:
        if self._hurrying:  # the drain is cut short: nothing new starts
            message.requeue(0, backoff=False)
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._hold(message)
        try:
            self._pool.submit(self._work, message, loop, done)
            ran = await done
        finally:
            if message.has_responded or message.auto_response:  # answered, or the dispatcher answers it now
                self._held.discard(message)
            # else the handler disabled the auto response: its code answers later, held until then
        if not ran and not message.has_responded:
            message.requeue(0, backoff=False)

    def _hold(self, message: Any) -> None:
        if len(self._held) >= self._prune_at:  # messages answered after their handler returned
            self._held = {held for held in self._held if not held.has_responded}
            self._prune_at = 2 * len(self._held) + 64
        self._held.add(message)

    def _work(self, message: Any, loop: asyncio.AbstractEventLoop, done: asyncio.Future[bool]) -> None:
        """In a worker thread: the user's handler, its outcome handed back to the loop."""
        ran = not self._hurrying  # not ran: it waited for a worker past a second signal
        error: BaseException | None = None
        if ran:
            try:
                self._user_handler(_thread_safe(message, loop))  # type: ignore[misc]
            except BaseException as exc:  # noqa: BLE001 - the dispatcher holds or requeues it
                # A SystemExit or StopIteration would break the loop's task: pass it on as an error.
                plain = isinstance(exc, Exception) and not isinstance(exc, StopIteration)
                error = exc if plain else RuntimeError(f"handler raised {exc!r}")
        try:
            loop.call_soon_threadsafe(_settle, done, ran, error)
        except RuntimeError:
            pass  # the loop is closed: stop() requeued this message at its deadline

    def start(self) -> None:
        """Connect and consume in the background."""
        if self._thread is not None:
            return
        self._thread = LoopThread("fastnsq-consumer")
        try:
            self._thread.call(self._consumer.start())
        except BaseException:
            self._thread.stop()
            self._thread = None
            raise

    def stop(self, timeout: float = 30.0) -> StopReport:
        """Drain (handlers finish until ``timeout``), requeue the rest, close. Idempotent, and
        safe from any thread: a call while another drains waits for that drain's report."""
        with self._stop_lock:
            if self._report is not None:
                return self._report
            if self._thread is None:
                return StopReport()
            try:
                report = self._thread.call(self._consumer.stop(timeout), timeout + _RESULT_MARGIN)
            finally:
                self._closed = True  # the async consumer is stopped: nothing on the loop changes it now
                self._thread.stop()
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._stopped.set()
            if self._abandoned:  # requeued by a hurried drain (run()): abandoned at its deadline
                report.abandoned += self._abandoned
                report.timed_out = True
            self._report = report
            return report

    def run(
        self,
        stop_signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
        *,
        timeout: float = 30.0,
        hurry_timeout: float = 1.0,
    ) -> StopReport:
        """Start, block until ``stop()`` or one of ``stop_signals`` (main thread only), then drain
        as ``stop(timeout)`` does and return its report.

        The signal handlers stay installed until the drain is over, so a duplicated signal (a
        process manager, ``timeout``, a shell and its child all signalled) cannot kill the drain.
        A second signal hurries it: no handler starts any more, and the drain ends at most
        ``hurry_timeout`` seconds later; what the handlers still hold then (or kept, unanswered,
        with the auto response disabled) is requeued and counted in the report's ``abandoned``.
        Later signals change nothing.
        """
        self._hurry_timeout = check_range("hurry_timeout", hurry_timeout, 0, 3600)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            # Before start(): a message may be handled before start() returns, and a signal then
            # must find the handler already there.
            for sig in stop_signals:
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            while not self._stopped.wait(0.2):
                pass
            return self.stop(timeout)
        finally:  # only now: a signal during the drain must not reach the default (kill) action
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        """run()'s handler, in the main thread: the first signal stops, the next ones hurry."""
        if not self._stopped.is_set():
            self._stopped.set()
            return
        thread = self._thread
        if thread is not None:
            try:
                thread.loop.call_soon_threadsafe(self._hurry)
            except RuntimeError:
                pass  # the loop is closed: the drain is over

    def _hurry(self) -> None:
        """On the loop: start nothing new; in ``hurry_timeout`` seconds requeue what is held."""
        if self._hurrying:
            return
        self._hurrying = True
        asyncio.get_running_loop().call_later(self._hurry_timeout, self._requeue_held)

    def _requeue_held(self) -> None:
        """On the loop: as stop() does at its deadline, and the drain sees nothing left in flight."""
        for message in list(self._held):
            if not message.has_responded:
                message.requeue(0, backoff=False)
                self._abandoned += 1

    def __iter__(self) -> Iterator[Message]:
        """The messages one by one, blocking (the async consumer's ``async for``), for a consumer
        made without a handler: answer each with ``finish()`` / ``requeue()``, from any thread.

        Starts the consumer if needed; ends when it stops (``stop()``, from another thread).
        Messages are taken from the loop up to ``max_in_flight`` at a time; those taken and not
        handed out yet when the iteration is left (``break``, an exception) are requeued at once,
        without backoff, as ``stop()`` does with what it still holds.
        """
        if self._user_handler is not None:
            raise RuntimeError("this consumer has a handler; iterating it is for consumers without one")
        return self._iterate_messages()

    def _iterate_messages(self) -> Iterator[Message]:
        batches = self._iterate_batches(max(1, self._consumer.max_in_flight), 0.0)
        with contextlib.closing(batches):  # left early: the async iteration is closed at once, too
            for batch in batches:
                messages = list(batch)
                handed = 0
                try:
                    for message in messages:
                        handed += 1
                        yield message
                finally:
                    _requeue_unhanded(messages[handed:])

    def batches(self, max_size: int = 100, max_wait: float = 1.0) -> Iterator[Batch]:
        """Blocking :meth:`fastnsq.Consumer.batches`, for a consumer made without a handler.

        Starts the consumer if needed; each batch is a sequence of messages whose
        ``finish()``/``requeue()`` (the batch's and each message's) may be called from any
        thread. The iteration ends when the consumer stops (``stop()``, from another thread).
        """
        if self._user_handler is not None:
            raise RuntimeError("this consumer has a handler; batches() is for consumers without one")
        check_range("max_size", max_size, 1, 10**7, integer=True)
        check_range("max_wait", max_wait, 0.0, 86400)
        return self._iterate_batches(max_size, max_wait)

    def _iterate_batches(self, max_size: int, max_wait: float) -> Generator[Batch, None, None]:
        self.start()
        thread = self._thread
        assert thread is not None
        batches = self._consumer.batches(max_size, max_wait)
        try:
            while (batch := self._next_batch(thread, batches)) is not None:
                yield Batch(batch, thread.loop)
        finally:
            if not self._closed:
                try:
                    self._call(thread, _aclose(batches))
                except RuntimeError:
                    pass  # the loop closed meanwhile, or the garbage collector closed us on the loop thread

    def _next_batch(self, thread: LoopThread, batches: AsyncIterator[AsyncBatch]) -> AsyncBatch | None:
        """The next batch, however long it takes to come; None once the consumer has stopped."""
        if self._closed:
            return None
        coro = _next_or_none(batches)
        try:
            future = asyncio.run_coroutine_threadsafe(coro, thread.loop)
        except RuntimeError:  # the loop closed a moment ago
            coro.close()
            return None
        while True:
            try:
                return future.result(0.5)
            except concurrent.futures.TimeoutError:
                if self._closed:  # stopped while waiting, and the loop is gone
                    future.cancel()
                    return None

    def is_starved(self) -> bool:
        """:meth:`fastnsq.Consumer.is_starved`, read on the consumer's loop."""
        return self._read(self._consumer.is_starved)

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """:meth:`fastnsq.Consumer.set_max_in_flight` (0 pauses), on the consumer's loop."""
        self._control(self._consumer.set_max_in_flight, max_in_flight)

    @property
    def max_in_flight(self) -> int:
        return self._consumer.max_in_flight

    def pause_partition(self, partition: int | None) -> None:
        """:meth:`fastnsq.Consumer.pause_partition` (None: an upstream nsqd's connections), on the
        consumer's loop."""
        self._control(self._consumer.pause_partition, partition)

    def resume_partition(self, partition: int | None) -> None:
        """:meth:`fastnsq.Consumer.resume_partition`, on the consumer's loop."""
        self._control(self._consumer.resume_partition, partition)

    @property
    def partitions(self) -> Any:
        """The async consumer's :class:`~fastnsq.consumer.PartitionState` objects (HA: starts, positions)."""
        return self._consumer.partitions

    def _control(self, method: Callable[..., None], *args: Any) -> None:
        """A run-time control: before start() it sets what start() uses; after stop() there is
        nothing left to control (and no loop to run it on)."""
        if not self._closed:
            self._read(method, *args)

    def _read(self, method: Callable[..., T], *args: Any) -> T:
        """``method(*args)`` on the loop thread, which owns the consumer's state; directly when no
        loop runs it (not started, or stopped: nothing changes it then)."""
        thread = self._thread
        if thread is None or self._closed:
            return method(*args)
        try:
            return self._call(thread, _call_async(method, *args))
        except RuntimeError:
            if not self._closed:
                raise
            return method(*args)  # the loop closed as we asked: the consumer has stopped

    def _call(self, thread: LoopThread, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return thread.call(coro, 10)
        except RuntimeError:
            coro.close()  # refused by a loop closed a moment ago: never to be awaited
            raise

    def snapshot(self) -> ConsumerStats:
        """The async consumer's :meth:`~fastnsq.Consumer.snapshot`, taken on its loop; after
        ``stop()``/``run()``, the final figures."""
        return self._read(self._consumer.snapshot)

    def stats(self) -> dict[str, Any]:
        """Deprecated: :meth:`snapshot`."""
        deprecated_spelling("fastnsq.sync.Consumer.stats()", "snapshot()")
        figures = self.snapshot().as_dict()
        figures["connections"] = list(figures["connections"])
        return figures

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _requeue_unhanded(messages: list[Message]) -> None:
    """Messages taken for an iteration that was left before it handed them out: back to nsqd now."""
    for message in messages:
        if not message.has_responded:
            with contextlib.suppress(RuntimeError):  # stop() requeued it meanwhile
                message.requeue(0, backoff=False)


async def _call_async(func: Callable[..., T], *args: Any) -> T:
    return func(*args)


async def _next_or_none(batches: AsyncIterator[AsyncBatch]) -> AsyncBatch | None:
    try:
        return await batches.__anext__()
    except StopAsyncIteration:
        return None


async def _aclose(batches: AsyncIterator[AsyncBatch]) -> None:
    await batches.aclose()  # type: ignore[attr-defined]


def _settle(done: asyncio.Future[bool], ran: bool, error: BaseException | None) -> None:
    """On the loop: a worker's outcome for ``_handle`` (unless stop() cancelled it meanwhile)."""
    if done.done():
        return
    if error is None:
        done.set_result(ran)
    else:
        done.set_exception(error)
