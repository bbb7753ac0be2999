"""fastnsq.run on every supported Python: asyncio.Runner where it exists, the 3.10 path elsewhere.

Both paths are exercised on every interpreter: ``run`` takes whichever the interpreter has,
and ``_run_without_runner`` (the only path on 3.10) is called directly.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

import fastnsq
from fastnsq import loop as fastnsq_loop

RUNNERS: list[Any] = [
    pytest.param(lambda main: fastnsq.run(main), id="run"),
    pytest.param(lambda main: fastnsq_loop._run_without_runner(main, None), id="without-runner"),
]


@pytest.mark.parametrize("runner", RUNNERS)
def test_returns_the_coroutine_result_on_fastnsqs_loop(runner: Callable[[Any], Any]) -> None:
    async def main() -> tuple[int, str]:
        return 42, type(asyncio.get_running_loop()).__module__

    value, loop_module = runner(main())
    assert value == 42
    expected = "uvloop" if fastnsq_loop.uvloop_enabled() else "asyncio"
    assert loop_module.startswith(expected)


@pytest.mark.parametrize("runner", RUNNERS)
def test_exceptions_propagate(runner: Callable[[Any], Any]) -> None:
    async def main() -> None:
        raise LookupError("from main")

    with pytest.raises(LookupError, match="from main"):
        runner(main())


@pytest.mark.parametrize("runner", RUNNERS)
def test_leftover_tasks_are_cancelled_and_async_generators_closed(runner: Callable[[Any], Any]) -> None:
    seen: list[str] = []

    async def sleeper() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("task cancelled")
            raise

    async def numbers() -> Any:
        try:
            yield 1
            yield 2
        finally:
            seen.append("generator closed")

    async def main() -> asyncio.AbstractEventLoop:
        asyncio.get_running_loop().create_task(sleeper())
        generator = numbers()
        assert await generator.__anext__() == 1
        await asyncio.sleep(0)
        main.generator = generator  # type: ignore[attr-defined]  # keep it alive past main
        return asyncio.get_running_loop()

    used = runner(main())
    assert sorted(seen) == ["generator closed", "task cancelled"]
    assert used.is_closed()


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_default_executor_is_shut_down(runner: Callable[[Any], Any]) -> None:
    async def main() -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, sum, [1, 2, 3]) == 6
        return loop

    loop = runner(main())
    assert loop.is_closed()
    # shutdown_default_executor joins the executor's threads before the loop closes.
    assert not [t for t in threading.enumerate() if t.name.startswith("asyncio_")]


def test_run_takes_the_runner_this_python_has(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    monkeypatch.setattr(fastnsq_loop, "_run_without_runner", lambda main, debug: taken.append("without") or main.close())
    fastnsq.run(asyncio.sleep(0))
    assert taken == ([] if sys.version_info >= (3, 11) else ["without"])


@pytest.mark.parametrize("debug", [True, False])
def test_debug_is_passed_to_the_loop(debug: bool) -> None:
    async def main() -> bool:
        return asyncio.get_running_loop().get_debug()

    assert fastnsq_loop._run_without_runner(main(), debug) is debug
    assert fastnsq.run(main(), debug=debug) is debug
