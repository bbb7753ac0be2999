"""Durations reported to users are measured with a real clock, not the event loop's.

uvloop's ``loop.time()`` is libuv's loop time: milliseconds, cached once per loop pass.
A publish round trip on loopback (well under a millisecond) measured with it reads 0.0,
or 0.001 when a tick falls in between (issue 36). These tests run on uvloop, through
``fastnsq.run``, against the embedded nsqd started on that loop, or the real one of
``FASTNSQ_TEST_NSQD`` (``python -m fastnsq.testing.real BIN_DIR -- pytest ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

import fastnsq
from fastnsq import Consumer, Producer
from fastnsq.testing import NSQD, external_nsqd_from_env, external_servers_configured

from .helpers import unique

uvloop = pytest.importorskip("uvloop", reason="the millisecond loop clock is uvloop's")

T = TypeVar("T")
PUBLISHES = 20


@contextlib.asynccontextmanager
async def nsqd_address() -> AsyncIterator[str]:
    """The real nsqd when one is configured, else an embedded one on the running loop."""
    external = external_nsqd_from_env()
    if external is not None:
        yield external.tcp_address
        return
    if external_servers_configured():
        pytest.skip("real servers are configured, but no nsqd")
    async with NSQD() as nsqd:
        yield nsqd.tcp_address


def on_uvloop(scenario: Callable[[str], Awaitable[T]]) -> T:
    async def main() -> T:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with nsqd_address() as address:
            return await scenario(address)

    return fastnsq.run(main())


def is_whole_milliseconds(seconds: float) -> bool:
    """What a difference of two readings of a millisecond clock looks like (to float error)."""
    return abs(seconds * 1000 - round(seconds * 1000)) < 1e-6


def test_publish_round_trips_are_timed_below_a_millisecond() -> None:
    async def scenario(address: str) -> tuple[list[float], list[float]]:
        observed: list[float] = []
        calls: list[float] = []
        async with Producer([address]) as producer:
            producer.set_round_trip_observer(observed.append)
            topic = unique("rtt")
            for i in range(PUBLISHES):  # one at a time: one write, one answer, one observation each
                began = time.perf_counter()
                await producer.publish(topic, b"%d" % i)
                calls.append(time.perf_counter() - began)
        return observed, calls

    observed, calls = on_uvloop(scenario)
    assert len(observed) == PUBLISHES
    assert all(seconds > 0 for seconds in observed), observed
    # Seconds, and the round trip inside its publish() call: no longer than the call as the
    # test timed it (how short a loopback round trip is, is bench/'s to say; load makes it long).
    assert all(rtt <= call + 1e-6 for rtt, call in zip(observed, calls)), (observed, calls)
    assert not all(is_whole_milliseconds(seconds) for seconds in observed), observed


def test_publish_round_trip_histogram_has_a_real_sum() -> None:
    prometheus_client = pytest.importorskip("prometheus_client", reason="metrics need the 'metrics' extra")
    from fastnsq.metrics import NSQMetrics

    registry = prometheus_client.CollectorRegistry()

    async def scenario(address: str) -> list[float]:
        metrics = NSQMetrics(registry)
        topic = unique("rtt")  # one topic: creating one costs a real nsqd an fsync of its metadata
        calls: list[float] = []
        async with Producer([address]) as producer:
            metrics.track(producer, name="rtt")
            for i in range(5):
                began = time.perf_counter()
                await producer.publish(topic, b"%d" % i)
                calls.append(time.perf_counter() - began)
        return calls

    calls = on_uvloop(scenario)
    get = registry.get_sample_value
    labels = {"producer": "rtt"}
    assert get("nsq_producer_publish_round_trip_seconds_count", labels) == 5
    total = get("nsq_producer_publish_round_trip_seconds_sum", labels)
    # Seconds, each round trip inside its publish() call as the test timed it.
    assert 0 < total <= sum(calls) + 1e-6 and not is_whole_milliseconds(total), (total, calls)
    # Each observation in its bucket: at least as many at or below a bound as calls that took no longer.
    from prometheus_client.utils import floatToGoString

    from fastnsq.metrics import ROUND_TRIP_BUCKETS

    for le in ROUND_TRIP_BUCKETS:
        bucket = get("nsq_producer_publish_round_trip_seconds_bucket", {**labels, "le": floatToGoString(le)})
        assert bucket >= sum(call <= le for call in calls), (le, bucket, calls)


def test_stop_report_duration_is_not_whole_milliseconds() -> None:
    async def scenario(address: str) -> Any:
        topic = unique("stop")
        async with Producer([address]) as producer:
            await producer.publish(topic, b"one")
        got: list[bytes] = []
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[address], handler=lambda m: got.append(m.body))
        await consumer.start()
        while not got:
            await asyncio.sleep(0.01)
        began = time.perf_counter()
        report = await consumer.stop()
        return report, time.perf_counter() - began

    runs = [on_uvloop(scenario) for _ in range(3)]
    durations = [report.duration for report, _ in runs]
    # Seconds, no longer than the stop() call as the test timed it.
    assert all(0 < report.duration <= call + 1e-6 for report, call in runs), runs
    assert not all(is_whole_milliseconds(d) for d in durations), durations


def test_ha_node_stats_average_round_trip_is_timed_below_a_millisecond() -> None:
    """``node_stats()`` (go-nsq's ``Stat()``): after one publish, its average is that round trip."""
    if external_servers_configured():
        pytest.skip("an embedded HA nsqd on the test's uvloop")

    async def main() -> float:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with NSQD(ha=True) as nsqd:
            topic = unique("rtt")
            nsqd.create_topic(topic, 1)
            async with Producer([nsqd.tcp_address]) as producer:
                began = time.perf_counter()
                await producer.publish(topic, b"one", partition=0)
                call = time.perf_counter() - began
                return producer.node_stats()[nsqd.tcp_address].avg_rt, call

    average, call = fastnsq.run(main())
    # Seconds: the one round trip, inside the publish() call as the test timed it.
    assert 0 < average <= call + 1e-6 and not is_whole_milliseconds(average), (average, call)
