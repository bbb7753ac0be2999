"""How far an HA consumer's channel is in each partition: position, end and lag, read from the leaders.

One job: ask each partition's leader (youzan's HA nsqd) where the consumer's channel stands,
for :mod:`fastnsq.metrics` or anyone who wants the figures.

Where the figures come from (youzan/nsq ``nsqd/stats.go`` NewChannelStats,
``nsqd/diskqueue_reader.go`` updateDepth; the same on 0.3.7-HA.1.13.0):

* the **end** of a partition is its topic's ``backend_depth`` in the leader's ``/stats``:
  the queue offset the next message will be written at;
* the channel's ``depth_size`` is the end minus the channel's **confirmed** offset (bytes),
  and its ``depth`` the messages between the two. The confirmed offset is the channel's
  real position: everything before it is finished, and the channel resumes there after a
  restart or a leader change. So ``position = end - depth_size`` and ``lag = depth``.

Why not from the messages: a message of ``SUB_ADVANCED`` / ``SUB_ORDERED`` carries its own
offset and size, which tell where the consumer *reads*, not where the partition ends, and
plain ``SUB`` messages carry neither. Counting offsets on the message path would also slow
every consumer down for a figure only a scrape wants. So the figures are read on demand:
:meth:`ProgressReader.read` asks every leader of the consumer's partitions at once (one
``GET /stats?topic=T&channel=C&needClients=false`` per leader node, the clients lists left
out), and answers for ``max_age`` seconds from what it read. Measured on youzan's
0.3.7-HA.1.13.0 (3 nodes, 4 partitions, 3 channels, 3 consumers): 3.8 KB and 0.6 ms a
request, 3.4 ms for a whole read of the 3 leaders. A scrape every 15 s costs one such
request per leader node every 15 s, and nothing when nobody scrapes.

The leaders' HTTP addresses come from lookupd (``lookupd_http_addresses``): a consumer of
direct endpoints only has no figures (nsqd's IDENTIFY does not give its HTTP port).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..nsqd_http import NsqdHTTP, NsqdHTTPError

if TYPE_CHECKING:
    from .consumer import Consumer

__all__ = ["PartitionProgress", "ProgressReader", "parse_progress", "progress_reader"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionProgress:
    """Where one channel stands in one partition, as the partition's leader said at ``read_at``.

    ``position``: the channel's confirmed queue offset (every message before it is finished;
    ``message.offset`` counts in the same bytes); ``end``: where the next message will be
    written; ``lag``: the messages from ``position`` to ``end`` (those in flight included);
    ``read_at``: ``time.time()`` of the answer.
    """

    partition: int
    position: int
    end: int
    lag: int
    read_at: float


def parse_progress(stats: Any, topic: str, channel: str, read_at: float = 0.0) -> dict[int, PartitionProgress]:
    """The partitions ``stats`` (a youzan ``/stats`` answer) shows ``channel`` in, where its node leads.

    >>> stats = {"topics": [{"topic_name": "t", "topic_partition": "1", "backend_depth": 1300, "is_leader": True,
    ...           "channels": [{"channel_name": "c", "depth": 4, "depth_size": 520}]}]}
    >>> parse_progress(stats, "t", "c")[1]
    PartitionProgress(partition=1, position=780, end=1300, lag=4, read_at=0.0)
    """
    found: dict[int, PartitionProgress] = {}
    topics = stats.get("topics") if isinstance(stats, dict) else None
    for entry in topics or ():
        if entry.get("topic_name") != topic or not entry.get("is_leader", True):
            continue  # a replica's figures trail the leader's
        for chan in entry.get("channels") or ():
            if chan.get("channel_name") != channel:
                continue
            try:
                partition, end = int(entry["topic_partition"]), int(entry["backend_depth"])
                behind, lag = int(chan["depth_size"]), int(chan["depth"])
            except (KeyError, TypeError, ValueError):
                break  # not youzan's HA nsqd: no queue offsets
            found[partition] = PartitionProgress(partition, end - behind, end, lag, read_at)
    return found


class ProgressReader:
    """Reads a consumer's :class:`PartitionProgress` per partition from the leaders, at most
    once per ``max_age`` seconds. Made by :func:`progress_reader`; lives on the consumer's loop.

    ``timeout``: how long one leader may take to answer; a leader that does not (or a
    partition without a known leader) is left out of the answer rather than shown stale.
    """

    def __init__(self, consumer: Consumer, *, max_age: float = 1.0, timeout: float = 5.0) -> None:
        self._consumer = consumer
        self.max_age = max_age
        self.timeout = timeout
        self._latest: dict[int, PartitionProgress] = {}
        self._latest_at = float("-inf")  # time.monotonic()
        self._reading: asyncio.Future[dict[int, PartitionProgress]] | None = None

    @property
    def latest(self) -> Mapping[int, PartitionProgress]:
        """What the last read found (empty before one)."""
        return self._latest

    async def read(self) -> dict[int, PartitionProgress]:
        """The figures of every partition the consumer reads, asked of their leaders now unless
        a read is under way (its answer is shared) or the last is younger than ``max_age``."""
        if time.monotonic() - self._latest_at < self.max_age:
            return self._latest
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_leaders())
            self._reading.add_done_callback(self._done)
        return await asyncio.shield(self._reading)

    def read_from_thread(self, wait: float) -> dict[int, PartitionProgress]:
        """:meth:`read` for a thread other than the consumer's loop (a Prometheus scrape):
        waits up to ``wait`` seconds, then gives the last figures read. On the loop's own
        thread (which must not block) it starts a read and gives the last figures at once."""
        loop = self._consumer._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return self._latest
        if loop is _running_loop():
            loop.create_task(self.read())
            return self._latest
        future = asyncio.run_coroutine_threadsafe(self.read(), loop)
        try:
            return future.result(wait)
        except Exception:  # noqa: BLE001 - a timeout or a loop closing: the last figures will do
            return self._latest

    def _done(self, future: asyncio.Future[dict[int, PartitionProgress]]) -> None:
        self._reading = None
        if not future.cancelled() and future.exception() is None:
            self._latest, self._latest_at = future.result(), time.monotonic()

    async def _read_leaders(self) -> dict[int, PartitionProgress]:
        consumer = self._consumer
        leaders = _leaders(consumer)
        if not leaders:
            return {}
        http = NsqdHTTP(timeout=self.timeout)
        try:
            answers = await asyncio.gather(
                *(self._ask(http, address) for address in set(leaders.values())), return_exceptions=True
            )
        finally:
            await http.close()
        found: dict[int, PartitionProgress] = {}
        for answer in answers:
            if isinstance(answer, dict):
                found.update((p, progress) for p, progress in answer.items() if p in leaders)
        return found

    async def _ask(self, http: NsqdHTTP, address: str) -> dict[int, PartitionProgress]:
        consumer = self._consumer
        try:
            answer = await http.stats(address, consumer.topic, consumer.channel)
        except NsqdHTTPError as exc:
            logger.debug("progress of %s/%s: %s", consumer.topic, consumer.channel, exc)
            return {}
        return parse_progress(answer, consumer.topic, consumer.channel, time.time())


_READERS: weakref.WeakKeyDictionary[Consumer, ProgressReader] = weakref.WeakKeyDictionary()


def progress_reader(consumer: Consumer, **options: Any) -> ProgressReader:
    """The :class:`ProgressReader` of ``consumer`` (one per consumer, shared by whoever asks;
    ``options`` apply when it is made: ``max_age``, ``timeout``)."""
    reader = _READERS.get(consumer)
    if reader is None:
        reader = _READERS[consumer] = ProgressReader(consumer, **options)
    return reader


def _leaders(consumer: Consumer) -> dict[int, str]:
    """partition -> the HTTP address of its leader, for the partitions the consumer subscribed."""
    route = consumer._ha.route
    if route is None:
        return {}
    leaders = {}
    for endpoint, node in route.endpoints.items():
        partition = endpoint.partition
        if partition is not None and partition in consumer.partitions and node.http_port:
            leaders[partition] = node.http_address
    return leaders


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
