"""The express lane: low latency at low rates from an nsqd that buffers its output.

nsqd writes a connection's message frames into a buffer of ``output_buffer_size``
bytes (16 KiB by default) and sends it when it is full, when the connection's
``output_buffer_timeout`` ticks (250 ms), or at once when the connection is no longer
ready (as many messages in flight as its RDY). With ``max_in_flight`` well above the
messages a consumer holds, at 1,000 msg/s of 100-byte messages the buffer fills in
about 120 ms, and that is what a message waits: full throughput, poor latency. An
unbuffered connection (``output_buffer_size=-1``) is the opposite: nsqd writes every
message by itself, at a cost in nsqd's CPU that grows with the rate.

nsqd fixes a connection's buffering at IDENTIFY, so the consumer keeps both kinds:
next to its buffered connections to an nsqd (upstream, not HA partitions), one
*express* connection, unbuffered, and it moves RDY between them by the rate it sees
from that nsqd, every ``TICK`` seconds:

* while messages arrive slower than ``max_rate`` (and the express connection is not
  full: in flight below 85 % of its RDY), the express connection holds RDY (at most
  ``reserve``) and the buffered ones RDY 0: a message is written as soon as nsqd has
  it;
* at ``max_rate`` and above, the buffered ones hold RDY (``max_in_flight`` less the
  reserve) and the express one RDY 0: nsqd fills its buffer within a few ms at such
  rates, and writes large blocks again.
* back to the express lane once the rate has stayed below half of ``max_rate`` for
  ``SETTLE_TICKS`` ticks, the buffered connections hold little in flight, and nsqd holds
  no backlog for the channel.

A low rate alone is no sign of a quiet topic: a consumer that is itself the bottleneck (a
CPU-bound handler, processes sharing the cores, a slow dependency) sees a low rate while
nsqd holds a backlog, and on the express lane (at most ``reserve`` in flight, a write per
message) it would stay slow for good, because a fast handler empties that connection at
once. What shows a backlog is how long messages waited: nsqd stamps each message when it
is published, and the freshest message of a tick that arrives well after its stamp waited
in nsqd's queue. The clocks of nsqd and of this host differ by an unknown offset, so the
wait is measured above a floor: the smallest stamp-to-arrival gap seen, which rises slowly
(``FLOOR_RISE``) so that a drifting clock is forgotten. A consumer leaves the express lane
as soon as the freshest message waited ``EXPRESS_WAIT`` above the floor, and does not come
back while messages wait longer than that plus nsqd's output buffer timeout (the most the
buffered connection itself holds a message); after each such exit it stays on the buffered
lane a while longer (``BACKLOG_HOLD``, doubling) so that a consumer right at its capacity
does not swing between the lanes.

The reserve (:meth:`fastnsq.rdy.RdyController.set_held`) keeps the move instant both
ways and ``max_in_flight`` whole: the held connection's share is kept back, never lent.
A consumer starts on its buffered connections (a backlog is drained at full speed
from the first message).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import ConnectionOptions, Endpoint, LoggerLike
from ..rdy import STARVED_RATIO, RdyController, RdyUpdate

__all__ = ["EXPRESS_RDY", "TICK", "ExpressLanes"]

#: How often the rate is looked at (seconds).
TICK = 0.025
#: How often, while max_in_flight leaves no express lane.
IDLE_TICK = 0.5
#: Ticks below half the rate before moving back to the express lane.
SETTLE_TICKS = 4
#: The most RDY an express connection holds, and the share of max_in_flight it may take.
EXPRESS_RDY = 100
EXPRESS_SHARE = 25  # a 25th: 4 %
#: Below this many (max_in_flight under 200 per nsqd) there is no express lane: it would hold too
#: few messages for a handler's round trips, or take too large a share from the buffered lane.
MIN_EXPRESS_RDY = 8
#: Seconds between attempts to open a lost express connection.
RETRY_DELAY = 1.0
#: How long the freshest message of a tick may have waited in nsqd (above the floor, seconds)
#: before the express lane is left: a backlog, or a consumer that cannot keep up.
EXPRESS_WAIT = 0.025
#: How fast the floor of stamp-to-arrival gaps rises (seconds per second): far above NTP's slew
#: (0.5 ms/s) and far below a backlog's growth.
FLOOR_RISE = 0.002
#: Seconds on the buffered lane after a backlog sent the consumer there (doubling up to the most).
BACKLOG_HOLD = 0.5
MAX_BACKLOG_HOLD = 30.0


@dataclass
class _Lane:
    endpoint: Endpoint
    express: Any = None  # its Link, once subscribed
    opening: asyncio.Task[None] | None = None
    express_mode: bool = False
    last_received: int = 0
    quiet_ticks: int = 0
    reserve: int = 0
    retry_at: float = 0.0
    bulk: list[Any] = field(default_factory=list)
    age_floor: float = math.inf  # the smallest stamp-to-arrival gap seen (rising by FLOOR_RISE)
    waited: float = 0.0  # how long the freshest message of the last tick waited above it
    entered_at: float = 0.0  # when the lane last moved to the express connection
    hold: float = BACKLOG_HOLD  # the next stay on the buffered lane after a backlog
    held_until: float = 0.0


class ExpressLanes:
    """One express connection per upstream nsqd endpoint, and the RDY moves between the lanes.

    The consumer calls :meth:`bulk_added` / :meth:`express_added` when a connection is
    subscribed, :meth:`closed` when one closes, and :meth:`close` when it stops; the
    lanes call back ``open_express(endpoint)`` to connect and ``apply(updates)`` to send
    RDY.
    """

    def __init__(
        self,
        rdy: RdyController,
        options: ConnectionOptions,
        *,
        max_rate: float,
        enabled: bool,
        open_express: Callable[[Endpoint], Awaitable[Any]],
        apply: Callable[[list[RdyUpdate]], None],
        log: LoggerLike,
    ) -> None:
        self._rdy = rdy
        # Unbuffered: nsqd writes each message at once (and ignores the timeout).
        self.options = options.replace(output_buffer_size=-1, output_buffer_timeout=-1)
        self.max_rate = max_rate
        # Pointless when the buffered connections are unbuffered already.
        self.enabled = enabled and options.output_buffer_size != -1
        # The longest the buffered connections' own buffer holds a message back in nsqd.
        self._buffer_wait = max(0.0, options.output_buffer_timeout)
        self._open_express = open_express
        self._apply = apply
        self._log = log
        self._lanes: dict[Endpoint, _Lane] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._ticked_at = 0.0
        self._closed = False

    # ---- what the consumer calls ---------------------------------------------------------

    def links(self) -> list[Any]:
        """The express connections' links (the consumer's other links are its own)."""
        return [lane.express for lane in self._lanes.values() if lane.express is not None]

    def owns(self, link: Any) -> bool:
        lane = self._lanes.get(link.endpoint)
        return lane is not None and lane.express is link

    def wants(self, link: Any, *, is_ha: bool, ordered: bool) -> bool:
        """Whether a buffered connection just subscribed gets an express lane beside it."""
        return self.enabled and not self._closed and not is_ha and not ordered and link.endpoint.partition is None

    def bulk_added(self, link: Any) -> None:
        """A buffered connection of an eligible endpoint is subscribed (and in the controller)."""
        self._loop = asyncio.get_running_loop()
        if not self._lanes:
            self._ticked_at = self._loop.time()
        lane = self._lanes.setdefault(link.endpoint, _Lane(link.endpoint))
        lane.bulk.append(link)
        if lane.express_mode:
            self._apply(self._rdy.set_held(link, True))
        self._arm()

    def hold_reserve(self) -> int:
        """The RDY an express connection holds, and its reserve: a small part of max_in_flight
        (0 when that part would be below MIN_EXPRESS_RDY: no express lane then)."""
        lanes = max(1, len(self._lanes))
        reserve = min(EXPRESS_RDY, self._rdy.max_in_flight // (EXPRESS_SHARE * lanes))
        return reserve if reserve >= MIN_EXPRESS_RDY else 0

    def express_added(self, link: Any) -> Any:
        """The express connection is subscribed: into the controller, held with its reserve.

        Returns the link; raises LookupError when its lane is gone meanwhile (the
        connection is closed then).
        """
        lane = self._lanes.get(link.endpoint)
        if lane is None or self._closed or lane.express is not None:
            assert self._loop is not None
            self._loop.create_task(link.conn.close())
            raise LookupError(f"no express lane wanted to {link.endpoint.address} now")
        lane.reserve = self.hold_reserve()
        max_rdy = min(lane.reserve, link.conn.max_rdy_count)
        updates = self._rdy.add_connection(link, max_rdy, held_reserve=lane.reserve)
        link.rdy_state = self._rdy.record(link)
        link.fast = True
        lane.express = link
        lane.last_received = self._received(lane)
        self._apply(updates)
        self._log.debug("express lane to %s open", link.endpoint.address)
        return link

    def closed(self, link: Any) -> None:
        """A connection closed (the controller has forgotten it)."""
        lane = self._lanes.get(link.endpoint)
        if lane is None:
            return
        if lane.express is link:
            lane.express = None
            if lane.express_mode:
                self._to_bulk(lane)
            assert self._loop is not None
            lane.retry_at = self._loop.time() + RETRY_DELAY
        elif link in lane.bulk:
            lane.bulk.remove(link)
            if not lane.bulk and lane.express is not None and self._loop is not None:
                # No buffered connection left to that nsqd: the consumer reconnects those, and
                # a new express lane opens beside the first.
                self._loop.create_task(lane.express.conn.close())
        if not lane.bulk and lane.express is None and lane.opening is None:
            del self._lanes[link.endpoint]

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for lane in self._lanes.values():
            if lane.opening is not None:
                lane.opening.cancel()

    # ---- the lanes -------------------------------------------------------------------------

    def _maybe_open(self, lane: _Lane) -> None:
        assert self._loop is not None
        if lane.express is None and lane.opening is None and lane.bulk and self._loop.time() >= lane.retry_at:
            lane.opening = self._loop.create_task(self._open(lane))

    async def _open(self, lane: _Lane) -> None:
        try:
            await self._open_express(lane.endpoint)
        except Exception as exc:  # noqa: BLE001 - any failure: the buffered lane carries on, retried later
            assert self._loop is not None
            lane.retry_at = self._loop.time() + RETRY_DELAY
            self._log.debug("express lane to %s: %s", lane.endpoint.address, exc)
        finally:
            lane.opening = None

    def _arm(self) -> None:
        if self._timer is None and not self._closed and self._loop is not None:
            # Without a reserve (max_in_flight too small) only a change of max_in_flight matters.
            self._timer = self._loop.call_later(TICK if self.hold_reserve() else IDLE_TICK, self._tick)

    def _tick(self) -> None:
        self._timer = None
        assert self._loop is not None
        now = self._loop.time()
        elapsed, self._ticked_at = max(1e-3, now - self._ticked_at), now
        for lane in list(self._lanes.values()):
            self._step(lane, elapsed, now)
        if self._lanes:
            self._arm()

    def _received(self, lane: _Lane) -> int:
        total = sum(link.received for link in lane.bulk)
        return total if lane.express is None else total + lane.express.received

    def _step(self, lane: _Lane, elapsed: float, now: float) -> None:
        """One tick of one nsqd: its rate and its messages' waits since the last tick decide the lane."""
        received = self._received(lane)
        rate = (received - lane.last_received) / elapsed
        lane.last_received = received
        self._measure_wait(lane, elapsed)
        reserve = self.hold_reserve()
        if lane.express is not None and reserve != lane.reserve:  # max_in_flight changed
            lane.reserve = reserve
            self._apply(self._rdy.set_max_rdy(lane.express, min(reserve, lane.express.conn.max_rdy_count)))
            if not lane.express_mode:
                self._apply(self._rdy.set_held(lane.express, True, reserve=reserve))
        if lane.express_mode:
            self._step_express(lane, rate, reserve, now)
            return
        bulk_in_flight = sum(self._rdy.connection_stats(link).in_flight for link in lane.bulk)
        quiet = (
            rate < self.max_rate / 2
            and bulk_in_flight * 2 <= reserve
            and lane.waited <= EXPRESS_WAIT + self._buffer_wait  # what the buffer itself holds back
            and now >= lane.held_until
        )
        lane.quiet_ticks = lane.quiet_ticks + 1 if quiet else 0
        if lane.quiet_ticks < SETTLE_TICKS or not reserve:
            return
        if lane.express is None:  # opened when first wanted: most consumers that never need one
            self._maybe_open(lane)
        else:
            self._log.debug("%s: %.0f msg/s, to the express lane", lane.endpoint.address, rate)
            self._to_express(lane, now)

    def _step_express(self, lane: _Lane, rate: float, reserve: int, now: float) -> None:
        if lane.waited > EXPRESS_WAIT:
            # A backlog (or a consumer behind its messages): the buffered lane drains it at full speed.
            if now - lane.entered_at >= MAX_BACKLOG_HOLD:  # a long quiet stay: start the doubling again
                lane.hold = BACKLOG_HOLD
            lane.held_until = now + lane.hold
            self._log.debug("%s: messages waited %.0f ms in nsqd, to the buffered lane for %.1f s",
                            lane.endpoint.address, lane.waited * 1000, lane.hold)
            lane.hold = min(lane.hold * 2, MAX_BACKLOG_HOLD)
            self._to_bulk(lane)
        elif rate >= self.max_rate or self._full(lane.express) or not reserve:
            self._log.debug("%s: %.0f msg/s, to the buffered lane", lane.endpoint.address, rate)
            self._to_bulk(lane)

    def _measure_wait(self, lane: _Lane, elapsed: float) -> None:
        """How long the freshest message since the last tick waited in nsqd, above the floor."""
        links = lane.bulk if lane.express is None else [*lane.bulk, lane.express]
        freshest = math.inf
        for link in links:
            freshest = min(freshest, link.freshest_age)
            link.freshest_age = math.inf
        if freshest == math.inf:  # nothing came: nsqd held nothing back from a connection with RDY
            lane.waited = 0.0
            return
        lane.age_floor = min(lane.age_floor + FLOOR_RISE * elapsed, freshest)
        lane.waited = freshest - lane.age_floor

    def _full(self, link: Any) -> bool:
        stats = self._rdy.connection_stats(link)
        return stats.rdy > 0 and stats.in_flight >= STARVED_RATIO * stats.rdy

    def _to_express(self, lane: _Lane, now: float) -> None:
        lane.express_mode = True
        lane.entered_at = now
        lane.quiet_ticks = 0
        for link in lane.bulk:  # lowered first: their share was never the reserve
            self._apply(self._rdy.set_held(link, True))
        self._apply(self._rdy.set_held(lane.express, False))

    def _to_bulk(self, lane: _Lane) -> None:
        lane.express_mode = False
        lane.quiet_ticks = 0
        if lane.express is not None:
            self._apply(self._rdy.set_held(lane.express, True, reserve=lane.reserve))
        for link in lane.bulk:
            self._apply(self._rdy.set_held(link, False))
