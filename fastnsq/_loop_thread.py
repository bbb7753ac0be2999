"""The blocking facade's event loop in a daemon thread, stopped before the interpreter ends.

A daemon thread still inside the loop when the interpreter finalizes is a crash waiting for
a timer: uvloop's timer callback takes the GIL with ``PyGILState_Ensure`` from C, and after
finalization that dereferences an interpreter state that is gone (SIGSEGV, seen in about one
in four forked children of a preloaded ``fastnsq.sync.Producer`` exiting by ``sys.exit`` on
a loaded machine). So every loop still running at exit is stopped and its thread joined from
``atexit``, which runs while the interpreter is whole: a producer or consumer the program
never closed (a script, a fork's child) ends its loop there. A fork's child forgets the
parent's loops: their threads do not exist in the child and their descriptors are the parent's.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from .loop import new_event_loop

__all__ = ["EXIT_JOIN_TIMEOUT", "JOIN_TIMEOUT", "LoopThread"]

T = TypeVar("T")
#: Seconds ``stop()`` waits for the loop's thread to end (at exit: per loop still running).
JOIN_TIMEOUT = 10.0
EXIT_JOIN_TIMEOUT = 2.0

_RUNNING: weakref.WeakSet[LoopThread] = weakref.WeakSet()


class LoopThread:
    """An event loop running in a daemon thread; ``call`` runs a coroutine there and blocks."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _RUNNING.add(self)

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
            if future.done():
                raise  # the call's own TimeoutError (PublishTimeoutError is one), not this wait's
            future.cancel()
            raise TimeoutError(f"no result within {timeout} s") from None

    def stop(self, timeout: float = JOIN_TIMEOUT) -> None:
        _RUNNING.discard(self)
        if self.loop.is_running():
            if self._thread is not threading.current_thread():
                self._wind_down(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)
        if not self.loop.is_running():
            self.loop.close()


    def _wind_down(self, timeout: float) -> None:
        """Cancel what still runs in the loop (the reconnect attempts of a producer or consumer
        never closed) and let it finish, within ``timeout``: a task left pending when the loop
        closes is reported at exit ("Task was destroyed but it is pending!", and its coroutine's
        cleanup fails with "no running event loop"), a screenful for a script that just ended."""
        try:
            asyncio.run_coroutine_threadsafe(_cancel_other_tasks(timeout), self.loop).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # the loop is stopping anyway: what did not finish is left, as before


async def _cancel_other_tasks(timeout: float) -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout / 2)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _stop_running_loops() -> None:
    for thread in list(_RUNNING):
        thread.stop(EXIT_JOIN_TIMEOUT)


atexit.register(_stop_running_loops)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RUNNING.clear)
