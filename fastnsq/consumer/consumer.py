"""The Consumer: options, lifecycle, connections and discovery, RDY, and the ways to consume.

Three ways to consume, one per consumer:

* ``handler=``: a sync function runs inline as frames are split (no task, no
  queue: its FIN goes out in the same write as the other answers of that read);
  a coroutine function runs concurrently in a task of its own (started eagerly on
  3.12+), at most ``max_in_flight`` at once. Returning finishes the message,
  raising holds it and calls the handler again (:mod:`.held`; ``hold_failed=False``:
  requeued with backoff); ``message.finish()`` / ``requeue()`` /
  ``touch()`` / ``disable_auto_response()`` take over.
* ``async for message in consumer``: the caller answers each message.
* ``async for batch in consumer.batches(max_size, max_wait)``: a batch is yielded
  when full, when the connections are starved (``is_starved()``: nsqd will send
  little more until some of it is answered) or at ``max_wait``.

What happens to a message is :mod:`.dispatch`'s job; where the topic lives,
:mod:`fastnsq.topology`'s; which RDY each connection holds, :mod:`fastnsq.rdy`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import codec
from ..codec import Message
from ..config import (
    ConnectionOptions,
    Endpoint,
    address_list,
    check_callable,
    check_logger,
    check_range,
    secret_text,
    split_options,
)
from ..conn import Connection
from ..errors import InvalidValueError, NSQError, ServerError
from ..optionspec import options_docstring, options_of
from ..rdy import RdyController, RdyUpdate
from ..stats import ConnectionStats, ConsumerStats, deprecated_spelling
from ..topology import TopicRoute, Topology
from .batch import Batch
from .dispatch import Dispatcher, DispatchSettings, Link
from .express import ExpressLanes
from .ha import HAConsumer, direct_endpoints
from .held import HeldMessages, probe_one
from .missing import REFRESH_ERRORS, Missing
from .partitions import Partitions
from .readiness import Readiness, check_name
from .report import StopReport

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from ..typed_options import ConsumerOptions, Handler

__all__ = ["CONSUMER_DEFAULTS", "ConnectionStats", "Consumer", "StopReport"]

logger = logging.getLogger(__name__)

#: The Consumer's own options (not the connections') with their defaults: go-nsq's names and
#: defaults where go-nsq has the option, durations in seconds (the table: fastnsq.optionspec).
CONSUMER_DEFAULTS: dict[str, Any] = {
    name: option.default for name, option in options_of("Consumer").items() if option.client == "consumer"
}

# `async for` hands out queued messages without awaiting; after this many in a row the
# loop gets a pass, or a fast iterator would hold back its own FINs (they are written at
# the end of a pass) and nsqd's refills until the whole max_in_flight is drained.
_YIELD_EVERY = 256

# A lowered RDY counts at its old value until nsqd has read it: assumed done after this many
# round trips of the connection's SUB, at least _MIN_SETTLE s, at most rdy_settle_time (0.5 s).
# A newly found nsqd's first RDY waits for the others' lowered ones: 0.5 s on loopback before.
_SETTLE_ROUND_TRIPS = 10
_MIN_SETTLE = 0.05


class Consumer:
    """Consumes a topic's channel from nsqd, directly or through nsqlookupd (``nsqd_tcp_addresses=[]``: none yet).

    >>> async def main():                                   # doctest: +SKIP
    ...     def handle(message):
    ...         print(message.body)
    ...     async with Consumer("events", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"],
    ...                         handler=handle, max_in_flight=100):
    ...         await asyncio.sleep(60)

    ``handler``: a function of one :class:`~fastnsq.Message`, plain or ``async``: it returns to
    finish the message and raises to have it held and handled again in-process, requeued only once
    other messages succeed beside it (``hold_failed=False``: requeued with backoff; what it returns is not read:
    pynsq's ``return False`` finishes); ``message.requeue()`` requeues without a traceback.
    Without one, ``async for message in consumer`` or :meth:`batches`. The keyword options are
    :class:`fastnsq.typed_options.ConsumerOptions` (go-nsq's names and defaults, durations in
    seconds), listed below with their defaults and units (and in docs/options.md).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        handler: Handler | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if not codec.valid_topic_name(topic):
            raise InvalidValueError(f"invalid topic name {topic!r}: 1-64 characters of [.a-zA-Z0-9_-]")
        if not codec.valid_channel_name(channel):
            raise InvalidValueError(f"invalid channel name {channel!r}: 1-64 characters of [.a-zA-Z0-9_-]")
        connection_options, s = split_options("Consumer", options)
        if connection_options.heartbeat_interval is None:
            raise InvalidValueError("heartbeat_interval cannot be disabled for a consumer: nsqd refuses SUB")
        self.topic = topic
        self.channel = channel
        self.options: ConnectionOptions = connection_options
        self.max_attempts: int = s["max_attempts"]
        self.default_requeue_delay: float = s["default_requeue_delay"]
        self.max_requeue_delay: float = s["max_requeue_delay"]
        self.lookupd_poll_interval: float = s["lookupd_poll_interval"]
        self.lookupd_poll_jitter: float = s["lookupd_poll_jitter"]
        self.reconnect_delay: float = s["reconnect_delay"]
        self.max_reconnect_delay: float = s["max_reconnect_delay"]
        self.connections_per_nsqd: int = s["connections_per_nsqd"]
        self.auto_touch: bool = s["auto_touch"]
        self.ordered: bool = s["ordered"]
        self.ordered_give_up: str = s["ordered_give_up"]
        self.backoff_scope: str = s["backoff_scope"]
        self.lookupd_poll_timeout: float = s["lookupd_poll_timeout"]
        self._discovery_filter: Callable[[list[str]], Any] | None = s["discovery_filter"]
        self._log = check_logger(s["logger"], logger)
        self._rdy = RdyController(
            s["max_in_flight"],
            low_rdy_idle_timeout=s["low_rdy_idle_timeout"],
            low_rdy_timeout=s["low_rdy_timeout"],
            rdy_redistribute_interval=s["rdy_redistribute_interval"],
            backoff_strategy=s["backoff_strategy"],
            max_backoff_duration=s["max_backoff_duration"],
            backoff_multiplier=s["backoff_multiplier"],
            backoff_per_key=self.backoff_scope == "partition",
        )
        self._direct = direct_endpoints(nsqd_tcp_addresses, s["partition"])
        self._lookupd_addresses = address_list(lookupd_http_addresses)
        if nsqd_tcp_addresses is None and not self._lookupd_addresses:  # [] given: connect_to_nsqd later
            raise InvalidValueError("give nsqd_tcp_addresses ([]: connect_to_nsqd later) or lookupd_http_addresses")
        check_callable("handler", handler)
        self._handler: Handler | None = handler
        self._inbox = codec.Inbox()  # messages for `async for` / batches() (no handler)
        self._queue: deque[Any] = self._inbox.queue
        #: What the consumer knows of each partition subscribed (None: an upstream topic's connections).
        self.partitions = Partitions(self._rdy)
        self._dispatch = Dispatcher(
            DispatchSettings(
                topic=topic, channel=channel, handler=handler, max_attempts=self.max_attempts,
                default_requeue_delay=self.default_requeue_delay, max_requeue_delay=self.max_requeue_delay,
                ordered=self.ordered, ordered_give_up=self.ordered_give_up,
                give_up_handler=s["give_up_handler"], log=self._log, dead_letter_topic=s["dead_letter_topic"],
                requeue_at_once=s["ready_check"] is not None,
            ),
            self._rdy, self.partitions, self._inbox, self._apply, lambda: self.set_max_in_flight(0),
        )
        self._ha = HAConsumer(
            topic, channel, s, ordered=self.ordered, has_lookupd=bool(self._lookupd_addresses),
            max_attempts=self.max_attempts,
            partitions=self.partitions, fast_allowed=lambda: not self.ordered and not self._stopping,
        )
        self._dispatch.ha_check = self._ha.inspect
        dead = s["dead_letter_topic"]
        if dead is not None and not codec.valid_topic_name(dead):  # nsqd would close the connection at each try
            raise InvalidValueError(f"invalid dead_letter_topic {dead!r}: 1-64 characters of [.a-zA-Z0-9_-]")
        self._readiness: Readiness | None = None
        #: hold_failed: the handler's failed messages, held and retried in-process (consumer/held.py).
        self.held: HeldMessages | None = None
        check, what = s["ready_check"], check_name(s["ready_check"])
        if check is None:
            self._rdy.on_backoff = self._dispatch.backoff_changed
            if handler is not None and s["hold_failed"] and not self.ordered and self.backoff_scope != "partition":
                self.held = self._dispatch.held = HeldMessages(
                    self._dispatch.call_again, lambda: self.total_finished, lambda: self.total_received,
                    lambda: self._rdy.max_in_flight,
                    lambda: probe_one(self._all_links()), lambda: self.msg_timeout, s["ready_check_interval"], self._log)
                check, what = self.held.retry, "the failed message's handler again"
        if check is not None:  # the check, not a backoff's waits and probes, says when to resume
            self._readiness = Readiness(check, s["ready_check_interval"],
                                        lambda holding: self._apply(self._rdy.hold(holding)), self._touch_held,
                                        self._log, f"{topic}/{channel}", what,
                                        None if self.held is None else self.held.release)
            if self.held is None:
                self._dispatch.on_failure = self._readiness.failed
            else:
                self.held.hold = self._readiness.failed
            self._dispatch.holding = lambda: self._readiness is not None and self._readiness.holding
        self._loop: asyncio.AbstractEventLoop | None = None
        self._links: dict[Endpoint, list[Link]] = {}
        self._missing = Missing(topic, self._fill, self._direct, delay=self.reconnect_delay,
                                max_delay=self.max_reconnect_delay,
                                lookupd_poll_interval=self.lookupd_poll_interval,
                                holds_none=lambda: not self._all_links(), log=self._log)
        self._topology: Topology | None = None
        self._meta_ext = False
        self._rdy_timer: asyncio.TimerHandle | None = None
        self._rdy_timer_at = 0.0
        self._touch_timer: asyncio.TimerHandle | None = None
        self._running = False
        self._stopping = False
        self._drained: asyncio.Event | None = None
        self._ever_connected: set[Endpoint] = set()
        self._lost_at: dict[Endpoint, float] = {}  # endpoint -> when its connection was lost (not yet back)
        self._retiring: set[Link] = set()
        #: Connections opened again to an endpoint connected before (after a loss, a leader move...).
        self.reconnects = 0
        self._errors: Counter[str] = Counter()  # nsqd's error frames, by code
        self._express = ExpressLanes(
            self._rdy, self.options, enabled=bool(s["express_lane"]), apply=self._apply, log=self._log,
            max_rate=s["express_max_rate"],
            open_express=lambda endpoint: self._connect(endpoint, express=True),
        )

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (directly and/or through lookupd) and start receiving."""
        if self._running:
            return
        self._loop = asyncio.get_running_loop()
        self._dispatch.start(self._loop)
        self._running = True
        self._drained = asyncio.Event()
        await asyncio.gather(*(self._connect_or_retry(endpoint) for endpoint in self._direct))
        if self._lookupd_addresses:
            await self._start_topology()
        if self.auto_touch:
            self._schedule_touch()

    async def _start_topology(self) -> None:
        self._topology = Topology(
            self._lookupd_addresses, access="r", poll_interval=self.lookupd_poll_interval,
            poll_jitter=self.lookupd_poll_jitter, auth_secret=secret_text(self.options.auth_secret),
            poll_timeout=self.lookupd_poll_timeout, log=self._log,
        )
        self._topology.add_listener(self.topic, self._on_route)
        self._missing.topology = self._topology
        try:
            await self._topology.refresh(self.topic)
        except NSQError as exc:
            self._log.warning("first lookupd poll failed: %s", exc)
        self._missing.tell()  # nothing found (every nsqd down, or the topic on none yet): poll often
        self._topology.watch(self.topic)

    async def __aenter__(self) -> Self:
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
        self._express.close()
        for link in self._all_links():
            link.fast = False  # every answer now goes through the dispatcher, which watches the drain
        self._dispatch.on_answer_while_stopping = self._answered_while_stopping
        assert self._loop is not None
        # The deadline on the loop's clock; the duration on a real one (uvloop's is in ms, cached per pass).
        started, measured_from = self._loop.time(), time.perf_counter()
        finished0, requeued0 = self.total_finished, self.total_requeued
        await self._missing.close()
        if self._topology is not None:
            await self._topology.close()
        await self._ha.close()
        self._apply(self._rdy.set_max_in_flight(0))
        if self._readiness is not None:
            self._readiness.cancel()
        await asyncio.gather(*(self._cls(link, timeout) for link in self._all_links()), return_exceptions=True)
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
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._drained.wait(), remaining)
        for link in self._all_links():
            for message in list(link.in_flight):
                report.abandoned += 1
                if not message.has_responded:
                    message.requeue(0, backoff=False)
        report.timed_out = report.abandoned > 0  # also when CLS alone took the whole timeout
        self._dispatch.cancel_tasks()  # past the deadline: their messages were requeued above
        await asyncio.sleep(0)  # let the last answers be written
        await asyncio.gather(*(link.conn.close() for link in self._all_links()), return_exceptions=True)
        self._cancel_timers()
        self._running = False
        report.finished = self.total_finished - finished0
        report.requeued = self.total_requeued - requeued0
        report.duration = time.perf_counter() - measured_from
        return report

    def _answered_while_stopping(self) -> None:
        if self._drained is not None and not self._in_flight_total():
            self._drained.set()

    async def _cls(self, link: Link, timeout: float) -> None:
        if link.conn.state in ("connected", "subscribed"):  # not twice (nsqd: fatal); 5 s at most for CLS
            try:
                await asyncio.wait_for(link.conn.cls(), min(5.0, timeout))
            except (NSQError, asyncio.TimeoutError, OSError) as exc:
                self._log.debug("CLS on %s: %s", link, exc)

    # ---- consuming without a handler ----------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Message]:
        if self._handler is not None:
            raise RuntimeError("this consumer has a handler; `async for` is for consumers without one")
        if self._readiness is not None:
            return self._when_ready()
        # In C, a queued message is handed out without a coroutine; _next_message does the waiting.
        return codec.MessageIterator(self._inbox, self._next_message, _YIELD_EVERY)

    async def _next_message(self, pass_first: bool) -> Message:
        """The next message for `async for`, after a loop pass if asked; StopAsyncIteration once stopped."""
        if pass_first:
            await asyncio.sleep(0)  # a pass for the loop
        while not self._queue:
            if self._stopping or not self._running:
                raise StopAsyncIteration
            await self._wait_queue()
        return self._queue.popleft()

    async def _when_ready(self) -> AsyncIterator[Message]:
        """`async for` with a ready_check: nothing handed out while the consumer holds."""
        assert self._readiness is not None
        while True:
            await self._readiness.wait()
            try:
                yield await self._next_message(False)
            except StopAsyncIteration:
                return

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
            if self._readiness is not None and self._readiness.holding and not self._stopping:
                await self._readiness.wait()  # held: the queue stays, TOUCHed, until the check passes
                continue
            take = min(max_size, len(self._queue))
            if take:
                yield Batch([self._queue.popleft() for _ in range(take)])
                if self._queue:  # nothing above awaited: let the FINs out and the reads in
                    await asyncio.sleep(0)  # a pass for the loop

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

    def pause_partition(self, partition: int | None) -> None:
        """RDY 0 on the connections of ``partition`` (None: those without a partition, i.e. an
        upstream nsqd's) until :meth:`resume_partition`; the others share max_in_flight."""
        self._apply(self._rdy.set_paused(partition, True))

    def resume_partition(self, partition: int | None) -> None:
        self._apply(self._rdy.set_paused(partition, False))

    @property
    def max_in_flight(self) -> int:
        return self._rdy.max_in_flight

    @property
    def backoff_level(self) -> int:
        return self._rdy.backoff_level

    @property
    def holding(self) -> bool:
        """True while the ``ready_check`` fails (RDY 0, nothing handed out): from its first failed
        check to the first that passes."""
        return self._readiness is not None and self._readiness.not_ready

    def hold(self) -> None:
        """Hold as a failed handler does: RDY 0, nothing handed out, until the ``ready_check``
        passes (the worker's failed batches, retried in-process). Needs a ``ready_check``."""
        if self._readiness is None:
            raise RuntimeError("hold() needs a ready_check: the check says when the hold ends")
        self._readiness.failed()

    @property
    def msg_timeout(self) -> float:
        """The shortest msg_timeout nsqd gives this consumer's connections (60 s without one)."""
        return min((link.msg_timeout for link in self._all_links()), default=60.0)

    @property
    def connections(self) -> list[Connection]:
        return [link.conn for link in self._all_links() if link.conn.is_open]

    @property
    def total_received(self) -> int:
        """Messages received over the consumer's life (all connections)."""
        return self._dispatch.closed_counts[0] + sum(link.received for link in self._all_links())

    @property
    def total_finished(self) -> int:
        return self._dispatch.closed_counts[1] + sum(link.finished for link in self._all_links())

    @property
    def total_requeued(self) -> int:
        return self._dispatch.closed_counts[2] + sum(link.requeued for link in self._all_links())

    @property
    def stats_given_up(self) -> int:
        """Messages given up on (past max_attempts)."""
        return self._dispatch.given_up

    @property
    def duplicates_dropped(self) -> int:
        """Ordered: copies of a message the HA nsqd sent twice in a row (see the dispatcher)."""
        return self.partitions.duplicates_dropped

    @property
    def ordering_errors(self) -> list[str]:
        """Ordered: every regression of id or offset seen within a partition."""
        return self.partitions.ordering_errors

    def snapshot(self) -> ConsumerStats:
        """What the consumer has done so far and holds now (a frozen copy)."""
        links = self._all_links()
        return ConsumerStats(
            topic=self.topic,
            channel=self.channel,
            received=self.total_received,
            finished=self.total_finished,
            requeued=self.total_requeued,
            timed_out=self._dispatch.closed_timed_out + sum(link.timed_out for link in links),
            given_up=self._dispatch.given_up,
            in_flight=self._rdy.in_flight,
            max_in_flight=self._rdy.max_in_flight,
            backoff_level=self._rdy.backoff_level,
            duplicates_dropped=self.duplicates_dropped,
            reconnects=self.reconnects,
            finish_dropped=self._dispatch.finish_dropped, requeue_dropped=self._dispatch.requeue_dropped,
            dead_lettered=self._dispatch.dead_lettered, holding=int(self.holding),
            errors=dict(self._errors),
            connections=tuple(self._connection_stats(link) for link in links),
        )

    def _connection_stats(self, link: Link) -> ConnectionStats:
        try:
            rdy = self._rdy.connection_stats(link).rdy
        except KeyError:  # closing: the controller has forgotten it
            rdy = 0
        return ConnectionStats(
            link.endpoint.address, link.endpoint.partition, rdy=rdy, in_flight=len(link.in_flight),
            received=link.received, finished=link.finished, requeued=link.requeued, timed_out=link.timed_out,
            express=self._express.owns(link))

    def stats(self) -> dict[str, Any]:
        """Deprecated: :meth:`snapshot` (the same figures, typed)."""
        deprecated_spelling("Consumer.stats()", "Consumer.snapshot()")
        figures = self.snapshot().as_dict()
        return {**figures, "connections": list(figures["connections"])}

    # ---- connections --------------------------------------------------------------------

    def _all_links(self) -> list[Link]:
        return [*(link for links in self._links.values() for link in links), *self._express.links()]

    async def _connect_or_retry(self, endpoint: Endpoint) -> None:
        """Open the endpoint's connections now; what fails is left to the recovery rule."""
        try:
            await self._fill(endpoint)
        except (OSError, asyncio.TimeoutError, NSQError) as exc:
            self._log.warning("cannot consume from %s: %s", endpoint.address, exc)
            self._missing.add(endpoint, exc)

    async def _fill(self, endpoint: Endpoint) -> None:
        """Open connections to ``endpoint`` up to ``connections_per_nsqd``; raises the first failure."""
        needed = self.connections_per_nsqd - len(self._links.get(endpoint, ()))
        results = await asyncio.gather(*(self._connect(endpoint) for _ in range(needed)), return_exceptions=True)
        if failures := [result for result in results if isinstance(result, BaseException)]:
            raise failures[0]

    async def _connect(self, endpoint: Endpoint, *, express: bool = False) -> Link:
        link = Link(self._dispatch, endpoint)
        conn = Connection(
            endpoint.address,
            self._express.options if express else self.options,
            extend_support=self._ha.extend_support(self._meta_ext),
            # The link is the reader's message sink: in C, the codec calls it directly.
            on_message=link,
            on_close=lambda c, error: self._on_close(link, error),
            on_error=lambda c, error: self._on_server_error(link, error),
        )
        link.attach(conn)
        self._dispatch.configure(link)
        conn.reader.delegate = link
        await conn.connect()
        if self.ordered and not conn.is_ha:
            await conn.close()
            raise InvalidValueError(f"ordered=True needs an HA nsqd; {endpoint.address} is not one")
        timeout_ms = conn.identify_response.get("msg_timeout")
        if timeout_ms:
            link.msg_timeout = timeout_ms / 1000
        try:
            plan = await self._ha.plan(endpoint, conn.is_ha)
            subscribing = time.monotonic()
            await conn.subscribe(self.topic, self.channel, partition=endpoint.partition, ordered=self.ordered,
                                 advanced=plan.advanced, position=plan.position)
        except BaseException:
            self._ha.subscribe_failed(endpoint)
            await conn.close()
            raise
        if self._stopping:
            await conn.close()
            raise NSQError("the consumer is stopping")
        if express:
            return self._express.express_added(link)  # closed by the consumer if refused
        self._links.setdefault(endpoint, []).append(link)
        self._missing.tell()  # the first connection ends the polling a consumer holding none does
        lost_at = self._lost_at.pop(endpoint, None)
        if endpoint in self._ever_connected:
            self.reconnects += 1
        self._ever_connected.add(endpoint)
        self.partitions.state(endpoint.partition)  # a partition's state exists from its first SUB
        settle = max(_MIN_SETTLE, _SETTLE_ROUND_TRIPS * (time.monotonic() - subscribing))
        updates = self._rdy.add_connection(link, conn.max_rdy_count, endpoint.partition, settle=settle)
        link.rdy_state = self._rdy.record(link)
        # Ordered consumption checks every message's offset: always the Python path (and an HA
        # start checks its first messages).
        self._ha.subscribed(link)
        self._apply(updates)
        if self._express.wants(link, is_ha=conn.is_ha, ordered=self.ordered):
            self._express.bulk_added(link)
        where = "" if endpoint.partition is None else f" partition {endpoint.partition}"
        if lost_at is None:
            self._log.info("consuming %s/%s from %s%s", self.topic, self.channel, endpoint.address, where)
        else:
            self._log.info("connection to %s%s re-established after %.2f s: consuming %s/%s again", endpoint.address,
                           where, time.monotonic() - lost_at, self.topic, self.channel)
        return link

    def _on_close(self, link: Link, error: BaseException | None) -> None:
        link.closed = True
        link.fast = False
        express = self._express.owns(link)  # the express lane reopens its own
        links = self._links.get(link.endpoint, [])
        if express or link in links:
            self._dispatch.link_closed(link)
        if link in links:
            links.remove(link)
            if not links:
                del self._links[link.endpoint]
        self._apply(self._rdy.remove_connection(link))
        self._express.closed(link)
        if isinstance(error, ServerError):
            self._errors[error.code] += 1
        if link in self._retiring or express:  # disconnect_from_nsqd: closed on purpose
            self._retiring.discard(link)
            return
        if self._stopping or not self._running:
            return
        self._log.warning("connection to %s closed%s", link.endpoint.address, f": {error}" if error else "")
        self._lost_at.setdefault(link.endpoint, time.monotonic())
        self._missing.add(link.endpoint, error if isinstance(error, REFRESH_ERRORS) else None)

    def _on_server_error(self, link: Link, error: ServerError) -> None:
        if not self._dispatch.expected_error(link, error):  # an expected one is logged at debug there
            self._errors[error.code] += 1
            self._log.warning("%s: %s", link.endpoint.address, error)

    async def _on_route(self, route: TopicRoute) -> None:
        """A new route from lookupd: connect to the nsqd (and partitions) listed and not connected,
        and drop the connections to partitions now led elsewhere (HA)."""
        if self._stopping:
            return
        self._meta_ext = route.extend_support
        self._ha.route = route
        self._missing.routed(route)
        for endpoint in route.moved_away(list(self._links)):
            for link in list(self._links.get(endpoint, ())):
                # The old leader cannot take our FINs any more; its messages in flight come back
                # from the new leader (at least once).
                self._log.info("partition %s of %s moved away from %s: closing that connection",
                            endpoint.partition, self.topic, endpoint.address)
                await link.conn.close()
        allowed = self._filtered({endpoint.address for endpoint in route.endpoints})
        missing = [e for e in route.endpoints if e not in self._links and e.address in allowed and self._ha.wants(e)
                   and not self._missing.has(e)]
        await asyncio.gather(*(self._connect_or_retry(endpoint) for endpoint in missing))

    def _filtered(self, addresses: set[str]) -> set[str]:
        """The discovery_filter's choice among the nsqd lookupd listed (all of them without one)."""
        if self._discovery_filter is None:
            return addresses
        try:
            chosen = self._discovery_filter(sorted(addresses))
            return {address for address in chosen if address in addresses}
        except Exception:  # noqa: BLE001 - the user's filter: logged with its traceback
            self._log.exception("discovery_filter failed; using every nsqd lookupd listed")
            return addresses

    # ---- run-time topology (go-nsq's ConnectToNSQD, DisconnectFromNSQD, ...) ---------------

    async def connect_to_nsqd(self, address: str, partition: int | None = None) -> None:
        """Consume from the nsqd at ``address`` too, as if it were in ``nsqd_tcp_addresses``
        (reconnecting when lost); ``max_in_flight`` is shared with it at once. HA: ``partition``
        names the partition to read there (go-nsq's ``ConnectToNSQD(addr, part)``)."""
        endpoint = direct_endpoints([address if partition is None else (address, partition)], self._ha.partition)[0]
        if endpoint in self._direct:
            raise InvalidValueError(f"already consuming from nsqd {address}")
        self._direct.append(endpoint)
        if self._running and not self._stopping:
            await self._connect_or_retry(endpoint)

    async def disconnect_from_nsqd(self, address: str, timeout: float = 30.0) -> None:
        """Stop consuming from the nsqd at ``address`` (given directly or by lookupd): its share
        of ``max_in_flight`` goes to the others at once, then CLS, its handlers finish (up to
        ``timeout``; what is left is requeued) and its connections close (nsqd has dropped them when
        this returns). A lookupd that lists it again makes the consumer connect to it again, as in
        go-nsq; filter it out with ``discovery_filter`` to keep away."""
        links = [link for link in self._all_links() if link.endpoint.address == address]
        given = [endpoint for endpoint in self._direct if endpoint.address == address]
        if not given and not links:
            raise InvalidValueError(f"not consuming from nsqd {address}")
        for endpoint in given:
            self._direct.remove(endpoint)
        self._missing.drop_address(address)
        await asyncio.gather(*(self._retire(link, timeout) for link in links))

    async def _retire(self, link: Link, timeout: float) -> None:
        """RDY 0 (its share to the others), CLS, wait for its messages in flight, close."""
        self._retiring.add(link)
        self._apply(self._rdy.remove_connection(link))
        link.fast = False
        await self._cls(link, timeout)
        assert self._loop is not None
        deadline = self._loop.time() + timeout
        while link.in_flight and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        for message in list(link.in_flight):
            if not message.has_responded:
                message.requeue(0, backoff=False)
        await link.conn.close(wait_for_server=2.0)  # returns once nsqd has dropped the client

    async def connect_to_lookupd(self, address: str) -> None:
        """Ask the lookupd at ``address`` too, from the next poll on."""
        if address in self._lookupd_addresses:
            raise InvalidValueError(f"already using nsqlookupd {address}")
        self._lookupd_addresses.append(address)
        if self._topology is not None:
            self._topology.set_lookupds(self._lookupd_addresses)
        elif self._running and not self._stopping:
            await self._start_topology()

    def disconnect_from_lookupd(self, address: str) -> None:
        """Stop asking the lookupd at ``address`` (not the last one: go-nsq refuses that too).

        The nsqd it found stay connected while another lookupd lists them or they are given.
        """
        if address not in self._lookupd_addresses:
            raise InvalidValueError(f"not using nsqlookupd {address}")
        if len(self._lookupd_addresses) == 1:
            raise InvalidValueError(f"cannot disconnect from the only nsqlookupd, {address}")
        self._lookupd_addresses.remove(address)
        if self._topology is not None:
            self._topology.set_lookupds(self._lookupd_addresses)

    def _in_flight_total(self) -> int:
        return sum(len(link.in_flight) for link in self._all_links())

    # ---- RDY ----------------------------------------------------------------------------

    def _apply(self, updates: list[RdyUpdate]) -> None:
        for link, count in updates:
            if not link.closed and link.conn.is_open and link.conn.state != "closing":
                # nsqd writes a message out at once only when it leaves the connection not ready, else at its output
                # buffer's tick: RDY 1 until the first message, which brings the rest; not with an HA start (ha.py).
                first = not link.received and not self._ha.starting(link.endpoint.partition)
                try:
                    link.conn.rdy(min(count, link.conn.max_rdy_count, 1 if first else count))
                except NSQError as exc:
                    self._log.debug("RDY on %s: %s", link, exc)
        self._arm_rdy_timer()

    def _arm_rdy_timer(self) -> None:
        """One timer at the controller's next deadline (its clock is time.monotonic)."""
        if self._loop is None:
            return
        when = self._rdy.next_deadline()
        if when is None or (self._rdy_timer is not None and self._rdy_timer_at <= when):
            return
        if self._rdy_timer is not None:
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
        assert self._loop is not None
        now = self._loop.time()
        for link in self._all_links():
            threshold = link.msg_timeout / 2
            for message, delivered in list(link.in_flight.items()):
                last = link.touched.get(message, delivered)
                if not message.has_responded and now - last >= threshold:
                    message.touch()
        if not self._stopping:
            self._schedule_touch()

    def _touch_held(self) -> float:
        """TOUCH the messages queued while holding; seconds until the next TOUCH is due."""
        for message in self._queue:
            if not message.has_responded:
                message.touch()
        return self.msg_timeout / 3

    def _cancel_timers(self) -> None:
        for timer in (self._rdy_timer, self._touch_timer):
            if timer is not None:
                timer.cancel()
        self._rdy_timer = self._touch_timer = None


Consumer.__doc__ = (Consumer.__doc__ or "") + options_docstring("Consumer")


def _resolve_none(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
