"""The user's handler: ``MODULE:FUNCTION`` or ``MODULE:OBJECT`` found, checked and described.

One job: turn the target string into a :class:`Handler` (the callable, whether it is a
coroutine function, and the per-process ``setup``/``teardown`` hooks of an object), or
raise :class:`LoadError` with one line that names the target and what went wrong. The
supervisor loads the target once before starting any child, so a module that does not
import fails at once with exit status 2, not as a crash loop of children.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class LoadError(Exception):
    """The target cannot be used as a handler (reported with exit status 2)."""


@dataclass
class Handler:
    """What a child runs: ``call(message)`` (or ``call(batch)``), and the object's hooks."""

    target: str
    call: Callable[[Any], Any]
    is_async: bool
    setup: Callable[[], Any] | None = None
    teardown: Callable[[], Any] | None = None
    #: A built-in app's hooks (``fastnsq to-file`` and the like): ``attach(consumer)`` once the
    #: Consumer runs, ``drain()`` before it stops; and whether it answers its batches itself
    #: (to-file FINs only after an fsync, to-nsq only after nsqd's OK); ``hup()`` on a SIGHUP
    #: (any handler object may have one: reopen a log file, reload a setting).
    attach: Callable[[Any], Any] | None = None
    drain: Callable[[], Any] | None = None
    answers_batches: bool = False
    hup: Callable[[], Any] | None = None
    #: Plain functions run in each thread that runs ``call`` (each of ``--threads M``, or the
    #: event loop's), before its first message and after its last: a driver whose objects
    #: belong to one thread (sqlite3) opens them there.
    setup_thread: Callable[[], Any] | None = None
    teardown_thread: Callable[[], Any] | None = None
    #: ``ready()`` (sync or async): the Consumer's ``ready_check``, polled while the handler fails.
    ready: Callable[[], Any] | None = None


def load(target: str, options: dict[str, Any] | None = None) -> Handler:
    """Import ``MODULE:NAME`` (NAME may be dotted) and make a :class:`Handler` of it.

    A function is the handler. A class is instantiated with no arguments (once per
    process); an object's ``handle`` method is the handler if it has one, else the object
    itself when callable; its ``setup()`` and ``teardown()`` (sync or async) are the hooks, and
    ``setup_thread()`` / ``teardown_thread()`` (plain functions) those of each handler thread.
    The current directory is on ``sys.path`` first, as for ``python -m``. ``options``: keyword
    arguments for a class (the settings of a built-in app), sent to each child as JSON.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise LoadError(f"handler {target!r} is not MODULE:FUNCTION or MODULE:OBJECT (e.g. myapp.jobs:handle)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = _import(module_name, target)
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise LoadError(f"handler {target!r}: module {module_name!r} has no attribute {attribute!r}") from None
    if inspect.isclass(found):
        try:
            found = found(**(options or {}))
        except Exception as exc:
            raise LoadError(f"handler {target!r}: {attribute}() raised {type(exc).__name__}: {exc}") from exc
    return _describe(target, found)


def _import(module_name: str, target: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or module_name.startswith(f"{exc.name}."):
            raise LoadError(f"handler {target!r}: no module named {module_name!r} "
                            f"(looked in the current directory and sys.path)") from exc
        raise LoadError(f"handler {target!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise LoadError(f"handler {target!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc


def _describe(target: str, found: Any) -> Handler:
    handle = getattr(found, "handle", None)
    hooks = not inspect.isfunction(found) and not inspect.ismethod(found)
    if handle is not None and callable(handle) and hooks:
        call = handle
    elif callable(found):
        call = found
    else:
        raise LoadError(f"handler {target!r} is a {type(found).__name__}, not a function or an object with handle()")
    setup, teardown, attach, drain, hup, setup_thread, teardown_thread, ready = (
        _hook(found, name) if hooks else None
        for name in ("setup", "teardown", "attach", "drain", "hup", "setup_thread", "teardown_thread", "ready"))
    for name, hook in (("setup_thread", setup_thread), ("teardown_thread", teardown_thread)):
        if hook is not None and _is_coroutine_function(hook):
            raise LoadError(f"handler {target!r}: {name}() is a coroutine function; it runs in a handler "
                            "thread, so it must be a plain function")
    return Handler(target, call, _is_coroutine_function(call), setup, teardown, attach, drain,
                   bool(getattr(found, "answers_batches", False)) if hooks else False, hup,
                   setup_thread, teardown_thread, ready)


def load_function(target: str, setting: str) -> Callable[..., Any]:
    """``MODULE:FUNCTION`` for a hook setting (``--ready-check``, ``--give-up-handler``): the callable."""
    module_name, _, attribute = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    found: Any = _import(module_name, target)
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise LoadError(f"{setting} {target!r}: not a function of module {module_name!r}")
    return found


def _hook(found: Any, name: str) -> Callable[..., Any] | None:
    hook = getattr(found, name, None)
    return hook if callable(hook) else None


def _is_coroutine_function(call: Any) -> bool:
    if inspect.iscoroutinefunction(call):
        return True
    dunder = getattr(call, "__call__", None)  # noqa: B004 - an object whose __call__ is async
    return dunder is not None and inspect.iscoroutinefunction(dunder)


async def run_hook(hook: Callable[[], Any] | None) -> None:
    """Call a setup/teardown hook, awaiting it when it is a coroutine function."""
    if hook is None:
        return
    result = hook()
    if inspect.isawaitable(result):
        await result
