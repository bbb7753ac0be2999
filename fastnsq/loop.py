"""Event-loop choice: uvloop when installed (the fast path), plain asyncio otherwise.

``FASTNSQ_NO_UVLOOP=1`` forces the standard loop. fastnsq works on both; the
benchmarks and ``fastnsq.run`` use uvloop by default.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["loop_factory", "loop_name", "new_event_loop", "run", "uvloop_enabled"]

T = TypeVar("T")


def uvloop_enabled() -> bool:
    """Whether uvloop is installed and not disabled by ``FASTNSQ_NO_UVLOOP``."""
    if os.environ.get("FASTNSQ_NO_UVLOOP", "") not in ("", "0"):
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def loop_name() -> str:
    """The loop fastnsq runs on, as ``fastnsq --version`` says it: ``uvloop 0.21.0``, or asyncio and why."""
    if os.environ.get("FASTNSQ_NO_UVLOOP", "") not in ("", "0"):
        return "asyncio (FASTNSQ_NO_UVLOOP=1)"
    try:
        import uvloop
    except ImportError:
        return "asyncio (uvloop is not installed)"
    return f"uvloop {uvloop.__version__}"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The factory of the loop fastnsq prefers."""
    if uvloop_enabled():
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    return loop_factory()()


def run(main: Awaitable[T], *, debug: bool | None = None) -> T:
    """Run a coroutine to completion on uvloop when available, like ``asyncio.run``.

    >>> import fastnsq
    >>> async def main():
    ...     return 42
    >>> fastnsq.run(main())
    42
    """
    if sys.version_info >= (3, 11):
        with asyncio.Runner(debug=debug, loop_factory=loop_factory()) as runner:
            return runner.run(main)  # type: ignore[arg-type]
    return _run_without_runner(main, debug)  # pragma: no cover - Python 3.10 only


def _run_without_runner(main: Awaitable[T], debug: bool | None) -> T:
    """``asyncio.run`` with fastnsq's loop on Python 3.10, which has no ``asyncio.Runner``.

    Same contract as the Runner given a ``loop_factory`` (which does not make the loop the
    thread's current one): afterwards the tasks left over are cancelled and awaited, async
    generators and the default executor are shut down, and the loop is closed.
    """
    loop = new_event_loop()
    if debug is not None:
        loop.set_debug(debug)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_leftover_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {"message": "unhandled exception during fastnsq.run() shutdown", "exception": task.exception(), "task": task}
            )
