"""A worker child's handler threads (``--threads M``), each set up and torn down in itself.

One job: run a blocking handler in M threads of the child, each of which calls the handler
object's ``setup_thread()`` before its first message and ``teardown_thread()`` after its
last. Why not a ``ThreadPoolExecutor``: it has no hook after a thread's last task, and its
threads start one by one as work comes, so a failing setup would show as failed messages
long after the child started. Here every thread is set up before the child consumes, and a
setup that raises stops the child (the supervisor says why), as ``setup()`` does.

A driver whose objects belong to the thread that made them (the standard library's
``sqlite3``; many C clients) opens them in ``setup_thread()`` and keeps them in a
``threading.local``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("fastnsq.worker")

#: How long the drain waits for the threads to finish their call and run ``teardown_thread()``.
TEARDOWN_WAIT = 5.0

_Work = tuple["concurrent.futures.Future[Any]", Callable[[Any], Any], Any]


class HandlerThreads:
    """``count`` threads named ``<name>_<i>`` taking calls in turn from one queue."""

    def __init__(self, count: int, setup_thread: Callable[[], Any] | None = None,
                 teardown_thread: Callable[[], Any] | None = None, name: str = "fastnsq-worker") -> None:
        self._setup, self._teardown = setup_thread, teardown_thread
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._set_up = [concurrent.futures.Future[None]() for _ in range(count)]
        self._ended = [concurrent.futures.Future[None]() for _ in range(count)]
        self._threads = [threading.Thread(target=self._serve, args=(index,), name=f"{name}_{index}", daemon=True)
                         for index in range(count)]
        self._closed = False

    async def start(self) -> None:
        """Start the threads and wait until each has run ``setup_thread()``; the first error raises."""
        for thread in self._threads:
            thread.start()
        try:
            await asyncio.gather(*(asyncio.wrap_future(done) for done in self._set_up))
        except (Exception, asyncio.CancelledError):  # not GeneratorExit: no await while being closed
            await self.close()  # the threads set up end (and tear down) before the child fails
            raise

    async def run(self, call: Callable[[Any], Any], argument: Any) -> Any:
        """``call(argument)`` in the next free thread; its result, or what it raised."""
        if self._closed:
            raise RuntimeError("the handler threads are closed (the worker is draining)")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((future, call, argument))
        return await asyncio.wrap_future(future)

    async def close(self, wait: float = TEARDOWN_WAIT) -> None:
        """No more calls: those not begun are cancelled (the consumer's drain has answered their
        messages), each thread ends its call and runs ``teardown_thread()``, for at most ``wait`` s."""
        self._closed = True
        while True:
            try:
                work = self._queue.get_nowait()
            except queue.Empty:
                break
            if work is not None:
                work[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        started = [asyncio.wrap_future(ended) for ended, thread in zip(self._ended, self._threads) if thread.ident]
        if started:
            _, late = await asyncio.wait(started, timeout=wait)
            if late:
                logger.warning("%d handler thread(s) still in a call %.0f s after the drain: not waiting for "
                               "their teardown_thread()", len(late), wait)

    def _serve(self, index: int) -> None:
        try:
            if self._setup is not None:
                self._setup()
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it on the loop
            self._set_up[index].set_exception(exc)
            self._ended[index].set_result(None)
            return
        self._set_up[index].set_result(None)
        while (work := self._queue.get()) is not None:
            future, call, argument = work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call(argument)
            except BaseException as exc:  # noqa: BLE001 - the handler's failure goes to its caller
                future.set_exception(exc)
            else:
                future.set_result(result)
        try:
            if self._teardown is not None:
                self._teardown()
        except Exception:  # a teardown that raises is logged; the drain goes on
            logger.exception("teardown_thread() raised in %s", threading.current_thread().name)
        finally:
            self._ended[index].set_result(None)
