"""Producer: publishing to many nsqd, pipelined, coalesced, with failover and retries.

* Many publishes are in flight on each connection; nsqd answers in command order.
* Concurrent ``publish()`` calls for one topic within one pass of the event loop
  become one MPUB (``coalesce=True``, the default). A call is never coalesced when
  it asks for something an MPUB cannot carry: ``defer``, ``partition``, a trace id
  or ext headers; those go out as their own command.
* A pool of ``pool_size`` connections per nsqd; round robin over the open ones; a lost
  connection reconnects by the recovery rule (:mod:`fastnsq.recovery`), and the publishes
  it carried are retried elsewhere (``max_retries``). nsqd may be down at ``start()``
  (``lazy_connect``); a publish while it is down fails fast with a current cause (``fail_fast``).
* Each publish is either acknowledged (returns) or raises: nothing is dropped
  silently. Errors that cannot succeed on a retry (a bad topic, a bad or oversized
  body) are raised at once, most of them before a byte is sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from .. import codec, tracing
from ..config import (
    ConnectionOptions,
    address_list,
    check_logger,
    check_range,
    parse_address,
    secret_text,
    split_options,
)
from ..conn import Connection
from ..errors import (
    BadBodyError,
    BadMessageError,
    BadPartitionError,
    BadTopicError,
    ConnectionClosedError,
    ExtNotSupportError,
    InvalidJsonHeaderError,
    InvalidTraceIdError,
    InvalidValueError,
    MPubFailedError,
    NoConnectionError,
    NotLeaderError,
    NotWritableError,
    NSQError,
    PubFailedError,
    PublishTimeoutError,
    ServerError,
    TopicNotExistError,
)
from ..optionspec import options_docstring, options_of
from ..sharding import murmur3_32
from ..stats import ProducerStats, deprecated_spelling
from ..topology import Topology
from .batches import FLUSH_AT, FLUSH_BYTES, BatchWriter
from .busy_poll import BusyPoll
from .deadline import answer_by, past_deadline
from .direct import DirectPublisher, Done
from .ha import CloseReport, HAProducer
from .load import NodeStats
from .messages import body_size, check_message_size, ext_json, fits_one_mpub, mpub_chunks, second
from .pool import ConnectionPool, NsqdDown, describe
from .routing import ANY_NSQD, Router

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from ..codec import TracedResponse
    from ..typed_options import Body, ProducerOptions

__all__ = ["NOT_RETRYABLE", "PRODUCER_DEFAULTS", "Producer"]

logger = logging.getLogger(__name__)

#: The Producer's own options (not the connections') with their defaults (the table: fastnsq.optionspec).
PRODUCER_DEFAULTS: dict[str, Any] = {n: o.default for n, o in options_of("Producer").items() if o.client == "producer"}

#: Server errors a retry cannot fix: the same bytes would be refused again.
NOT_RETRYABLE = (BadTopicError, BadMessageError, BadBodyError, BadPartitionError, ExtNotSupportError,
                 InvalidJsonHeaderError, InvalidTraceIdError)
#: HA: the partition moved or is not on that node: look it up again, then retry (protocol.md §9.14).
_REFRESH_ERRORS = (NotLeaderError, NotWritableError, TopicNotExistError)
#: HA's non-fatal publish failures are transient (e.g. "pub to wait channel timeout").
_TRANSIENT = (PubFailedError, MPubFailedError)
#: _direct_answer's word for "failed, and a retry may mend it".
_RETRY = object()


class Producer:
    """Publishes to one or more nsqd.

    >>> async def main():                                   # doctest: +SKIP
    ...     async with Producer(["127.0.0.1:4150"]) as producer:
    ...         await producer.publish("events", b"hello")
    ...         await producer.mpublish("events", [b"a", b"b"])

    ``publish`` returns nsqd's answer (``b"OK"``; a ``TracedResponse`` with ``trace_id``) or raises.
    Options: :class:`fastnsq.typed_options.ProducerOptions`, listed below (and in docs/options.md).
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        *,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        **options: Unpack[ProducerOptions],
    ) -> None:
        connection_options, settings = split_options("Producer", options)
        self.options: ConnectionOptions = connection_options
        self.pool_size: int = settings["pool_size"]
        self.coalesce: bool = settings["coalesce"]
        self.publish_timeout: float = settings["publish_timeout"]
        self.max_retries: int = settings["max_retries"]
        self.retry_delay: float = settings["retry_delay"]
        self.reconnect_delay: float = settings["reconnect_delay"]
        self.max_reconnect_delay: float = settings["max_reconnect_delay"]
        self.lazy_connect: bool = settings["lazy_connect"]
        self.fail_fast: bool = settings["fail_fast"]
        self.lookupd_poll_interval: float = settings["lookupd_poll_interval"]
        self.lookupd_poll_jitter: float = settings["lookupd_poll_jitter"]
        self._busy_poll = BusyPoll(settings["busy_poll"])  # a lone publish's wait for its answer
        self._nsqd_addresses = address_list(nsqd_tcp_addresses)
        self._lookupd_addresses = address_list(lookupd_http_addresses)
        for address in self._nsqd_addresses:
            parse_address(address)
        if not self._nsqd_addresses and not self._lookupd_addresses:
            raise InvalidValueError("give nsqd_tcp_addresses or lookupd_http_addresses")
        hasher = settings["hasher"]
        self.lookupd_poll_timeout: float = settings["lookupd_poll_timeout"]
        self._log = check_logger(settings["logger"], logger)
        self._pool = ConnectionPool(
            connection_options, pool_size=self.pool_size, publish_timeout=self.publish_timeout, log=self._log,
            reconnect_delay=self.reconnect_delay, max_reconnect_delay=self.max_reconnect_delay,
            suspect_after=settings["suspect_after"])
        topology = None
        if self._lookupd_addresses:
            topology = Topology(
                self._lookupd_addresses, access="w", poll_interval=self.lookupd_poll_interval,
                poll_jitter=self.lookupd_poll_jitter, auth_secret=secret_text(self.options.auth_secret),
                poll_timeout=self.lookupd_poll_timeout, log=self._log,
            )
        self._ha = HAProducer(settings, self._pool, self.publish, _retryable)
        self._router = Router(topology, self._pool, hasher if hasher is not None else murmur3_32,
                              self._ha.loads if self._ha.load_aware else None)
        self._max_msg_size = self.options.max_msg_size
        self._direct = DirectPublisher(self._pool, self._ha, self.options.max_body_size, self._max_msg_size,
                                       self._soon_failed)
        self._batches = BatchWriter(self._pool, self._router, self._ha, self.options.max_body_size)
        self._ready_topics: set[str] = set()
        self._coalescer: Any = None
        self._connecting: asyncio.Task[None] | None = None  # start(background=True)'s connects
        self._soon_tasks: set[asyncio.Task[Any]] = set()  # publish_soon()'s, referenced until done
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle_waiter: asyncio.Future[None] | None = None
        self._active = 0
        self._closing = False
        self._started = False
        self.published = 0
        self.failed = 0
        self.retried = 0
        self._errors: Counter[str] = Counter()  # messages refused by nsqd, by error code

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self, *, background: bool = False) -> None:
        """Connect to every nsqd, one attempt each (those that fail keep retrying). By default
        it returns either way (an ASGI app starts while nsqd is down); with ``lazy_connect=False``
        it raises ``NoConnectionError`` unless one answers.

        ``background=True`` returns at once and connects in the background (the blocking
        facade's start, go-nsq's ``NewProducer``): publishes wait for :meth:`connecting`.
        """
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._pool.start()
        # A lone publish goes out at once; not where lookupd routes (partitions take turns per pass).
        self._coalescer = codec.Coalescer(self._loop, self._batches.flush, self._max_msg_size, FLUSH_AT,
                                          FLUSH_BYTES, lone_at_once=self._router.topology is None)
        if background:
            self._connecting = self._loop.create_task(self._connect_in_background())
            return
        await self._connect(must_open=not self.lazy_connect)

    async def _connect_in_background(self) -> None:
        try:
            await self._connect(must_open=False)
        except Exception as exc:  # noqa: BLE001 - nobody awaits this task: say it, reconnects go on
            self._log.warning("connecting in the background: %s", describe(exc))

    async def _connect(self, must_open: bool) -> None:
        """Open every nsqd's connections; ``must_open``: raise when none opened."""
        addresses = list(self._nsqd_addresses)
        topology = self._router.topology
        if topology is not None:
            addresses += [a for a in await topology.nodes() if a not in addresses]
        failures = await self._pool.add_all(addresses)
        if topology is not None:
            topology.watch_nodes(self._pool.add_nodes)
        if failures is not None and must_open:
            await self.close(timeout=0)
            raise NoConnectionError(f"no nsqd could be reached ({failures})")
        elif failures is not None:
            self._log.warning("no nsqd could be reached (%s); reconnecting in the background", failures)

    async def close(self, timeout: float | None = 5.0) -> CloseReport:
        """Stop accepting publishes, wait for those in flight (up to ``timeout``), then close.

        Returns what was left unsent: the publishes waiting for a background retry (:meth:`publish_and_retry_background`).
        """
        if self._closing:
            return CloseReport()
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        report = await self._ha.close()
        self._closing = True
        self._ready_topics.clear()
        if timeout and self._loop is not None and self._waiting():
            self._idle_waiter = self._loop.create_future()
            deadline = self._loop.time() + timeout
            # Publishes through the coalescer resolve in batches: look again every few ms.
            while self._waiting() and self._loop.time() < deadline:
                await asyncio.sleep(0.005)
            if self._waiting():
                self._log.warning("closing with %d publishes still waiting for nsqd", self._waiting())
        if self._router.topology is not None:
            await self._router.topology.close()
        await self._pool.close()
        return report

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _waiting(self) -> int:
        return self._active + self._direct.pending + (self._coalescer.pending if self._coalescer is not None else 0)

    @property
    def reconnects(self) -> int:
        """Connections re-opened after a loss."""
        return self._pool.reconnects

    def snapshot(self) -> ProducerStats:
        """Messages acknowledged and failed (their publish raised), retries, reconnects, publishes waiting now."""
        coalesced = self._coalescer.published if self._coalescer is not None else 0
        return ProducerStats(
            published=self.published + coalesced + self._direct.published,
            failed=self.failed,
            retried=self.retried,
            reconnects=self.reconnects,
            waiting=self._waiting(),
            connections=len(self._pool.open), rerouted=self._pool.rerouted,
            errors=dict(self._errors),
        )

    @property
    def stats(self) -> dict[str, int]:
        """Deprecated: :meth:`snapshot` (the same figures, typed)."""
        deprecated_spelling("Producer.stats", "Producer.snapshot()")
        return self.snapshot().as_dict()

    async def connect_to_nsqd(self, address: str) -> None:
        """Publish to the nsqd at ``address`` too (``pool_size`` connections, reconnecting);
        raises if none of them opens (they keep trying in the background)."""
        parse_address(address)
        if address in self._nsqd_addresses:
            raise InvalidValueError(f"already publishing to nsqd {address}")
        self._nsqd_addresses.append(address)
        await self._pool.add_node(address)

    async def disconnect_from_nsqd(self, address: str) -> None:
        """Stop publishing to the nsqd at ``address``; publishes waiting for its answer are
        retried on the other connections (within ``max_retries``)."""
        if address not in self._nsqd_addresses and not self._pool.has_node(address):
            raise InvalidValueError(f"not publishing to nsqd {address}")
        if address in self._nsqd_addresses:
            self._nsqd_addresses.remove(address)
        await self._pool.remove_node(address)

    def set_round_trip_observer(self, observer: Callable[[float], object] | None) -> None:
        """Call ``observer`` with each publish round trip in seconds (from a write to nsqd to the
        answer of its last command: one call per write, however many publishes it carried);
        None stops. :class:`fastnsq.metrics.NSQMetrics` uses it for its histogram."""
        self._pool.set_round_trip_observer(observer)

    @property
    def connections(self) -> list[Connection]:
        """The open connections (for stats and tests)."""
        return list(self._pool.open)

    def answering(self) -> bool:
        """Whether an open connection answers (not suspect or on probation): to-nsq skips a destination without."""
        return self._pool.answering()

    def node_stats(self) -> dict[str, NodeStats]:
        """Per nsqd: publish commands pending, their average round trip (go-nsq's ``Stat()``)."""
        return self._ha.node_stats()

    async def publish_and_retry_background(
        self,
        topic: str,
        body: Any,
        *,
        partition: int | None = None,
        sharding_key: Any = None,
        ext: Mapping[str, Any] | None = None,
    ) -> bool:
        """Publish; if that fails, keep it for background retries (go-nsq's PublishAndRetryBackground).

        True: nsqd has it. False: it waits in the retry buffer (``pub_background_buffer``)
        and is retried up to ``pub_max_background_retry`` times; one that runs out goes to
        ``background_failure_handler``, and :meth:`close` returns those still waiting. A full
        buffer raises ``BackgroundBufferFullError``; an error no retry can fix raises at once.
        """
        arguments = {name: value for name, value in
                     (("partition", partition), ("sharding_key", sharding_key), ("ext", ext)) if value is not None}
        return await self._ha.background.publish(topic, body, arguments)

    # ---- publishing -------------------------------------------------------------------

    @overload
    async def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: None = None, ext: None = None,
    ) -> bytes: ...
    @overload
    async def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: int, ext: None = None,
    ) -> TracedResponse: ...
    @overload
    async def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> bytes | TracedResponse: ...

    async def publish(
        self, topic: str, body: Body, *, defer: float | None = None, timeout: float | None = None,
        partition: int | None = None, sharding_key: Any = None, trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> Any:
        """Publish one message; returns nsqd's answer (``b"OK"``) once it has the message.

        ``defer`` (seconds) delays delivery (DPUB; upstream nsqd only). On an HA nsqd
        (found by itself, from lookupd or IDENTIFY): ``partition`` names the
        partition, ``sharding_key`` picks one by hash (the same key always lands on
        the same partition), otherwise partitions take turns; ``trace_id`` publishes
        with PUB_TRACE and returns the ``TracedResponse`` (internal id, trace id,
        offset, size); ``ext`` (a JSON object) publishes with PUB_EXT.

        Raises ``InvalidValueError`` for a bad topic, body or option before sending,
        ``ServerError`` when nsqd refuses, ``PublishTimeoutError`` or ``NoConnectionError``.
        """
        deadline = None
        if (
            topic in self._ready_topics
            and timeout is None
            and defer is None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and ext is None
            and not tracing.ENABLED
        ):
            direct = self._router.topology is None and self._pool.open
            # The call's one deadline, should it go on to the slow path: a retry is not a new call.
            deadline = self._loop.time() + self.publish_timeout  # type: ignore[union-attr] # open: checked
            # A lone publish (nothing unanswered, no batch to join) takes the pipelined path below.
            if self.coalesce and not (direct and not self._active and not self._coalescer.pending):
                # The fast path: the C coalescer checks the body, batches it with the other
                # publishes of this loop pass and returns the future one MPUB's answer resolves.
                key = topic if self._router.topology is None else self._router.coalescing_key(topic)
                if key is not None:
                    try:
                        return await self._coalescer.add(key, body)
                    except (ConnectionClosedError, NoConnectionError, ServerError) as exc:
                        self._note_error(exc, 1)
                        if not _retryable(exc):
                            self.failed += 1
                            raise
                        self._forget_route(topic, exc)
                        self.retried += 1  # and on to the slow path, which retries
            elif direct:
                # The pipelined fast path: one PUB on the next connection, awaited right here, without
                # _call's routing coroutines (nothing to route without lookupd; the sweeper enforces
                # publish_timeout). The codec checks the body before a byte is buffered. _direct_answer
                # written out here: its coroutine costs ~0.25 us a message.
                # Nagle's rule: with nothing unanswered, written now (see _direct_answer).
                conn = self._pool.next_open()
                future = conn.publish(topic, body, now=not self._active)
                self._active += 1
                try:
                    result = await (self._busy_poll.answer(future) if self._active == 1 else future)
                except (ConnectionClosedError, NoConnectionError, ServerError) as exc:
                    self._note_error(exc, 1)
                    if not _retryable(exc):
                        self.failed += 1
                        raise
                    self.retried += 1  # and on to the slow path, which retries
                else:
                    self.published += 1
                    self._ha.loads.count(conn.address)  # not timed: a done callback a message costs more
                    return result
                finally:
                    self._active -= 1
                    if not self._active and self._idle_waiter is not None:
                        _resolve(self._idle_waiter)
        if tracing.HOOKED:
            call = tracing.PublishCall(topic, partition, None if ext is None else [dict(ext)], 1)
            with tracing.publishing(call):
                call.answer = await self._publish_slow(
                    topic, body, defer, timeout, partition, sharding_key, trace_id,
                    None if call.exts is None else call.exts[0], deadline,
                )
                return call.answer
        return await self._publish_slow(topic, body, defer, timeout, partition, sharding_key, trace_id, ext,
                                        deadline)

    # ---- for callers that do not await: the blocking facade --------------------------------

    def connecting(self) -> asyncio.Task[None] | None:
        """The background start's connection attempts while they run (``start(background=True)``)."""
        task = self._connecting
        return task if task is not None and not task.done() else None

    def unreachable(self) -> NsqdDown | None:
        """With ``fail_fast``, while no connection is open and every attempt failed: an error
        naming each nsqd and why, if the last attempt began within 0.2 s; else None, and an
        attempt starts now, whose outcome the publishes handed over then wait for."""
        if self._pool.open or not self.fail_fast:
            return None
        causes = self._pool.down_error()
        if causes is None or self._pool.hurry():
            return None
        return NsqdDown(f"no connection to nsqd: {causes}; reconnecting in the background")

    def publish_batch_soon(self, topic: str, bodies: list[Any], dones: list[Done]) -> None:
        """:meth:`publish_soon` for many plain publishes to one topic: one MPUB, written now, when
        nothing asks otherwise (coalescing on, no lookupd to route by, no tracing)."""
        if self.coalesce and self._router.topology is None and not tracing.ENABLED and self._topic_ok(topic):
            self._direct.send(topic, bodies, dones)
            return
        for body, done in zip(bodies, dones):  # each caller gets its own error, or the general path
            self.publish_soon(topic, body, done)

    def publish_soon(self, topic: str, body: Any, done: Done) -> None:
        """:meth:`publish` for a caller that does not await (the blocking facade): ``done(answer,
        error)`` runs on this loop once nsqd answered or the publish failed. The coalescing fast
        path takes no coroutine and no task; anything else runs :meth:`publish` in a task."""
        try:
            self._check_topic(topic)
            if self.coalesce and not tracing.ENABLED:
                key = topic if self._router.topology is None else self._router.coalescing_key(topic)
                if key is not None:
                    future = self._coalescer.add(key, body)  # checks the body; counted by the coalescer
                    future.add_done_callback(functools.partial(self._soon_answered, topic, body, done))
                    return
        except Exception as exc:  # noqa: BLE001 - this caller's error (a bad topic or body, closed)
            done(None, exc)
            return
        self._soon_task(self.publish(topic, body), done)

    def _soon_answered(self, topic: str, body: Any, done: Done, future: asyncio.Future[Any]) -> None:
        error = ConnectionClosedError("the command was cancelled") if future.cancelled() else future.exception()
        if error is None:
            done(future.result(), None)
        else:
            self._soon_failed(topic, body, done, error)

    def _soon_failed(self, topic: str, body: Any, done: Done, error: BaseException) -> None:
        """A publish of the fast paths without a coroutine failed: as publish()'s fast path, a
        lost link goes on to the slow path, which retries; anything else is the caller's."""
        if isinstance(error, (ConnectionClosedError, NoConnectionError, ServerError)):
            self._note_error(error, 1)
            if _retryable(error) and not self._closing:
                self._forget_route(topic, error)
                self.retried += 1
                self._soon_task(self._publish_slow(topic, body, None, None, None, None, None, None), done)
                return
            self.failed += 1
        done(None, error)

    def _soon_task(self, call: Coroutine[Any, Any, Any], done: Done) -> None:
        assert self._loop is not None
        task = self._loop.create_task(call)
        self._soon_tasks.add(task)
        task.add_done_callback(functools.partial(_task_done, self._soon_tasks, done))

    async def _publish_slow(
        self,
        topic: str,
        body: Any,
        defer: float | None,
        timeout: float | None,
        partition: int | None,
        sharding_key: Any,
        trace_id: int | None,
        ext: Mapping[str, Any] | None,
        deadline: float | None = None,
    ) -> Any:
        """publish() beyond its fast paths (``deadline``: the call's, when one tried first): checks,
        routing, retries. (Its own function: the fast paths make no closure cells for the lambdas.)"""
        self._check_topic(topic)
        if ext is not None and self._ha.compressing:
            body, ext = self._ha.compress(topic, body, ext)
        size = body_size(body)
        if size == 0 or size > self._max_msg_size:
            check_message_size(size, self._max_msg_size, 0)  # raises, naming the limit
        if defer is not None:
            defer_ms = round(check_range("defer", defer, 0, 3600) * 1000)
            send = lambda conn, pid: conn.dpublish(topic, defer_ms, body)
        elif ext is not None:
            ext_header = ext_json(ext, trace_id)
            send = lambda conn, pid: conn.publish_ext(topic, pid, ext_header, body)
        elif trace_id is not None:
            check_range("trace_id", trace_id, 0, 2**64 - 1, integer=True)
            send = lambda conn, pid: conn.publish_trace(topic, pid, trace_id, body)
        elif self.coalesce and timeout is None:
            send = None  # coalesced with the other publishes of this loop pass
        else:
            send = lambda conn, pid: conn.publish(topic, body, partition=pid)
        traced = trace_id is not None or ext is not None
        return await self._call(topic, send, timeout, partition, sharding_key, body=body, size=size, traced=traced,
                                deadline=deadline)

    @overload
    async def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: None = None, exts: None = None,
    ) -> bytes: ...
    @overload
    async def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: Sequence[int], exts: None = None,
    ) -> TracedResponse: ...
    @overload
    async def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any]] | None = None,
    ) -> bytes | TracedResponse: ...

    async def mpublish(
        self, topic: str, bodies: Sequence[Body], *, timeout: float | None = None, partition: int | None = None,
        sharding_key: Any = None, trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any]] | None = None,
    ) -> Any:
        """Publish a batch with MPUB (split into several under nsqd's max body size); returns nsqd's
        answer to the last MPUB (``b"OK"``; a ``TracedResponse`` with ``trace_ids``).

        On HA: ``partition`` / ``sharding_key`` as for :meth:`publish`; ``trace_ids``
        (one per body) uses MPUB_TRACE, ``exts`` (one JSON object per body) MPUB_EXT.
        """
        deadline = None
        if (
            topic in self._ready_topics and timeout is None and partition is None and sharding_key is None
            and trace_ids is None and exts is None and not tracing.ENABLED
            and self._router.topology is None and self._pool.open
        ):
            # The pipelined fast path, as publish()'s: the common batch (one MPUB under nsqd's limits) on the
            # next connection, awaited without _call's routing coroutines; a retry keeps the call's deadline.
            deadline = self._loop.time() + self.publish_timeout  # type: ignore[union-attr] # open: checked
            batch = bodies if type(bodies) is list else list(bodies)
            if fits_one_mpub(batch, self.options.max_body_size, self._max_msg_size):
                conn = self._pool.next_open()
                answer = await self._direct_answer(conn.mpublish(topic, batch, now=not self._active), len(batch),
                                                   conn.address)
                if answer is not _RETRY:
                    return answer
        if tracing.HOOKED:
            call = tracing.PublishCall(topic, partition, None if exts is None else [dict(e) for e in exts],
                                       len(bodies))
            with tracing.publishing(call):
                call.answer = await self._mpublish(topic, bodies, timeout, partition, sharding_key, trace_ids,
                                                   call.exts, deadline)
                return call.answer
        return await self._mpublish(topic, bodies, timeout, partition, sharding_key, trace_ids, exts, deadline)

    async def _mpublish(
        self,
        topic: str,
        bodies: Sequence[Any],
        timeout: float | None,
        partition: int | None,
        sharding_key: Any,
        trace_ids: Sequence[int] | None,
        exts: Sequence[Mapping[str, Any]] | None, deadline: float | None = None,
    ) -> Any:
        self._check_topic(topic)
        batch = list(bodies)
        if not batch:
            raise InvalidValueError("mpublish needs at least one message")
        for name, extra in (("trace_ids", trace_ids), ("exts", exts)):
            if extra is not None and len(extra) != len(batch):
                raise InvalidValueError(f"{name} must have one entry per body ({len(batch)}), got {len(extra)}")
        header: Callable[[Any], int] | None
        body_of: Callable[[Any], Any] | None
        if exts is not None:
            if self._ha.compressing:
                batch, exts = self._ha.compress_batch(topic, batch, exts)
            ids = trace_ids if trace_ids is not None else [None] * len(batch)
            items = [(ext_json(e, t), b) for e, t, b in zip(exts, ids, batch)]
            header = lambda item: 2 + len(item[0])
            body_of = second
            make = lambda conn, pid, chunk: conn.mpublish_ext(topic, pid, chunk)
        elif trace_ids is not None:
            for trace_id in trace_ids:
                check_range("trace_ids[]", trace_id, 0, 2**64 - 1, integer=True)
            items = list(zip(trace_ids, batch))  # type: ignore[arg-type]
            header = lambda item: 8
            body_of = second
            make = lambda conn, pid, chunk: conn.mpublish_trace(topic, pid, chunk)
        else:
            items = batch
            header = body_of = None
            make = lambda conn, pid, chunk: conn.mpublish(topic, chunk, partition=pid)
        chunks = self._chunks(items, header, body_of)
        sends = [
            self._call(topic, lambda conn, pid, c=chunk: make(conn, pid, c), timeout, partition, sharding_key,
                       traced=trace_ids is not None, messages=len(chunk), deadline=deadline)
            for chunk in chunks
        ]
        # One chunk is the common case: awaited directly, without a task for gather() to wrap it in.
        results = [await sends[0]] if len(sends) == 1 else await asyncio.gather(*sends)
        return results[-1]

    def _check_topic(self, topic: str) -> None:
        """Raise unless the producer is open and ``topic`` valid; remember valid topics (``_ready_topics``,
        emptied by close(): the fast path needs a single set lookup for both questions)."""
        if self._closing:
            raise ConnectionClosedError("the producer is closed")
        if not self._started:
            raise NSQError("call `await producer.start()` (or use `async with`) before publishing")
        if topic in self._ready_topics:
            return
        if not codec.valid_topic_name(topic):
            raise InvalidValueError(
                f"invalid topic name {topic!r}: 1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral"
            )
        if len(self._ready_topics) < 10_000:  # names repeat; validate each once
            self._ready_topics.add(topic)

    def _topic_ok(self, topic: str) -> bool:
        """_check_topic as a question (it remembers the topic as checked)."""
        try:
            self._check_topic(topic)
        except Exception:  # noqa: BLE001 - the answer is no; the caller's path raises it
            return False
        return True

    def _chunks(
        self,
        items: list[Any],
        header: Callable[[Any], int] | None = None,
        body_of: Callable[[Any], Any] | None = None,
    ) -> list[list[Any]]:
        return mpub_chunks(items, self.options.max_body_size, self.options.max_msg_size, header, body_of)

    async def _call(
        self,
        topic: str,
        send: Any,
        timeout: float | None,
        partition: int | None,
        sharding_key: Any,
        *,
        body: Any = None,
        size: int = 0,
        traced: bool = False,
        messages: int = 1,
        deadline: float | None = None,
    ) -> Any:
        """Route, send (``send(conn, partition)``, or the coalescing batch when ``send`` is
        None), await the answer; retry after a lost link or a moved partition leader.
        ``messages``: how many the command carries (the counters count messages). One
        ``deadline`` for the call, from its start (:mod:`.deadline`), given when a fast path began it."""
        assert self._loop is not None
        self._active += 1
        if deadline is None:
            deadline = self._loop.time() + (self.publish_timeout if timeout is None else timeout)
        try:
            attempt = 0
            while True:
                try:
                    target = await self._router.target(topic, partition, sharding_key, deadline)
                    if send is None:
                        await self._pool.connection_for(target[0], deadline, self.fail_fast)
                        key = topic if target == ANY_NSQD else (topic, target[0], target[1])
                        future = self._coalescer.add(key, body)  # counted by the coalescer
                    else:
                        conn = await self._pool.connection_for(target[0], deadline, self.fail_fast)
                        future = send(conn, target[1])
                        self._ha.timed(conn.address, future)
                    result = await answer_by(future, deadline, self.publish_timeout, timeout is not None)
                    if send is not None:
                        self.published += messages
                    if traced and tracing.LOG_ENABLED:
                        tracing.published(topic, target[1], result, target[0] or "")
                    return result
                except PublishTimeoutError:
                    self.failed += messages  # it may still arrive: a retry could publish it twice
                    raise
                except (ConnectionClosedError, NoConnectionError, ServerError) as exc:
                    self._note_error(exc, messages)
                    if not _retryable(exc):
                        self.failed += messages
                        raise
                    self._forget_route(topic, exc)
                    if isinstance(exc, NsqdDown):  # an attempt made for this publish failed just now
                        self.failed += messages
                        raise
                    attempt += 1
                    if attempt > self.max_retries or self._closing or self._loop.time() >= deadline:
                        self.failed += messages
                        raise past_deadline(exc, timeout or self.publish_timeout, self._closing or attempt > self.max_retries)
                    self.retried += 1
                    delay = min(self.retry_delay * (2 ** (attempt - 1)), max(0.0, deadline - self._loop.time()))
                    self._log.debug("publish failed (%s); retry %d in %.3f s", exc, attempt, delay)
                    await asyncio.sleep(delay)
        finally:
            self._active -= 1
            if not self._active and self._idle_waiter is not None:
                _resolve(self._idle_waiter)

    async def _direct_answer(self, future: Any, messages: int, address: str) -> Any:
        """nsqd's answer to a command of the pipelined fast path, counted; ``_RETRY`` after a failure a
        retry may mend (the caller goes on to the slow path, which retries); other failures raise.

        Nagle's rule: with no other publish of this producer unanswered there is nothing to wait
        for, so the command is written now rather than at the end of the loop pass (one task
        publishing in a loop saves a pass, and its poll, a message). With many callers some are
        always unanswered, and theirs share the pass's one write: a connection cannot tell the two
        apart (nsqd may have answered all it held while a thousand callers are about to publish).
        The callers pass ``now=`` to the connection: a flush scheduled and then made moot would
        still cost a loop pass and its poll."""
        self._active += 1
        try:
            result = await (self._busy_poll.answer(future) if self._active == 1 else future)
        except (ConnectionClosedError, NoConnectionError, ServerError) as exc:
            self._note_error(exc, messages)
            if not _retryable(exc):
                self.failed += messages
                raise
            self.retried += messages
            return _RETRY
        else:
            self.published += messages
            self._ha.loads.count(address)  # one command answered (an MPUB counts once), not timed
            return result
        finally:
            self._active -= 1
            if not self._active and self._idle_waiter is not None:
                _resolve(self._idle_waiter)

    def _note_error(self, exc: BaseException, messages: int) -> None:
        if isinstance(exc, ServerError):
            self._errors[exc.code] += messages

    def _forget_route(self, topic: str, exc: BaseException) -> None:
        """A failed publish: the next goes elsewhere; a moved leader, or one that is down: look
        the topic up again (at most two lookups a second)."""
        self._router.forget(topic, leader_moved=isinstance(exc, (*_REFRESH_ERRORS, NsqdDown)))


Producer.__doc__ = (Producer.__doc__ or "") + options_docstring("Producer")


def _retryable(exc: BaseException) -> bool:
    """A lost link, a moved leader or a transient failure may be retried; a refusal that would repeat may not."""
    if isinstance(exc, NOT_RETRYABLE):
        return False
    if isinstance(exc, ServerError):
        return exc.fatal or isinstance(exc, _REFRESH_ERRORS + _TRANSIENT)
    return True


def _task_done(tasks: set[asyncio.Task[Any]], done: Done, task: asyncio.Task[Any]) -> None:
    tasks.discard(task)
    if task.cancelled():
        done(None, ConnectionClosedError("the publish was cancelled: the producer closed"))
    else:
        error = task.exception()
        done(None if error is not None else task.result(), error)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
