"""Where a publish goes while lookupd's answer changes: the producer's Router on scripted routes.

The routes stand for what nsqlookupd answers during an HA failover (a partition whose leader died
is not listed until another is elected); the Router is the real one, its lookups counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fastnsq.errors import InvalidValueError, NoConnectionError
from fastnsq.producer.routing import Router
from fastnsq.sharding import murmur3_32
from fastnsq.topology import TopicRoute


class ScriptedTopology:
    """lookupd's answers, one per refresh (the last repeats); ``asked`` counts the refreshes."""

    def __init__(self, *routes: TopicRoute) -> None:
        self._routes = list(routes)
        self.route = self._routes.pop(0)
        self.asked = 0

    def cached(self, topic: str) -> TopicRoute:
        return self.route

    async def refresh(self, topic: str) -> TopicRoute:
        await asyncio.sleep(0.01)  # lookupd's answer takes a moment (the real poller: 2 a second at most)
        self.asked += 1
        if self._routes:
            self.route = self._routes.pop(0)
        return self.route


class Pool:
    async def add_nodes(self, addresses: list[str]) -> None:
        pass

    def connected_to(self, address: str | None) -> bool:
        return True


def route(*pids: int) -> TopicRoute:
    return TopicRoute("t", partitions={pid: f"n{pid}:4150" for pid in pids}, partition_num=4, is_ha=True)


def router(topology: Any) -> Router:
    return Router(topology, Pool(), murmur3_32)  # type: ignore[arg-type]


async def test_a_partition_without_a_listed_leader_is_looked_up_until_one_is() -> None:
    """It raised InvalidValueError ("has no partition 1"), an input error for a transient state,
    until the cached route expired (issue 61)."""
    topology = ScriptedTopology(route(0, 2, 3), route(0, 2, 3), route(0, 1, 2, 3))
    deadline = asyncio.get_running_loop().time() + 30
    assert await router(topology).target("t", 1, None, deadline) == ("n1:4150", 1)
    assert topology.asked == 2  # asked again until lookupd listed partition 1's leader


async def test_a_partition_without_a_leader_until_the_deadline_is_a_connection_error() -> None:
    topology = ScriptedTopology(route(0, 2, 3))
    deadline = asyncio.get_running_loop().time() + 0.2
    with pytest.raises(NoConnectionError, match=r"partition 1 of topic 't' \(partitions with a leader: \[0, 2, 3\]\)"):
        await router(topology).target("t", 1, None, deadline)
    assert topology.asked >= 2


async def test_a_partition_the_topic_does_not_have_is_an_input_error() -> None:
    topology = ScriptedTopology(route(0, 1, 2, 3))
    with pytest.raises(InvalidValueError, match="no partition 9"):
        await router(topology).target("t", 9, None, asyncio.get_running_loop().time() + 30)
    assert topology.asked == 0


async def test_a_short_route_is_asked_for_again_while_publishes_go_to_the_other_partitions() -> None:
    """Round robin over the listed partitions kept the short route until it expired (the 60 s
    poll): partition 1 took no writes after lookupd listed it again (issue 61). Now a short route
    is asked for again in the background (the recovery rule's fast cadence) on any publish."""
    topology = ScriptedTopology(route(0, 2, 3), route(0, 2, 3), route(0, 1, 2, 3))
    routed = router(topology)
    deadline = asyncio.get_running_loop().time() + 30
    chosen: list[int | None] = []
    for _ in range(400):  # publishes with no partition named, ~10 ms apart
        chosen.append((await routed.target("t", None, None, deadline))[1])
        if 1 in chosen:
            break
        await asyncio.sleep(0.01)
    assert 1 in chosen, f"partition 1 never chosen after lookupd listed it ({topology.asked} lookups)"
    assert topology.asked == 2  # one poll per FAST_POLL[0] at most, not one per publish
    assert set(chosen[:2]) <= {0, 2, 3}


async def test_a_sharding_key_whose_partition_has_no_leader_waits_for_one() -> None:
    topology = ScriptedTopology(route(0, 2, 3), route(0, 2, 3), route(0, 1, 2, 3))
    key = next(k for k in range(100) if murmur3_32(str(k).encode()) % 4 == 1)
    deadline = asyncio.get_running_loop().time() + 30
    assert await router(topology).target("t", None, key, deadline) == ("n1:4150", 1)


@pytest.mark.parametrize("partition", [1, None], ids=["partition named", "round robin"])
async def test_an_ha_topic_with_no_partition_listed_waits_for_a_leader(partition: int | None) -> None:
    """With both replicas of partitions down, a real youzan lookupd listed no partition of the
    topic at all for a while (issue 61's two-leaders run): the Router took that for an upstream
    topic and sent the publishes to any nsqd of its pool, which has no such partition
    (TopicNotExistError, then the connection closed). It waits for a leader instead."""
    topology = ScriptedTopology(route(), route(), route(0, 1, 2, 3))
    deadline = asyncio.get_running_loop().time() + 30
    target = await router(topology).target("t", partition, None, deadline)
    assert target[0] is not None and target == (f"n{target[1]}:4150", target[1])
    assert partition is None or target[1] == partition
    assert topology.asked == 2


async def test_an_ha_topic_with_no_partition_listed_until_the_deadline_is_a_connection_error() -> None:
    topology = ScriptedTopology(route())
    deadline = asyncio.get_running_loop().time() + 0.2
    with pytest.raises(NoConnectionError, match=r"the partition of topic 't' \(partitions with a leader: \[\]\)"):
        await router(topology).target("t", None, None, deadline)
    assert topology.asked >= 2
