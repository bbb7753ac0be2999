"""Publishes handed over in batches by a caller that does not await: the blocking facade.

The facade's loop thread takes the plain publishes of many threads at once, so per topic they
are a batch already: one MPUB (chunked under nsqd's limits) on the next open connection,
written at once rather than at the end of the loop pass, with no future and no callback per
message; its answer resolves them all. A bad body fails only its own caller; a lost
connection hands each of its messages to the producer's retrying path (``failed``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import InvalidValueError, NoConnectionError
from .ha import HAProducer
from .messages import MPUB_FRAMING, body_size, check_message_size, mpub_chunks
from .pool import ConnectionPool

__all__ = ["DirectPublisher", "Done"]

#: Called once per publish with nsqd's answer, or None and the error.
Done = Callable[[Any, BaseException | None], object]


class DirectPublisher:
    """One MPUB per topic and hand-over, answers handed back through each caller's ``done``."""

    def __init__(
        self,
        pool: ConnectionPool,
        ha: HAProducer,
        max_body_size: int,
        max_msg_size: int,
        failed: Callable[[str, Any, Done, BaseException], None],
    ) -> None:
        self._pool = pool
        self._ha = ha
        self._max_body_size = max_body_size
        self._max_msg_size = max_msg_size
        self._max_count = (max_body_size - 4) // 5  # as mpub_chunks counts nsqd's limit
        self._failed = failed  # the producer's: count it, retry it or hand the error over
        self.published = 0  # messages nsqd acknowledged through here
        self.pending = 0  # messages written, not answered yet (close() waits for them)

    def send(self, topic: str, bodies: list[Any], dones: list[Done]) -> None:
        """Publish ``bodies`` to ``topic`` now (a valid topic); ``dones[i]`` gets body i's outcome."""
        items = []
        used = 4  # MPUB's message count, then 4 bytes of size before each body
        for body, done in zip(bodies, dones):
            try:
                size = body_size(body)
                check_message_size(size, self._max_msg_size, 0)
            except InvalidValueError as exc:  # this caller's mistake alone
                done(None, exc)
                continue
            items.append((body, done))
            used += 4 + size
        if not items:
            return
        conn = self._pool.pick(None)
        if conn is None:
            for body, done in items:
                self._failed(topic, body, done, NoConnectionError("no open connection to any nsqd"))
            return
        if used <= self._max_body_size - MPUB_FRAMING + 4 and len(items) <= self._max_count:
            chunks = [items]  # the common case: the sizes are known already
        else:
            chunks = mpub_chunks(items, self._max_body_size, self._max_msg_size, _no_header, _body)
        held = conn.hold_writes()  # this hand-over is the whole batch: written at once, not a pass later
        try:
            for chunk in chunks:
                answer = _Answer(self, topic, chunk, self._ha.timer(conn.address))
                try:
                    if len(chunk) == 1:
                        conn.publish(topic, chunk[0][0], answer=answer)
                    else:
                        conn.mpublish(topic, [body for body, _ in chunk], answer=answer)
                except Exception as exc:  # noqa: BLE001 - e.g. the connection closed during this pass
                    for body, done in chunk:
                        self._failed(topic, body, done, exc)
                    continue
                self.pending += len(chunk)
        finally:
            if held:
                conn.release_writes()
            else:
                conn.flush()

    def _answered(self, topic: str, chunk: list[tuple[Any, Done]], error: BaseException | None, answer: Any) -> None:
        self.pending -= len(chunk)
        if error is None:
            self.published += len(chunk)
            for _, done in chunk:
                _call_done(done, answer, None)
            return
        for body, done in chunk:
            try:
                self._failed(topic, body, done, error)
            except Exception as exc:  # noqa: BLE001 - an answer must not raise into the connection's read
                _report(exc)


class _Answer:
    """One command's answer (the connection's :class:`~fastnsq.conn.Answer`): its callers get the
    outcome in the read that brings it, with no future and no loop pass in between."""

    __slots__ = ("_chunk", "_owner", "_settled", "_timer", "_topic")

    def __init__(self, owner: DirectPublisher, topic: str, chunk: list[tuple[Any, Done]],
                 timer: Callable[[BaseException | None], None]) -> None:
        self._owner = owner
        self._topic = topic
        self._chunk = chunk
        self._timer = timer
        self._settled = False

    def done(self) -> bool:
        return self._settled

    def set_result(self, result: Any) -> None:
        self._settle(None, result)

    def set_exception(self, exception: BaseException) -> None:
        self._settle(exception, None)

    def _settle(self, error: BaseException | None, answer: Any) -> None:
        if self._settled:
            return
        self._settled = True
        self._timer(error)
        self._owner._answered(self._topic, self._chunk, error, answer)


def _call_done(done: Done, answer: Any, error: BaseException | None) -> None:
    try:
        done(answer, error)
    except Exception as exc:  # noqa: BLE001 - a caller's callback must not raise into the connection's read
        _report(exc)


def _report(exc: BaseException) -> None:
    asyncio.get_running_loop().call_exception_handler(
        {"message": "a publish's answer callback raised", "exception": exc}
    )


def _no_header(item: tuple[Any, Done]) -> int:
    return 0


def _body(item: tuple[Any, Done]) -> Any:
    return item[0]
