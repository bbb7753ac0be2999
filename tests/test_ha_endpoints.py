"""One partition, direct (nsqd, partition) endpoints, ext by hand, trace subscription, the blocking facade.

youzan/go-nsq's NewPartitionConsumer, ConnectToNSQD(addr, part), SetConsumeExt and EnableTrace,
and every HA argument through ``fastnsq.sync``; on the embedded HA cluster and a real one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

from fastnsq import Consumer, Producer, TracedResponse, sync
from fastnsq.consumer.positions import ConsumeOffset
from fastnsq.errors import InvalidValueError

from .helpers import eventually, unique

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4


async def placed_topic(cluster: Any, *, ext: bool = False, channels: tuple[str, ...] = ("ch",)
                       ) -> tuple[str, dict[int, str]]:
    topic = unique("ep")
    placed = await cluster.create_topic(topic, partitions=PARTITIONS, ext=ext, channels=list(channels))
    return topic, {p: (cluster.tcp_addresses[v] if isinstance(v, int) else v) for p, v in placed.items()}


async def fill(cluster: Any, topic: str, per_partition: int = 5, **options: Any) -> dict[int, list[TracedResponse]]:
    answers: dict[int, list[TracedResponse]] = {p: [] for p in range(PARTITIONS)}
    async with Producer(lookupd_http_addresses=cluster.lookupd_http_addresses) as producer:
        for seq in range(per_partition):
            for p in range(PARTITIONS):
                answers[p].append(await producer.publish(topic, b"%d-%d" % (p, seq), partition=p, trace_id=seq + 1,
                                                         **options))
    return answers


async def test_a_single_partition_consumer_reads_only_its_partition(nsq_cluster_ha: Any) -> None:
    topic, _ = await placed_topic(nsq_cluster_ha)
    await fill(nsq_cluster_ha, topic)
    got: list[Any] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses, partition=2,
                        handler=got.append, max_in_flight=10, lookupd_poll_interval=0.5)
    await consumer.start()
    await eventually(lambda: len(got) >= 5, timeout=20)
    await asyncio.sleep(1.0)  # a poll or two: nothing from the other partitions
    await consumer.stop()
    assert sorted(m.body for m in got) == [b"2-%d" % s for s in range(5)]
    assert [state.partition for state in consumer.partitions.values()] == [2]


async def test_direct_endpoints_name_their_partition(nsq_cluster_ha: Any) -> None:
    topic, leaders = await placed_topic(nsq_cluster_ha)
    await fill(nsq_cluster_ha, topic)
    got: list[Any] = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[(leaders[1], 1), (leaders[3], 3)], handler=got.append,
                        max_in_flight=10)
    await consumer.start()
    await eventually(lambda: len(got) >= 10, timeout=20)
    await asyncio.sleep(0.5)
    await consumer.stop()
    assert Counter(m.partition for m in got) == {1: 5, 3: 5}
    assert sorted(m.body for m in got) == sorted(b"%d-%d" % (p, s) for p in (1, 3) for s in range(5))


async def test_consume_ext_where_no_lookupd_says(nsq_cluster_ha: Any) -> None:
    topic, leaders = await placed_topic(nsq_cluster_ha, ext=True)
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await producer.publish(topic, b"with a header", partition=0, ext={"k": "v"})
    got: list[Any] = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[(leaders[0], 0)], consume_ext=True, handler=got.append)
    await consumer.start()
    await eventually(lambda: got, timeout=20)
    await consumer.stop()
    assert got[0].body == b"with a header" and got[0].ext == {"k": "v"}


async def test_without_consume_ext_the_ext_topic_refuses_the_subscribe(
    nsq_cluster_ha: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topic, leaders = await placed_topic(nsq_cluster_ha, ext=True)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[(leaders[0], 0)], handler=lambda m: None,
                        reconnect_delay=5, max_reconnect_delay=5)
    await consumer.start()
    assert consumer.connections == []
    assert "E_SUB_EXTEND_NEED" in caplog.text  # the server refused the SUB and closed the connection
    await consumer.stop()


async def test_trace_subscription_gives_offsets_without_ordering(nsq_cluster_ha: Any) -> None:
    topic, _ = await placed_topic(nsq_cluster_ha)
    answers = await fill(nsq_cluster_ha, topic, per_partition=10)
    held: list[Any] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        enable_trace=True, max_in_flight=100, lookupd_poll_interval=0.5)
    await consumer.start()
    iterator = consumer.__aiter__()
    while len(held) < PARTITIONS * 10:
        held.append(await asyncio.wait_for(iterator.__anext__(), 20))  # held, not finished yet
    for message in held:
        message.finish()
    await asyncio.sleep(0.2)
    await consumer.stop()
    # Every message in flight at once (ordered consumption would give one per partition) ...
    assert consumer.snapshot().finished == PARTITIONS * 10
    by_id = {(m.partition, m.trace_id): m for m in held}
    for p, traced in answers.items():
        for seq, answer in enumerate(traced):
            message = by_id[(p, seq + 1)]
            # ... and each with the queue offset and raw size its publish answered.
            assert (message.offset, message.raw_size, message.internal_id) == (answer.offset, answer.size,
                                                                             answer.internal_id)


def test_bad_endpoint_options_name_the_option() -> None:
    with pytest.raises(InvalidValueError, match="partition=-1 is outside the accepted range 0..2147483647"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], partition=-1)
    with pytest.raises(InvalidValueError, match=r"\('host:port', partition\)"):
        Consumer("t", "c", nsqd_tcp_addresses=[("127.0.0.1:4150",)])
    with pytest.raises(InvalidValueError, match="names partition 2 but the consumer reads partition 1"):
        Consumer("t", "c", nsqd_tcp_addresses=[("127.0.0.1:4150", 2)], partition=1)
    with pytest.raises(InvalidValueError, match="consume_ext must be True or False, or None"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], consume_ext="yes")


# ---- the blocking facade ---------------------------------------------------------------------------


async def test_the_blocking_facade_publishes_and_consumes_with_every_ha_argument(nsq_cluster_ha: Any) -> None:
    topic, _ = await placed_topic(nsq_cluster_ha, ext=True, channels=("ch", "late"))
    lookupd = nsq_cluster_ha.lookupd_http_addresses

    def publish_all() -> list[Any]:
        with sync.Producer(lookupd_http_addresses=lookupd, topics_for_compress=[topic],
                           message_size_for_compress=64, client_compress_decodec="snappy") as producer:
            results = [
                producer.publish(topic, b"p0", partition=0, ext={}),
                producer.publish(topic, b"keyed", sharding_key="user-1", ext={"k": "s"}),
                producer.publish(topic, b"traced", partition=1, trace_id=99, ext={"k": "t"}),
                producer.publish(topic, b"x" * 200, partition=2, ext={"k": "big"}),
                producer.mpublish(topic, [b"m1", b"m2"], partition=3, exts=[{"i": "1"}, {"i": "2"}]),
            ]
            future = producer.publish_async(topic, b"async", partition=3, ext={"k": "a"})
            results.append(future.result(30))
            return results

    results = await asyncio.get_running_loop().run_in_executor(None, publish_all)
    assert isinstance(results[2], TracedResponse) and results[2].trace_id == 99
    got: dict[bytes, Any] = {}
    lock = threading.Lock()

    def handle(message: Any) -> None:
        with lock:
            got[message.body] = (message.partition, message.ext, message.offset)

    def consume() -> Any:
        consumer = sync.Consumer(topic, "late", handler=handle, workers=2, lookupd_http_addresses=lookupd,
                                 consume_offset=ConsumeOffset.msg_count(1), enable_trace=True,
                                 lookupd_poll_interval=0.5)
        consumer.start()
        deadline = time.monotonic() + 30
        while len(got) < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        consumer.pause_partition(0)
        consumer.resume_partition(0)
        starts = {state.partition: state.start_applied for state in consumer.partitions.values()}
        consumer.stop()
        return starts

    starts = await asyncio.get_running_loop().run_in_executor(None, consume)
    assert set(got) == {b"p0", b"keyed", b"traced", b"x" * 200, b"m1", b"m2", b"async"}
    assert got[b"x" * 200][1] == {"k": "big"}  # compressed on the way, transparent to the handler
    assert got[b"traced"][1] == {"k": "t", "##trace_id": "99"} and got[b"m2"][0] == 3
    assert all(offset is not None for _, _, offset in got.values())  # enable_trace
    assert starts == {p: True for p in range(PARTITIONS)}
