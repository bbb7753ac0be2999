"""Whether a channel has consumed everything published to its topic, from nsqd's ``/stats``.

A channel's own counts of the moment are not enough, for two reasons seen on nsqd 1.3.0:

* A channel made by a consumer's SUB is filled by its topic's message pump. Right after the
  SUB the channel reads empty (depth, in flight and deferred all 0) while the topic still
  holds the whole backlog; a test that calls that "drained" stops its consumer with the
  messages still in nsqd (issue 52: an archive that looked like data loss).
* nsqd reads one answer's counts one after another (in flight, deferred, depth, then
  ``message_count``), while the pump goes on: one answer can show the channel's
  ``message_count`` already at the published count and its depth and in flight from before the
  pump moved the messages.

So a channel is drained when it has taken at least what was published (its ``message_count``,
summed over the nodes), nothing is left anywhere (the topic's depth, the channel's depth, in
flight and deferred), and that holds in two answers one after the other: the second answer's
counts are read after the first answer's ``message_count`` saw every message in the channel.

youzan's HA nsqd has no topic-to-channel pump (a channel reads the topic's partitions at its
own offset) and reports the topic's stored bytes as its depth; there the topic's depth is not
looked at, and ``message_count`` is the partition's.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ChannelCounts", "channel_counts", "channel_drained", "channel_drained_sync", "is_drained"]

#: What "nothing left" reads in a channel's entry.
_LEFT_IN_CHANNEL = ("depth", "in_flight_count", "deferred_count")


@dataclass(frozen=True)
class ChannelCounts:
    """One channel over every node asked: what it took, what is left in it and in its topic."""

    found: bool  # the channel exists on at least one node
    taken: int  # messages the channel took from its topic (message_count, summed)
    left_in_channel: int  # depth + in flight + deferred, summed
    left_in_topic: int  # upstream: the topics' depth, summed (0 for HA nodes)


def channel_counts(answers: Iterable[Mapping[str, Any]], topic: str, channel: str) -> ChannelCounts:
    """The counts of ``topic``/``channel`` in nsqd ``/stats?format=json`` answers (one a node)."""
    found, taken, in_channel, in_topic = False, 0, 0, 0
    for answer in answers:
        for entry in answer.get("topics") or []:
            if entry.get("topic_name") != topic:
                continue
            if "topic_partition" not in entry:  # upstream: the pump may still hold the backlog
                in_topic += int(entry.get("depth", 0))
            for chan in entry.get("channels") or []:
                if chan.get("channel_name") == channel:
                    found = True
                    taken += int(chan.get("message_count", 0))
                    in_channel += sum(int(chan.get(key, 0)) for key in _LEFT_IN_CHANNEL)
    return ChannelCounts(found, taken, in_channel, in_topic)


def is_drained(counts: ChannelCounts, published: int) -> bool:
    """One answer's verdict: the channel took ``published`` messages and none is left."""
    return counts.found and counts.taken >= published and counts.left_in_channel == 0 and counts.left_in_topic == 0


def _answer(http_address: str, topic: str) -> dict[str, Any]:
    url = f"http://{http_address}/stats?format=json&topic={topic}"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urllib.request.urlopen(request, timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data.get("data", data) if "status_code" in data else data  # youzan's envelope


def channel_drained_sync(http_addresses: str | Iterable[str], topic: str, channel: str, *, published: int) -> bool:
    """Whether ``channel`` of ``topic`` has consumed the ``published`` messages (two answers in a row)."""
    addresses = [http_addresses] if isinstance(http_addresses, str) else list(http_addresses)
    for _ in range(2):
        if not is_drained(channel_counts([_answer(a, topic) for a in addresses], topic, channel), published):
            return False
    return True


async def channel_drained(http_addresses: str | Iterable[str], topic: str, channel: str, *, published: int) -> bool:
    """:func:`channel_drained_sync` without blocking the event loop."""
    return await asyncio.to_thread(channel_drained_sync, http_addresses, topic, channel, published=published)
