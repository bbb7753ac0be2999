"""The source's live half: a fastnsq Consumer on its own event loop, and the batches it holds.

One job: keep every message that Spark has not committed in flight at nsqd, and
answer it exactly when Spark says so. It lives only in Spark's long-lived
driver-side streaming-source process, is created there on first use and never
pickled. Everything that touches a message (FIN, REQ, TOUCH, the bookkeeping)
runs on the loop thread; the Spark thread asks for it through :meth:`call`.

Bookkeeping, all on the loop thread:

* ``buffer``: delivered, not yet part of a batch;
* ``sealed``: part of a batch (``seq`` numbers ``base .. next_seq-1``), not FINed;
* ``held``: message key -> its first delivery (the row), and ``redelivered``: key ->
  later deliveries. A redelivery of a key still held (its timeout passed during a
  stall, or its connection was replaced) does not become a new row: it is answered
  with the first, newest first, so the FIN/REQ reaches the delivery nsqd currently
  has in flight. The key is (partition, id): a standalone HA nsqd (and the embedded HA
  cluster) numbers each partition's messages from 1, so partitions share ids; youzan's
  cluster puts the partition in the id's high bits (upstream: partition None, the id alone).

The offsets Spark checkpoints are ``{"session": <this process>, "seq": n}``:
a batch whose end belongs to another session was planned by a process that is
gone; its messages went back to nsqd (by REQ, or at msg_timeout) and are
delivered again, so it replays as empty.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar
from urllib.parse import quote

from ..codec import finish_all
from ..consumer import Consumer
from ..errors import NSQError
from ..loop import new_event_loop
from ._options import SourceOptions

__all__ = ["SIGTERM_EXIT_CODE", "SourceRuntime"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
MessageKey = tuple[int | None, bytes]  # (partition, id)
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
_START_TIMEOUT = 60.0
_CALL_TIMEOUT = 120.0
_SHUTDOWN_TIMEOUT = 15.0  # CLS, CLOSE_WAIT, REQ and close; past it the process exits anyway
_PARENT_CHECK_INTERVAL = 1.0
_HTTP_TIMEOUT = 10.0
_TAKE_AT_ONCE = 100_000  # messages taken from the consumer per loop pass, at most
# (partition, id): HA ids may be unique only within a partition (a standalone youzan nsqd,
# topic.go defaultIDSeq, and the embedded HA cluster number each partition's messages 1, 2,
# ...; youzan's cluster uses partition << 50 + n); keyed by the id alone, partition 1's
# messages were taken for redeliveries of partition 0's and dropped.
_KEY = attrgetter("partition", "id")
# Trigger.AvailableNow shrinks the in-flight window to what is left to take: at the end of a
# run it holds fewer slots than there are connections, and a slot moves on only when its
# connection has been idle that long (go-nsq's 10 s, checked every 5 s). Connections that see
# different messages (HA partitions, several nsqd) then waited their turn one by one: the last
# message of 4 partitions was not delivered within availableNowTimeoutMs (30 s). The consumer
# only rotates slots when it has fewer than its connections, so this changes nothing else.
_FAST_ROTATION = {"low_rdy_idle_timeout": 1.0, "rdy_redistribute_interval": 0.25}


class SourceRuntime:
    """The consumer and its held messages, driven from Spark's source process.

    >>> rt = SourceRuntime(options)                    # doctest: +SKIP
    >>> rt.start()
    >>> end, messages = rt.call(rt.plan, start, 1000)  # in latestOffset
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.session = uuid.uuid4().hex  # this process; offsets of any other session are dead
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="fastnsq-spark-source", daemon=True)
        self.consumer: Consumer | None = None
        self._pump: asyncio.Task[None] | None = None
        self.buffer: deque[Any] = deque()
        self.sealed: list[Any] = []  # sealed[i] has seq base + i
        self.base = 0
        self.held: dict[MessageKey, Any] = {}  # (partition, id) -> its first delivery, the row
        self.redelivered: dict[MessageKey, list[Any]] = {}  # key -> later deliveries of a held key
        self.arrived = threading.Event()  # set by the loop thread when the buffer grows
        self._arrived_flag = False
        self.redeliveries_dropped = 0
        self.finished = 0
        # Trigger.AvailableNow: deliveries stop at this many rows (None: no limit).
        self._delivery_cap: int | None = None
        self._shutdown_started = False
        self._shutdown_done = threading.Event()
        self._parent_pid = os.getppid()
        self._started = False

    # ---- life cycle (Spark thread) ----------------------------------------------------

    def start(self, delivery_cap: int | None = None) -> None:
        """Start the loop thread and the consumer; install the SIGTERM and exit paths.

        ``delivery_cap``: take at most this many messages (Trigger.AvailableNow's target).
        """
        if self._started:
            return
        self._started = True
        self._delivery_cap = delivery_cap
        if self.options.ha:
            warn_of_new_ha_channel(self.options)  # before the SUB that would create it
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start_consumer(), self.loop)
        try:
            future.result(_START_TIMEOUT)
        except BaseException:
            self._stop_loop()
            raise
        self._install_exit_paths()

    async def _start_consumer(self) -> None:
        opts = self.options
        # A micro-batch holds its messages far longer than nsqd's output buffer: no express lane
        # (a second connection per nsqd for nothing), unless the user's options ask for one.
        kwargs = {"express_lane": False, **_FAST_ROTATION, **opts.consumer_kwargs()}
        if self._delivery_cap is not None:
            kwargs["max_in_flight"] = max(1, self._delivery_window())  # 0 (nothing to take): paused below
        self.consumer = Consumer(opts.topic, opts.channel, **kwargs)
        await self.consumer.start()
        if self._delivery_cap is not None:
            self._limit_in_flight()
        self._pump = self.loop.create_task(self._consume())
        self.loop.call_later(_PARENT_CHECK_INTERVAL, self._check_parent)

    async def _consume(self) -> None:
        # Whatever arrived since the last loop pass, in one go: the consumer's C path queues
        # the messages and this takes them in bulk, with no Python call per message on the
        # loop thread (which shares the GIL with Spark's planning thread). Nothing is
        # answered here: each message stays in flight until Spark commits its batch.
        assert self.consumer is not None
        async for batch in self.consumer.batches(max_size=_TAKE_AT_ONCE, max_wait=0.0):
            self._on_messages(batch.messages)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _stop_loop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    def call(self, func: Callable[..., T], *args: Any, timeout: float = _CALL_TIMEOUT) -> T:
        """Run ``func(*args)`` on the loop thread and return its result (Spark thread only)."""
        if self._shutdown_started:
            raise NSQError("the nsq source is shutting down")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(func(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def post(self, func: Callable[..., Any], *args: Any) -> None:
        """Run ``func(*args)`` on the loop thread without waiting for it (Spark thread)."""
        if not self._shutdown_started:
            self.loop.call_soon_threadsafe(func, *args)

    def stop(self) -> None:
        """Requeue what is held and close (blocking; never call from a signal handler)."""
        if not self._started:
            return
        self._begin_shutdown(exit_code=None)
        self._shutdown_done.wait(_SHUTDOWN_TIMEOUT + 5)

    def _install_exit_paths(self) -> None:
        # Spark does not call stop() on the source: its process gets SIGTERM, or sees
        # EOF on its socket and exits. Both end here, with the held messages requeued.
        atexit.register(self.stop)
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError) as exc:  # not the main thread of the interpreter
            logger.debug("cannot install the SIGTERM handler: %s", exc)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # A signal handler must not block (the interrupted thread may hold a lock the
        # shutdown needs) and must not log: hand everything to the loop thread, which
        # ends the process when the messages are back at nsqd.
        self._begin_shutdown(exit_code=SIGTERM_EXIT_CODE)

    def _begin_shutdown(self, exit_code: int | None) -> None:
        if self._shutdown_started:
            return
        self._shutdown_started = True
        if exit_code is not None and hasattr(signal, "alarm"):
            # If the loop thread is wedged, SIGALRM's default action still ends the process
            # a bit later (alarm() is a plain syscall: safe in a signal handler, unlike a thread).
            signal.alarm(int(_SHUTDOWN_TIMEOUT) + 5)
        try:
            self.loop.call_soon_threadsafe(self._spawn_shutdown, exit_code)
        except RuntimeError:  # the loop is closed already
            self._shutdown_done.set()

    def _spawn_shutdown(self, exit_code: int | None) -> None:
        self.loop.create_task(self._shutdown(exit_code))

    async def _shutdown(self, exit_code: int | None) -> None:
        """RDY 0 and CLS, wait for CLOSE_WAIT, REQ everything held, close; exit if asked to."""
        try:
            if self.consumer is not None:
                # Consumer.stop sends RDY 0 and CLS, waits for CLOSE_WAIT (nothing new can
                # arrive after it), then REQs every unanswered delivery and closes.
                report = await asyncio.wait_for(self.consumer.stop(timeout=0.0), _SHUTDOWN_TIMEOUT)
                logger.info("nsq source session %s stopped: %d requeued", self.session, report.requeued)
                self._forget_held()
        except BaseException as exc:  # noqa: BLE001 - the process is ending; say why, then go on
            logger.warning("nsq source shutdown did not complete: %r", exc)
        finally:
            self._shutdown_done.set()
            if exit_code is not None:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                os._exit(exit_code)
            self.loop.stop()

    def _forget_held(self) -> None:
        for deliveries in [[m] for m in self.held.values()] + list(self.redelivered.values()):
            for message in deliveries:
                if not message.has_responded:  # its connection closed earlier
                    logger.debug("message %r: its connection is gone, nsqd requeues it at msg_timeout", message)
        self.held.clear()
        self.redelivered.clear()
        self.buffer.clear()
        self.sealed.clear()

    def _check_parent(self) -> None:
        # Spark's JVM died without closing our socket (SIGKILL): a runner that outlives
        # it keeps its connections and would hold (and TOUCH) its messages forever.
        if self._shutdown_started:
            return
        if os.getppid() != self._parent_pid:
            logger.warning("the Spark process that started this nsq source is gone; requeueing and exiting")
            self._shutdown_started = True
            self.loop.create_task(self._shutdown(SIGTERM_EXIT_CODE))
            return
        self.loop.call_later(_PARENT_CHECK_INTERVAL, self._check_parent)

    # ---- messages (loop thread) -------------------------------------------------------

    def _on_messages(self, messages: list[Any]) -> None:
        """Messages delivered together: rows, unless a key is held already (then one by one)."""
        held = self.held
        keys = list(map(_KEY, messages))
        before = len(held)
        if not held.keys().isdisjoint(keys):
            for message in messages:
                self._on_message(message)
            return
        held.update(zip(keys, messages))
        if len(held) != before + len(keys):  # a key twice in this lot: undo, then one by one
            for key in keys:
                held.pop(key, None)
            for message in messages:
                self._on_message(message)
            return
        self.buffer.extend(messages)
        self._after_arrival()

    def _on_message(self, message: Any) -> None:
        key = _KEY(message)
        held = self.held
        if key in held:
            self._redelivered(key, message)
            return
        held[key] = message
        self.buffer.append(message)
        self._after_arrival()

    def _after_arrival(self) -> None:
        if self._delivery_cap is not None and self.delivered >= self._delivery_cap:
            self._limit_in_flight()
        if not self._arrived_flag:  # a plain attribute: Event.is_set() costs more
            self._arrived_flag = True
            self.arrived.set()

    def _redelivered(self, key: MessageKey, message: Any) -> None:
        """A key still held came again (its timeout passed in a stall, or its connection was
        replaced): no second row; it is answered with the first delivery, newest first."""
        self.redelivered.setdefault(key, []).append(message)
        self.redeliveries_dropped += 1

    @property
    def delivered(self) -> int:
        """Rows taken so far: distinct messages that reached the buffer."""
        return self.base + len(self.sealed) + len(self.buffer)

    @property
    def next_seq(self) -> int:
        return self.base + len(self.sealed)

    def plan(self, start: dict[str, Any], max_rows: int | None) -> tuple[dict[str, Any], list[Any]]:
        """``latestOffset``: seal a new batch and return its end with the messages of ``start .. end``.

        The FIN of what Spark has committed (everything before ``start``) is scheduled
        right after this call on the loop thread, so Spark's thread does not wait for it.
        """
        end = self.seal_after(start, max_rows, fin_later=True)
        messages = self.batch(start, end) if end != start else []
        return end, messages or []

    def seal_after(self, start: dict[str, Any], max_rows: int | None, fin_later: bool = False) -> dict[str, Any]:
        """FIN what Spark has committed (``< start``), seal a new batch, return its end."""
        if start.get("session") == self.session:
            if fin_later:
                self.loop.call_soon(self.finish_before, int(start["seq"]))
            else:
                self.finish_before(int(start["seq"]))
        take = len(self.buffer) if max_rows is None else min(max_rows, len(self.buffer))
        for _ in range(take):
            self.sealed.append(self.buffer.popleft())
        if not self.buffer:
            self._arrived_flag = False
            self.arrived.clear()
        if start.get("session") == self.session and int(start["seq"]) == self.next_seq:
            return start
        if start.get("session") != self.session and not self.sealed:
            return start
        return {"session": self.session, "seq": self.next_seq}

    def finish_before(self, seq: int) -> int:
        """FIN every sealed message with a seq below ``seq`` (Spark committed them)."""
        count = min(seq, self.next_seq) - self.base
        if count <= 0:
            return 0
        done, self.sealed = self.sealed[:count], self.sealed[count:]
        self.base += count
        held, redelivered = self.held, self.redelivered
        for message in done:
            key = _KEY(message)
            held.pop(key, None)
            if redelivered:  # the delivery nsqd has in flight now is the newest
                finish_all(reversed(redelivered.pop(key, ())))
        finish_all(done)
        self.finished += count
        if self._delivery_cap is not None:
            self._limit_in_flight()
        return count

    # ---- Trigger.AvailableNow's cap (loop thread) ---------------------------------------

    def cap_deliveries(self, target: int) -> None:
        """Take ``target`` more rows than the batches hold now (what is buffered counts), then no more.

        Messages taken beyond the target would sit in the buffer when the run ends and go
        back to nsqd (REQ), so nsqd must not send them: the in-flight window shrinks to
        what is left to take.
        """
        self._delivery_cap = self.delivered - len(self.buffer) + target
        self._limit_in_flight()

    def _delivery_window(self) -> int:
        """maxInFlight, or less: the messages in flight plus those still to take never exceed the cap.

        In flight = delivered - finished (nothing is FINed before Spark commits it), and
        delivered may grow to the cap, so the window is cap - finished.
        """
        assert self._delivery_cap is not None
        return max(0, min(self.options.max_in_flight, self._delivery_cap - self.finished))

    def _limit_in_flight(self) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        window = 0 if self.delivered >= (self._delivery_cap or 0) else self._delivery_window()
        if window < consumer.max_in_flight:
            consumer.set_max_in_flight(window)

    def batch(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any] | None:
        """The messages of batch ``start .. end``; None when ``end`` is of another session."""
        if end.get("session") != self.session:
            return None
        first = int(start["seq"]) if start.get("session") == self.session else 0
        last = int(end["seq"])
        if first < self.base:
            logger.error(
                "batch %s..%s asks for seq %d, already finished up to %d: those rows are not replayed",
                start, end, first, self.base,
            )
            first = self.base
        return self.sealed[first - self.base:last - self.base]

    def counts(self) -> dict[str, int]:
        """What is held right now (for logs, tests and the AvailableNow target)."""
        return {
            "buffered": len(self.buffer),
            "sealed": len(self.sealed),
            "held": len(self.held),
            "finished": self.finished,
            "redeliveries_dropped": self.redeliveries_dropped,
            "connections": len(self.consumer.connections) if self.consumer is not None else 0,
        }

    # ---- Trigger.AvailableNow (Spark thread) ------------------------------------------

    def available_now_target(self) -> int:
        """How many messages this run should deliver, when the consumer already runs.

        Our own buffer is counted first, then nsqd's /stats (a message cannot go back from
        our buffer to the queue, so nothing is counted twice). When we are the channel's
        only consumer, its in-flight messages that are not in our batches (on their way
        to us) count as well.
        """
        counts = self.call(self.counts)
        backlog = 0
        in_flight_elsewhere = 0
        only_us = True
        for stats in (_channel_stats(address, self.options.topic, self.options.channel)
                      for address in http_addresses(self.options)):
            backlog += stats["depth"] + stats["topic_depth"]
            in_flight_elsewhere += stats["in_flight"]
            only_us = only_us and stats["clients"] <= self.options.connections_per_nsqd
        extra = max(0, in_flight_elsewhere - counts["sealed"] - counts["buffered"]) if only_us else 0
        return counts["buffered"] + backlog + extra


#: How long the AvailableNow target waits for nsqd to move a topic's backlog into a new channel.
_TOPIC_PUMP_TIMEOUT = 30.0
_TOPIC_PUMP_STALLED = 1.0  # the topic's depth did not fall for this long: paused, or publishers keep up


def available_now_backlog(options: SourceOptions) -> int:
    """Trigger.AvailableNow's target, before the source consumes: what the channel holds now.

    nsqd keeps a topic's messages in the topic until it has a channel, then moves them
    into every channel in the background. /stats read during that move can miss the
    messages in transit (it reads the channels before the topic), so the channel is
    created first (upstream nsqd: what the consumer's SUB would do anyway) and the target
    is read once the topic's queue is empty or stops emptying. Messages in flight with
    no consumer connected come back at their timeout: they count. Deferred ones are not
    available now: they do not.
    """
    addresses = http_addresses(options)
    if not options.ha:  # the HA nsqd creates channels per partition, and new ones start at the end
        for address in addresses:
            _create_channel(address, options.topic, options.channel)
    stats = [_channel_stats(address, options.topic, options.channel) for address in addresses]
    deadline = time.monotonic() + _TOPIC_PUMP_TIMEOUT
    lowest, lowest_at = sum(s["topic_depth"] for s in stats), time.monotonic()
    while lowest > 0 and time.monotonic() < deadline and time.monotonic() - lowest_at < _TOPIC_PUMP_STALLED:
        time.sleep(0.02)
        stats = [_channel_stats(address, options.topic, options.channel) for address in addresses]
        depth = sum(s["topic_depth"] for s in stats)
        if depth < lowest:
            lowest, lowest_at = depth, time.monotonic()
    if lowest == 0:
        # nsqd's /stats reads a channel's depth before its topic's: a message moved between the two
        # reads is in neither, so the answer that first shows the topic empty can be short by the
        # messages then in transit (one of 30,000 was left behind so). Every message moved before
        # that answer is in the channel in the next one.
        stats = [_channel_stats(address, options.topic, options.channel) for address in addresses]
    return sum(s["depth"] + s["topic_depth"] + (s["in_flight"] if s["clients"] == 0 else 0) for s in stats)


def http_addresses(options: SourceOptions) -> list[str]:
    """nsqd HTTP addresses of the source: option nsqdHttp, or the topic's producers at the lookupds."""
    opts = options.common
    if opts.nsqd_http:
        return list(opts.nsqd_http)
    if opts.lookupd:
        from ..loop import run

        return run(_lookup_http_addresses(options))
    raise NSQError(
        "Trigger.AvailableNow needs nsqd's HTTP address to read the channel depth: "
        "give option 'nsqdHttp' (one per 'nsqd' address) or use option 'lookupd'"
    )


async def _lookup_http_addresses(options: SourceOptions) -> list[str]:
    from ..lookupd import LookupdClient

    found: list[str] = []
    async with LookupdClient(timeout=_HTTP_TIMEOUT) as client:
        for address in options.common.lookupd:
            result = await client.lookup(address, options.topic)
            for node in result.producers:
                if node.http_address not in found:
                    found.append(node.http_address)
    return found


def _base_url(http_address: str) -> str:
    base = http_address if "://" in http_address else f"http://{http_address}"
    return base.rstrip("/")


def _post(http_address: str, path: str) -> None:
    request = urllib.request.Request(_base_url(http_address) + path, method="POST",
                                     headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT) as response:
        response.read()


def _create_channel(http_address: str, topic: str, channel: str) -> None:
    """The channel, where the topic exists (nsqd answers 404 where it does not: nothing to read there)."""
    try:
        _post(http_address, f"/channel/create?topic={quote(topic)}&channel={quote(channel)}")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


def _topic_entries(http_address: str, topic: str) -> list[dict[str, Any]]:
    """``topic``'s entries in one nsqd's ``GET /stats`` (one per partition it holds on an HA nsqd)."""
    url = f"{_base_url(http_address)}/stats?format=json&topic={quote(topic)}"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT) as response:
        payload = json.loads(response.read())
    if isinstance(payload, dict) and "data" in payload and "topics" not in payload:
        payload = payload["data"]  # nsqd before 1.0 wrapped every answer
    return [entry for entry in payload.get("topics") or () if entry.get("topic_name") == topic]


def _find_channel(entry: dict[str, Any], channel: str) -> dict[str, Any] | None:
    for chan in entry.get("channels") or ():
        if chan.get("channel_name") == channel:
            return dict(chan)
    return None


def _client_count(chan: dict[str, Any]) -> int:
    clients = chan.get("client_count", chan.get("client_num"))  # upstream's name, then youzan's
    return int(clients) if clients is not None else len(chan.get("clients") or ())


def _channel_stats(http_address: str, topic: str, channel: str) -> dict[str, int]:
    """Of ``topic/channel`` on one nsqd (``GET /stats``): the channel's depth, in-flight count
    and consumers, and the topic's depth (messages not yet moved into its channels; with no
    channel yet, all of them: nsqd gives them to the first channel).

    On an HA nsqd the node lists every partition it holds: the ones it leads are summed
    (``clients`` is the most any one has); a replica's entry is skipped, its leader counts
    it. An HA topic has no queue of its own (its channels read the partition's log, and
    youzan's topic ``depth`` is in bytes), so ``topic_depth`` stays 0 there.
    """
    found = {"depth": 0, "in_flight": 0, "clients": 0, "topic_depth": 0}
    for entry in _topic_entries(http_address, topic):
        if entry.get("is_leader") is False:
            continue
        ha = "topic_partition" in entry
        if not ha:
            found["topic_depth"] += int(entry.get("depth", 0))
        chan = _find_channel(entry, channel)
        if chan is not None:
            depth, in_flight = _queued_and_in_flight(chan, ha)
            found["depth"] += depth
            found["in_flight"] += in_flight
            found["clients"] = max(found["clients"], _client_count(chan))
    return found


def _queued_and_in_flight(chan: dict[str, Any], ha: bool) -> tuple[int, int]:
    """A channel's (queued, in flight) as upstream nsqd counts them.

    youzan's HA nsqd counts its ``depth`` from the channel's confirmed offset (its oldest
    unfinished message) to the partition's end, so in flight and deferred messages are in it,
    and its ``in_flight_count`` holds the deferred ones. Those are taken out here; what a
    consumer finished past an unfinished one cannot be told apart and stays counted (the
    figure errs high, by at most the messages in flight).
    """
    depth, in_flight = int(chan.get("depth", 0)), int(chan.get("in_flight_count", 0))
    if ha:
        deferred = int(chan.get("deferred_count", 0))
        depth, in_flight = max(0, depth - in_flight), max(0, in_flight - deferred)
    return depth, in_flight


def _partitions_without_channel(http_address: str, topic: str, channel: str) -> list[int]:
    """The HA partitions this nsqd leads that have no ``channel`` yet (none on upstream nsqd)."""
    return sorted(
        int(entry["topic_partition"])
        for entry in _topic_entries(http_address, topic)
        if "topic_partition" in entry and entry.get("is_leader") is not False and _find_channel(entry, channel) is None
    )


def warn_of_new_ha_channel(options: SourceOptions) -> list[int]:
    """Warn when the source's SUB is about to create its channel on partitions of an HA topic.

    youzan's nsqd starts a new channel at the partition's end: the query reads only what is
    published after it subscribed, and nothing else would tell (0 rows, no error).
    Returns the partitions warned about. Without an HTTP address (``nsqd`` without
    ``nsqdHttp``) there is nothing to ask, and no warning.
    """
    try:
        missing = sorted({p for address in http_addresses(options)
                          for p in _partitions_without_channel(address, options.topic, options.channel)})
    except (NSQError, OSError, ValueError) as exc:
        logger.debug("could not check whether channel %s exists: %s", options.channel, exc)
        return []
    if missing:
        logger.warning(
            "channel %r does not exist on partition(s) %s of HA topic %r: the subscription creates it "
            "at each partition's end, so this query reads only messages published from now on "
            "(create the channel before publishing, or read the backlog with readMode=offsets)",
            options.channel, ", ".join(map(str, missing)), options.topic,
        )
    return missing
