"""Trigger.AvailableNow's target on a topic nsqd is still moving into a new channel.

nsqd's /stats reads a channel's depth before its topic's, so one answer taken while the
topic's pump runs can miss the messages in transit. The target is what a run delivers before
it stops: one short, and the last message stays behind for the next run (seen on a real
nsqd 1.3.0: 29,999 of 30,000 delivered by a cluster source). Here the answers are scripted,
as such a read gives them; no Spark and no socket are involved.
"""

from __future__ import annotations

from typing import Any

import pytest

from fastnsq.spark import _runtime
from fastnsq.spark._options import parse_source


def test_the_target_is_read_after_an_answer_that_showed_the_topic_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([
        {"depth": 20_000, "in_flight": 0, "clients": 0, "topic_depth": 10_000},  # the pump moving them
        {"depth": 29_999, "in_flight": 0, "clients": 0, "topic_depth": 0},  # torn: the last one in transit
        {"depth": 30_000, "in_flight": 0, "clients": 0, "topic_depth": 0},
        {"depth": 30_000, "in_flight": 0, "clients": 0, "topic_depth": 0},
    ])
    read: list[dict[str, int]] = []

    def scripted(address: str, topic: str, channel: str) -> dict[str, int]:
        read.append(next(answers))
        return read[-1]

    created: list[Any] = []
    monkeypatch.setattr(_runtime, "_channel_stats", scripted)
    monkeypatch.setattr(_runtime, "_create_channel", lambda *args: created.append(args))
    options = parse_source({"nsqd": "127.0.0.1:4150", "nsqdHttp": "127.0.0.1:4151", "topic": "t", "channel": "c"})
    assert _runtime.available_now_backlog(options) == 30_000
    assert created == [("127.0.0.1:4151", "t", "c")] and len(read) == 3
