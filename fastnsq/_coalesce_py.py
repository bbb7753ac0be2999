"""Coalescing of concurrent publishes in plain Python: the twin of ``_coalesce.pyx``.

Same API and behaviour (see that module's docstring); used with
``FASTNSQ_NO_EXTENSIONS=1`` or when the extension is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .errors import ConnectionClosedError, InvalidValueError

IMPLEMENTATION = "python"


def body_size(body: Any) -> int:
    """Bytes on the wire for a body (str is sent as UTF-8)."""
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, str):
        return len(body) if body.isascii() else len(body.encode("utf-8"))
    if isinstance(body, memoryview):
        return body.nbytes
    raise InvalidValueError(f"message body must be bytes, bytearray, memoryview or str, not {type(body).__name__}")


class Batch:
    """The publishes of one loop pass for one key: bodies, their futures, the MPUB size.

    A Batch is also the answer its PUB/MPUB waits for on the connection (``done``,
    ``set_result``, ``set_exception``: what the connection calls on a command's future): it
    resolves its publishes in the read that brings nsqd's answer, with no future of its own and
    no loop pass in between. ``on_settled``, when set, is called with the error (None: answered).
    """

    __slots__ = ("_settled", "bodies", "futures", "nbytes", "on_settled", "owner")

    def __init__(self, owner: Coalescer) -> None:
        self.bodies: list[Any] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.nbytes = 4  # the MPUB message count
        self.owner = owner
        self._settled = False
        self.on_settled: Callable[[BaseException | None], object] | None = None

    def __len__(self) -> int:
        return len(self.bodies)

    def done(self) -> bool:
        return self._settled

    def set_result(self, result: Any) -> None:
        self._settle(result, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def resolve(self, sent: asyncio.Future[Any]) -> None:
        """Done-callback of a PUB/MPUB future: resolve every publish of the batch with its outcome."""
        if sent.cancelled():
            self._settle(None, ConnectionClosedError("the command was cancelled"))
        elif sent.exception() is not None:
            self._settle(None, sent.exception())
        else:
            self._settle(sent.result(), None)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        if self._settled:
            return
        self._settled = True
        ok = 0
        for future in self.futures:
            if future.done():
                continue
            if error is None:
                future.set_result(result)
                ok += 1
            else:
                future.set_exception(error)
        self.owner.published += ok
        self.owner.pending -= len(self.futures)
        if self.on_settled is not None:
            self.on_settled(error)

    def fail(self, error: BaseException) -> None:
        """The batch could not be sent: every publish of it gets ``error``."""
        self._settle(None, error)

    def split(self, max_bytes: int, max_count: int) -> list[Batch]:
        """Batches of at most ``max_bytes`` (MPUB body) and ``max_count`` messages, in order."""
        parts: list[Batch] = []
        part: Batch | None = None
        for body, future in zip(self.bodies, self.futures):
            size = 4 + body_size(body)
            if part is None or (part.bodies and (part.nbytes + size > max_bytes or len(part.bodies) >= max_count)):
                part = Batch(self.owner)
                parts.append(part)
            part.bodies.append(body)
            part.futures.append(future)
            part.nbytes += size
        return parts


class Coalescer:
    """Gathers publishes per key during one loop pass; ``flush(batches)`` runs once per pass."""

    __slots__ = (
        "_batches",
        "_call_soon",
        "_create_future",
        "_flush",
        "_scheduled",
        "flush_at",
        "flush_bytes",
        "lone_at_once",
        "max_msg_size",
        "pending",
        "published",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, flush: Callable[[dict[Any, Batch]], Any],
                 max_msg_size: int, flush_at: int = 0, flush_bytes: int = 0, lone_at_once: bool = False) -> None:
        self._create_future = loop.create_future
        self._call_soon = loop.call_soon
        self._flush = flush
        self._batches: dict[Any, Batch] = {}
        self._scheduled = False
        self.max_msg_size = max_msg_size
        self.pending = 0
        self.published = 0
        self.flush_at = flush_at
        self.flush_bytes = flush_bytes
        self.lone_at_once = lone_at_once

    def add(self, key: Any, body: Any) -> asyncio.Future[Any]:
        size = body_size(body)
        if size == 0:
            raise InvalidValueError("empty message body: nsqd rejects empty messages")
        if size > self.max_msg_size:
            raise InvalidValueError(f"message of {size} bytes exceeds max_msg_size {self.max_msg_size}")
        future = self._create_future()
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = Batch(self)
        batch.bodies.append(body)
        batch.futures.append(future)
        batch.nbytes += 4 + size
        self.pending += 1
        if (self.lone_at_once and self.pending == 1) or (self.flush_at and len(batch.bodies) >= self.flush_at) or (
            self.flush_bytes and batch.nbytes >= self.flush_bytes
        ):
            # Out now: the only publish unanswered, or a full batch (see _coalesce.pyx).
            del self._batches[key]
            self._flush({key: batch})
            return future
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._run_flush)
        return future

    def _run_flush(self) -> None:
        self._scheduled = False
        batches, self._batches = self._batches, {}
        self._flush(batches)
