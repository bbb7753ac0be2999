"""Blocking facade for code that is not async: scripts, WSGI apps, worker processes.

Each object runs fastnsq's asyncio client on its own event loop in a daemon
thread; calls from any number of threads are handed to that loop, so concurrent
publishes from many threads still share connections and are coalesced.

>>> from fastnsq.sync import Producer                       # doctest: +SKIP
>>> with Producer(["127.0.0.1:4150"]) as producer:
...     producer.publish("events", b"hello")

A :class:`Consumer` runs a plain function handler in worker threads (``workers``,
default 1), so a slow handler never blocks the connection's heartbeats. In the
handler, return to finish the message and raise to requeue it; the message's
``finish``/``requeue``/``touch`` are safe to call from the handler's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .consumer import Consumer as AsyncConsumer
from .consumer import StopReport
from .errors import InvalidValueError
from .loop import new_event_loop
from .producer import Producer as AsyncProducer
from .producer.ha import CloseReport
from .producer.load import NodeStats
from .stats import ConsumerStats, ProducerStats, deprecated_spelling

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Consumer", "Producer"]

T = TypeVar("T")
_RESULT_MARGIN = 5.0  # seconds added to a call's own timeout before the caller stops waiting


class _LoopThread:
    """An event loop running in a daemon thread; ``call`` runs a coroutine there and blocks."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking call from the facade's own event-loop thread would deadlock")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout} s") from None

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class Producer:
    """A blocking :class:`fastnsq.Producer`, safe to call from many threads.

    Same arguments and options as the async producer (the HA ones included); ``publish``
    and ``mpublish`` take the same keyword arguments as the async ones and block until nsqd
    has the message(s), returning its answer; ``publish_async`` returns at once with a
    ``concurrent.futures.Future`` of that answer (go-nsq's ``PublishAsync``).
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        *,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        # Built here, in the caller's thread, so bad options raise at once.
        self._producer = AsyncProducer(nsqd_tcp_addresses, lookupd_http_addresses=lookupd_http_addresses, **options)
        self._thread = _LoopThread("fastnsq-producer")
        try:
            self._thread.call(self._producer.start())
        except BaseException:
            self._thread.stop()
            raise
        self._closed = False

    def _timeout(self, timeout: float | None) -> float:
        return (self._producer.publish_timeout if timeout is None else timeout) * (1 + self._producer.max_retries) + _RESULT_MARGIN

    def publish(
        self,
        topic: str,
        body: Any,
        *,
        defer: float | None = None,
        timeout: float | None = None,
        partition: int | None = None,
        sharding_key: Any = None,
        trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> Any:
        """Publish one message and block until nsqd acknowledged it (or raise); the arguments are
        :meth:`fastnsq.Producer.publish`'s."""
        call = self._producer.publish(topic, body, defer=defer, timeout=timeout, partition=partition,
                                      sharding_key=sharding_key, trace_id=trace_id, ext=ext)
        return self._thread.call(call, self._timeout(timeout))

    def publish_async(self, topic: str, body: Any, **arguments: Any) -> concurrent.futures.Future[Any]:
        """:meth:`publish` without waiting: a future of nsqd's answer (or of the error)."""
        call = self._producer.publish(topic, body, **arguments)
        return asyncio.run_coroutine_threadsafe(call, self._thread.loop)

    def mpublish(
        self,
        topic: str,
        bodies: Sequence[Any],
        *,
        timeout: float | None = None,
        partition: int | None = None,
        sharding_key: Any = None,
        trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any]] | None = None,
    ) -> Any:
        """Publish a batch and block until nsqd acknowledged it (or raise); the arguments are
        :meth:`fastnsq.Producer.mpublish`'s."""
        call = self._producer.mpublish(topic, bodies, timeout=timeout, partition=partition,
                                       sharding_key=sharding_key, trace_ids=trace_ids, exts=exts)
        return self._thread.call(call, self._timeout(timeout))

    def publish_and_retry_background(self, topic: str, body: Any, **arguments: Any) -> bool:
        """:meth:`fastnsq.Producer.publish_and_retry_background`: True if nsqd has it, False if it
        waits for a background retry (the retries run on the facade's loop)."""
        return self._thread.call(self._producer.publish_and_retry_background(topic, body, **arguments),
                                 self._timeout(None))

    def node_stats(self) -> dict[str, NodeStats]:
        """:meth:`fastnsq.Producer.node_stats`, taken on its loop."""
        if self._closed:
            return self._producer.node_stats()
        return self._thread.call(_call_async(self._producer.node_stats), 10)

    def snapshot(self) -> ProducerStats:
        """The async producer's :meth:`~fastnsq.Producer.snapshot`, taken on its loop."""
        if self._closed:
            return self._producer.snapshot()
        return self._thread.call(_call_async(self._producer.snapshot), 10)

    def close(self, timeout: float = 5.0) -> CloseReport:
        """Wait for publishes in flight (up to ``timeout``), close connections, stop the thread;
        returns what was left unsent (background retries)."""
        if self._closed:
            return CloseReport()
        self._closed = True
        try:
            return self._thread.call(self._producer.close(timeout), timeout + _RESULT_MARGIN)
        finally:
            self._thread.stop()

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

    def _on_loop(self, method: str, *args: Any) -> None:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def call() -> None:
            try:
                getattr(self._message, method)(*args)
                done.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        done.result(30)

    def finish(self) -> None:
        self._on_loop("finish")

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        self._on_loop("requeue", delay, backoff)

    def touch(self) -> None:
        self._on_loop("touch")

    def disable_auto_response(self) -> None:
        self._on_loop("disable_auto_response")


class Consumer:
    """A blocking consumer: ``handler(message)`` runs in ``workers`` threads.

    >>> def handle(message):                                 # doctest: +SKIP
    ...     print(message.body)
    >>> consumer = Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"],
    ...                     handler=handle, workers=4, max_in_flight=8)
    >>> consumer.run()          # blocks until stop() is called or SIGINT/SIGTERM arrives

    ``start()`` returns at once (the consumer runs in the background); ``stop()``
    drains as :meth:`fastnsq.Consumer.stop` does and returns its report.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        handler: Callable[[Any], Any],
        workers: int = 1,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        if not callable(handler):
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
            handler=self._handle,
            **options,
        )
        self._thread: _LoopThread | None = None
        self._stopped = threading.Event()
        self._report: StopReport | None = None

    async def _handle(self, message: Any) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._user_handler, _ThreadSafeMessage(message, loop))

    def start(self) -> None:
        """Connect and consume in the background."""
        if self._thread is not None:
            return
        self._thread = _LoopThread("fastnsq-consumer")
        try:
            self._thread.call(self._consumer.start())
        except BaseException:
            self._thread.stop()
            self._thread = None
            raise

    def stop(self, timeout: float = 30.0) -> StopReport:
        """Drain (handlers finish until ``timeout``), requeue the rest, close. Idempotent."""
        if self._report is not None:
            return self._report
        if self._thread is None:
            return StopReport()
        try:
            self._report = self._thread.call(self._consumer.stop(timeout), timeout + _RESULT_MARGIN)
        finally:
            self._thread.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()
        return self._report

    def run(self, stop_signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> StopReport:
        """Start, block until ``stop()`` or one of ``stop_signals`` (main thread only), then drain."""
        self.start()
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in stop_signals:
                previous[sig] = signal.signal(sig, lambda *_: self._stopped.set())
        try:
            while not self._stopped.wait(0.2):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.stop()

    def pause_partition(self, partition: int | None) -> None:
        """:meth:`fastnsq.Consumer.pause_partition`, on the consumer's loop."""
        self._on_loop(self._consumer.pause_partition, partition)

    def resume_partition(self, partition: int | None) -> None:
        self._on_loop(self._consumer.resume_partition, partition)

    @property
    def partitions(self) -> Any:
        """The async consumer's :class:`~fastnsq.consumer.PartitionState` objects (HA: starts, positions)."""
        return self._consumer.partitions

    def _on_loop(self, method: Callable[..., Any], *args: Any) -> None:
        if self._thread is None:
            method(*args)
            return

        async def run() -> None:
            method(*args)

        self._thread.call(run(), 10)

    def snapshot(self) -> ConsumerStats:
        """The async consumer's :meth:`~fastnsq.Consumer.snapshot`, taken on its loop."""
        if self._thread is None:
            return self._consumer.snapshot()  # not started: nothing runs that could change it
        return self._thread.call(_call_async(self._consumer.snapshot), 10)

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


async def _call_async(func: Callable[[], T]) -> T:
    return func()
