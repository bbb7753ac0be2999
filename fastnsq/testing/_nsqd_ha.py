"""The HA dialect of the embedded nsqd: youzan's "redesigned NSQ", as youzan/nsq's source has it.

One job: speak what a youzan nsqd (``0.3.7-HA.1.13.0``) speaks, byte for byte where
the protocol notes show it, on top of the upstream server of ``_nsqd_client`` and
``_nsqd_queue``:

* topics have numbered partitions and are never auto-created (``E_TOPIC_NOT_EXIST ``,
  fatal, trailing space); ``INTERNAL_CREATE_TOPIC <topic> <partition>[ <ext>]`` creates
  one on a standalone node (a cluster node answers the non-fatal ``E_CREATE_TOPIC_FAILED``);
* ``SUB``/``SUB_ORDERED``/``SUB_ADVANCED`` (partition read only with exactly 4 words,
  the ``SUB_ADVANCED`` start-position quirk included), the ``extend_support`` checks,
  ordered channels (one message in flight per partition, flushed at once, ``REQ`` with a
  delay silently ignored), binary message ids (u64 internal id per partition,
  monotonic, ‖ u64 trace id) and the four message layouts of §9.5;
* ``PUB``/``MPUB``/``PUB_TRACE``/``MPUB_TRACE``/``PUB_EXT``/``MPUB_EXT`` with their
  partition, checks in nsqd's order, the 30-byte traced reply, the non-fatal errors of
  §6.2 and the ``MPUB_EXT`` desync (the unread rest of the batch is parsed as commands);
* no ``DPUB``; FIN/REQ/TOUCH read binary-safe; attempts capped at 4000; the read
  deadline is 3 heartbeat intervals; IDENTIFY's HA fields and its deflate-level bug.

A *cluster node* (``NSQD.ha_cluster``, set by :class:`~fastnsq.testing.NSQCluster`)
leads some partitions and only replicates the others: SUB, FIN and the PUB family
on a partition it does not lead answer ``E_FAILED_ON_NOT_LEADER `` (fatal for SUB and
FIN, not for publishing), and only led partitions are registered with lookupd. A
standalone node leads every partition it has, as a real one without a coordinator.

What is emulated rather than real: there is no disk queue, so a message's
``offset`` and ``raw_size`` are what youzan's disk queue would give (the record is
``u32 size`` + the message as nsqd stores it, offsets add up per partition); only the
leader holds a partition's messages (replicas hold the topic and its channels), and
moving the leadership moves the queues (see ``NSQCluster.move_leader``). A partition
keeps its last ``retained_messages`` messages (youzan keeps its disk queue), so that a
channel can be moved to a start position: ``SUB_ADVANCED`` with ``timestamp:``,
``virtual_queue:``, ``msgcount:`` or ``special:-1`` (the first three only on a cluster
node, as only a node with a coordinator can search its commit log), taken only from the
channel's first client, and the leader's ``POST /channel/setoffset`` (whatever clients the
channel has). ``ext_filter`` is not implemented.
"""

from __future__ import annotations

import bisect
import json
import random
import struct
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from fastnsq import codec
from fastnsq._protocol import HA_MAX_LINE

from ._nsqd_base import HA_VERSION
from ._nsqd_client import (
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    ClientConnection,
    ConnectionServer,
    _ClientError,
    _fatal,
)
from ._nsqd_parse import (
    HA_IDENTIFY_FIELDS,
    base10,
    fastjson_error,
    go_atoi,
    go_bytes,
    go_parse_bool,
    go_parse_int,
    go_parse_uint,
    go_quote,
    parse_identify,
    text,
)
from ._nsqd_queue import Channel, Msg, QueueServer, Subscriber, Topic

__all__ = [
    "HA_VERSION",
    "MAX_ATTEMPTS",
    "HAChannel",
    "HAClientConnection",
    "HAServer",
    "HATopic",
    "raw_record_size",
]


class HAServer(ConnectionServer, QueueServer, Protocol):
    """What an HA connection and an HA partition use of their nsqd, beyond upstream's."""

    @property
    def clients(self) -> Mapping[int, ClientConnection]: ...

    @property
    def partitions(self) -> dict[tuple[str, int], HATopic]: ...

    @property
    def ha_cluster(self) -> bool: ...

    def notify_lookupd(self, verb: bytes, *params: str) -> None: ...

    def default_partition(self, topic: str) -> int: ...

    def last_flush(self, partition: int) -> float: ...

    def create_partition(
        self, topic: str, partition: int, *, ext: bool = False, ordered: bool = False, leader: bool = True
    ) -> HATopic: ...

#: Attempts are capped here when a message is written to a client (nsqd/message.go).
MAX_ATTEMPTS = 4000
#: REQ 0 is refused past this many attempts when the message came less than the window ago.
MAX_QUICK_REQUEUES = 100  # MaxMemReqTimes * 10 (nsqd/channel.go)
QUICK_REQUEUE_WINDOW = 0.1
TOO_MUCH_REQUEUE = "Message too much requeue"
#: ext_ver of a JSON header (internal/ext/ext.go).
EXT_JSON_HEADER = 4
#: youzan's defaults that differ from upstream (nsqd/options.go, nsqd/client_v2.go).
DEFAULT_OUTPUT_BUFFER_SIZE = 100
SUBSCRIBED_OUTPUT_BUFFER_SIZE = 4096
TRACE_ID_KEY = "##trace_id"
DISPATCH_TAG_KEY = "##client_dispatch_tag"

NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"

_randrange = random.randrange
_encode_message = codec.encode_message
_encode_traced = codec.encode_traced_response
_valid_topic = codec.valid_topic_name
_valid_channel = codec.valid_channel_name
_IDS = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
# The message record on disk: u32 size + 8 timestamp + 2 attempts + 16 id + body.
_RECORD_BASE = 4 + 26
_ZERO_ID = bytes(8)

# Message layouts per connection (what it sent): the ext header, the offset/size header.
LAYOUT_EXT = 1
LAYOUT_DETAIL = 2
_EXT_DETAIL = LAYOUT_EXT | LAYOUT_DETAIL

_PUB, _PUB_TRACE, _PUB_EXT = "PUB", "PUB_TRACE", "PUB_EXT"


def raw_record_size(body_len: int, ext_topic: bool, ext_version: int, ext_len: int) -> int:
    """Bytes a message takes in youzan's disk queue (``RawMoveSize``): what offsets advance by.

    >>> raw_record_size(5, False, 0, 0)
    35
    """
    size = _RECORD_BASE + body_len
    if ext_topic:
        size += 1 + (2 + ext_len if ext_version else 0)
    return size


# ---- queues --------------------------------------------------------------------------


def _frame(layout: int, timestamp: int, attempts: int, payload: Any) -> bytes:
    """A message frame in the layout the client's SUB asked for (§9.5)."""
    body, wire_id, ext_version, ext, offset, raw_size = payload
    if not layout:
        return _encode_message(timestamp, attempts, wire_id, body)
    if layout == LAYOUT_EXT:
        return _encode_message(timestamp, attempts, wire_id, body, ext_version=ext_version, ext=ext)
    if layout == LAYOUT_DETAIL:
        return _encode_message(timestamp, attempts, wire_id, body, offset=offset, raw_size=raw_size)
    return _encode_message(
        timestamp, attempts, wire_id, body, ext_version=ext_version, ext=ext, offset=offset, raw_size=raw_size
    )


class HAChannel(Channel):
    """A channel of one topic partition.

    A queued message is ``(internal id as 8 bytes, payload, timestamp, attempts, 0)``
    with ``payload = (body, wire id (16 bytes), ext_version, ext, offset, raw_size)``;
    the 8-byte internal id is the in-flight key, as youzan finds messages by it
    (the trace-id half of a FIN's id is not looked at).

    Tags (youzan/nsq nsqd/channel.go messagePump, tagMsgChans): on an ext channel with a
    client whose IDENTIFY had a ``desired_tag``, a message whose JSON header has
    ``##client_dispatch_tag`` X goes only to the clients tagged X while one is
    subscribed, and to the untagged clients otherwise; tagged clients get nothing else.
    The channel dispatches in order and waits on a message no client may take yet (youzan's
    pump blocks on it), on first delivery and on requeue alike.
    """

    NOT_IN_FLIGHT = "Message ID not in flight"

    def __init__(self, topic: HATopic, name: str) -> None:
        super().__init__(topic, name)
        self.ext = topic.ext
        self.ordered = topic.ordered
        self._replay_head = False
        #: Subscribed clients per desired tag (ext channels): while any, dispatch goes by tag.
        self.tags: dict[str, int] = {}
        self._tag_turn = 0

    def _not_owner(self, owner: Subscriber, client: Subscriber) -> str:
        return f"client does not own message : {owner.id} vs {client.id}"

    def set_ordered(self, ordered: bool) -> None:
        """Ordered delivery (SUB_ORDERED sets it; only ``/channel/setorder`` clears it).

        Turning it on resets youzan's channel reader to the last confirmed message while
        the message it had already read waits to be dispatched: that one still goes out,
        then the reader reads it again, so the head of the queue is delivered twice (same
        id and attempts; one in-flight entry, confirmed by the first FIN).
        """
        if ordered == self.ordered:
            return
        self.ordered = ordered
        self._replay_head = ordered and bool(self.queue)
        for client in self._ready:
            client.in_ready = False
        self._ready.clear()
        for client in list(self.clients.values()):
            self.client_may_be_ready(client)

    # -- delivery ------------------------------------------------------------------

    def _deliver(self, client: Any, msg: Msg, now: float) -> None:
        if client.sample_rate and _randrange(100) > client.sample_rate:
            return  # youzan confirms a sampled-out message: gone for the channel
        message_id, payload, timestamp, attempts, _ = msg
        attempts += 1
        if attempts > MAX_ATTEMPTS:  # noqa: PLR1730 - cheaper than min() per delivery
            attempts = MAX_ATTEMPTS
        self._take_off(client, message_id, payload, timestamp, attempts, now)
        client.write_message(_frame(client.layout, timestamp, attempts, payload))
        if self.ordered:
            client.flush_messages()  # needFlush = IsOrdered()

    def _deliver_from_queue(self, client: Any, count: int, now: float) -> None:
        # The HA layouts and ordered flushes live in _deliver: one at a time
        # (sampled-out messages free their room, hence the loop on room, not count).
        queue = self.queue
        while queue and client.rdy > client.in_flight:
            self._deliver(client, queue.popleft(), now)

    # -- tags: a tagged client takes only its tag's messages ------------------------------

    def add_client(self, client: Subscriber) -> bool:
        if not super().add_client(client):
            return False
        tag = getattr(client, "desired_tag", "")
        if tag and self.ext:
            if not self.tags:
                self._ready.clear()  # dispatch goes through _pump_tagged from now on
                for other in self.clients.values():
                    other.in_ready = False
            self.tags[tag] = self.tags.get(tag, 0) + 1
        return True

    def remove_client(self, client: Subscriber) -> None:
        known = client.id in self.clients
        super().remove_client(client)
        tag = getattr(client, "desired_tag", "")
        if known and tag in self.tags:
            self.tags[tag] -= 1
            if not self.tags[tag]:
                del self.tags[tag]
            for other in list(self.clients.values()):  # its tag's messages may go elsewhere now
                self.client_may_be_ready(other)

    def _pump_tagged(self) -> None:
        """Hand out the queue in order, each message to a client that may take it (see the class)."""
        if self.paused:
            return
        queue = self.queue
        now = self.server.loop.time()
        written = []
        while queue:
            client = self._tag_target(queue[0])
            if client is None:
                break  # youzan's pump waits on this message
            self._deliver(client, queue.popleft(), now)
            written.append(client)
        for client in dict.fromkeys(written):
            client.flush_messages()

    def _tag_target(self, msg: Msg) -> Any:
        tag = _dispatch_tag(msg)
        wanted = tag if tag in self.tags else ""
        candidates = [
            c for c in self.clients.values()
            if getattr(c, "desired_tag", "") == wanted and c.state == STATE_SUBSCRIBED and c.rdy > c.in_flight
        ]
        if not candidates:
            return None
        self._tag_turn += 1
        return candidates[self._tag_turn % len(candidates)]

    # -- ordered channels: one message in flight for the whole partition -------------

    def client_may_be_ready(self, client: Any) -> None:
        if self.ordered:
            self._pump_ordered()
        elif self.tags:
            self._pump_tagged()
        else:
            super().client_may_be_ready(client)

    def put(self, msg: Msg) -> None:
        if self.ordered:
            self.queue.append(msg)
            self._pump_ordered()
        elif self.tags:
            self.queue.append(msg)
            self._pump_tagged()
        else:
            super().put(msg)

    def put_from_topic(self, msgs: list[Msg], deferrable: bool) -> None:
        if self.ordered or self.tags:
            self.message_count += len(msgs)
            self.queue.extend(msgs)
            self._pump_ordered() if self.ordered else self._pump_tagged()
        else:
            super().put_from_topic(msgs, deferrable)

    def _put_back(self, msg: Msg) -> None:
        # youzan's requeued messages go out before the rest of the queue.
        if self.ordered or self.tags:
            self.queue.appendleft(msg)
            self._pump_ordered() if self.ordered else self._pump_tagged()
            return
        ready = self._ready
        while ready and not self.paused:
            client = ready[0]
            if client.rdy > client.in_flight:
                self._deliver(client, msg, self.server.loop.time())
                if client.rdy <= client.in_flight:
                    ready.popleft()
                    client.in_ready = False
                    client.flush_messages()
                return
            ready.popleft()
            client.in_ready = False
        self.queue.appendleft(msg)

    def _pump_ordered(self) -> None:
        if self.in_flight or self.paused or not self.queue:
            return
        client: Any  # an HAClientConnection
        for client in self.clients.values():
            if client.rdy > client.in_flight and client.state == STATE_SUBSCRIBED:
                self._deliver(client, self.queue.popleft(), self.server.loop.time())
                if self._replay_head and self.in_flight:  # see set_ordered
                    self._replay_head = False
                    entry = next(reversed(self.in_flight.values()))
                    client.write_message(_frame(client.layout, entry[2], entry[3], entry[1]))
                    client.flush_messages()
                return

    def requeue(self, client: Subscriber, message_id: bytes, delay: float) -> str | None:
        # youzan's RequeueMessage refuses a REQ 0 of a message requeued too often: from
        # MaxAttempts/2 attempts on, or past 100 attempts within 100 ms of its delivery.
        if delay == 0:
            entry = self.in_flight.get(message_id)
            if entry is not None:
                attempts = entry[3]
                if attempts >= MAX_ATTEMPTS // 2 or (
                    attempts > MAX_QUICK_REQUEUES and self.server.loop.time() - entry[6] < QUICK_REQUEUE_WINDOW
                ):
                    return TOO_MUCH_REQUEUE
        return super().requeue(client, message_id, delay)

    def move_reader(self, msgs: list[Msg]) -> None:
        """The channel's reader moves to a start position: ``msgs`` are what it reads from there.

        The message youzan's reader had already read and holds for dispatch (the head of
        a non-empty queue) is still delivered first: the reset only moves the reader
        (youzan/nsq nsqd/channel.go: "retry delivering msg to client, regardless reset
        result"; seen on 0.3.7-HA.1.13.0). In-flight and deferred messages stay.
        """
        head = self.queue[0] if self.queue else None
        self.queue.clear()
        if head is not None and not (msgs and msgs[0][0] == head[0]):
            self.queue.append(head)
        self.queue.extend(msgs)
        if self.ordered:
            self._pump_ordered()
        else:
            for client in list(self.clients.values()):
                self.client_may_be_ready(client)

    def confirmed_offset(self, end: int) -> int:
        """The offset of the oldest message not finished yet (``end`` when all are)."""
        pending = [*self.queue, *self.in_flight.values(), *self.deferred.values()]
        return min((_offset_of(msg) for msg in pending), default=end)

    def take_state(self) -> tuple[list[Msg], list[tuple[float, Msg]]]:
        """Empty this channel for a leader move: (queued messages, in flight first), (deferred)."""
        now = self.server.loop.time()
        in_flight = sorted(self.in_flight.values(), key=lambda entry: entry[6])
        queued = [entry[:4] + (0,) for entry in in_flight]
        queued.extend(self.queue)
        deferred = [
            (max(0.0, when - now), msg)
            for when, _, msg in sorted(self._deferred_heap, key=lambda e: e[:2])
            if self.deferred.get(msg[0]) is msg
        ]
        for client in list(self.clients.values()):
            client.in_flight = 0
        self._forget_in_flight()
        self.queue.clear()
        return queued, deferred

    def give_state(self, queued: list[Msg], deferred: list[tuple[float, Msg]]) -> None:
        """Take over what :meth:`take_state` of the old leader's channel gave."""
        self.queue.extendleft(reversed(queued))
        for delay, msg in deferred:
            self._defer(msg, delay)
        if self.ordered:
            self._pump_ordered()
        else:
            for client in list(self.clients.values()):
                self.client_may_be_ready(client)


class HATopic(Topic):
    """One partition of a topic: its id and offset counters, its channels, its flags.

    A standalone node leads all its partitions; a cluster node's ``leader`` follows
    the cluster. In youzan a new channel starts at the end of the partition as
    readers see it (which is why its lookupd hides partitions without channels from
    writers): on a cluster node that is everything committed, so messages published
    while a partition has no channel are counted and dropped; a standalone node only
    moves that end when it flushes (at once while a channel waits for more, else on
    its flush ticker: every 4th ``sync_timeout`` for a given partition), so its first
    channel also gets what was published since the partition's last flush.
    """

    def __init__(
        self,
        server: HAServer,
        name: str,
        partition: int,
        *,
        ext: bool = False,
        ordered: bool = False,
        leader: bool = True,
    ) -> None:
        super().__init__(server, name)
        self.server: HAServer = server
        self.partition = partition
        self.ext = ext
        self.ordered = ordered
        self.leader = leader
        #: SUB only reaches existing channels (E_SUB_CHANNEL_NOT_REGISTERED otherwise).
        self.disable_channel_auto_create = False
        self.next_internal_id = 1
        self.next_offset = 0
        #: The last ``retained_messages`` messages published (for start positions), and the
        #: count of messages published before the first of them.
        self.retained: deque[Msg] = deque()
        self.retained_before = 0
        #: Standalone: (loop time, message) published while there was no channel.
        self._unflushed: list[tuple[float, Msg]] = []
        #: youzan's leader writes a publish to its disk queue first, then replicates it to the
        #: ISR, then commits it (or rolls it back: ``failed write begin rollback``). What it
        #: wrote and has not committed yet counts in ``/stats`` (``backend_depth`` and
        #: ``message_count`` are the write end); readers and ``/message/get`` see only what is
        #: committed. :meth:`write_uncommitted` stands for that window, on demand.
        self.uncommitted: list[Msg] = []

    def get_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            first = not self.channels
            channel = self.channels[name] = HAChannel(self, name)
            if self.leader:
                self.server.notify_lookupd(b"REGISTER", self.name, str(self.partition), name)
            if first and self._unflushed:
                flushed = self.server.last_flush(self.partition)
                pending = [msg for when, msg in self._unflushed if when >= flushed]
                self._unflushed.clear()
                if pending:
                    channel.put_from_topic(pending, False)
        return channel

    def delete_channel(self, name: str) -> bool:
        channel = self.channels.pop(name, None)
        if channel is None:
            return False
        channel.exiting = True
        if self.leader:
            self.server.notify_lookupd(b"UNREGISTER", self.name, str(self.partition), name)
        channel.close_clients()
        channel._forget_in_flight()
        channel.queue.clear()
        self.server.unwatch(channel)
        return True

    def put(self, msgs: list[Msg], nbytes: int, deferrable: bool = False) -> None:
        self.message_count += len(msgs)
        self.message_bytes += nbytes
        if not self.channels:
            if not self.server.ha_cluster:  # see the class docstring
                flushed = self.server.last_flush(self.partition)
                if self._unflushed and self._unflushed[0][0] < flushed:
                    # Flushed since: a new channel starts after these.
                    self._unflushed = [entry for entry in self._unflushed if entry[0] >= flushed]
                now = self.server.loop.time()
                self._unflushed.extend((now, msg) for msg in msgs)
            return
        for channel in list(self.channels.values()):
            channel.put_from_topic(msgs, False)

    def publish(self, items: list[tuple[bytes, int, int, bytes | None]]) -> tuple[int, int, int]:
        """Append ``(body, trace id, ext_version, ext)`` messages: (first id, first offset, total size)."""
        timestamp = time.time_ns()
        first_id = next_id = self.next_internal_id
        first_offset = offset = self.next_offset
        ext_topic = self.ext
        msgs = []
        nbytes = 0
        pack = _IDS.pack
        for body, trace_id, ext_version, ext in items:
            size = len(body)
            raw = _RECORD_BASE + size
            if ext_topic:
                raw += 1 + (2 + len(ext) if ext_version else 0)  # type: ignore[arg-type]
            wire_id = pack(next_id, trace_id)
            msgs.append((wire_id[:8], (body, wire_id, ext_version, ext, offset, raw), timestamp, 0, 0))
            offset += raw
            nbytes += size
            next_id += 1
        self.next_internal_id = next_id
        self.next_offset = offset
        self._retain(msgs)
        self.put(msgs, nbytes)
        return first_id, first_offset, offset - first_offset

    def publish_bodies(self, bodies: list[bytes]) -> None:
        """The plain PUB/MPUB fast path: no trace id, no ext header."""
        timestamp = time.time_ns()
        next_id = self.next_internal_id
        offset = self.next_offset
        base = _RECORD_BASE + 1 if self.ext else _RECORD_BASE
        msgs = []
        nbytes = 0
        pack = _U64.pack
        for body in bodies:
            size = len(body)
            raw = base + size
            id8 = pack(next_id)
            msgs.append((id8, (body, id8 + b"\0\0\0\0\0\0\0\0", 0, None, offset, raw), timestamp, 0, 0))
            offset += raw
            nbytes += size
            next_id += 1
        self.next_internal_id = next_id
        self.next_offset = offset
        self._retain(msgs)
        self.put(msgs, nbytes)

    def write_uncommitted(self, bodies: list[bytes]) -> None:
        """Write ``bodies`` after the committed end without committing them (a leader waiting
        for its ISR): :meth:`commit` or :meth:`rollback` ends it, before the next publish
        (youzan writes one partition's publishes one after the other)."""
        timestamp = time.time_ns()
        next_id = self.next_internal_id + len(self.uncommitted)
        offset = self.write_end
        base = _RECORD_BASE + 1 if self.ext else _RECORD_BASE
        for body in bodies:
            id8 = _U64.pack(next_id)
            raw = base + len(body)
            self.uncommitted.append((id8, (body, id8 + b"\0" * 8, 0, None, offset, raw), timestamp, 0, 0))
            offset += raw
            next_id += 1

    @property
    def write_end(self) -> int:
        """Where the next write goes: past what is written, committed or not."""
        if not self.uncommitted:
            return self.next_offset
        last = self.uncommitted[-1][1]
        return int(last[4] + last[5])

    def commit(self) -> None:
        """The ISR acknowledged what was written: readers see it now."""
        msgs, self.uncommitted = self.uncommitted, []
        if msgs:
            self.next_internal_id += len(msgs)
            self.next_offset = int(msgs[-1][1][4] + msgs[-1][1][5])
            self._retain(msgs)
            self.put(msgs, sum(len(msg[1][0]) for msg in msgs))

    def rollback(self) -> int:
        """Replication failed: the write end goes back to the committed end (youzan's
        ``ResetBackendEndNoLock``); the next publish takes the same offsets. Returns how many
        messages were dropped."""
        dropped = len(self.uncommitted)
        self.uncommitted = []
        return dropped

    def _retain(self, msgs: list[Msg]) -> None:
        retained = self.retained
        retained.extend(msgs)
        excess = len(retained) - self.server.options.retained_messages
        if excess > 0:
            self.retained_before += excess
            for _ in range(excess):
                retained.popleft()

    def remove_before(self, offset: int) -> int:
        """Retention: forget the messages that begin before ``offset`` (youzan cleans old disk
        segments this way; ``backend_start`` then moves, counts stay). Returns how many went."""
        retained = self.retained
        removed = 0
        while retained and _offset_of(retained[0]) < offset:
            retained.popleft()
            removed += 1
        self.retained_before += removed
        return removed

    def start_messages(self, kind: str, value: int) -> list[Msg]:
        """What a channel moved to ``<kind>:<value>`` reads (youzan's SetChannelOffset searches).

        ``timestamp``: from the first message published at or after second ``value``;
        ``virtual_queue``: from the first message at or after offset ``value``;
        ``msgcount``: from the ``value``-th message (0 and 1: the first); ``special:-1``: none.
        A start before the oldest retained message begins there; one past the end, at the end.
        """
        retained = self.retained
        if kind == "timestamp":
            index = bisect.bisect_left(retained, value * 1_000_000_000, key=_timestamp_of)
        elif kind == "virtual_queue":
            index = bisect.bisect_left(retained, value, key=_offset_of)
        elif kind == "msgcount":
            index = min(max(value - 1, 0) - self.retained_before, len(retained))
        else:
            index = len(retained)
        return list(retained)[max(index, 0):]

    def message_at_count(self, count: int) -> tuple[int, int, bytes, int, int] | None:
        """The ``count``-th message (from 1; 0 reads as 1) still retained, as ``/message/get`` shows
        it: (offset, its count from 1, body, timestamp, trace id); None past the end or before
        the oldest retained."""
        index = max(count, 1) - 1 - self.retained_before
        return self._shown(index)

    def message_at_offset(self, offset: int) -> tuple[int, int, bytes, int, int] | None:
        """The first retained message at or after ``offset``, as :meth:`message_at_count` shows it."""
        index = bisect.bisect_left(self.retained, offset, key=_offset_of)
        return self._shown(index)

    def _shown(self, index: int) -> tuple[int, int, bytes, int, int] | None:
        if not 0 <= index < len(self.retained):
            return None
        msg = self.retained[index]
        body, wire_id = msg[1][0], msg[1][1]
        trace_id = int.from_bytes(wire_id[8:16], "big")
        return _offset_of(msg), self.retained_before + index + 1, body, _timestamp_of(msg), trace_id

    def keep_for_restart(self, keep_messages: bool) -> None:
        for name, channel in list(self.channels.items()):
            if channel.ephemeral:
                channel.close_clients()
                del self.channels[name]
            else:
                channel.keep_for_restart(keep_messages)
        self.message_count = self.message_bytes = 0

    def _messages_from(self, offset: int) -> int:
        """How many retained messages start at or after ``offset``."""
        return len(self.retained) - bisect.bisect_left(self.retained, offset, key=_offset_of)

    def stats(self, channel_name: str, include_clients: bool) -> dict[str, Any] | None:
        entry = super().stats(channel_name, include_clients)
        if entry is not None:
            entry["topic_partition"] = str(self.partition)
            entry["backend_depth"] = self.write_end  # youzan: where the partition's writes end
            # youzan: the first offset on disk, and the messages written since the partition began
            # (both with what is written and not committed yet: the write end)
            entry["backend_start"] = _offset_of(self.retained[0]) if self.retained else self.next_offset
            entry["message_count"] = self.retained_before + len(self.retained) + len(self.uncommitted)
            for channel in entry["channels"]:
                channel["client_num"] = channel["client_count"]  # youzan's name
                held = self.channels.get(channel["channel_name"])
                if isinstance(held, HAChannel):
                    # youzan counts both from the channel's confirmed offset (its oldest message
                    # not finished: queued, in flight or deferred) to the partition's end: the
                    # bytes, and the messages (so its depth holds those in flight, deferred, and
                    # finished out of order past the confirmed one, unlike upstream's)
                    confirmed = held.confirmed_offset(self.next_offset)
                    channel["depth_size"] = self.next_offset - confirmed
                    channel["depth"] = self._messages_from(confirmed)
                    # youzan keeps a deferred message among those in flight, with a later timeout
                    channel["in_flight_count"] += channel["deferred_count"]
            entry["is_leader"] = self.leader
            entry["is_multi_ordered"] = self.ordered
            entry["is_ext"] = self.ext
        return entry


# ---- the connection ---------------------------------------------------------------------


class _Desync(Exception):
    """A non-fatal MPUB_EXT error that leaves the rest of the batch unread (it becomes commands)."""

    def __init__(self, code: str, description: str, rest: bytes) -> None:
        super().__init__(code, description)
        self.error = _ClientError(code, description, fatal=False)
        self.rest = rest


def _nonfatal(code: str, description: str) -> _ClientError:
    return _ClientError(code, description, fatal=False)


class HAClientConnection(ClientConnection):
    """One client of an HA nsqd (``NSQD(ha=True)``); the command table is below the class."""

    READ_DEADLINE_FACTOR = 3
    BINARY_IDS = True
    MAX_LINE = HA_MAX_LINE
    AUTH_TEXTS: ClassVar[dict[str, str]] = {
        "already": "AUTH Already set",
        "disabled": "AUTH Disabled",
        "none": "AUTH No authorizations found",
    }

    def __init__(self, server: HAServer) -> None:
        super().__init__(server)
        self.server: HAServer = server
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self._buffer_size_set = False
        self.extend_support = False
        self.desired_tag = ""
        self.enable_trace = False
        self.layout = 0
        self.topic: HATopic | None = None

    def _on_magic(self, magic: bytes) -> None:
        limit = self.options.max_conn_for_client
        if magic == codec.MAGIC_V2 and limit and len(self.server.clients) > limit:
            # IOLoop's first check: no E_ code, then the close.
            self._reader.pause()
            self._write_now(codec.encode_error(b"too much client connections"))
            self.close()
            return
        super()._on_magic(magic)

    def _unknown_command(self, name: bytes, params: list[bytes]) -> _ClientError:
        # fmt.Sprintf("invalid command %v", params) of the [][]byte words.
        words = " ".join(go_bytes(word) for word in (name, *params))
        return _fatal("E_INVALID", f"invalid command [{words}]")

    # -- IDENTIFY --------------------------------------------------------------------

    def _decode_identify(self, body: bytes) -> dict[str, Any]:
        return parse_identify(body, HA_IDENTIFY_FIELDS)

    def _take_identity(self, data: dict[str, Any]) -> None:
        self.client_id = data["client_id"] or data["short_id"]
        self.hostname = data["hostname"] or data["long_id"]
        self.user_agent = data["user_agent"]

    def _apply_identify(self, data: dict[str, Any]) -> str | None:
        """youzan's client_v2 Identify: its order, its output-buffer rules, the tag and ext."""
        options = self.options
        error = self._apply_heartbeat_interval(data["heartbeat_interval"])
        if error:
            return error
        size = data["output_buffer_size"]
        if size == -1:
            self.output_buffer_size = 1
            self._buffer_size_set = True
        elif size != 0:
            if size < 64:
                return f"output buffer size ({size}) is invalid"
            self.output_buffer_size = min(size, options.max_output_buffer_size)
            self._buffer_size_set = True
        timeout = data["output_buffer_timeout"]
        if timeout == -1:
            self.output_buffer_timeout = 0.0
        elif timeout != 0:
            if not 1 <= timeout <= int(options.max_output_buffer_timeout * 1000):
                return f"output buffer timeout ({timeout}) is invalid"
            self.output_buffer_timeout = max(timeout, 10) / 1000.0
        error = self._apply_sample_rate_and_msg_timeout(data)
        if error:
            return error
        tag = data["desired_tag"]
        if tag:
            # SetDesiredTag checks only the length (the tag's characters are not validated).
            if len(tag.encode()) > 100:
                return f"invalid tag len {len(tag.encode())}, exceed limit 100"
            self.desired_tag = tag
        if data["extend_support"]:
            self.extend_support = True
        return None

    def _negotiation(self, data: dict[str, Any]) -> tuple[bytes, bool, tuple[str, int] | None]:
        options = self.options
        tls = self.server.tls_context is not None and data["tls_v1"]
        deflate = options.deflate and data["deflate"]
        level = 0
        if deflate:
            # youzan's bug: the default of 6 for <= 0 is overwritten by min(requested, max).
            level = min(data["deflate_level"], options.max_deflate_level)
        snappy = options.snappy and data["snappy"]
        if deflate and snappy:
            raise _fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        answer: dict[str, Any] = {
            "max_rdy_count": options.max_rdy_count,
            "version": HA_VERSION,
            "max_msg_timeout": round(options.max_msg_timeout * 1000),
            "msg_timeout": round(self.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": options.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": self.server.auth_enabled,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": round(self.output_buffer_timeout * 1000),
        }
        if self.desired_tag:
            answer["desired_tag"] = self.desired_tag
        compression = ("snappy", 0) if snappy else ("deflate", level) if deflate else None
        return json.dumps(answer, separators=(",", ":")).encode(), tls, compression

    def _upgrade(self, tls: bool, compression: tuple[str, int] | None) -> None:
        if compression is not None and compression[0] == "deflate":
            level = compression[1]
            if level < -2:
                # Go's flate.NewWriter refuses it, after the JSON went out.
                self._write_now(
                    codec.encode_error(
                        b"E_IDENTIFY_FAILED IDENTIFY failed flate: invalid compression level %d: "
                        b"want value in range [-2, 9]" % level
                    )
                )
                self.close()
                return
            # -1 (default) and -2 (Huffman only) decode like any deflate stream.
            compression = ("deflate", 6 if level < 0 else level)
        super()._upgrade(tls, compression)

    # -- SUB family --------------------------------------------------------------------

    def _cmd_sub(self, params: list[bytes], body: Any) -> None:
        self._subscribe(params, trace=False, ordered=False, start=None)

    def _cmd_sub_ordered(self, params: list[bytes], body: Any) -> None:
        self._subscribe(params, trace=True, ordered=True, start=None)

    def _cmd_sub_advanced(self, params: list[bytes], body: Any) -> None:
        start = None
        if len(params) > 3 and params[3]:
            start = _parse_start(params[3])
        self._subscribe(params, trace=True, ordered=False, start=start)

    def _subscribe(
        self, params: list[bytes], *, trace: bool, ordered: bool, start: tuple[str, int] | None
    ) -> None:
        if self.state != STATE_INIT:
            raise _fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise _fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 2:
            raise _fatal("E_INVALID", "SUB insufficient number of parameters")
        topic_name = text(params[0])
        if not _valid_topic(topic_name):
            raise _fatal("E_BAD_TOPIC", f"SUB topic name {go_quote(params[0])} is not valid")
        channel_name = text(params[1])
        if not _valid_channel(channel_name):
            raise _fatal("E_BAD_CHANNEL", f"SUB channel name {go_quote(params[1])} is not valid")
        partition = -1
        if len(params) == 3:  # only with exactly 4 words (the SUB_ADVANCED start position skips it)
            try:
                partition = go_atoi(params[2])
            except ValueError as exc:
                raise _fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        self._check_auth("SUB", topic_name, channel_name)
        server = self.server
        if partition == -1:
            partition = server.default_partition(topic_name)
        topic = server.partitions.get((topic_name, partition))
        if topic is None:
            raise _fatal(TOPIC_NOT_EXIST, "")
        if topic.ordered and not ordered:
            raise _fatal("E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub")
        if topic.ext:
            if not self.options.allow_sub_ext_compatible and not self.extend_support:
                raise _fatal(
                    "E_SUB_EXTEND_NEED", "this topic is extended and should identify as extend support."
                )
        elif self.extend_support:
            raise _fatal(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        if not topic.leader:
            raise _fatal(NOT_LEADER, "")
        if topic.disable_channel_auto_create and channel_name not in topic.channels:
            raise _fatal("E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic.")
        channel: HAChannel = topic.get_channel(channel_name)  # type: ignore[assignment]
        if not topic.ext and self.desired_tag:
            self.desired_tag = ""  # a tag on a topic without ext is dropped
        if channel.exiting or not channel.add_client(self):
            raise _fatal(NOT_WRITABLE, "")
        self.state = STATE_SUBSCRIBED
        self.channel = channel
        self.topic = topic
        if ordered:
            if self.sample_rate != 0:
                raise _fatal("E_INVALID", "order consume is not allowed while sample rate is not 0")
            channel.set_ordered(True)
        if start is not None and len(channel.clients) <= 1:  # only the channel's first client moves it
            error = set_channel_offset(server, topic, channel, start)
            if error is not None:
                raise _fatal("E_INVALID", error)
        self.enable_trace = trace
        self.layout = (LAYOUT_EXT if self.extend_support and channel.ext else 0) | (
            LAYOUT_DETAIL if trace else 0
        )
        if not self._buffer_size_set and not channel.ephemeral:
            self.output_buffer_size = SUBSCRIBED_OUTPUT_BUFFER_SIZE
        self._send_response(codec.OK)

    # -- FIN / REQ / TOUCH ---------------------------------------------------------------

    def _full_id(self, params: list[bytes], command: str) -> bytes:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise _fatal("E_INVALID", f"cannot {command} in current state")
        if not params:
            raise _fatal("E_INVALID", f"{command} insufficient number of params")
        message_id = params[0]
        if len(message_id) != 16:
            raise _fatal("E_INVALID", "Invalid Message ID")
        return message_id

    def _cmd_fin(self, params: list[bytes], body: Any) -> None:
        message_id = self._full_id(params, "FIN")
        key = message_id[:8]
        if key == _ZERO_ID or message_id[0] & 0x80:  # int64(internal id) <= 0
            raise _fatal("E_INVALID", "Invalid Message ID")
        topic = self.topic
        if topic is not None and not topic.leader:
            raise _fatal(NOT_LEADER, "")
        channel = self.channel
        error = channel.finish(self, key)  # type: ignore[union-attr]
        if error is not None:
            if self.server.ha_cluster:
                # A cluster node finishes through its coordinator, whose local errors
                # read "ErrType:<CoordLocalErr> ErrCode:<RpcNoErr> : <channel's error>".
                error = f"ErrType:7 ErrCode:0 : {error}"
            raise _nonfatal("E_FIN_FAILED", f"FIN {go_bytes(message_id)} failed {error}")
        self.finish_count += 1
        self.in_flight -= 1
        self.refill()

    def _cmd_req(self, params: list[bytes], body: Any) -> None:
        message_id = self._full_id(params, "REQ")
        if len(params) < 2:
            raise _fatal("E_INVALID", "REQ insufficient number of params")
        parsed = base10(params[1])
        if parsed is None:
            raise _fatal("E_INVALID", f"REQ could not parse timeout {text(message_id)}, {text(params[1])}")
        delay_ms = min(parsed, int(self.options.max_req_timeout * 1000))
        channel: HAChannel = self.channel  # type: ignore[assignment]
        if delay_ms > 0 and (channel.ordered or (self.topic is not None and self.topic.ordered)):
            return  # "ignore delay for ordered topic": the message stays in flight
        error = channel.requeue(self, message_id[:8], delay_ms / 1000.0)
        if error is not None:
            raise _nonfatal("E_REQ_FAILED", f"REQ {go_bytes(message_id)} failed {error}")
        self.requeue_count += 1
        self.in_flight -= 1
        self.refill()

    def _cmd_touch(self, params: list[bytes], body: Any) -> None:
        message_id = self._full_id(params, "TOUCH")
        error = self.channel.touch(self, message_id[:8], self.msg_timeout)  # type: ignore[union-attr]
        if error is not None:
            raise _nonfatal("E_TOUCH_FAILED", f"TOUCH {go_bytes(message_id)} failed {error}")

    # -- the PUB family ------------------------------------------------------------------

    def _prepare_pub(self, params: list[bytes], body: bytes | int | None, mpub: bool) -> HATopic:
        """youzan's preparePub: every check before the body is read, in its order; all fatal."""
        if not params:
            raise _fatal("E_INVALID", "insufficient number of parameters")
        name = text(params[0])
        partition = -1
        if len(params) == 2:  # only with exactly 3 words
            try:
                partition = go_atoi(params[1])
            except ValueError as exc:
                raise _fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        given = partition
        if partition == -1:
            partition = self.server.default_partition(name)
        if type(body) is int:
            if body <= 0:
                raise _fatal("E_BAD_BODY", f"invalid body size {body}")
            if mpub:
                raise _fatal("E_BAD_BODY", f"body too big {body} > {self.options.max_body_size}")
            raise _fatal("E_BAD_MESSAGE", f"message too big {body} > {self.options.max_msg_size}")
        topic = self.server.partitions.get((name, partition))
        if topic is None:
            raise _fatal(TOPIC_NOT_EXIST, "")
        if given == -1 and topic.ordered:
            raise _fatal("E_BAD_PARTITION", f"topic partition is not valid for multi partition: {given}")
        self._check_auth("PUB", name, "")
        return topic

    def _cmd_pub(self, params: list[bytes], body: bytes | int | None) -> None:
        topic = self._prepare_pub(params, body, False)
        if not topic.leader:
            raise _nonfatal(NOT_LEADER, "")
        topic.publish_bodies([body])  # type: ignore[list-item]
        self._count_published(topic.name, 1)
        self._send_response(codec.OK)

    def _cmd_pub_trace(self, params: list[bytes], body: bytes | int | None) -> None:
        topic = self._prepare_pub(params, body, False)
        data: bytes = body  # type: ignore[assignment]
        if len(data) <= 8:
            raise _fatal("E_BAD_BODY", f"invalid body size {len(data)} with trace id enabled")
        trace_id = _U64.unpack_from(data)[0]
        self._publish_one(topic, data[8:], trace_id, 0, None, traced=True)

    def _cmd_pub_ext(self, params: list[bytes], body: bytes | int | None) -> None:
        topic = self._prepare_pub(params, body, False)
        data: bytes = body  # type: ignore[assignment]
        size = len(data)
        if size <= 2:
            raise _fatal("E_BAD_BODY", f"invalid body size {size} with ext json header enabled")
        json_len = _U16.unpack_from(data)[0]
        if size <= 2 + json_len:
            raise _fatal("E_BAD_BODY", f"invalid body size {size} in ext json header content length")
        ext = data[2 : 2 + json_len]
        trace_id, traced, keep_ext = self._check_ext(topic, ext)
        if keep_ext:
            self._publish_one(topic, data[2 + json_len :], trace_id, EXT_JSON_HEADER, ext, traced=traced)
        else:
            self._publish_one(topic, data[2 + json_len :], trace_id, 0, None, traced=traced)

    def _check_ext(self, topic: HATopic, ext: bytes) -> tuple[int, bool, bool]:
        """A JSON ext header: (trace id, traced reply wanted, keep the header); non-fatal errors."""
        # youzan checks the header with fastjson: its verdict and its error text, not a strict parser's.
        error = fastjson_error(ext)
        if error is not None:
            raise _nonfatal("E_INVALID_JSON_HEADER", f"fail to parse json header:{error}")
        try:
            header = json.loads(ext.decode("utf-8", "replace"), parse_constant=_nan_is_a_number)
        except ValueError:
            header = None  # fastjson takes it (say, 1.2.3 as a number) but it has no key to read
        trace_id = 0
        traced = False
        if isinstance(header, dict) and TRACE_ID_KEY in header:
            value = header[TRACE_ID_KEY]
            if not isinstance(value, str):
                raise _nonfatal("INVALID_TRACE_ID", "passin trace id should be string")
            try:
                trace_id = go_parse_uint(value.encode())
            except ValueError:
                raise _nonfatal("INVALID_TRACE_ID", "invalid trace id") from None
            traced = True
        if topic.ext:
            return trace_id, traced, True
        if self.options.allow_ext_compatible and _only_internal_keys(header):
            return trace_id, traced, False
        raise _nonfatal("E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic.name}")

    def _publish_one(
        self, topic: HATopic, data: bytes, trace_id: int, ext_version: int, ext: bytes | None, *, traced: bool
    ) -> None:
        if not topic.leader:
            raise _nonfatal(NOT_LEADER, "")
        internal_id, offset, size = topic.publish([(data, trace_id, ext_version, ext)])
        self._count_published(topic.name, 1)
        if traced:
            self._out.append(_encode_traced(internal_id, trace_id, offset, size))
            self._request_flush()
        else:
            self._send_response(codec.OK)

    def _cmd_mpub(self, params: list[bytes], body: bytes | int | None) -> None:
        topic = self._prepare_pub(params, body, True)
        options = self.options
        try:
            bodies = codec.decode_mpub(body, options.max_msg_size, options.max_body_size)  # type: ignore[arg-type]
        except ValueError as exc:
            code, description = exc.args
            raise _fatal(code, description) from None
        if not topic.leader:
            raise _nonfatal(NOT_LEADER, "")
        topic.publish_bodies(bodies)
        self._count_published(topic.name, len(bodies))
        self._send_response(codec.OK)

    def _cmd_mpub_trace(self, params: list[bytes], body: bytes | int | None) -> None:
        topic = self._prepare_pub(params, body, True)
        items = self._read_mpub(topic, body, _PUB_TRACE)  # type: ignore[arg-type]
        if not topic.leader:
            raise _nonfatal(NOT_LEADER, "")
        internal_id, offset, size = topic.publish(items)
        self._count_published(topic.name, len(items))
        self._out.append(_encode_traced(internal_id, 0, offset, size))
        self._request_flush()

    def _cmd_mpub_ext(self, params: list[bytes], body: bytes | int | None) -> None:
        topic = self._prepare_pub(params, body, True)
        try:
            items = self._read_mpub(topic, body, _PUB_EXT)  # type: ignore[arg-type]
        except _Desync as desync:
            # readMPUBEXT returned before reading the rest: nsqd parses it as commands.
            self._reinject(desync.rest)
            raise desync.error from None
        if not topic.leader:
            raise _nonfatal(NOT_LEADER, "")
        topic.publish(items)
        self._count_published(topic.name, len(items))
        self._send_response(codec.OK)

    def _read_mpub(
        self, topic: HATopic, body: bytes, kind: str
    ) -> list[tuple[bytes, int, int, bytes | None]]:
        """readMPUBEXT for MPUB_TRACE / MPUB_EXT, one message at a time, errors in its order."""
        options = self.options
        end = len(body)
        if end < 4:
            raise _fatal("E_BAD_BODY", "MPUB failed to read message count")
        count = _I32.unpack_from(body)[0]
        if count <= 0 or count > (options.max_body_size - 4) // 5:
            raise _fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        max_msg = options.max_msg_size
        items: list[tuple[bytes, int, int, bytes | None]] = []
        pos = 4
        for index in range(count):
            if pos + 4 > end:
                raise _fatal("E_BAD_MESSAGE", f"MPUB failed to read message({index}) body size")
            size = _I32.unpack_from(body, pos)[0]
            pos += 4
            if size <= 0:
                raise _fatal("E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}")
            if size > max_msg:
                raise _fatal("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg}")
            if pos + size > end:
                raise _fatal("E_BAD_MESSAGE", "MPUB failed to read message body")
            message = body[pos : pos + size]
            pos += size
            if kind == _PUB_TRACE:
                if size <= 8:
                    raise _fatal(
                        "E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size} for tracing"
                    )
                items.append((message[8:], _U64.unpack_from(message)[0], 0, None))
                continue
            json_len = _U16.unpack_from(message.ljust(2, b"\0"))[0]
            if size <= 2 + json_len:
                raise _fatal("E_BAD_BODY", f"invalid body size {size} in ext json header content length")
            trace_id, ext_version, ext = 0, 0, None
            if json_len > 0:
                ext = message[2 : 2 + json_len]
                try:
                    trace_id, _, keep = self._check_ext(topic, ext)
                except _ClientError as err:
                    raise _Desync(err.args[0], err.args[1], body[pos:]) from None
                if keep:
                    ext_version = EXT_JSON_HEADER
                else:
                    ext = None
            items.append((message[2 + json_len :], trace_id, ext_version, ext))
        return items

    def _reinject(self, rest: bytes) -> None:
        """Put ``rest`` back in front of what the reader has not split yet."""
        if not rest:
            return
        reader = self._reader
        reader.pause()
        pending = reader.take_unparsed()
        reader.feed(rest + pending)
        self.loop.call_soon(self._resume_after_reinject)

    def _resume_after_reinject(self) -> None:
        if not self._closing and (self._task is None or self._task.done()):
            self._resume_reading()

    # -- INTERNAL_CREATE_TOPIC ----------------------------------------------------------------

    def _cmd_internal_create_topic(self, params: list[bytes], body: Any) -> None:
        if len(params) < 2:
            raise _fatal("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        name = text(params[0])
        if not _valid_topic(name):
            raise _fatal("E_BAD_TOPIC", f"topic name {go_quote(params[0])} is not valid")
        try:
            partition = go_atoi(params[1])
        except ValueError as exc:
            raise _fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        self._check_auth("CREATE_TOPIC", name, "")
        if partition < 0:
            raise _fatal("E_BAD_PARTITION", "partition should not less than 0")
        ext = False
        if len(params) >= 3:
            try:
                ext = go_parse_bool(params[2])
            except ValueError as exc:
                raise _fatal("E_BAD_EXT", f"topic ext is not valid: {exc}") from None
        if self.server.ha_cluster:
            raise _nonfatal(
                "E_CREATE_TOPIC_FAILED", "CREATE_TOPIC is not allowed here while cluster feature enabled."
            )
        self.server.create_partition(name, partition, ext=ext)
        self._send_response(codec.OK)


def set_channel_offset(server: HAServer, topic: HATopic, channel: HAChannel, start: tuple[str, int]) -> str | None:
    """Move ``channel`` to ``start`` (youzan's SetChannelOffset); the error text, or None."""
    kind, value = start
    if kind == "special":
        if value != -1:
            return "not supported offset type"
    elif not server.ha_cluster:
        return "Not supported while coordinator disabled"
    elif kind == "timestamp" and value < 0:
        return f"Invalid timestamp {value}"
    channel.move_reader(topic.start_messages(kind, value))
    return None


def _dispatch_tag(msg: Msg) -> str:
    """The ``##client_dispatch_tag`` of a queued message's JSON header ("" without one)."""
    payload = msg[1]
    if payload[2] != EXT_JSON_HEADER or not payload[3] or DISPATCH_TAG_KEY.encode() not in payload[3]:
        return ""
    try:
        header = json.loads(payload[3])
    except ValueError:
        return ""
    tag = header.get(DISPATCH_TAG_KEY) if isinstance(header, dict) else None
    return tag if isinstance(tag, str) else ""


def _timestamp_of(msg: Msg) -> int:
    return int(msg[2])


def _offset_of(msg: Msg) -> int:
    return int(msg[1][4])


def parse_start(raw: bytes) -> tuple[str, int]:
    """The text form of :func:`_parse_start`'s checks, for HTTP (ValueError with the server's text)."""
    parts = raw.split(b":")
    if len(parts) != 2 or parts[0] not in (b"special", b"virtual_queue", b"timestamp", b"msgcount"):
        raise ValueError(f"invalid consume offset:{text(raw)}")
    return parts[0].decode(), go_parse_int(parts[1])


def _parse_start(raw: bytes) -> tuple[str, int]:
    """SUB_ADVANCED's ``<type>:<int>`` (ConsumeOffset.FromBytes); fatal E_INVALID when bad."""
    try:
        return parse_start(raw)
    except ValueError as exc:
        raise _fatal("E_INVALID", str(exc)) from None


def _only_internal_keys(header: Any) -> bool:
    """canIgnoreJsonHeader: every key starts with ``##`` (a non-object has none)."""
    if not isinstance(header, dict):
        return True
    return all(key.startswith("##") for key in header)


def _nan_is_a_number(name: str) -> Any:
    return float(name)  # fastjson reads NaN (and inf) as numbers


# The HA command table: upstream's, without DPUB, with the HA commands.
HAClientConnection.COMMANDS = {
    **{k: v for k, v in ClientConnection.COMMANDS.items() if k != b"DPUB"},
    b"FIN": HAClientConnection._cmd_fin,
    b"REQ": HAClientConnection._cmd_req,
    b"TOUCH": HAClientConnection._cmd_touch,
    b"SUB": HAClientConnection._cmd_sub,
    b"SUB_ORDERED": HAClientConnection._cmd_sub_ordered,
    b"SUB_ADVANCED": HAClientConnection._cmd_sub_advanced,
    b"PUB": HAClientConnection._cmd_pub,
    b"PUB_TRACE": HAClientConnection._cmd_pub_trace,
    b"PUB_EXT": HAClientConnection._cmd_pub_ext,
    b"MPUB": HAClientConnection._cmd_mpub,
    b"MPUB_TRACE": HAClientConnection._cmd_mpub_trace,
    b"MPUB_EXT": HAClientConnection._cmd_mpub_ext,
    b"INTERNAL_CREATE_TOPIC": HAClientConnection._cmd_internal_create_topic,
}
