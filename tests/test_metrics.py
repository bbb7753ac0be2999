"""Prometheus metrics (fastnsq.metrics): the scraped figures equal what happened, labels stay bounded.

Against the nsqd the suite uses (embedded, or real through FASTNSQ_TEST_*): the counts are
checked against nsqd's own /stats where its HTTP address is known.
"""

from __future__ import annotations

import asyncio

import pytest

prometheus_client = pytest.importorskip("prometheus_client", reason="metrics need the 'metrics' extra")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fastnsq import Batch, Consumer, Producer
from fastnsq.metrics import NSQMetrics
from fastnsq.testing.proxy import FaultProxy

from .helpers import eventually, stats_json, topic_entry, unique

MESSAGES = 100_000


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by (sample name, sorted labels), through Prometheus' text format."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_scraped_counters_equal_what_happened(nsqd) -> None:
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    topic = unique("metrics")
    requeued_once: set[bytes] = set()

    def handle(message):
        if len(requeued_once) < 100 and message.body not in requeued_once and message.attempts == 1:
            requeued_once.add(message.body)
            message.requeue(0, backoff=False)

    async with Producer([nsqd.tcp_address]) as producer:
        metrics.track(producer, name="test")
        bodies = [b"%06d" % i for i in range(MESSAGES)]
        for start in range(0, MESSAGES, 1000):
            await asyncio.gather(*(producer.publish(topic, body) for body in bodies[start:start + 1000]))
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=2500)
        metrics.track(consumer)
        await consumer.start()
        try:
            await eventually(lambda: consumer.snapshot().finished == MESSAGES, timeout=120,
                             what=f"{MESSAGES} finished")
            samples = scrape(registry)
            # One buffered connection, and the express lane's once the consumer went quiet.
            connections = sum(1 for c in consumer.snapshot().connections if c.address == nsqd.tcp_address)
        finally:
            await consumer.stop()
        labels = {"topic": topic, "channel": "ch"}
        assert value(samples, "nsq_consumer_messages_finished_total", **labels) == MESSAGES
        assert value(samples, "nsq_consumer_messages_requeued_total", **labels) == 100
        assert value(samples, "nsq_consumer_messages_received_total", **labels) == MESSAGES + 100
        assert value(samples, "nsq_consumer_in_flight", **labels) == 0
        assert value(samples, "nsq_consumer_max_in_flight", **labels) == 2500
        assert connections in (1, 2)
        assert value(samples, "nsq_consumer_connections", nsqd=nsqd.tcp_address, **labels) == connections
        assert value(samples, "nsq_producer_messages_published_total", producer="test") == MESSAGES
        assert value(samples, "nsq_producer_messages_failed_total", producer="test") == 0
        writes = value(samples, "nsq_producer_publish_round_trip_seconds_count", producer="test")
        assert 0 < writes <= MESSAGES  # one observation per write, each carrying one or more publishes
        if nsqd.http_address:  # nsqd's own count: what it delivered on the channel, and what it took
            stats = topic_entry(await stats_json(nsqd.http_address, topic), topic)
            channel = next(c for c in stats["channels"] if c["channel_name"] == "ch")
            assert stats["message_count"] == value(samples, "nsq_producer_messages_published_total", producer="test")
            # nsqd counts a message into the channel once (a requeue does not count it again) and
            # each requeue apart: every message was finished once, 100 of them after a requeue.
            assert channel["message_count"] == value(samples, "nsq_consumer_messages_finished_total", **labels)
            assert channel["requeue_count"] == value(samples, "nsq_consumer_messages_requeued_total", **labels)
            assert channel["message_count"] + channel["requeue_count"] == value(
                samples, "nsq_consumer_messages_received_total", **labels)


async def channel_stats(nsqd, topic: str, channel: str = "ch") -> dict:
    stats = topic_entry(await stats_json(nsqd.http_address, topic), topic)
    return next(c for c in stats["channels"] if c["channel_name"] == channel)


async def test_answers_after_a_cut_count_as_dropped_as_nsqd_sees_them(nsqd) -> None:
    """Issue 36: the connection cut with 100 messages in flight, then their batch answered.
    nsqd never saw those FINs (in flight, then timed out): ``finished`` must not count them."""
    if not nsqd.http_address:
        pytest.skip("needs nsqd's /stats")
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    topic = unique("cut")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b"%03d" % i for i in range(300)])
    async with FaultProxy(nsqd.tcp_address) as proxy:
        # No reconnect within the test: nsqd's view of the cut connection stays still.
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[proxy.address], max_in_flight=300, msg_timeout=1.0,
                            reconnect_delay=60, max_reconnect_delay=60)
        metrics.track(consumer)
        await consumer.start()
        try:
            held = []
            async for batch in consumer.batches(max_size=100, max_wait=5.0):
                held.append(batch)
                if sum(map(len, held)) == 300:
                    break
            early = [m for batch in held for m in batch][:200]
            late = [m for batch in held for m in batch][200:]
            for message in early:
                message.finish()
            await eventually(lambda: _in_flight_is(nsqd, topic, 100), timeout=10, what="nsqd to take 200 FINs")
            proxy.cut()
            await eventually(lambda: not consumer.connections, timeout=10, what="the consumer to see the cut")
            Batch(late[:50]).finish()  # raises nothing: the connection is gone, the FINs with it
            Batch(late[50:]).requeue(0)
            snapshot = consumer.snapshot()
            samples = scrape(registry)
            # nsqd: the 100 stay in flight until msg_timeout, then time out back into the queue.
            await eventually(lambda: _timed_out_is(nsqd, topic, 100), timeout=30, what="nsqd to time 100 out")
            channel = await channel_stats(nsqd, topic)
        finally:
            await consumer.stop()
    # What nsqd finished: what entered the channel and is neither queued, in flight nor deferred.
    nsqd_finished = channel["message_count"] - channel["depth"] - channel["in_flight_count"] - channel["deferred_count"]
    assert (snapshot.finished, snapshot.requeued) == (nsqd_finished, channel["requeue_count"]) == (200, 0)
    assert channel["depth"] == 100
    assert (snapshot.finish_dropped, snapshot.requeue_dropped) == (50, 50)
    labels = {"topic": topic, "channel": "ch"}
    assert value(samples, "nsq_consumer_messages_finished_total", **labels) == 200
    assert value(samples, "nsq_consumer_messages_finish_dropped_total", **labels) == 50
    assert value(samples, "nsq_consumer_messages_requeued_total", **labels) == 0
    assert value(samples, "nsq_consumer_messages_requeue_dropped_total", **labels) == 50


async def _in_flight_is(nsqd, topic: str, count: int) -> bool:
    return (await channel_stats(nsqd, topic))["in_flight_count"] == count


async def _timed_out_is(nsqd, topic: str, count: int) -> bool:
    return (await channel_stats(nsqd, topic))["timeout_count"] == count


async def test_label_cardinality_stays_bounded_across_reconnects(nsqd) -> None:
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    async with FaultProxy(nsqd.tcp_address) as proxy:
        consumer = Consumer(unique("reconnects"), "ch", nsqd_tcp_addresses=[proxy.address], handler=lambda m: None,
                            reconnect_delay=0.001, max_reconnect_delay=0.01)
        metrics.track(consumer)
        await consumer.start()
        try:
            before = set(scrape(registry))
            for round_ in range(1, 101):
                proxy.cut()
                await eventually(lambda r=round_: consumer.snapshot().reconnects == r and consumer.connections,
                                 timeout=10, what=f"reconnect {round_}")
            samples = scrape(registry)
        finally:
            await consumer.stop()
    assert set(samples) == before  # the same series, whatever the client ports were
    assert value(samples, "nsq_consumer_reconnects_total", topic=consumer.topic, channel="ch") == 100


async def test_errors_by_code_and_untracking(nsqd) -> None:
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    async with Producer([nsqd.tcp_address], max_msg_size=2 * 1024 * 1024, max_retries=0) as producer:
        metrics.track(producer)
        with pytest.raises(Exception, match="E_BAD_MESSAGE"):
            await producer.publish(unique("big"), b"x" * (1024 * 1024 + 1))
        samples = scrape(registry)
        assert value(samples, "nsq_producer_errors_total", producer="default", code="E_BAD_MESSAGE") == 1
        metrics.untrack(producer)
        assert not [key for key in scrape(registry) if key[0].startswith("nsq_producer_messages")
                    and dict(key[1]).get("producer") == "default"]


async def test_every_error_code_has_a_series_at_zero_before_its_first(nsqd) -> None:
    """A rate() over a series that does not exist is empty, not 0, and an alert on it never
    fires: from the first scrape, each code nsqd may send a consumer or a producer is there at 0."""
    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    topic = unique("zero")
    async with Producer([nsqd.tcp_address]) as producer:
        metrics.track(producer, name="quiet")
        await producer.publish(topic, b"one")
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: None)
        metrics.track(consumer)
        async with consumer:
            await eventually(lambda: consumer.snapshot().finished == 1, 10, "the message finished")
            samples = scrape(registry)

    def series(name: str, codes: tuple[str, ...], **labels: str) -> dict[str, float | None]:
        return {code: samples.get((name, tuple(sorted({**labels, "code": code}.items())))) for code in codes}

    consumer_errors = series("nsq_consumer_errors_total", ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED",
                                                           "E_INVALID", "E_BAD_TOPIC"), topic=topic, channel="ch")
    producer_errors = series("nsq_producer_errors_total", ("E_PUB_FAILED", "E_MPUB_FAILED", "E_BAD_TOPIC",
                                                           "E_BAD_MESSAGE"), producer="quiet")
    assert set(consumer_errors.values()) == {0.0}, consumer_errors
    assert set(producer_errors.values()) == {0.0}, producer_errors
    from fastnsq.errors import CONSUMER_CODES, PRODUCER_CODES  # and every other code of the lists

    assert set(series("nsq_consumer_errors_total", CONSUMER_CODES, topic=topic, channel="ch").values()) == {0.0}
    assert set(series("nsq_producer_errors_total", PRODUCER_CODES, producer="quiet").values()) == {0.0}


def test_tracking_anything_else_is_refused() -> None:
    with pytest.raises(TypeError, match="Consumer or Producer, not str"):
        NSQMetrics(None).track("consumer")  # type: ignore[arg-type]


async def test_a_blocking_producer_is_tracked_with_its_threads_publishes(nsqd) -> None:
    """fastnsq.sync.Producer: the calling threads' publishes on their own connections count
    (published, connections) and time (the round-trip histogram) as the loop's do."""
    import threading

    from fastnsq.sync import Producer as BlockingProducer

    registry = CollectorRegistry()
    metrics = NSQMetrics(registry)
    topic = unique("blocking")

    def run() -> dict:
        with BlockingProducer([nsqd.tcp_address]) as producer:
            metrics.track(producer, name="wsgi")
            producer.publish(topic, b"first")  # the loop's: it validates the topic
            threads = [threading.Thread(target=lambda: [producer.publish(topic, b"m") for _ in range(50)])
                       for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return scrape(registry)

    samples = await asyncio.get_running_loop().run_in_executor(None, run)
    assert value(samples, "nsq_producer_messages_published_total", producer="wsgi") == 201
    assert value(samples, "nsq_producer_connections", producer="wsgi") >= 2  # the loop's and the threads'
    assert value(samples, "nsq_producer_publish_round_trip_seconds_count", producer="wsgi") >= 200
