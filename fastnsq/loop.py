"""Event-loop choice: uvloop when installed (the fast path), plain asyncio otherwise.

``FASTNSQ_NO_UVLOOP=1`` forces the standard loop. fastnsq works on both; the
benchmarks and ``fastnsq.run`` use uvloop by default.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["loop_factory", "new_event_loop", "run", "uvloop_enabled"]

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
    with asyncio.Runner(debug=debug, loop_factory=loop_factory()) as runner:
        return runner.run(main)  # type: ignore[arg-type]
