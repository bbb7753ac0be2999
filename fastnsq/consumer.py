"""Consumer: discovery, reconnects, RDY, backoff, handlers, batches and graceful stop.

The rules are the NSQ client guide's (shared/peers.md lists where the peers break
them); the RDY and backoff decisions themselves live in :mod:`fastnsq.rdy`, a
pure state machine this module feeds with events.

Three ways to consume, one per consumer:

* ``handler=``: a sync function runs inline as frames are split (no task, no
  queue: its FIN goes out in the same write as the other answers of that read);
  a coroutine function runs concurrently, at most ``max_in_flight`` at once, and
  gets a task only when it actually awaits. Returning finishes the message,
  raising requeues it with backoff; ``message.finish()`` / ``requeue()`` /
  ``touch()`` / ``disable_auto_response()`` take over.
* ``async for message in consumer``: the caller answers each message.
* ``async for batch in consumer.batches(max_size, max_wait)``: a batch is yielded
  when full, when the connections are starved (``is_starved()``: nsqd will send
  little more until some of it is answered) or at ``max_wait``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import codec, tracing
from .config import ConnectionOptions, Endpoint, check_range, parse_address, split_options
from .conn import Connection
from .errors import (
    InvalidValueError,
    NotLeaderError,
    NotWritableError,
    NSQError,
    ServerError,
    TopicNotExistError,
)
from .rdy import Outcome, RdyController, RdyUpdate

if TYPE_CHECKING:
    from .lookupd import LookupdPoller

__all__ = ["CONSUMER_DEFAULTS", "Batch", "ConnectionStats", "Consumer", "StopReport"]

logger = logging.getLogger(__name__)

#: go-nsq's names and defaults (shared/peers.md §2), durations in seconds.
CONSUMER_DEFAULTS: dict[str, Any] = {
    "max_in_flight": 1,
    "max_attempts": 5,
    "default_requeue_delay": 90.0,
    "max_requeue_delay": 900.0,
    "backoff_strategy": "exponential",
    "max_backoff_duration": 120.0,
    "backoff_multiplier": 1.0,
    "lookupd_poll_interval": 60.0,
    "lookupd_poll_jitter": 0.3,
    "low_rdy_idle_timeout": 10.0,
    "low_rdy_timeout": 30.0,
    "rdy_redistribute_interval": 5.0,
    "reconnect_delay": 0.5,
    "max_reconnect_delay": 60.0,
    "connections_per_nsqd": 1,
    "auto_touch": False,
    "give_up_handler": None,
    "ordered": False,
    "ordered_give_up": "finish",
}

_ORDERED_GIVE_UP = ("finish", "requeue", "stop")
# HA errors after which the connection is dropped and lookup refreshed (protocol.md §9.14).
_REFRESH_ERRORS = (NotLeaderError, NotWritableError, TopicNotExistError)
_REFRESH_DELAY = 1.0
_EAGER_TASKS = sys.version_info >= (3, 12)
# `async for` hands out queued messages without awaiting; after this many in a row the
# loop gets a pass, or a fast iterator would hold back its own FINs (they are written at
# the end of a pass) and nsqd's refills until the whole max_in_flight is drained.
_YIELD_EVERY = 256


@dataclass
class ConnectionStats:
    """Counters of one consumer connection."""

    address: str
    partition: int | None
    rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    timed_out: int = 0


@dataclass
class StopReport:
    """What ``Consumer.stop()`` did."""

    finished: int = 0  # messages finished while draining
    requeued: int = 0  # messages requeued while draining (by handlers, or by stop at the deadline)
    abandoned: int = 0  # handlers still running at the deadline (their messages were requeued)
    timed_out: bool = False  # the deadline passed before every handler had finished
    duration: float = 0.0


#: One subscribed connection of the consumer and the delegate of its messages (``fastnsq._delivery``):
#: its fast lane handles the common case in C; the ``_link_*`` methods below are everything else.
_Link = codec.Link


class Batch(Sequence[Any]):
    """Messages yielded together by ``Consumer.batches()``; answer them in one write."""

    __slots__ = ("messages",)

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: Any) -> Any:
        return self.messages[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.messages)

    def finish(self) -> None:
        """FIN every message not answered yet."""
        codec.finish_all(self.messages)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ every message not answered yet (backoff counts once per batch)."""
        first = True
        for message in self.messages:
            if not message.has_responded:
                message.requeue(delay, backoff=backoff and first)
                first = False


class Consumer:
    """Consumes a topic's channel from nsqd, directly or through nsqlookupd.

    >>> async def main():                                   # doctest: +SKIP
    ...     def handle(message):
    ...         print(message.body)
    ...     async with Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"],
    ...                         handler=handle, max_in_flight=100):
    ...         await asyncio.sleep(60)

    Options (go-nsq's names and defaults, durations in seconds): ``max_in_flight``
    (1), ``max_attempts`` (5; 0 = unlimited), ``default_requeue_delay`` (90, times
    the attempts), ``max_requeue_delay`` (900), ``backoff_strategy``
    ("exponential", "full_jitter" or a callable level -> seconds),
    ``max_backoff_duration`` (120; 0 disables backoff), ``backoff_multiplier`` (1),
    ``lookupd_poll_interval`` (60), ``lookupd_poll_jitter`` (0.3),
    ``low_rdy_idle_timeout`` (10), ``low_rdy_timeout`` (30),
    ``rdy_redistribute_interval`` (5), ``reconnect_delay`` / ``max_reconnect_delay``
    (0.5 / 60, exponential with jitter, direct nsqd only), ``connections_per_nsqd``
    (1), ``auto_touch`` (False), ``give_up_handler`` (called with each message past
    max_attempts after it is finished; the default logs), and every connection
    option (``msg_timeout``, ``heartbeat_interval``, TLS, compression, AUTH...).
    HA nsqd: ``ordered`` (SUB_ORDERED per partition) and ``ordered_give_up``.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        handler: Callable[[Any], Any] | None = None,
        **options: Any,
    ) -> None:
        if not codec.valid_topic_name(topic):
            raise InvalidValueError(f"invalid topic name {topic!r}: 1-64 characters of [.a-zA-Z0-9_-]")
        if not codec.valid_channel_name(channel):
            raise InvalidValueError(f"invalid channel name {channel!r}: 1-64 characters of [.a-zA-Z0-9_-]")
        connection_options, own = split_options(options)
        unknown = set(own) - set(CONSUMER_DEFAULTS)
        if unknown:
            raise InvalidValueError(f"unknown Consumer option(s): {', '.join(sorted(unknown))}")
        if connection_options.heartbeat_interval is None:
            raise InvalidValueError("heartbeat_interval cannot be disabled for a consumer: nsqd refuses SUB")
        s = {**CONSUMER_DEFAULTS, **own}
        self.topic = topic
        self.channel = channel
        self.options: ConnectionOptions = connection_options
        self.max_attempts = check_range("max_attempts", s["max_attempts"], 0, 65535, integer=True)
        self.default_requeue_delay = check_range("default_requeue_delay", s["default_requeue_delay"], 0, 3600)
        self.max_requeue_delay = check_range("max_requeue_delay", s["max_requeue_delay"], 0, 3600)
        self.lookupd_poll_interval = check_range("lookupd_poll_interval", s["lookupd_poll_interval"], 0.01, 300)
        self.lookupd_poll_jitter = check_range("lookupd_poll_jitter", s["lookupd_poll_jitter"], 0, 1)
        self.reconnect_delay = check_range("reconnect_delay", s["reconnect_delay"], 0.001, 60)
        self.max_reconnect_delay = check_range("max_reconnect_delay", s["max_reconnect_delay"], 0.001, 3600)
        self.connections_per_nsqd = check_range(
            "connections_per_nsqd", s["connections_per_nsqd"], 1, 64, integer=True
        )
        self.auto_touch = bool(s["auto_touch"])
        self.ordered = bool(s["ordered"])
        if s["ordered_give_up"] not in _ORDERED_GIVE_UP:
            raise InvalidValueError(f"ordered_give_up must be one of {_ORDERED_GIVE_UP}, got {s['ordered_give_up']!r}")
        self.ordered_give_up = s["ordered_give_up"]
        if s["give_up_handler"] is not None and not callable(s["give_up_handler"]):
            raise InvalidValueError("give_up_handler must be callable")
        self._give_up_handler = s["give_up_handler"]
        self._rdy = RdyController(
            s["max_in_flight"],
            low_rdy_idle_timeout=s["low_rdy_idle_timeout"],
            low_rdy_timeout=s["low_rdy_timeout"],
            rdy_redistribute_interval=s["rdy_redistribute_interval"],
            backoff_strategy=s["backoff_strategy"],
            max_backoff_duration=s["max_backoff_duration"],
            backoff_multiplier=s["backoff_multiplier"],
        )
        self._nsqd_addresses = _as_list(nsqd_tcp_addresses)
        self._lookupd_addresses = _as_list(lookupd_http_addresses)
        for address in self._nsqd_addresses:
            parse_address(address)
        if not self._nsqd_addresses and not self._lookupd_addresses:
            raise InvalidValueError("give nsqd_tcp_addresses or lookupd_http_addresses")
        if handler is not None and not callable(handler):
            raise InvalidValueError("handler must be callable")
        self._handler = handler
        self._handler_is_async = handler is not None and _is_async_callable(handler)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._now: Callable[[], float] = _no_loop_time
        self._links: dict[Endpoint, list[_Link]] = {}
        self._reconnecting: dict[Endpoint, asyncio.Task[None]] = {}
        self._listed: set[Endpoint] = set()
        self._meta_ext = False
        self._poller: LookupdPoller | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._rdy_timer: asyncio.TimerHandle | None = None
        self._rdy_timer_at = 0.0
        self._touch_timer: asyncio.TimerHandle | None = None
        self._refresh_pending: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._inbox = codec.Inbox()  # messages for `async for` / batches() (no handler)
        self._queue: deque[Any] = self._inbox.queue
        self._running = False
        self._stopping = False
        self._drained: asyncio.Event | None = None
        self._last_offsets: dict[int | None, tuple[int, int]] = {}
        self.ordering_errors: list[str] = []
        self.stats_given_up = 0
        # Counts of connections already closed; the live ones count on their links.
        self._closed_counts = [0, 0, 0]  # received, finished, requeued
        #: Ordered: copies of a message the HA nsqd sent twice in a row (see _on_message).
        self.duplicates_dropped = 0

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (directly and/or through lookupd) and start receiving."""
        if self._running:
            return
        self._loop = loop = asyncio.get_running_loop()
        self._now = loop.time
        self._running = True
        self._drained = asyncio.Event()
        await asyncio.gather(
            *(
                self._connect_or_retry(Endpoint(address, None), direct=True)
                for address in self._nsqd_addresses
                for _ in range(self.connections_per_nsqd)
            )
        )
        if self._lookupd_addresses:
            from .lookupd import LookupdPoller  # imported only when used: it brings aiohttp

            self._poller = LookupdPoller(
                self._lookupd_addresses,
                self.topic,
                access="r",
                metainfo=True,
                poll_interval=self.lookupd_poll_interval,
                poll_jitter=self.lookupd_poll_jitter,
            )
            try:
                await self._on_discovery(await self._poller.poll_once())
            except NSQError as exc:
                logger.warning("first lookupd poll failed: %s", exc)
            self._poll_task = loop.create_task(self._poller.run(self._on_discovery))
        if self.auto_touch:
            self._schedule_touch()

    @property
    def total_received(self) -> int:
        """Messages received over the consumer's life (all connections)."""
        return self._closed_counts[0] + sum(link.received for link in self._all_links())

    @property
    def total_finished(self) -> int:
        return self._closed_counts[1] + sum(link.finished for link in self._all_links())

    @property
    def total_requeued(self) -> int:
        return self._closed_counts[2] + sum(link.requeued for link in self._all_links())

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self, timeout: float = 30.0) -> StopReport:
        """Drain and close: CLS everywhere, let running handlers finish until ``timeout``,
        requeue (without backoff) whatever is unanswered, then close every connection.

        Returns what happened. Messages queued for ``async for`` / ``batches()`` and
        not handed out yet are requeued at once.
        """
        report = StopReport()
        if not self._running or self._stopping:
            return report
        self._stopping = True
        for link in self._all_links():
            link.fast = False  # every answer now goes through _link_done, which watches the drain
        assert self._loop is not None
        started = self._loop.time()
        finished0, requeued0 = self._totals()
        for task in list(self._reconnecting.values()):
            task.cancel()
        if self._poll_task is not None:
            self._poll_task.cancel()
        if self._poller is not None:
            await self._poller.close()
        self._apply(self._rdy.set_max_in_flight(0))
        await asyncio.gather(*(self._cls(link) for link in self._all_links()), return_exceptions=True)
        while self._queue:  # never handed out: back to nsqd now
            message = self._queue.popleft()
            if not message.has_responded:
                message.requeue(0, backoff=False)
        self._inbox.wake()
        remaining = timeout - (self._loop.time() - started)
        if self._in_flight_total() and remaining > 0:
            assert self._drained is not None
            self._drained.clear()
            if self._in_flight_total():
                try:
                    await asyncio.wait_for(self._drained.wait(), remaining)
                except asyncio.TimeoutError:
                    report.timed_out = True
        for link in self._all_links():
            for message in list(link.in_flight):
                report.abandoned += 1
                if not message.has_responded:
                    message.requeue(0, backoff=False)
        for handler_task in list(self._tasks):
            handler_task.cancel()  # past the deadline: their messages were requeued above
        await asyncio.sleep(0)  # let the last answers be written
        await asyncio.gather(*(link.conn.close() for link in self._all_links()), return_exceptions=True)
        self._cancel_timers()
        self._running = False
        finished1, requeued1 = self._totals()
        report.finished = finished1 - finished0
        report.requeued = requeued1 - requeued0
        report.duration = self._loop.time() - started
        return report

    async def _cls(self, link: _Link) -> None:
        if link.conn.is_open:
            try:
                await asyncio.wait_for(link.conn.cls(), 5.0)
            except (NSQError, asyncio.TimeoutError, OSError) as exc:
                logger.debug("CLS on %s: %s", link, exc)

    # ---- consuming without a handler ----------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._handler is not None:
            raise RuntimeError("this consumer has a handler; `async for` is for consumers without one")
        # In C, a queued message is handed out without a coroutine; _next_message does the waiting.
        return codec.MessageIterator(self._inbox, self._next_message, _YIELD_EVERY)

    async def _next_message(self, pass_first: bool) -> Any:
        """The next message for `async for`, after a loop pass if asked; StopAsyncIteration once stopped."""
        if pass_first:
            await _give_the_loop_a_pass()
        while not self._queue:
            if self._stopping or not self._running:
                raise StopAsyncIteration
            await self._wait_queue()
        return self._queue.popleft()

    async def batches(self, max_size: int = 100, max_wait: float = 1.0) -> AsyncIterator[Batch]:
        """Yield batches: when ``max_size`` messages are ready, when the connections are
        starved (nsqd will send little more until these are answered), or ``max_wait``
        seconds after the batch's first message. Answer with ``batch.finish()`` /
        ``batch.requeue()`` (or per message)."""
        if self._handler is not None:
            raise RuntimeError("this consumer has a handler; batches() is for consumers without one")
        check_range("max_size", max_size, 1, 10**7, integer=True)
        check_range("max_wait", max_wait, 0.0, 86400)
        assert self._loop is not None, "start the consumer first"
        while True:
            if not self._queue:
                if self._stopping or not self._running:
                    return
                await self._wait_queue()
                continue
            deadline = self._loop.time() + max_wait
            while len(self._queue) < max_size and not self._rdy.is_starved() and not self._stopping:
                remaining = deadline - self._loop.time()
                if remaining <= 0:
                    break
                await self._wait_queue(remaining)
            take = min(max_size, len(self._queue))
            if take:
                yield Batch([self._queue.popleft() for _ in range(take)])
                if self._queue:  # nothing above awaited: let the FINs out and the reads in
                    await _give_the_loop_a_pass()

    async def _wait_queue(self, timeout: float | None = None) -> None:
        """Until a message is pushed to the inbox (or the consumer stops), at most ``timeout``."""
        assert self._loop is not None
        waiter = self._loop.create_future()
        self._inbox.waiter = waiter
        # A timer that resolves the same waiter, not asyncio.wait_for(): batches() waits here once
        # or twice per batch, and wait_for's extra future and callbacks showed in its profile.
        timer = None if timeout is None else self._loop.call_later(timeout, _resolve_none, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if self._inbox.waiter is waiter:
                self._inbox.waiter = None

    # ---- run-time control and state -----------------------------------------------------

    def is_starved(self) -> bool:
        """True if a connection holds messages in flight amounting to at least 85 % of its last
        RDY: process what you have (batching consumers), nsqd will send little more until then."""
        return self._rdy.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time; 0 pauses."""
        self._apply(self._rdy.set_max_in_flight(max_in_flight))

    @property
    def max_in_flight(self) -> int:
        return self._rdy.max_in_flight

    @property
    def backoff_level(self) -> int:
        return self._rdy.backoff_level

    @property
    def connections(self) -> list[Connection]:
        return [link.conn for link in self._all_links() if link.conn.is_open]

    def stats(self) -> dict[str, Any]:
        """Per connection RDY, in flight, received, finished, requeued, timed out; backoff level."""
        links = []
        for link in self._all_links():
            try:
                rdy = self._rdy.connection_stats(link).rdy
            except KeyError:
                rdy = 0
            links.append(ConnectionStats(
                link.endpoint.address, link.endpoint.partition, rdy=rdy, in_flight=len(link.in_flight),
                received=link.received, finished=link.finished, requeued=link.requeued,
                timed_out=link.timed_out,
            ))
        return {
            "connections": links,
            "backoff_level": self._rdy.backoff_level,
            "in_flight": self._rdy.in_flight,
            "max_in_flight": self._rdy.max_in_flight,
            "given_up": self.stats_given_up,
            "duplicates_dropped": self.duplicates_dropped,
            "received": self.total_received,
            "finished": self.total_finished,
            "requeued": self.total_requeued,
        }

    # ---- connections --------------------------------------------------------------------

    def _all_links(self) -> list[_Link]:
        return [link for links in self._links.values() for link in links]

    async def _connect_or_retry(self, endpoint: Endpoint, *, direct: bool) -> None:
        try:
            await self._connect(endpoint)
        except (OSError, asyncio.TimeoutError, NSQError) as exc:
            logger.warning("cannot consume from %s: %s", endpoint.address, exc)
            if isinstance(exc, _REFRESH_ERRORS) and self._poller is not None:
                self._refresh_lookup_soon()  # HA: the partition is led elsewhere now
            elif direct:
                self._reconnect_later(endpoint)

    async def _connect(self, endpoint: Endpoint) -> _Link:
        link = _Link(self, endpoint)
        conn = Connection(
            endpoint.address,
            self.options,
            extend_support=self._meta_ext,
            # The link is the reader's message sink: in C, the codec calls it directly.
            on_message=link,
            on_close=lambda c, error: self._on_close(link, error),
            on_error=lambda c, error: self._on_server_error(link, error),
        )
        link.attach(conn)
        link.configure(
            handler=self._handler,
            is_async=self._handler_is_async,
            inbox=self._inbox if self._handler is None else None,
            max_attempts=self.max_attempts,
            async_dispatch=self._run_async_handler,
        )
        conn.reader.delegate = link
        await conn.connect()
        if self.ordered and not conn.is_ha:
            await conn.close()
            raise InvalidValueError(f"ordered=True needs an HA nsqd; {endpoint.address} is not one")
        timeout_ms = conn.identify_response.get("msg_timeout")
        if timeout_ms:
            link.msg_timeout = timeout_ms / 1000
        try:
            await conn.subscribe(self.topic, self.channel, partition=endpoint.partition, ordered=self.ordered)
        except BaseException:
            await conn.close()
            raise
        if self._stopping:
            await conn.close()
            raise NSQError("the consumer is stopping")
        self._links.setdefault(endpoint, []).append(link)
        updates = self._rdy.add_connection(link, conn.max_rdy_count)
        link.rdy_state = self._rdy.record(link)
        # Ordered consumption checks every message's offset: always the Python path.
        link.fast = not self.ordered
        self._apply(updates)
        logger.info("consuming %s/%s from %s%s", self.topic, self.channel, endpoint.address,
                    "" if endpoint.partition is None else f" partition {endpoint.partition}")
        return link

    def _on_close(self, link: _Link, error: BaseException | None) -> None:
        link.closed = True
        link.fast = False
        links = self._links.get(link.endpoint)
        if links is not None and link in links:
            links.remove(link)
            if not links:
                del self._links[link.endpoint]
            # Its counts stay in the totals; answers after this (no FIN sent) count there too.
            self._closed_counts[0] += link.received
            self._closed_counts[1] += link.finished
            self._closed_counts[2] += link.requeued
            link.received = link.finished = link.requeued = 0
        self._apply(self._rdy.remove_connection(link))
        if self._stopping or not self._running:
            return
        logger.warning("connection to %s closed%s", link.endpoint.address, f": {error}" if error else "")
        refresh = isinstance(error, _REFRESH_ERRORS)
        if link.endpoint.address in self._nsqd_addresses and not refresh:
            self._reconnect_later(link.endpoint)
        elif self._poller is not None:
            self._refresh_lookup_soon()

    def _on_server_error(self, link: _Link, error: ServerError) -> None:
        logger.warning("%s: %s", link.endpoint.address, error)

    def _reconnect_later(self, endpoint: Endpoint) -> None:
        """Direct nsqd: one task per endpoint restores connections_per_nsqd, backing off with jitter."""
        if self._stopping or endpoint in self._reconnecting:
            return
        assert self._loop is not None
        self._reconnecting[endpoint] = self._loop.create_task(self._reconnect(endpoint))

    async def _reconnect(self, endpoint: Endpoint) -> None:
        failures = 0
        try:
            while not self._stopping and len(self._links.get(endpoint, ())) < self.connections_per_nsqd:
                ceiling = min(self.max_reconnect_delay, self.reconnect_delay * 2 ** min(failures, 30))
                await asyncio.sleep(random.uniform(ceiling / 2, ceiling))  # jitter: no stampede
                try:
                    await self._connect(endpoint)
                    failures = 0
                except (OSError, asyncio.TimeoutError, NSQError) as exc:
                    failures += 1
                    logger.debug("reconnect to %s failed: %s", endpoint.address, exc)
        finally:
            self._reconnecting.pop(endpoint, None)

    async def _on_discovery(self, discovery: Any) -> None:
        """A lookupd poll's result: connect to the nsqd (and partitions) listed and not connected."""
        if self._stopping:
            return
        meta = getattr(discovery, "meta", None)
        self._meta_ext = bool(meta is not None and meta.extend_support)
        self._listed = set(discovery.endpoints)
        await self._drop_stale_partitions()
        missing = [e for e in discovery.endpoints if e not in self._links]
        await asyncio.gather(
            *(
                self._connect_or_retry(endpoint, direct=False)
                for endpoint in missing
                for _ in range(self.connections_per_nsqd)
            )
        )

    async def _drop_stale_partitions(self) -> None:
        """HA: a partition now led by another nsqd; the old leader cannot take our FINs any more.

        Its messages in flight come back from the new leader (at least once).
        """
        # Only a partition now listed under another nsqd: an answer that lists nothing
        # (a lookupd restarting, a registration not in yet) must not drop working links.
        led_by = {e.partition: e.address for e in self._listed if e.partition is not None}
        stale = [
            e for e in self._links
            if e.partition is not None and led_by.get(e.partition, e.address) != e.address
        ]
        for endpoint in stale:
            for link in list(self._links.get(endpoint, ())):
                logger.info("partition %s of %s moved away from %s: closing that connection",
                            endpoint.partition, self.topic, endpoint.address)
                await link.conn.close()

    def _refresh_lookup_soon(self) -> None:
        """One lookupd poll within a second. Requests while one is pending join it: each
        failed connection asks for one, and a poll that finds the same refusing node again
        must not multiply the polls (a partition's leader can refuse SUB for minutes
        while it rejoins a youzan cluster)."""
        if self._poller is None or self._loop is None or self._refresh_pending is not None:
            return
        self._refresh_pending = self._loop.call_later(_REFRESH_DELAY * random.uniform(0.5, 1.0), self._refresh_now)

    def _refresh_now(self) -> None:
        self._refresh_pending = None
        if self._poller is not None and not self._stopping:
            self._poller.trigger()

    # ---- messages -----------------------------------------------------------------------

    # The Python path of a message and its answers: all of them on the pure-Python twin,
    # and on the C link whatever its fast lane does not cover (fastnsq/_delivery.pyx).

    def _on_message(self, link: _Link, message: Any) -> None:
        if self.ordered:
            last = link.last_delivered
            if last is not None and message.attempts == last.attempts and message.id == last.id:
                self._repeated(link, last, message)
                return
            link.last_delivered = message
            link.last_finished = False
        link.in_flight[message] = self._now()
        link.received += 1
        updates = self._rdy.on_message(link, message)
        if updates:
            self._apply(updates)
        if self.ordered:
            self._check_order(link, message)
        if tracing.ENABLED:
            transport = link.conn._transport
            tracing.consumed(
                self.topic, link.endpoint.partition, message,
                transport.get_extra_info("sockname") if transport else None,
                transport.get_extra_info("peername") if transport else None,
            )
        if self.max_attempts and message.attempts > self.max_attempts:
            self._give_up(message)
            return
        handler = self._handler
        if handler is None:
            self._inbox.push(message)
        elif self._handler_is_async:
            self._run_async_handler(handler, message)
        else:
            try:
                handler(message)
            except Exception:  # noqa: BLE001 - a user handler; _handler_failed logs the traceback
                self._handler_failed(message)
            else:
                self._auto_answer(message, failed=False)

    def _handler_failed(self, message: Any) -> None:
        """A sync handler raised (call it in the except block: the traceback is logged)."""
        logger.exception("handler failed for message %r; requeueing", message)
        self._auto_answer(message, failed=True)

    def _link_finish(self, link: _Link, message: Any) -> None:
        """``message.finish()``: FIN, and tell the RDY controller."""
        if message is link.last_delivered:
            link.last_finished = True
        self._link_done(link, message, Outcome.SUCCESS)
        if link.closed:
            self._closed_counts[1] += 1
        else:
            link.finished += 1
            link.conn.fin(message)

    def _link_requeue(self, link: _Link, message: Any, delay: float | None, backoff: bool) -> None:
        """``message.requeue()``: REQ after ``delay`` (None: the default backoff delay)."""
        delay_ms = self._requeue_delay_ms(message, delay)
        self._link_done(link, message, Outcome.FAILURE if backoff else Outcome.NEUTRAL)
        if link.closed:
            self._closed_counts[2] += 1
        else:
            link.requeued += 1
            link.conn.req(message, delay_ms)

    def _link_touch(self, link: _Link, message: Any) -> None:
        if message in link.in_flight or link.current_delivery(message) is not None:
            link.touched[message] = self._now()
        if not link.closed:
            link.conn.touch(message)

    def _link_done(self, link: _Link, message: Any, outcome: Outcome) -> None:
        delivered = link.in_flight.pop(message, None)
        if delivered is None:
            delivered = link.current_delivery(message)  # a sync handler on the C path answers it inline
        if link.touched:
            link.touched.pop(message, None)
        elif delivered is not None and self._now() - delivered > link.msg_timeout:
            link.timed_out += 1  # nsqd gave it to someone else already
        updates = self._rdy.on_message_done(link, message, outcome)
        if updates:
            self._apply(updates)
        if self._stopping:
            self._message_done()

    def _repeated(self, link: _Link, first: Any, copy: Any) -> None:
        """Ordered: the same message again, same attempts (any redelivery counts one).

        A youzan channel that turns ordered (its first SUB_ORDERED) resets its reader to
        the last confirmed message while the one it had read is sent anyway: the same
        message twice in a row, and nsqd holds one of the two in flight. Handling it again
        would break the order. While the first copy is unanswered its answer covers both;
        once it was finished, nsqd may be holding this copy instead (that FIN then failed
        with E_FIN_FAILED), so the copy is finished too, or the partition would wait out
        msg_timeout. A first copy that was requeued comes back anyway.
        """
        self.duplicates_dropped += 1
        logger.debug("%s: the repeated delivery of %r", link.endpoint.address, copy)
        if first.has_responded and link.last_finished and not link.closed:
            link.conn.fin(copy)

    def _auto_answer(self, message: Any, *, failed: bool) -> None:
        if message.has_responded or not message.auto_response:
            return
        if failed:
            message.requeue()
        else:
            message.finish()

    def _run_async_handler(self, handler: Callable[[Any], Any], message: Any) -> None:
        coro = handler(message)
        if _EAGER_TASKS:
            assert self._loop is not None
            task: asyncio.Task[Any] = asyncio.Task(coro, loop=self._loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
            if task.done():
                self._async_done(message, task)
            else:
                self._tasks.add(task)
                task.add_done_callback(lambda t: self._async_finished(message, t))
            return
        try:
            yielded = coro.send(None)
        except StopIteration:
            self._auto_answer(message, failed=False)
            return
        except Exception:
            logger.exception("handler failed for message %r; requeueing", message)
            self._auto_answer(message, failed=True)
            return
        assert self._loop is not None
        task = self._loop.create_task(_resume(coro, yielded))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._async_finished(message, t))

    def _async_finished(self, message: Any, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        self._async_done(message, task)

    def _async_done(self, message: Any, task: asyncio.Future[Any]) -> None:
        if task.cancelled():
            if not message.has_responded:
                message.requeue(0, backoff=False)
            return
        error = task.exception()
        if error is not None:
            logger.error("handler failed for message %r; requeueing", message, exc_info=error)
        self._auto_answer(message, failed=error is not None)

    def _give_up(self, message: Any) -> None:
        """Past max_attempts: FIN it (or, ordered, per ordered_give_up) and call the give-up hook."""
        self.stats_given_up += 1
        if self.ordered and self.ordered_give_up == "requeue":
            message.requeue(0, backoff=True)
        elif self.ordered and self.ordered_give_up == "stop":
            logger.error("ordered message %r is past max_attempts; pausing the consumer", message)
            message.requeue(0, backoff=False)
            self.set_max_in_flight(0)
        else:
            message.finish()
        hook = self._give_up_handler
        if hook is None:
            logger.warning("giving up on message %r after %d attempts (max_attempts=%d)",
                           message, message.attempts, self.max_attempts)
            return
        try:
            result = hook(message)
            if inspect.isawaitable(result):
                assert self._loop is not None
                task = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception:
            logger.exception("give_up_handler failed for message %r", message)

    def _check_order(self, link: _Link, message: Any) -> None:
        """Ordered HA consumption: internal ids and offsets only grow within a partition."""
        key = link.endpoint.partition
        current = (message.internal_id or 0, message.offset or 0)
        last = self._last_offsets.get(key)
        if last is not None and message.attempts == 1 and (current[0] < last[0] or current[1] < last[1]):
            problem = (
                f"partition {key}: message id {current[0]} offset {current[1]} arrived after "
                f"id {last[0]} offset {last[1]}"
            )
            self.ordering_errors.append(problem)
            logger.error("ordering regression: %s", problem)
        if last is None or current > last:
            self._last_offsets[key] = current

    def _requeue_delay_ms(self, message: Any, delay: float | None) -> int:
        if self.ordered:
            return 0  # HA ignores REQ delays on ordered channels: redeliver at once
        if delay is None:
            delay = min(self.default_requeue_delay * message.attempts, self.max_requeue_delay)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise InvalidValueError(f"requeue delay must be seconds >= 0, got {delay!r}")
        return min(round(delay * 1000), 3600 * 1000)

    def _message_done(self) -> None:
        if self._stopping and self._drained is not None and not self._in_flight_total():
            self._drained.set()

    def _in_flight_total(self) -> int:
        return sum(len(link.in_flight) for link in self._all_links())

    def _totals(self) -> tuple[int, int]:
        return self.total_finished, self.total_requeued

    # ---- RDY ----------------------------------------------------------------------------

    def _apply(self, updates: list[RdyUpdate]) -> None:
        for link, count in updates:
            if not link.closed and link.conn.is_open and link.conn.state != "closing":
                try:
                    link.conn.rdy(min(count, link.conn.max_rdy_count))
                except NSQError as exc:
                    logger.debug("RDY on %s: %s", link, exc)
        self._arm_rdy_timer()

    def _arm_rdy_timer(self) -> None:
        """One timer at the controller's next deadline (its clock is time.monotonic)."""
        if self._loop is None:
            return
        when = self._rdy.next_deadline()
        if when is None:
            return
        if self._rdy_timer is not None:
            if self._rdy_timer_at <= when:
                return
            self._rdy_timer.cancel()
        self._rdy_timer_at = when
        self._rdy_timer = self._loop.call_later(max(0.0, when - time.monotonic()), self._on_rdy_timer)

    def _on_rdy_timer(self) -> None:
        self._rdy_timer = None
        self._apply(self._rdy.tick())

    def _schedule_touch(self) -> None:
        assert self._loop is not None
        # Checking every quarter of the timeout and touching past half of it leaves a
        # quarter of the timeout for the TOUCH to reach nsqd.
        interval = max(0.05, min(link.msg_timeout for link in self._all_links()) / 4) if self._links else 0.25
        self._touch_timer = self._loop.call_later(interval, self._auto_touch)

    def _auto_touch(self) -> None:
        """auto_touch=True: TOUCH messages whose handler is still running past half their timeout."""
        now = self._now()
        for link in self._all_links():
            threshold = link.msg_timeout / 2
            for message, delivered in list(link.in_flight.items()):
                last = link.touched.get(message, delivered)
                if not message.has_responded and now - last >= threshold:
                    message.touch()
        if not self._stopping:
            self._schedule_touch()

    def _cancel_timers(self) -> None:
        for timer in (self._rdy_timer, self._touch_timer, self._refresh_pending):
            if timer is not None:
                timer.cancel()
        self._rdy_timer = self._touch_timer = self._refresh_pending = None


def _resolve_none(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _give_the_loop_a_pass() -> None:
    await asyncio.sleep(0)


async def _resume(coro: Any, yielded: Any) -> Any:
    """Drive the rest of a coroutine that was started outside a task, as a Task would.

    Python 3.11 has no eager tasks: a handler is first run inline and only when it
    awaits something does it get this task, which waits for what the coroutine
    awaits and then resumes it.
    """
    while True:
        throw: BaseException | None = None
        try:
            if yielded is None:
                await asyncio.sleep(0)  # a bare yield: give the loop one pass
            else:
                # As a Task does when it takes over a yielded future: clear the flag the
                # coroutine's own await set, or awaiting the future again is refused.
                yielded._asyncio_future_blocking = False
                try:
                    await yielded  # the coroutine reads the outcome itself when resumed
                except asyncio.CancelledError:
                    if not yielded.cancelled():
                        raise
                except Exception:  # noqa: S110 - the coroutine sees this error itself
                    pass
        except asyncio.CancelledError as exc:
            throw = exc
        try:
            yielded = coro.throw(throw) if throw is not None else coro.send(None)
        except StopIteration as stop:
            return stop.value


def _is_async_callable(func: Any) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


def _as_list(addresses: str | Sequence[str] | None) -> list[str]:
    if addresses is None:
        return []
    if isinstance(addresses, str):
        return [a for a in (part.strip() for part in addresses.split(",")) if a]
    return list(addresses)


def _no_loop_time() -> float:
    raise RuntimeError("the consumer is not started")
