"""Per-partition gauges of an HA consumer (fastnsq.metrics): position, end and lag, against nsqd's /stats.

On the embedded HA cluster and on a real youzan cluster (``dev.py test --real-ha``), with the
same assertions: after a known number of messages is consumed, a scrape's figures equal the
offsets the publishes were answered with and what each partition's leader says in ``/stats``;
with the consumer paused the lag is exactly the messages published since; resumed, it reaches 0.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="metrics need the 'metrics' extra")

from prometheus_client import CollectorRegistry

from fastnsq import Consumer, Producer
from fastnsq.consumer.progress import parse_progress, progress_reader
from fastnsq.metrics import NSQMetrics

from .helpers import eventually, stats_json, unique
from .test_ha_positions import topic_with
from .test_metrics import scrape

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4
FIRST = 200  # messages per partition consumed first
LATER = 30  # messages per partition published while the consumer is paused
FIGURES = ("position", "end", "lag")


async def publish(producer: Producer, topic: str, count: int, ends: dict[int, int]) -> None:
    """``count`` traced messages on every partition; ``ends`` gets each partition's end after them."""
    for seq in range(count):
        for partition in range(PARTITIONS):
            answer = await producer.publish(topic, f"m-{partition}-{seq}".encode(), partition=partition, trace_id=1)
            ends[partition] = answer.offset + answer.size


def gauges(samples: dict, topic: str, channel: str) -> dict[int, dict[str, float]]:
    """{partition: {figure: value}} of the consumer's per-partition series in a scrape."""
    found: dict[int, dict[str, float]] = {}
    for (name, labels), sample in samples.items():
        labelled = dict(labels)
        for figure in FIGURES:
            if name == f"nsq_consumer_partition_{figure}" and labelled["topic"] == topic:
                assert labelled["channel"] == channel
                found.setdefault(int(labelled["partition"]), {})[figure] = sample
    return found


async def leader_figures(cluster: Any, leaders: dict[int, str], topic: str, channel: str) -> dict[int, dict]:
    """Each partition's topic and channel entry in its leader's own /stats."""
    figures = {}
    for partition, leader in leaders.items():
        http = cluster.http_addresses[cluster.tcp_addresses.index(leader)]
        stats = await stats_json(http, topic)
        entry = next(t for t in stats["topics"] if t["topic_partition"] == str(partition) and t["is_leader"])
        chan = next(c for c in entry["channels"] if c["channel_name"] == channel)
        figures[partition] = {"backend_depth": entry["backend_depth"], "depth": chan["depth"],
                              "depth_size": chan["depth_size"]}
    return figures


async def scraped(registry: CollectorRegistry, topic: str, channel: str) -> dict[int, dict[str, float]]:
    await asyncio.sleep(1.05)  # past the reader's max_age: this scrape asks the leaders again
    # A scrape comes from prometheus_client's own thread, which waits for the consumer's loop.
    return gauges(await asyncio.to_thread(scrape, registry), topic, channel)


def assert_matches_stats(got: dict[int, dict[str, float]], stats: dict[int, dict]) -> None:
    for partition, leader in stats.items():
        assert got[partition] == {
            "position": leader["backend_depth"] - leader["depth_size"],
            "end": leader["backend_depth"],
            "lag": leader["depth"],
        }, partition


@pytest.mark.parametrize("ordered", [False, True], ids=["sub", "ordered"])
async def test_partition_gauges_follow_the_leaders_stats(nsq_cluster_ha: Any, ordered: bool) -> None:
    cluster = nsq_cluster_ha
    channel = "metrics"
    topic, leaders = await topic_with(cluster, (channel,), partitions=PARTITIONS)
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    got: list[Any] = []
    ends: dict[int, int] = {}
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        await publish(producer, topic, FIRST, ends)
        consumer = Consumer(topic, channel, lookupd_http_addresses=cluster.lookupd_http_addresses,
                            handler=lambda message: got.append(message.partition), max_in_flight=50,
                            lookupd_poll_interval=0.5, ordered=ordered)
        metrics.track(consumer)
        await consumer.start()
        try:
            await eventually(lambda: len(got) == PARTITIONS * FIRST, timeout=60, what="the first messages")
            # Caught up: the channel is at each partition's end, which the publishes' answers gave.
            first = await scraped(registry, topic, channel)
            assert first == {p: {"position": ends[p], "end": ends[p], "lag": 0} for p in range(PARTITIONS)}
            assert_matches_stats(first, await leader_figures(cluster, leaders, topic, channel))

            # Paused: the end moves on, the position stays, the lag is what was published since.
            consumer.set_max_in_flight(0)
            await asyncio.sleep(0.5)
            caught_up = dict(ends)
            await publish(producer, topic, LATER, ends)

            async def published() -> bool:
                stats = await leader_figures(cluster, leaders, topic, channel)
                return all(stats[p]["backend_depth"] == ends[p] and stats[p]["depth"] == LATER for p in stats)

            await eventually(published, timeout=30, what="the later messages in the leaders' /stats")
            paused = await scraped(registry, topic, channel)
            assert paused == {p: {"position": caught_up[p], "end": ends[p], "lag": LATER} for p in range(PARTITIONS)}
            assert_matches_stats(paused, await leader_figures(cluster, leaders, topic, channel))
            assert len(got) == PARTITIONS * FIRST

            # Resumed: the lag of every partition falls to 0 and the position reaches the end.
            consumer.set_max_in_flight(50)
            lags: list[float] = []

            async def caught_up_again() -> bool:
                figures = await scraped(registry, topic, channel)
                lags.append(sum(f["lag"] for f in figures.values()))
                return figures == {p: {"position": ends[p], "end": ends[p], "lag": 0} for p in range(PARTITIONS)}

            await eventually(caught_up_again, timeout=60, what="every partition's lag at 0")
            assert lags[-1] == 0 and len(got) == PARTITIONS * (FIRST + LATER)
            assert_matches_stats(await scraped(registry, topic, channel),
                                 await leader_figures(cluster, leaders, topic, channel))
        finally:
            await consumer.stop()


async def test_upstream_consumers_have_no_partition_series(nsqd: Any) -> None:
    """An upstream nsqd's topic has no partitions: no per-partition series, and no /stats asked."""
    topic = unique("up")
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    async with Producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"x")
    got: list[Any] = []
    consumer = Consumer(topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=got.append)
    metrics.track(consumer)
    async with consumer:
        await eventually(lambda: len(got) == 1)
        samples = await asyncio.to_thread(scrape, registry)
    assert samples[("nsq_consumer_messages_received_total", (("channel", "c"), ("topic", topic)))] == 1
    assert not [name for name, _ in samples if name.startswith("nsq_consumer_partition_")]


def test_parse_progress_reads_only_leaders_of_the_channel() -> None:
    stats = {"topics": [
        {"topic_name": "t", "topic_partition": "0", "backend_depth": 1300, "is_leader": True,
         "channels": [{"channel_name": "c", "depth": 3, "depth_size": 390}, {"channel_name": "d", "depth": 0,
                                                                              "depth_size": 0}]},
        {"topic_name": "t", "topic_partition": "1", "backend_depth": 900, "is_leader": False,
         "channels": [{"channel_name": "c", "depth": 9, "depth_size": 900}]},
        {"topic_name": "u", "topic_partition": "2", "backend_depth": 5, "is_leader": True,
         "channels": [{"channel_name": "c", "depth": 1, "depth_size": 5}]},
        {"topic_name": "t", "topic_partition": "3", "backend_depth": 0, "is_leader": True,
         "channels": [{"channel_name": "c", "depth": 0}]},  # no depth_size: not youzan's
    ]}
    found = parse_progress(stats, "t", "c")
    assert list(found) == [0]
    assert (found[0].position, found[0].end, found[0].lag) == (910, 1300, 3)


async def test_a_scrape_on_the_consumers_loop_reports_the_previous_read(nsq_cluster_ha: Any) -> None:
    """generate_latest() on the consumer's own loop cannot wait for the leaders: it starts a read
    and shows what the previous one found (nothing the first time)."""
    cluster = nsq_cluster_ha
    topic, _ = await topic_with(cluster, ("c",), partitions=2)
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    ends: dict[int, int] = {}
    got: list[Any] = []
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        for partition in range(2):
            answer = await producer.publish(topic, b"x", partition=partition, trace_id=1)
            ends[partition] = answer.offset + answer.size
    consumer = Consumer(topic, "c", lookupd_http_addresses=cluster.lookupd_http_addresses, handler=got.append,
                        max_in_flight=10, lookupd_poll_interval=0.5)
    metrics.track(consumer)
    async with consumer:
        await eventually(lambda: len(got) == 2, timeout=30)
        await asyncio.sleep(0.3)  # the FINs reach nsqd before the read below asks
        assert gauges(scrape(registry), topic, "c") == {}  # the read it started is not back yet
        await eventually(lambda: len(progress_reader(consumer).latest) == 2, timeout=10, what="the read's answer")
        assert gauges(scrape(registry), topic, "c") == {p: {"position": ends[p], "end": ends[p], "lag": 0}
                                                         for p in range(2)}
