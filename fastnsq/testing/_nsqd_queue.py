"""Topics, channels and messages of the embedded nsqd: nsqd 1.3's queue semantics, in memory.

What is modelled (facts from nsqio/nsq ``nsqd/topic.go`` and ``nsqd/channel.go``):

- A topic keeps messages while it has no channel or is paused; otherwise every channel
  gets a copy of each message (the first channel the original, the others a copy with
  the same id, body and timestamp and attempts 0).
- A channel keeps a FIFO of messages, the messages in flight (keyed by id, with an
  owner and a deadline), and the deferred ones (REQ with a delay, DPUB). Its clients
  share its messages: each message goes to one ready client (RDY > in flight).
- A message in flight times out at ``delivery + msg_timeout`` (TOUCH moves that, up to
  ``delivery + max_msg_timeout``) and goes back to the end of the FIFO; so do REQ'd and
  due deferred messages. Attempts grow by one at every delivery.

The structures are chosen for the hot path: deques for the FIFOs, dicts keyed by id,
and in-flight deadlines kept in one deque per ``msg_timeout`` value (deliveries made
with the same timeout expire in delivery order), scanned from the head only: FIN and
REQ leave a stale entry behind that the scan drops in O(1), so nothing is ever
O(everything in flight) per message. TOUCHed messages (rare) go to a heap.

A message is a plain tuple (see :data:`Msg`), not an object: a queue may hold
millions of them, and tuples of bytes and ints are untracked by Python's cyclic GC,
whose collections would otherwise cost more than the rest of the work. One tuple is
shared by every channel of the topic. A message in flight is a second tuple that
adds its owner, deadline and delivery time (:data:`InFlight`); there are at most
RDY of those per client.

The server (a :class:`QueueServer`: ``nsqd.NSQD``) drives timeouts with a scan every 100 ms, like nsqd's
``--queue-scan-interval``; a client connection (``_nsqd_client``) is the consumer.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from fastnsq import codec

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

    from ._nsqd_base import NSQDOptions

__all__ = [
    "EPHEMERAL_SUFFIX",
    "Channel",
    "InFlight",
    "Msg",
    "QueueServer",
    "Subscriber",
    "Topic",
    "new_message",
]


class QueueServer(Protocol):
    """What topics and channels use of their nsqd."""

    @property
    def options(self) -> NSQDOptions: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def watch(self, channel: Channel) -> None: ...

    def unwatch(self, channel: Channel) -> None: ...

    def notify_register(self, topic: str, channel: str | None) -> None: ...

    def notify_unregister(self, topic: str, channel: str | None) -> None: ...

    def delete_topic(self, name: str) -> bool: ...


class Subscriber(Protocol):
    """What a channel uses of a subscribed client connection (its RDY accounting and output)."""

    id: int
    state: int
    rdy: int
    in_flight: int
    in_ready: bool
    message_count: int
    sample_rate: int
    delivery_timeout: float

    def write_message(self, frame: bytes) -> None: ...

    def write_messages(self, frames: list[bytes]) -> None: ...

    def flush_messages(self) -> None: ...

    def close(self) -> None: ...

    def stats(self, topic_filter: str = "") -> dict[str, Any]: ...

EPHEMERAL_SUFFIX = "#ephemeral"

_encode_message = codec.encode_message
_randrange = random.randrange
_heappush = heapq.heappush
_heappop = heapq.heappop
# Tie-breaker for heap entries with equal times (messages do not compare).
_sequence = itertools.count()


#: A queued message: (id, body, timestamp ns, attempts so far, DPUB delay in ms).
Msg = tuple  # tuple[bytes, bytes, int, int, int]
#: A message in flight: (id, body, timestamp, attempts, owner, deadline, delivered_at).
InFlight = tuple  # tuple[bytes, bytes, int, int, Subscriber, float, float]
ID, BODY, TIMESTAMP, ATTEMPTS, DEFER_MS = range(5)
OWNER, DEADLINE, DELIVERED_AT = 4, 5, 6


def new_message(message_id: bytes, body: bytes, timestamp: int, defer_ms: int = 0) -> Msg:
    """A freshly published message (attempts 0)."""
    return (message_id, body, timestamp, 0, defer_ms)


class Channel:
    """A channel of a topic: its queue, in-flight and deferred messages, and clients."""

    def __init__(self, topic: Topic, name: str) -> None:
        self.topic = topic
        self.server: QueueServer = topic.server
        self.name = name
        self.ephemeral = name.endswith(EPHEMERAL_SUFFIX)
        self.queue: deque[Msg] = deque()
        self.in_flight: dict[bytes, InFlight] = {}
        self.deferred: dict[bytes, Msg] = {}
        self._deferred_heap: list[tuple[float, int, Msg]] = []
        # msg_timeout (s) -> deque of (deadline, id), deadlines ascending.
        self._timeouts: dict[float, deque[tuple[float, bytes]]] = {}
        self._touched: list[tuple[float, int, bytes]] = []
        self.clients: dict[int, Subscriber] = {}
        # Clients that may take a message now (lazily cleaned: see put()).
        self._ready: deque[Subscriber] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.delivery_count = 0  # nsq master's global_msg_count (no topology configured)

    # -- clients -----------------------------------------------------------

    def add_client(self, client: Subscriber) -> bool:
        """Attach a subscribed client; False when ``max_channel_consumers`` is reached."""
        limit = self.server.options.max_channel_consumers
        if client.id not in self.clients and limit and len(self.clients) >= limit:
            return False
        self.clients[client.id] = client
        return True

    def remove_client(self, client: Subscriber) -> None:
        """Detach a client that went away; its messages in flight stay until they time out."""
        if self.clients.pop(client.id, None) is None:
            return
        client.in_ready = False
        if not self.clients and self.ephemeral and not self.exiting:
            self.topic.delete_channel(self.name)

    def client_may_be_ready(self, client: Subscriber) -> None:
        """Hand queued messages to ``client`` if it can take some (RDY, FIN, REQ...)."""
        if client.in_ready or self.paused or client.rdy <= client.in_flight:
            return
        if self.queue:
            self._fill(client)
        if client.rdy > client.in_flight:
            client.in_ready = True
            self._ready.append(client)
        else:
            client.flush_messages()

    def _fill(self, client: Subscriber) -> None:
        count = min(len(self.queue), client.rdy - client.in_flight)
        if count > 0:
            self._deliver_from_queue(client, count, self.server.loop.time())

    def _deliver_from_queue(self, client: Subscriber, count: int, now: float) -> None:
        """Deliver the first ``count`` queued messages to ``client``: :meth:`_deliver`
        unrolled for a batch (one deadline, one write), the path of every refill."""
        queue = self.queue
        if client.sample_rate:  # sampled-out messages free their room: fill it again
            deliver = self._deliver
            while queue and client.rdy > client.in_flight:
                deliver(client, queue.popleft(), now)
            return
        pop = queue.popleft
        in_flight = self.in_flight
        if not in_flight:
            self.server.watch(self)
        timeout = client.delivery_timeout
        deadline = now + timeout
        expire = self._expiring(timeout).append
        encode = _encode_message
        frames: list[bytes] = []
        add_frame = frames.append
        for _ in range(count):
            message_id, body, timestamp, attempts, _defer = pop()
            attempts += 1
            in_flight[message_id] = (message_id, body, timestamp, attempts, client, deadline, now)
            expire((deadline, message_id))
            add_frame(encode(timestamp, attempts & 0xFFFF, message_id, body))
        client.in_flight += count
        client.message_count += count
        self.delivery_count += count
        client.write_messages(frames)

    # -- messages in -------------------------------------------------------

    def put(self, msg: Msg) -> None:
        """A message becomes available: straight to a ready client, else to the queue."""
        ready = self._ready
        if ready and not self.paused:
            while ready:
                client = ready[0]
                if client.rdy > client.in_flight:
                    self._deliver(client, msg, self.server.loop.time())
                    ready.popleft()
                    if client.rdy > client.in_flight:
                        ready.append(client)
                    else:
                        client.in_ready = False
                        client.flush_messages()
                    return
                ready.popleft()
                client.in_ready = False
        self.queue.append(msg)

    def _put_back(self, msg: Msg) -> None:
        """A message comes back (REQ, timeout, deferral over): nsqd queues it like a new one."""
        self.put(msg)

    def put_from_topic(self, msgs: list[Msg], deferrable: bool) -> None:
        """Messages published to the topic (``deferrable``: some may carry a DPUB delay).

        ``msgs`` is shared with the topic's other channels: it is not modified.
        """
        self.message_count += len(msgs)
        if not deferrable and not self._ready:
            self.queue.extend(msgs)
            return
        put = self.put
        ready = self._ready
        for index, msg in enumerate(msgs):
            defer_ms = msg[DEFER_MS]
            if defer_ms:
                self._defer((msg[ID], msg[BODY], msg[TIMESTAMP], msg[ATTEMPTS], 0), defer_ms / 1000.0)
            elif ready or deferrable:
                put(msg)
            else:  # nobody is ready any more: the rest waits in the queue
                self.queue.extend(msgs[index:])
                return

    def _defer(self, msg: Msg, delay: float) -> None:
        when = self.server.loop.time() + delay
        self.deferred[msg[ID]] = msg
        _heappush(self._deferred_heap, (when, next(_sequence), msg))
        self.server.watch(self)

    # -- delivery ----------------------------------------------------------

    def _deliver(self, client: Subscriber, msg: Msg, now: float) -> None:
        # nsqd's messagePump: a sampled-out message is dropped for the whole channel.
        if client.sample_rate and _randrange(100) > client.sample_rate:
            return
        message_id, body, timestamp, attempts, _ = msg
        attempts += 1
        self._take_off(client, message_id, body, timestamp, attempts, now)
        client.write_message(_encode_message(timestamp, attempts & 0xFFFF, message_id, body))

    def _take_off(self, client: Subscriber, message_id: bytes, payload: Any, timestamp: int,
                  attempts: int, now: float) -> None:
        """Record one delivery: in flight with ``client`` until its deadline, counted."""
        timeout = client.delivery_timeout
        deadline = now + timeout
        in_flight = self.in_flight
        if not in_flight:
            self.server.watch(self)
        in_flight[message_id] = (message_id, payload, timestamp, attempts, client, deadline, now)
        self._expiring(timeout).append((deadline, message_id))
        client.in_flight += 1
        client.message_count += 1
        self.delivery_count += 1

    def _expiring(self, timeout: float) -> deque[tuple[float, bytes]]:
        """The (deadline, id) of the deliveries made with ``timeout``, oldest first."""
        expiring = self._timeouts.get(timeout)
        if expiring is None:
            expiring = self._timeouts[timeout] = deque()
        return expiring

    #: nsqd's error texts for FIN/REQ/TOUCH of a message that is not the client's.
    NOT_IN_FLIGHT = "ID not in flight"

    def _not_owner(self, owner: Subscriber, client: Subscriber) -> str:
        return "client does not own message"

    def _pop_in_flight(self, client: Subscriber, message_id: bytes) -> InFlight | str:
        """The message ``client`` holds, or nsqd's error text."""
        entry = self.in_flight.get(message_id)
        if entry is None:
            return self.NOT_IN_FLIGHT
        if entry[OWNER] is not client:
            return self._not_owner(entry[OWNER], client)
        del self.in_flight[message_id]
        return entry

    def finish(self, client: Subscriber, message_id: bytes) -> str | None:
        """FIN: forget the message; returns nsqd's error text on failure."""
        in_flight = self.in_flight
        entry = in_flight.get(message_id)
        if entry is not None and entry[OWNER] is client:  # the hot path, inlined
            del in_flight[message_id]
            return None
        error = self._pop_in_flight(client, message_id)
        return error if type(error) is str else None

    def requeue(self, client: Subscriber, message_id: bytes, delay: float) -> str | None:
        """REQ: back to the queue now, or after ``delay`` seconds; error text on failure."""
        entry = self._pop_in_flight(client, message_id)
        if isinstance(entry, str):
            return entry
        self.requeue_count += 1
        msg = entry[:4] + (0,)
        if delay > 0:
            self._defer(msg, delay)
        else:
            self._put_back(msg)
        return None

    def touch(self, client: Subscriber, message_id: bytes, msg_timeout: float) -> str | None:
        """TOUCH: a new deadline of now + msg_timeout, capped at delivery + max_msg_timeout."""
        entry = self.in_flight.get(message_id)
        if entry is None:
            return self.NOT_IN_FLIGHT
        if entry[OWNER] is not client:
            return self._not_owner(entry[OWNER], client)
        max_timeout = self.server.options.max_msg_timeout
        delivered_at = entry[DELIVERED_AT]
        deadline = self.server.loop.time() + msg_timeout
        if deadline - delivered_at >= max_timeout:
            deadline = delivered_at + max_timeout
        self.in_flight[message_id] = entry[:5] + (deadline, delivered_at)
        _heappush(self._touched, (deadline, next(_sequence), message_id))
        return None

    # -- timers ------------------------------------------------------------

    def scan(self, now: float) -> bool:
        """Time out due messages and release due deferred ones; True while work remains."""
        in_flight = self.in_flight
        for expiring in list(self._timeouts.values()):
            while expiring:
                deadline, message_id = expiring[0]
                entry = in_flight.get(message_id)
                if entry is None or entry[DEADLINE] != deadline:  # finished, requeued, touched...
                    expiring.popleft()
                    continue
                if deadline > now:
                    break
                expiring.popleft()
                self._time_out(entry)
        touched = self._touched
        while touched:
            deadline, _, message_id = touched[0]
            entry = in_flight.get(message_id)
            if entry is None or entry[DEADLINE] != deadline:
                _heappop(touched)
                continue
            if deadline > now:
                break
            _heappop(touched)
            self._time_out(entry)
        heap = self._deferred_heap
        while heap and heap[0][0] <= now:
            msg = _heappop(heap)[2]
            if self.deferred.get(msg[ID]) is msg:
                del self.deferred[msg[ID]]
                self._put_back(msg)
        return bool(self.in_flight or self.deferred)

    def _time_out(self, entry: InFlight) -> None:
        del self.in_flight[entry[ID]]
        self.timeout_count += 1
        client: Subscriber = entry[OWNER]
        msg = entry[:4] + (0,)
        if self.clients.get(client.id) is client:
            client.in_flight -= 1
            self._put_back(msg)
            self.client_may_be_ready(client)
        else:
            self._put_back(msg)

    # -- administration ----------------------------------------------------

    def pause(self) -> None:
        """Stop delivering; clients flush what they buffered (they are no longer ready)."""
        self.paused = True
        for client in self._ready:
            client.in_ready = False
        self._ready.clear()
        for client in list(self.clients.values()):
            client.flush_messages()

    def unpause(self) -> None:
        self.paused = False
        for client in list(self.clients.values()):
            self.client_may_be_ready(client)

    def empty(self) -> None:
        """nsqd's Channel.Empty: drop queued, in-flight and deferred messages."""
        self.queue.clear()
        self._forget_in_flight()
        for client in list(self.clients.values()):
            client.in_flight = 0
            self.client_may_be_ready(client)

    def _forget_in_flight(self) -> None:
        self.in_flight.clear()
        self._timeouts.clear()
        self._touched.clear()
        self.deferred.clear()
        self._deferred_heap.clear()

    def close_clients(self) -> None:
        """Close every client connection (channel deleted, server stopping)."""
        for client in list(self.clients.values()):
            client.close()
        self.clients.clear()
        self._ready.clear()

    def keep_for_restart(self, keep_messages: bool) -> None:
        """Reset to what a restarted nsqd reloads: queued, then in-flight, then deferred.

        That is the order nsqd's clean shutdown writes them to the backend; counters
        start again from 0 after a restart.
        """
        self.close_clients()
        if keep_messages:
            in_flight = sorted(self.in_flight.values(), key=lambda entry: entry[DELIVERED_AT])
            deferred = [
                entry[2]
                for entry in sorted(self._deferred_heap, key=lambda e: e[:2])
                if self.deferred.get(entry[2][ID]) is entry[2]
            ]
            self._forget_in_flight()
            self.queue.extend(entry[:4] + (0,) for entry in in_flight)
            self.queue.extend(deferred)
        else:
            self.queue.clear()
            self._forget_in_flight()
        self.message_count = self.requeue_count = self.timeout_count = self.delivery_count = 0

    def stats(self, include_clients: bool) -> dict[str, Any]:
        """The channel's entry in ``/stats?format=json`` (nsqd 1.3 field order)."""
        out: dict[str, Any] = {
            "channel_name": self.name,
            "depth": len(self.queue),
            "backend_depth": 0,
            "in_flight_count": len(self.in_flight),
            "deferred_count": len(self.deferred),
            "message_count": self.message_count,
        }
        if self.delivery_count and self.server.options.topology:  # nsq master only; omitempty
            out["global_msg_count"] = self.delivery_count
        out["requeue_count"] = self.requeue_count
        out["timeout_count"] = self.timeout_count
        out["client_count"] = len(self.clients)
        # Without clients nsqd leaves the slice nil: JSON null.
        out["clients"] = [c.stats(self.topic.name) for c in self.clients.values()] if include_clients else None
        out["paused"] = self.paused
        out["e2e_processing_latency"] = {"count": 0, "percentiles": None}
        return out


class Topic:
    """A topic: the messages waiting for a channel, and the channels."""

    def __init__(self, server: QueueServer, name: str) -> None:
        self.server = server
        self.name = name
        self.ephemeral = name.endswith(EPHEMERAL_SUFFIX)
        self.queue: deque[Msg] = deque()
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0

    def put(self, msgs: list[Msg], nbytes: int, deferrable: bool = False) -> None:
        """Publish: count, then hand the messages to every channel (or keep them)."""
        self.message_count += len(msgs)
        self.message_bytes += nbytes
        if self.channels and not self.paused:
            for channel in list(self.channels.values()):
                channel.put_from_topic(msgs, deferrable)
        else:
            self.queue.extend(msgs)

    def _release_queue(self) -> None:
        """Messages kept while there was no channel (or while paused) flow on."""
        if self.queue and self.channels and not self.paused:
            msgs = list(self.queue)
            self.queue.clear()
            deferrable = any(msg[DEFER_MS] for msg in msgs)
            for channel in list(self.channels.values()):
                channel.put_from_topic(msgs, deferrable)

    def get_channel(self, name: str) -> Channel:
        """The channel, created (and announced to lookupd) on first use."""
        channel = self.channels.get(name)
        if channel is None:
            channel = self.channels[name] = Channel(self, name)
            self.server.notify_register(self.name, name)
            self._release_queue()
        return channel

    def delete_channel(self, name: str) -> bool:
        """Delete a channel: its clients are disconnected, its messages dropped."""
        channel = self.channels.pop(name, None)
        if channel is None:
            return False
        channel.exiting = True
        self.server.notify_unregister(self.name, name)
        channel.close_clients()
        channel._forget_in_flight()
        channel.queue.clear()
        self.server.unwatch(channel)
        if not self.channels and self.ephemeral and not self.exiting:
            self.server.delete_topic(self.name)
        return True

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self._release_queue()

    def empty(self) -> None:
        """nsqd's Topic.Empty: drop what waits in the topic (not in its channels)."""
        self.queue.clear()

    def delete(self) -> None:
        self.exiting = True
        for name in list(self.channels):
            self.delete_channel(name)
        self.queue.clear()

    def keep_for_restart(self, keep_messages: bool) -> None:
        """Reset for a restart of the server (see Channel.keep_for_restart)."""
        for name, channel in list(self.channels.items()):
            if channel.ephemeral:
                channel.close_clients()
                del self.channels[name]
            else:
                channel.keep_for_restart(keep_messages)
        if keep_messages:
            # A DPUB delay does not survive nsqd's backend either.
            kept = [msg[:4] + (0,) if msg[DEFER_MS] else msg for msg in self.queue]
            self.queue.clear()
            self.queue.extend(kept)
        else:
            self.queue.clear()
        self.message_count = self.message_bytes = 0

    def stats(self, channel_name: str, include_clients: bool) -> dict[str, Any] | None:
        """The topic's entry in ``/stats``; None when ``channel_name`` names no channel."""
        if channel_name:
            channel = self.channels.get(channel_name)
            if channel is None:
                return None
            channels = [channel]
        else:
            channels = sorted(self.channels.values(), key=lambda c: c.name)
        return {
            "topic_name": self.name,
            "channels": [c.stats(include_clients) for c in channels],
            "depth": len(self.queue),
            "backend_depth": 0,
            "message_count": self.message_count,
            "message_bytes": self.message_bytes,
            "paused": self.paused,
            "e2e_processing_latency": {"count": 0, "percentiles": None},
        }
