"""The blocking producer's hand-off: calls from any thread to the producer's event loop.

A future handed to the loop per call (``run_coroutine_threadsafe``: a coroutine, a task, a
concurrent future and a wake of the loop each) cost more than the publish itself. Here a call
is a tuple in a deque; the loop is woken once when the deque goes from empty to non-empty,
takes everything queued in one pass and gives the plain publishes to the producer per topic
(``publish_batch_soon``: one MPUB written at once, no coroutine, no future per message); each
answer comes back through a lock its caller blocks on (:class:`Call`), one MPUB's answer
releasing all its callers. The deque keeps each thread's calls in order.

While no connection is open and every attempt failed, publishes fail at once with an error
naming the nsqd and the cause (the producer keeps reconnecting); a cause older than 0.2 s is
not given: the publishes then wait for an attempt made for them, so the first one after nsqd
is back goes through; while the first attempt is under way they wait for it. After ``os.fork()`` the child's copy of the loop has no thread:
right after the fork, ``_abandon`` makes sure the child never touches the parent's loop or
sockets; at its first call the facade builds a new loop, producer and bridge
(``FORKS.generation`` tells it a fork happened).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from .errors import ConnectionClosedError, PublishTimeoutError
from .producer import Producer
from .producer.direct import Done

__all__ = ["FORKS", "Bridge", "Call", "close_producer"]

# What a queued call is: its first item.
PUBLISH = 0  # (PUBLISH, topic, body, done): producer.publish_batch_soon; fails fast while nsqd is down
SEND = 1  # (SEND, make_coroutine, None, done): a publish in a task; fails fast while nsqd is down
CALL = 2  # (CALL, make_coroutine, None, done): close, background retries: always run, never held


class _Forks:
    """How many times this process is a fork's child; a lock made anew in each child."""

    def __init__(self) -> None:
        self.generation = 0
        self.lock = threading.Lock()

    def after_in_child(self) -> None:
        self.generation += 1
        self.lock = threading.Lock()  # another thread may have held the parent's at the fork
        # Now, before the child's own code runs: the descriptors are still the parent's sockets.
        for bridge in list(_LIVE):
            _abandon(bridge)
        _LIVE.clear()


FORKS = _Forks()
_LIVE: weakref.WeakSet[Bridge] = weakref.WeakSet()  # the bridges whose loop runs in this process
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=FORKS.after_in_child)


class Call:
    """One blocking call: the caller waits on ``lock``, which the loop thread releases."""

    __slots__ = ("answer", "error", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.answer: Any = None
        self.error: BaseException | None = None

    def __call__(self, answer: Any, error: BaseException | None) -> None:  # the ``done`` of a call
        self.answer = answer
        self.error = error
        self.lock.release()

    def wait(self, timeout: float, limit: float | None = None) -> Any:
        """The answer within ``timeout`` s (what is left of ``limit``, the call's publish_timeout)."""
        if not self.lock.acquire(True, timeout):
            within = f"{timeout:.3f} s" if limit is None else f"publish_timeout={limit} s"
            raise PublishTimeoutError(f"no answer within {within} (it may still arrive)")
        if self.error is not None:
            raise self.error
        return self.answer


def settle_future(future: concurrent.futures.Future[Any], answer: Any, error: BaseException | None) -> None:
    """The ``done`` of ``publish_async``: its concurrent future (unless the caller cancelled it)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is None:
            future.set_result(answer)
        else:
            future.set_exception(error)


class Bridge:
    """Queued calls from any thread, dispatched on ``loop`` to ``producer``, many per wake."""

    def __init__(self, loop: asyncio.AbstractEventLoop, producer: Producer, loop_thread: int) -> None:
        self.loop = loop
        self.loop_thread = loop_thread  # its ident: a blocking call from there would wait for itself
        self.producer = producer
        self.generation = FORKS.generation
        self.closed = False
        self._queue: deque[tuple[int, Any, Any, Done]] = deque()
        self._woken = False  # a _drain is scheduled: nobody needs to wake the loop
        self._held: list[tuple[int, Any, Any, Done]] | None = None  # waiting for the first connect
        self._failing = threading.Lock()  # fail_leftovers may run in two threads at once
        _LIVE.add(self)

    # ---- any thread -----------------------------------------------------------------------

    def put(self, kind: int, first: Any, second: Any, done: Done) -> None:
        """Queue a call; ``done(answer, error)`` runs on the loop thread (or here once closed)."""
        self._queue.append((kind, first, second, done))
        # The loop clears _woken before it takes the queue, so a call appended before this read
        # saw True only if that drain is still to take it; two wakes at once are harmless.
        if not self._woken:
            self._woken = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: the producer is
                self.closed = True
        if self.closed:
            self.fail_leftovers()

    def publish(self, topic: str, body: Any, timeout: float, limit: float | None = None) -> Any:
        if threading.get_ident() == self.loop_thread:
            _deadlock()
        call = Call()
        self.put(PUBLISH, topic, body, call)
        return call.wait(timeout, limit)

    def run(self, kind: int, make: Callable[[], Coroutine[Any, Any, Any]], timeout: float,
            limit: float | None = None) -> Any:
        if threading.get_ident() == self.loop_thread:
            _deadlock()
        call = Call()
        self.put(kind, make, None, call)
        return call.wait(timeout, limit)

    def fail_leftovers(self) -> None:
        """The loop is gone: every call still queued or held fails (each once; any thread)."""
        self.closed = True
        _LIVE.discard(self)
        with self._failing:
            held, self._held = self._held or [], None
            for _, _, _, done in held:
                done(None, ConnectionClosedError("the producer is closed"))
            while True:
                try:
                    _, _, _, done = self._queue.popleft()
                except IndexError:
                    return
                done(None, ConnectionClosedError("the producer is closed"))

    # ---- the loop thread --------------------------------------------------------------------

    def _drain(self) -> None:
        self._woken = False
        queue = self._queue
        items = [queue.popleft() for _ in range(len(queue))]
        if self._held is None and self.producer.connecting() is None:
            self._dispatch(items)
            return
        # The first attempt to connect is under way: publishes wait for its outcome (close()
        # waits for it too, within its own timeout: the facade's close does).
        self._dispatch([item for item in items if item[0] == CALL])
        publishes = [item for item in items if item[0] != CALL]
        if self._held is not None:
            self._held += publishes
            return
        task = self.producer.connecting()
        assert task is not None
        self._held = publishes
        task.add_done_callback(self._release)

    def _release(self, _task: object) -> None:
        items, self._held = self._held or [], None
        self._dispatch(items)

    def _dispatch(self, items: list[tuple[int, Any, Any, Done]]) -> None:
        producer = self.producer
        down = producer.unreachable()
        batches: dict[str, tuple[list[Any], list[Done]]] = {}  # the plain publishes, per topic, in order
        for kind, first, second, done in items:
            if kind == PUBLISH and down is None:
                if type(first) is str:
                    batch = batches.get(first)
                    if batch is None:
                        batch = batches[first] = ([], [])
                    batch[0].append(second)
                    batch[1].append(done)
                else:
                    producer.publish_soon(first, second, done)  # raises for this caller alone
            elif kind == CALL or down is None:
                self._run_task(first(), done)
            else:
                done(None, type(down)(*down.args))  # one per caller: each raises its own
        for topic, (bodies, dones) in batches.items():
            producer.publish_batch_soon(topic, bodies, dones)

    def _run_task(self, call: Coroutine[Any, Any, Any], done: Done) -> None:
        task = self.loop.create_task(call)
        task.add_done_callback(lambda finished: _task_outcome(finished, done))


async def close_producer(producer: Producer, timeout: float) -> Any:
    """The facade's close on the loop: publishes held for the first connect go out first (within
    ``timeout``; a connect that takes longer is given up), then the producer's own close."""
    connecting = producer.connecting()
    if connecting is not None:
        await asyncio.wait({connecting}, timeout=timeout)
    return await producer.close(timeout)


def _deadlock() -> None:
    raise RuntimeError("a blocking call from the facade's own event-loop thread would wait for itself "
                       "(from a callback on that loop, use publish_async)")


def _task_outcome(task: asyncio.Task[Any], done: Done) -> None:
    if task.cancelled():
        done(None, ConnectionClosedError("the call was cancelled: the producer closed"))
        return
    error = task.exception()
    done(None if error is not None else task.result(), error)


# ---- after a fork ------------------------------------------------------------------------------

_ABANDONED: list[Any] = []


def _abandon(bridge: Bridge) -> None:
    """In a fork's child: never touch the parent's loop, producer or connections again.

    The child's copies share the parent's open files: closing a connection here would take
    it out of the parent's epoll set (libuv removes a closed descriptor from its epoll, which
    the child shares), and the loop, "running" in a thread the child does not have, raises
    when freed. So they are kept alive for good, and the child's descriptors of the
    connections to nsqd now point at /dev/null: nsqd still sees the parent's connection
    close when the parent closes it, and nothing here can read or write it.
    """
    _ABANDONED.append(bridge)
    _keep_forever(bridge)
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for conn in bridge.producer.connections:
                fd = _socket_fd(conn)
                if fd is not None:
                    os.dup2(null, fd)
        finally:
            os.close(null)


def _socket_fd(conn: Any) -> int | None:
    transport = getattr(conn, "_transport", None)  # Connection keeps no public handle on it
    sock = transport.get_extra_info("socket") if transport is not None else None
    fd = sock.fileno() if sock is not None else -1
    return fd if fd >= 0 else None


def _keep_forever(obj: object) -> None:
    """One reference the interpreter's shutdown does not drop (module globals it does)."""
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except (ImportError, AttributeError):  # pragma: no cover - no ctypes: the list keeps it until exit
        pass
