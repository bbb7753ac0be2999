"""The status line nsq's apps print every ``--status-every`` messages (bitly's timer_metrics).

``[aggregate]: finished 250 - 99th: 1.20ms - 95th: 0.90ms - avg: 0.41ms``: the time from a
message's hand-over to its answer (the sink's acknowledgement), over the last ``every``
messages. We time a batch once and count it for each of its messages, so a line comes after
the batch that crosses the count. 0 turns it off.
"""

from __future__ import annotations

import sys
from typing import TextIO


class StatusLine:
    """Count answered messages and their times; print one line every ``every`` messages."""

    def __init__(self, every: int, prefix: str = "[aggregate]:", stream: TextIO | None = None) -> None:
        self.every = every
        self.prefix = prefix
        self.stream = stream
        self.timings: list[tuple[float, int]] = []  # (seconds, how many messages took that long)
        self.count = 0

    def record(self, seconds: float, messages: int) -> None:
        if not self.every or not messages:
            return
        self.timings.append((seconds, messages))
        self.count += messages
        if self.count >= self.every:
            self._print()

    def _print(self) -> None:
        timings = sorted(self.timings)
        total = sum(count for _, count in timings)

        def percentile(p: float) -> float:
            rank, seen = total * p / 100.0, 0
            for seconds, count in timings:
                seen += count
                if seen >= rank:
                    return seconds
            return timings[-1][0]

        average = sum(seconds * count for seconds, count in timings) / total
        print(f"{self.prefix} finished {total} - 99th: {percentile(99) * 1000:.02f}ms - 95th: "
              f"{percentile(95) * 1000:.02f}ms - avg: {average * 1000:.02f}ms",
              file=self.stream or sys.stderr, flush=True)
        self.timings, self.count = [], 0
