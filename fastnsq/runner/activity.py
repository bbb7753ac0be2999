"""``--split-nsqd``: what a child tells the supervisor about its nsqd, so that work can move to an idle child.

One job: sampling the child's consumer. Every ``INTERVAL`` s the child reads its
connections' counters. An nsqd is *busy* while it delivered a message within the last
``WINDOW`` s (its channel has messages for this child: nsqd refills the RDY window as
fast as the handler answers), or while its connection is younger than that (just taken,
its first messages on their way). The child is *idle* when none of its nsqd is busy, it
holds no message in flight and it is not in backoff. The child sends the supervisor a new activity only when it
changes (and with every report); the supervisor moves an nsqd to an idle child
(:mod:`.shares`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

#: Seconds between two samples of the consumer's counters.
INTERVAL = 0.05
#: An nsqd that delivered within this many seconds is busy.
WINDOW = 0.2


class Activity:
    """The busy nsqd and idleness of one consumer, from its counters sampled over time."""

    def __init__(self, consumer: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self._clock = clock
        self._received: dict[str, int] = {}  # per nsqd: the received count at the last sample
        self._last_seen: dict[str, float] = {}  # per nsqd: when it last delivered (or was connected)
        self.state: dict[str, Any] = {"busy": [], "idle": False}

    def sample(self) -> bool:
        """Read the counters now; True if the activity changed."""
        now = self._clock()
        snapshot = self.consumer.snapshot()
        received: dict[str, int] = {}
        for connection in snapshot.connections:
            received[connection.address] = received.get(connection.address, 0) + connection.received
        for address, count in received.items():
            if address not in self._received or count != self._received[address]:
                self._last_seen[address] = now  # new connection, or messages since the last sample
        self._received = received
        for address in list(self._last_seen):
            if address not in received:
                del self._last_seen[address]  # let go of
        busy = sorted(a for a, seen in self._last_seen.items() if now - seen < WINDOW)
        # A consumer in backoff receives nothing by choice: not idle (it would slow a moved nsqd down).
        state = {"busy": busy, "idle": not busy and snapshot.in_flight == 0 and not snapshot.backoff_level}
        changed = state != self.state
        self.state = state
        return changed

    async def watch(self, changed: Callable[[], None]) -> None:
        """Sample every INTERVAL s; call ``changed()`` each time the activity changes."""
        while True:
            if self.sample():
                changed()
            await asyncio.sleep(INTERVAL)
