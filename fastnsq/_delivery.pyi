"""The consumer's per-message path: one connection's link, the RDY record it updates, the inbox.

Two implementations share this API: the C extension ``fastnsq._delivery`` (with a fast
lane for the common case) and the pure-Python ``fastnsq._delivery_py`` (every message
through the consumer's Python methods). ``fastnsq.codec`` picks one.
"""

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from typing import Any, Protocol

IMPLEMENTATION: str  # "c" or "python"

class ConnRdy:
    """The RDY controller's record of one connection (``fastnsq.rdy``); ``fast``: the
    controller allows a link to count deliveries and FINs on it itself."""

    conn_id: Hashable
    seq: int
    max_rdy: int
    rdy: int
    remaining: int
    target: int
    in_flight: int
    pending: int
    pending_until: float
    last_message_at: float | None
    last_rdy_at: float | None
    granted_at: float | None
    extra_since: float | None
    waiting_since: float | None
    fast: bool
    def __init__(self, conn_id: Hashable, seq: int, max_rdy: int, now: float | None) -> None: ...

class Inbox:
    """Messages of a consumer without a handler; ``waiter`` is resolved by the next push."""

    queue: deque[Any]
    waiter: Any
    def __init__(self) -> None: ...
    def push(self, message: Any) -> None: ...
    def wake(self) -> None: ...
    def __len__(self) -> int: ...

class LinkOwner(Protocol):
    """What a :class:`Link` calls in Python: every message and answer its fast lane does not take.

    Implemented by the consumer's dispatcher (``fastnsq.consumer.dispatch.Dispatcher``), never
    by the consumer itself: the fast lane knows nothing else of its owner.
    """

    # ``link`` is the calling link, of either twin (the C one or ``_delivery_py``'s).
    def on_message(self, link: Any, message: Any) -> None:
        """A message the fast lane did not take (backoff, refill, give-up, ordered, traced, ...)."""
    def on_handler_failed(self, message: Any) -> None:
        """A sync handler run inline raised; called inside the ``except`` block."""
    def on_finish(self, link: Any, message: Any) -> None:
        """``message.finish()`` the fast lane did not take."""
    def on_requeue(self, link: Any, message: Any, delay: float | None, backoff: bool) -> None:
        """``message.requeue()`` (always here)."""
    def on_touch(self, link: Any, message: Any) -> None:
        """``message.touch()`` (always here)."""

class Link:
    """One subscribed connection of a consumer: the reader's message sink and the messages' delegate."""

    owner: LinkOwner
    endpoint: Any
    conn: Any
    in_flight: dict[Any, float]
    touched: dict[Any, float]
    msg_timeout: float
    closed: bool
    fast: bool
    inspect_ext: bool
    """Messages with an ext header take the owner's path (HA client-side decompression)."""
    received: int
    finished: int
    requeued: int
    timed_out: int
    freshest_age: float
    """The smallest (arrival, monotonic clock - nsqd's timestamp) since last reset to ``math.inf``:
    the freshest message's wait plus the clocks' offset (the express lane compares it with itself)."""
    rdy_state: ConnRdy | None
    def __init__(self, owner: LinkOwner, endpoint: Any) -> None: ...
    def attach(self, conn: Any) -> None: ...
    def configure(
        self,
        *,
        handler: Callable[[Any], Any] | None = None,
        is_async: bool = False,
        inbox: Inbox | None = None,
        max_attempts: int = 0,
        async_dispatch: Callable[..., Any] | None = None,
    ) -> None: ...
    def __call__(self, message: Any) -> None: ...
    def finish_message(self, message: Any) -> None: ...
    def requeue_message(self, message: Any, delay: float | None, backoff: bool) -> None: ...
    def touch_message(self, message: Any) -> None: ...
    def current_delivery(self, message: Any) -> float | None:
        """When ``message`` is the one a sync handler is running for on the C path: when it arrived."""

class MessageIterator(AsyncIterator[Any]):
    """``async for message in consumer``: queued messages first, ``slow_next(pass_first)`` otherwise."""

    def __init__(self, inbox: Inbox, slow_next: Callable[[bool], Awaitable[Any]], yield_every: int) -> None: ...
    def __aiter__(self) -> MessageIterator: ...
    def __anext__(self) -> Awaitable[Any]: ...

def finish_all(messages: Iterable[Any]) -> None:
    """FIN every message of a batch that is not answered yet."""
