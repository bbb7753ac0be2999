"""fastnsq.testing.drain: when a channel has consumed what was published, from nsqd's /stats.

The answers below are what a real nsqd 1.3.0 gave in the failing runs of issue 52 (to-file on a
loaded machine), cut to the fields that matter: each one read as "drained" by the channel's own
counts while the messages were still in nsqd.
"""

from __future__ import annotations

from typing import Any

from fastnsq.testing import drain
from fastnsq.testing.drain import channel_counts, is_drained

from .helpers import unique
from .test_consumer import publish_spread


def _answer(topic_depth: int, **channel: int) -> dict[str, Any]:
    entry = {"channel_name": "nsq_to_file", "depth": 0, "in_flight_count": 0, "deferred_count": 0,
             "message_count": 0, **channel}
    return {"topics": [{"topic_name": "t", "depth": topic_depth, "channels": [entry]}]}


def test_a_channel_just_made_by_the_apps_sub_is_not_drained() -> None:
    """The topic's pump had not yet moved the backlog: the channel's own counts all read 0."""
    fresh = _answer(3000)
    assert not is_drained(channel_counts([fresh], "t", "nsq_to_file"), 3000)


def test_an_answer_read_across_the_pump_is_not_drained() -> None:
    """nsqd read depth and in flight before the pump moved the 3000 and message_count after:
    the counts agree, but only a second answer (read after that message_count) can say so."""
    torn = _answer(0, message_count=3000)
    assert not is_drained(channel_counts([torn], "t", "nsq_to_file"), 3001)  # short of the published count
    assert is_drained(channel_counts([torn], "t", "nsq_to_file"), 3000)  # why two answers are asked for


def test_counts_add_up_over_nodes_and_leave_an_ha_topics_depth_out() -> None:
    nodes = [_answer(0, message_count=1000), _answer(0, message_count=2000, in_flight_count=3)]
    counts = channel_counts(nodes, "t", "nsq_to_file")
    assert (counts.found, counts.taken, counts.left_in_channel, counts.left_in_topic) == (True, 3000, 3, 0)
    ha = _answer(123_456, message_count=3000)  # youzan: the topic's depth is the bytes it stores
    ha["topics"][0]["topic_partition"] = "0"
    assert is_drained(channel_counts([ha], "t", "nsq_to_file"), 3000)
    assert not channel_counts([ha], "other", "nsq_to_file").found


async def test_on_a_server_a_backlog_in_the_topic_is_not_drained(nsqd) -> None:
    """Published before any channel: the messages wait in the topic; a channel made now is not
    drained until a consumer takes them (here, none does)."""
    topic = unique("drain")
    await publish_spread([nsqd.tcp_address], topic, 50)
    assert not await drain.channel_drained(nsqd.http_address, topic, "nsq_to_file", published=50)
