"""Run an embedded server on its own event loop in a background thread.

For code that is not async (a Spark job, a Flask app's tests, a script) but needs a
server to talk to::

    from fastnsq.testing import NSQD
    from fastnsq.testing.background import in_thread

    with in_thread(NSQD, msg_timeout=5.0) as nsqd:
        print(nsqd.tcp_address)    # blocking clients can use it here

The server object is built and started inside the thread's loop and stopped there
on exit; ``call(coro_function, *args)`` runs a coroutine function on that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..loop import new_event_loop

__all__ = ["BackgroundServer", "in_thread"]

S = TypeVar("S")


class BackgroundServer:
    """A started server and the loop thread that runs it."""

    def __init__(self, factory: Callable[..., Any], options: dict[str, Any]) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fastnsq-embedded-server", daemon=True)
        self._thread.start()
        self.server: Any = self.call(self._start, factory, options)

    @staticmethod
    async def _start(factory: Callable[..., Any], options: dict[str, Any]) -> Any:
        server = factory(**options)
        await server.start()
        return server

    def call(self, coroutine_function: Callable[..., Any], *args: Any, timeout: float = 60.0) -> Any:
        """Run ``coroutine_function(*args)`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine_function(*args), self._loop).result(timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self.server.stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()


@contextlib.contextmanager
def in_thread(factory: Callable[..., S], **options: Any) -> Iterator[S]:
    """Start ``factory(**options)`` (NSQD, NSQLookupd, NSQCluster, ...) in a background
    thread, yield it, and stop it on exit."""
    background = BackgroundServer(factory, options)
    try:
        yield background.server
    finally:
        background.close()
