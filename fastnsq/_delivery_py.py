"""The pure-Python twin of ``_delivery.pyx``: the same classes, every message on the consumer's path.

The C module adds a fast lane for the common case; this twin has none, so each
message and each answer goes through the link's owner, the consumer's dispatcher
(``on_message``, ``on_finish``, ``on_requeue``, ``on_touch``: the ``LinkOwner``
protocol of ``_delivery.pyi``), which defines the behaviour of both.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._delivery import LinkOwner

IMPLEMENTATION = "python"

__all__ = ["IMPLEMENTATION", "ConnRdy", "Inbox", "Link", "MessageIterator", "finish_all"]


class ConnRdy:
    """The RDY controller's record of one connection (see :mod:`fastnsq.rdy`)."""

    __slots__ = (
        "conn_id",
        "extra_since",
        "fast",
        "granted_at",
        "in_flight",
        "last_message_at",
        "last_rdy_at",
        "max_rdy",
        "pending",
        "pending_until",
        "rdy",
        "remaining",
        "seq",
        "target",
        "waiting_since",
    )

    def __init__(self, conn_id: Hashable, seq: int, max_rdy: int, now: float | None) -> None:
        self.conn_id = conn_id
        self.seq = seq  # insertion order: the deterministic tie-break
        self.max_rdy = max_rdy
        self.rdy = 0
        self.remaining = 0
        self.target = 0
        self.in_flight = 0
        self.pending = 0
        self.pending_until = 0.0
        self.last_message_at: float | None = None
        self.last_rdy_at: float | None = None
        self.granted_at: float | None = None  # when rdy last reached target from below
        self.extra_since: float | None = None  # holds one of the rotating "extra" slots since
        self.waiting_since: float | None = now  # without an extra slot since (None while holding one)
        self.fast = False  # read by the C link only


class Inbox:
    """Messages of a consumer without a handler, waiting for ``async for`` or ``batches()``."""

    __slots__ = ("queue", "waiter")

    def __init__(self) -> None:
        self.queue: deque[Any] = deque()
        self.waiter: Any = None

    def push(self, message: Any) -> None:
        self.queue.append(message)
        self.wake()

    def wake(self) -> None:
        """Resolve the waiter (once) and forget it."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def __len__(self) -> int:
        return len(self.queue)


class Link:
    """One subscribed connection of a consumer, and the delegate of its messages."""

    __slots__ = (
        "__weakref__",
        "closed",
        "conn",
        "endpoint",
        "fast",
        "finished",
        "freshest_age",
        "in_flight",
        "inspect_ext",
        "msg_timeout",
        "owner",
        "rdy_state",
        "received",
        "requeued",
        "timed_out",
        "touched",
    )

    def __init__(self, owner: LinkOwner, endpoint: Any) -> None:
        self.owner = owner
        self.endpoint = endpoint
        self.conn: Any = None
        self.in_flight: dict[Any, float] = {}  # message -> delivered at (loop clock)
        self.touched: dict[Any, float] = {}  # message -> last TOUCH (only messages touched)
        self.msg_timeout = 60.0
        self.closed = False
        self.fast = False
        self.inspect_ext = False  # the C link's switch; here every message goes to the owner anyway
        self.received = self.finished = self.requeued = self.timed_out = 0
        # The smallest (arrival on the monotonic clock - nsqd's timestamp) since the express lane last
        # read it: the freshest message's wait plus the clocks' offset (comparable only with itself).
        self.freshest_age = math.inf
        self.rdy_state: ConnRdy | None = None

    def __repr__(self) -> str:
        return f"<link {self.endpoint.address} p={self.endpoint.partition}>"

    def attach(self, conn: Any) -> None:
        self.conn = conn

    def configure(
        self,
        *,
        handler: Callable[[Any], Any] | None = None,
        is_async: bool = False,
        inbox: Inbox | None = None,
        max_attempts: int = 0,
        async_dispatch: Callable[..., Any] | None = None,
    ) -> None:
        """Nothing to set up: the consumer's Python path dispatches every message itself."""

    def __call__(self, message: Any) -> None:
        if message.attempts == 1:  # a requeued message is old by design
            self.freshest_age = min(self.freshest_age, time.monotonic() - message.timestamp * 1e-9)
        self.owner.on_message(self, message)

    def finish_message(self, message: Any) -> None:
        self.owner.on_finish(self, message)

    def requeue_message(self, message: Any, delay: float | None, backoff: bool) -> None:
        self.owner.on_requeue(self, message, delay, backoff)

    def touch_message(self, message: Any) -> None:
        self.owner.on_touch(self, message)

    def current_delivery(self, message: Any) -> float | None:
        """Only the C link runs handlers before registering a message in ``in_flight``."""
        return None


class MessageIterator:
    """``async for message in consumer``: queued messages first, ``slow_next`` when there are none
    (or after ``yield_every`` in a row, with ``pass_first`` True)."""

    __slots__ = ("_handed", "_inbox", "_slow_next", "_yield_every")

    def __init__(self, inbox: Inbox, slow_next: Callable[[bool], Any], yield_every: int) -> None:
        self._inbox = inbox
        self._slow_next = slow_next
        self._handed = 0
        self._yield_every = yield_every

    def __aiter__(self) -> MessageIterator:
        return self

    async def __anext__(self) -> Any:
        if self._handed < self._yield_every and self._inbox.queue:
            self._handed += 1
            return self._inbox.queue.popleft()
        pass_first = self._handed >= self._yield_every
        self._handed = 0
        return await self._slow_next(pass_first)


def finish_all(messages: Iterable[Any]) -> None:
    """FIN every message of a batch that is not answered yet."""
    for message in messages:
        if not message.has_responded:
            message.finish()
