"""Reading one partition's offset range on an executor (``readMode=offsets``).

One job: the messages that begin in ``[start, end)`` of one HA partition, each exactly once,
in offset order, whatever the task attempt. How:

1. On the partition's leader, ``POST /channel/create`` a channel of this attempt's own,
   ``<channel>-<partition>-<10 hex>#ephemeral`` (nsqd deletes an ephemeral channel when its
   last client leaves, so a killed task leaves nothing behind that would hold back youzan's
   retention), and ``POST /channel/setoffset`` it to ``virtual_queue:<start>``: a fresh
   channel has no client yet, and setoffset (unlike ``SUB_ADVANCED``'s start position) moves
   exactly the partition named even when the node leads several.
2. Subscribe with ``SUB_ADVANCED`` (``enable_trace``): every message carries its offset
   and raw size. Keep those in the range; advance a cursor from ``start`` by each message's
   raw size while the next message is there (a redelivery or a stray message read before
   the move changes nothing); finish every message as it arrives.
3. Done when the cursor reaches ``end``. No message for ``readStallTimeoutMs``, a refused
   channel, or no connection to the leader for a second (a leader that moved closes it with
   E_FAILED_ON_NOT_LEADER): ask the lookupd for the partition's leader again and read the
   whole range again from its start. Three reads a leader answered and that did not complete
   fail the task (Spark retries it); a partition with no leader that answers (a leader's
   outage) is asked for again until one does, for up to ``leaderWaitTimeoutMs``.

Before each read the leader's ``/stats`` says where the partition starts now: a range that
retention removed (in part) since it was planned fails the task at once naming the partition
and the offsets (``failOnDataLoss=true``), or is read from where the partition now starts,
with a warning and the count of what was skipped (``false``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..consumer import Consumer
from ..errors import NSQError, RangeReadError
from ..nsqd_http import NsqdHTTP, NsqdHTTPError
from ._offsets import DataLossError, Leader, OffsetPlanner, RangePlan

if TYPE_CHECKING:
    from ._options import SourceOptions

__all__ = ["RangeReadError", "read_range"]

logger = logging.getLogger(__name__)

#: Reads of one range (first on the planned leader, then after asking the lookupd again).
ATTEMPTS = 3
#: A read whose connection to the leader is gone this long asks the lookupd again (a leader that
#: moved closes it with E_FAILED_ON_NOT_LEADER and refuses the reconnects), without waiting out
#: readStallTimeoutMs; checked this often.
LEADER_LOST_AFTER = 1.0
_CHECK_EVERY = 0.25


class _Collector:
    """The messages of ``[start, end)`` in offset order, from deliveries in any order."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.cursor = start
        self.ordered: list[Any] = []
        self._early: dict[int, Any] = {}  # beyond the cursor: arrived before their predecessor
        self.done = asyncio.Event()
        self.progress = asyncio.Event()
        if start >= end:
            self.done.set()

    def take(self, message: Any) -> None:
        offset = message.offset
        if not self.cursor <= offset < self.end or offset in self._early:
            return  # read before, outside the range, or a redelivery
        self._early[offset] = message
        early = self._early
        while self.cursor in early:
            found = early.pop(self.cursor)
            self.ordered.append(found)
            self.cursor += found.raw_size
        self.progress.set()
        if self.cursor >= self.end:
            self.done.set()

    async def wait(self, stall_timeout: float, connected: Callable[[], bool]) -> None:
        """Until the range is complete; :class:`RangeReadError` after ``stall_timeout`` s without a
        message, :class:`NSQError` once ``connected()`` has been false for :data:`LEADER_LOST_AFTER` s."""
        loop = asyncio.get_running_loop()
        while not self.done.is_set():
            self.progress.clear()
            stalled_at = loop.time() + stall_timeout
            lost_since: float | None = None
            while not self.progress.is_set():
                now = loop.time()
                if now >= stalled_at:
                    raise RangeReadError(
                        f"no message for {stall_timeout:.1f} s (option 'readStallTimeoutMs') at offset {self.cursor} "
                        f"of range {self.start}..{self.end}"
                    )
                if connected():
                    lost_since = None
                elif lost_since is None:
                    lost_since = now
                elif now - lost_since >= LEADER_LOST_AFTER:
                    raise NSQError(f"the connection to the leader closed at offset {self.cursor} of range "
                                   f"{self.start}..{self.end} and did not come back within {LEADER_LOST_AFTER:.0f} s")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.progress.wait(), min(_CHECK_EVERY, stalled_at - now))


async def read_range(options: SourceOptions, plan: RangePlan) -> list[Any]:
    """The range's messages, in offset order.

    A read that a leader answered and that did not complete (no message for
    ``readStallTimeoutMs``, a refused channel) counts: the third fails the task with
    :class:`RangeReadError` (Spark retries it). A partition without a leader that answers (the
    lookupd lists none, or the node it lists is down: a leader's outage) does not count: it is
    asked again every second or two until one answers, for up to ``leaderWaitTimeoutMs``.
    """
    loop = asyncio.get_running_loop()
    leader = plan.leader
    failures: list[str] = []
    stalls = 0
    leaderless_since: float | None = None
    while True:
        try:
            if failures or not leader.tcp:
                leader = await _current_leader(options, plan.partition)
            rest = await _retained_rest(options, replace(plan, leader=leader))
            if rest is None:
                return []
            return await _read_once(options, rest, leader)
        except DataLossError:
            raise
        except RangeReadError as exc:  # the leader answered: the range did not come
            stalls += 1
            leaderless_since = None
            failures.append(f"{leader.tcp}: {exc}")
            if stalls >= ATTEMPTS:
                raise RangeReadError(f"topic {options.topic!r} partition {plan.partition}: range {plan.start.offset}.."
                                     f"{plan.end.offset} not read in {ATTEMPTS} attempts: "
                                     f"{'; '.join(failures[-ATTEMPTS:])}") from None
        except (NSQError, OSError) as exc:  # no leader listed, or the one listed does not answer
            failures.append(f"{leader.tcp or 'no leader'}: {exc}")
            now = loop.time()
            leaderless_since = now if leaderless_since is None else leaderless_since
            if now - leaderless_since > options.leader_wait_timeout:
                raise RangeReadError(
                    f"topic {options.topic!r} partition {plan.partition}: range {plan.start.offset}..{plan.end.offset}: "
                    f"no leader that answers for {now - leaderless_since:.0f} s (option 'leaderWaitTimeoutMs'): "
                    f"{failures[-1]}") from None
        logger.warning("topic %s partition %d range %d..%d: attempt %d failed on %s (%s)", options.topic,
                       plan.partition, plan.start.offset, plan.end.offset, len(failures), leader.tcp or "no leader",
                       failures[-1])
        await asyncio.sleep(min(0.5 * len(failures), 2.0))


async def _current_leader(options: SourceOptions, partition: int) -> Leader:
    planner = OffsetPlanner(options)
    try:
        return await planner.leader(partition)
    finally:
        await planner.close()


async def _retained_rest(options: SourceOptions, plan: RangePlan) -> RangePlan | None:
    planner = OffsetPlanner(options)
    try:
        return await planner.retained_rest(plan)
    finally:
        await planner.close()


async def _read_once(options: SourceOptions, plan: RangePlan, leader: Leader) -> list[Any]:
    topic, partition = options.topic, plan.partition
    channel = f"{options.channel}-{partition}-{uuid.uuid4().hex[:10]}#ephemeral"
    http = NsqdHTTP(timeout=10.0)
    collector = _Collector(plan.start.offset, plan.end.offset)
    consumer: Consumer | None = None
    try:
        try:
            await http.create_channel(leader.http, topic, partition, channel)
            await http.set_channel_offset(leader.http, topic, partition, channel, f"virtual_queue:{plan.start.offset}")
        except NsqdHTTPError as exc:
            raise RangeReadError(
                f"the leader would not make channel {channel!r} at offset {plan.start.offset} (the source needs "
                f"channel auto-create on the topic, and the range still on disk): {exc}"
            ) from exc
        consumer = Consumer(
            topic, channel, nsqd_tcp_addresses=[leader.tcp], handler=collector.take,
            **_consumer_kwargs(options, plan),
        )
        await consumer.start()
        await collector.wait(options.read_stall_timeout, lambda: bool(consumer.connections))
        return collector.ordered
    finally:
        if consumer is not None:
            await consumer.stop(timeout=5.0)
        await http.close()  # the channel is ephemeral: nsqd deletes it as the consumer leaves


def _consumer_kwargs(options: SourceOptions, plan: RangePlan) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(options.common.connection)
    kwargs.update(
        partition=plan.partition,
        enable_trace=True,  # SUB_ADVANCED: the offset and raw size of every message
        consume_ext=plan.ext,
        max_in_flight=options.max_in_flight,
        max_attempts=0,
        max_backoff_duration=0,
    )
    if options.msg_timeout_ms is not None:
        kwargs["msg_timeout"] = options.msg_timeout_ms / 1000
    return kwargs
