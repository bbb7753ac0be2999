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

The server (``nsqd.NSQD``) drives timeouts with a scan every 100 ms, like nsqd's
``--queue-scan-interval``; a client connection (``_nsqd_client``) is the consumer.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastnsq import codec

if TYPE_CHECKING:  # pragma: no cover
    from ._nsqd_client import ClientConnection
    from .nsqd import NSQD

__all__ = ["Message", "Topic", "Channel", "EPHEMERAL_SUFFIX"]

EPHEMERAL_SUFFIX = "#ephemeral"

_encode_message = codec.encode_message
_randrange = random.randrange
_heappush = heapq.heappush
_heappop = heapq.heappop
# Tie-breaker for heap entries with equal times (messages do not compare).
_sequence = itertools.count()


class Message:
    """One message as a channel holds it.

    ``deadline`` is the loop time at which the current delivery times out (0.0 when
    the message is not in flight); ``owner`` is the connection it was delivered to.
    ``defer_ms`` is set on a DPUB message until it reaches its channels.
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "deadline", "delivered_at", "owner", "defer_ms")

    def __init__(self, message_id: bytes, body: bytes, timestamp: int, defer_ms: int = 0) -> None:
        self.id = message_id
        self.body = body
        self.timestamp = timestamp
        self.attempts = 0
        self.deadline = 0.0
        self.delivered_at = 0.0
        self.owner: ClientConnection | None = None
        self.defer_ms = defer_ms

    def copy(self) -> Message:
        """The copy a second (third...) channel of the topic gets: same id, body, time."""
        return Message(self.id, self.body, self.timestamp, self.defer_ms)


class Channel:
    """A channel of a topic: its queue, in-flight and deferred messages, and clients."""

    def __init__(self, topic: Topic, name: str) -> None:
        self.topic = topic
        self.server: NSQD = topic.server
        self.name = name
        self.ephemeral = name.endswith(EPHEMERAL_SUFFIX)
        self.queue: deque[Message] = deque()
        self.in_flight: dict[bytes, Message] = {}
        self.deferred: dict[bytes, Message] = {}
        self._deferred_heap: list[tuple[float, int, Message]] = []
        # msg_timeout (s) -> deque of (deadline, message), deadlines ascending.
        self._timeouts: dict[float, deque[tuple[float, Message]]] = {}
        self._touched: list[tuple[float, int, Message]] = []
        self.clients: dict[int, ClientConnection] = {}
        # Clients that may take a message now (lazily cleaned: see put()).
        self._ready: deque[ClientConnection] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.delivery_count = 0  # nsqd 1.3's global_msg_count (no topology configured)

    # -- clients -----------------------------------------------------------

    def add_client(self, client: ClientConnection) -> bool:
        """Attach a subscribed client; False when ``max_channel_consumers`` is reached."""
        limit = self.server.options.max_channel_consumers
        if client.id not in self.clients and limit and len(self.clients) >= limit:
            return False
        self.clients[client.id] = client
        return True

    def remove_client(self, client: ClientConnection) -> None:
        """Detach a client that went away; its messages in flight stay until they time out."""
        if self.clients.pop(client.id, None) is None:
            return
        client.in_ready = False
        if not self.clients and self.ephemeral and not self.exiting:
            self.topic.delete_channel(self.name)

    def client_may_be_ready(self, client: ClientConnection) -> None:
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

    def _fill(self, client: ClientConnection) -> None:
        queue = self.queue
        now = self.server.loop.time()
        deliver = self._deliver
        while queue and client.rdy > client.in_flight:
            deliver(client, queue.popleft(), now)

    # -- messages in -------------------------------------------------------

    def put(self, msg: Message) -> None:
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

    def put_from_topic(self, msgs: Iterable[Message], deferrable: bool) -> None:
        """Messages published to the topic (``deferrable``: some may carry a DPUB delay)."""
        if not deferrable and (not self._ready or self.paused):
            before = len(self.queue)
            self.queue.extend(msgs)
            self.message_count += len(self.queue) - before
            return
        put = self.put
        count = 0
        for msg in msgs:
            count += 1
            if msg.defer_ms:
                defer_ms = msg.defer_ms
                msg.defer_ms = 0
                self._defer(msg, defer_ms / 1000.0)
            else:
                put(msg)
        self.message_count += count

    def _defer(self, msg: Message, delay: float) -> None:
        when = self.server.loop.time() + delay
        self.deferred[msg.id] = msg
        _heappush(self._deferred_heap, (when, next(_sequence), msg))
        self.server.watch(self)

    # -- delivery ----------------------------------------------------------

    def _deliver(self, client: ClientConnection, msg: Message, now: float) -> None:
        # nsqd's messagePump: a sampled-out message is dropped for the whole channel.
        if client.sample_rate and _randrange(100) > client.sample_rate:
            return
        attempts = msg.attempts + 1
        msg.attempts = attempts
        timeout = client.delivery_timeout
        deadline = now + timeout
        msg.deadline = deadline
        msg.delivered_at = now
        msg.owner = client
        in_flight = self.in_flight
        if not in_flight:
            self.server.watch(self)
        in_flight[msg.id] = msg
        expiring = self._timeouts.get(timeout)
        if expiring is None:
            expiring = self._timeouts[timeout] = deque()
        expiring.append((deadline, msg))
        client.in_flight += 1
        client.message_count += 1
        self.delivery_count += 1
        client.write_message(_encode_message(msg.timestamp, attempts & 0xFFFF, msg.id, msg.body))

    def _pop_in_flight(self, client: ClientConnection, message_id: bytes) -> Message | str:
        """The message ``client`` holds, or nsqd's error text."""
        msg = self.in_flight.get(message_id)
        if msg is None:
            return "ID not in flight"
        if msg.owner is not client:
            return "client does not own message"
        del self.in_flight[message_id]
        msg.deadline = 0.0
        msg.owner = None
        return msg

    def finish(self, client: ClientConnection, message_id: bytes) -> str | None:
        """FIN: forget the message; returns nsqd's error text on failure."""
        msg = self._pop_in_flight(client, message_id)
        if type(msg) is str:
            return msg
        return None

    def requeue(self, client: ClientConnection, message_id: bytes, delay: float) -> str | None:
        """REQ: back to the queue now, or after ``delay`` seconds; error text on failure."""
        msg = self._pop_in_flight(client, message_id)
        if type(msg) is str:
            return msg
        self.requeue_count += 1
        if delay > 0:
            self._defer(msg, delay)  # type: ignore[arg-type]
        else:
            self.put(msg)  # type: ignore[arg-type]
        return None

    def touch(self, client: ClientConnection, message_id: bytes, msg_timeout: float) -> str | None:
        """TOUCH: a new deadline of now + msg_timeout, capped at delivery + max_msg_timeout."""
        msg = self.in_flight.get(message_id)
        if msg is None:
            return "ID not in flight"
        if msg.owner is not client:
            return "client does not own message"
        max_timeout = self.server.options.max_msg_timeout
        deadline = self.server.loop.time() + msg_timeout
        if deadline - msg.delivered_at >= max_timeout:
            deadline = msg.delivered_at + max_timeout
        msg.deadline = deadline
        _heappush(self._touched, (deadline, next(_sequence), msg))
        return None

    # -- timers ------------------------------------------------------------

    def scan(self, now: float) -> bool:
        """Time out due messages and release due deferred ones; True while work remains."""
        for expiring in self._timeouts.values():
            while expiring:
                deadline, msg = expiring[0]
                if msg.deadline != deadline:  # finished, requeued, touched or redelivered
                    expiring.popleft()
                    continue
                if deadline > now:
                    break
                expiring.popleft()
                self._time_out(msg)
        touched = self._touched
        while touched:
            deadline, _, msg = touched[0]
            if msg.deadline != deadline:
                _heappop(touched)
                continue
            if deadline > now:
                break
            _heappop(touched)
            self._time_out(msg)
        heap = self._deferred_heap
        while heap and heap[0][0] <= now:
            _, _, msg = _heappop(heap)
            if self.deferred.get(msg.id) is msg:
                del self.deferred[msg.id]
                self.put(msg)
        return bool(self.in_flight or self.deferred)

    def _time_out(self, msg: Message) -> None:
        del self.in_flight[msg.id]
        self.timeout_count += 1
        client = msg.owner
        msg.deadline = 0.0
        msg.owner = None
        if client is not None and self.clients.get(client.id) is client:
            client.in_flight -= 1
            self.put(msg)
            self.client_may_be_ready(client)
        else:
            self.put(msg)

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
        for msg in self.in_flight.values():
            msg.deadline = 0.0
            msg.owner = None
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
            in_flight = sorted(self.in_flight.values(), key=lambda m: m.delivered_at)
            deferred = [entry[2] for entry in sorted(self._deferred_heap) if entry[2].id in self.deferred]
            self._forget_in_flight()
            self.queue.extend(in_flight)
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
        if self.delivery_count:  # omitempty in nsqd
            out["global_msg_count"] = self.delivery_count
        out["requeue_count"] = self.requeue_count
        out["timeout_count"] = self.timeout_count
        out["client_count"] = len(self.clients)
        out["clients"] = (
            [c.stats(self.topic.name) for c in self.clients.values()] if include_clients else []
        )
        out["paused"] = self.paused
        out["e2e_processing_latency"] = {"count": 0, "percentiles": None}
        return out


class Topic:
    """A topic: the messages waiting for a channel, and the channels."""

    def __init__(self, server: NSQD, name: str) -> None:
        self.server = server
        self.name = name
        self.ephemeral = name.endswith(EPHEMERAL_SUFFIX)
        self.queue: deque[Message] = deque()
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0

    def put(self, msgs: list[Message], nbytes: int, deferrable: bool = False) -> None:
        """Publish: count, then hand the messages to every channel (or keep them)."""
        self.message_count += len(msgs)
        self.message_bytes += nbytes
        if self.channels and not self.paused:
            self._distribute(msgs, deferrable)
        else:
            self.queue.extend(msgs)

    def _distribute(self, msgs: list[Message], deferrable: bool) -> None:
        first = True
        for channel in list(self.channels.values()):
            if first:
                first = False
                channel.put_from_topic(msgs, deferrable)
            else:
                channel.put_from_topic([m.copy() for m in msgs], deferrable)

    def _release_queue(self) -> None:
        """Messages kept while there was no channel (or while paused) flow on."""
        if self.queue and self.channels and not self.paused:
            msgs = list(self.queue)
            self.queue.clear()
            self._distribute(msgs, any(m.defer_ms for m in msgs))

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
        if not keep_messages:
            self.queue.clear()
        for msg in self.queue:
            msg.defer_ms = 0
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
