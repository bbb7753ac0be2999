"""Start positions on HA: SUB_ADVANCED's starts on the wire, and ``Consumer(consume_offset=...)``.

On the embedded HA cluster and on a real youzan cluster (``dev.py test --real-ha``), with the
same assertions: a consumer started at a time, a queue offset, a message count or the end
receives exactly what lies after that point (count and first offset per partition); a start
is taken only from the channel's first client, and the consumer says so when it is not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any

import pytest

from fastnsq import Consumer, Producer, TracedResponse
from fastnsq.consumer.positions import ConsumeOffset
from fastnsq.errors import InvalidValueError
from fastnsq.nsqd_http import NsqdHTTP

from .helpers import eventually, unique
from .test_embedded_ha import command, connect

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4
PER_PARTITION = 6


async def topic_with(cluster: Any, channels: tuple[str, ...], partitions: int = PARTITIONS) -> tuple[str, dict[int, str]]:
    topic = unique("pos")
    placed = await cluster.create_topic(topic, partitions=partitions, channels=list(channels))
    leaders = {p: (cluster.tcp_addresses[v] if isinstance(v, int) else v) for p, v in placed.items()}
    return topic, leaders


async def publish_round(producer: Producer, topic: str, tag: str, per_partition: int = PER_PARTITION,
                        partitions: int = PARTITIONS) -> dict[int, list[TracedResponse]]:
    """``per_partition`` traced messages on each partition, in order: {partition: answers}."""
    answers: dict[int, list[TracedResponse]] = defaultdict(list)
    for seq in range(per_partition):
        for partition in range(partitions):
            answer = await producer.publish(topic, f"{tag}-{partition}-{seq}".encode(), partition=partition,
                                            trace_id=1 + seq)
            answers[partition].append(answer)
    return answers


def received_by_partition(messages: list[Any]) -> dict[int, list[tuple[bytes, int]]]:
    got: dict[int, list[tuple[bytes, int]]] = defaultdict(list)
    for message in messages:
        got[message.partition].append((message.body, message.offset))
    return got


async def consume_until(cluster: Any, topic: str, channel: str, count: int, **options: Any) -> tuple[Consumer, list]:
    got: list[Any] = []
    options.setdefault("max_in_flight", 50)
    consumer = Consumer(topic, channel, lookupd_http_addresses=cluster.lookupd_http_addresses,
                        handler=got.append, lookupd_poll_interval=0.5, **options)
    await consumer.start()
    await eventually(lambda: len(got) >= count, timeout=30, what=f"{count} messages")
    await asyncio.sleep(0.5)  # and nothing more
    return consumer, got


def assert_exactly(got: list[Any], expected: dict[int, list[TracedResponse]], tag: str) -> None:
    """Exactly the messages of round ``tag``, in order per partition, starting at its first offset."""
    by_partition = received_by_partition(got)
    assert set(by_partition) == set(expected)
    for partition, answers in expected.items():
        bodies = [body for body, _ in by_partition[partition]]
        assert bodies == [f"{tag}-{partition}-{seq}".encode() for seq in range(len(answers))], partition
        offsets = [offset for _, offset in by_partition[partition]]
        assert offsets == [answer.offset for answer in answers], partition


async def wait_for_next_second() -> int:
    """Sleep into the next whole second of the clock (the server's, on loopback); return it."""
    second = int(time.time()) + 1
    await asyncio.sleep(second - time.time() + 0.05)
    return second


# ---- the Consumer ------------------------------------------------------------------------------


async def test_a_start_at_a_timestamp_gets_exactly_what_was_published_from_then(nsq_cluster_ha: Any) -> None:
    # "late" exists and holds the earlier round too: its reader holds a message from before the start.
    topic, _ = await topic_with(nsq_cluster_ha, ("late",))
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await publish_round(producer, topic, "before")
        second = await wait_for_next_second()
        after = await publish_round(producer, topic, "after")
    consumer, got = await consume_until(nsq_cluster_ha, topic, "late", PARTITIONS * PER_PARTITION,
                                        consume_offset=ConsumeOffset.timestamp(second))
    await consumer.stop()
    assert_exactly(got, after, "after")
    for state in consumer.partitions.values():
        assert state.start == ConsumeOffset("timestamp", second) and state.start_applied is True
        assert state.start_skipped <= 1  # the held message, finished unseen


async def test_a_start_at_a_queue_offset_per_partition(nsq_cluster_ha: Any) -> None:
    topic, _ = await topic_with(nsq_cluster_ha, ("late",))
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        answers = await publish_round(producer, topic, "m")
    cut = {partition: 1 + partition for partition in range(PARTITIONS)}  # a different start in each
    starts = {p: ConsumeOffset.virtual_queue(answers[p][cut[p]].offset) for p in range(PARTITIONS)}
    expected = sum(PER_PARTITION - cut[p] for p in range(PARTITIONS))
    consumer, got = await consume_until(nsq_cluster_ha, topic, "late", expected, consume_offset=starts)
    await consumer.stop()
    by_partition = received_by_partition(got)
    for partition in range(PARTITIONS):
        want = answers[partition][cut[partition]:]
        assert [offset for _, offset in by_partition[partition]] == [a.offset for a in want], partition
        assert by_partition[partition][0][0] == f"m-{partition}-{cut[partition]}".encode()
    assert len(got) == expected


async def test_a_start_at_the_end_gets_only_what_comes_after_the_subscribe(nsq_cluster_ha: Any) -> None:
    topic, _ = await topic_with(nsq_cluster_ha, ("late",))
    got: list[Any] = []
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await publish_round(producer, topic, "old")
        consumer = Consumer(topic, "late", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                            handler=got.append, max_in_flight=50, lookupd_poll_interval=0.5,
                            consume_offset="special:-1")
        await consumer.start()
        await eventually(lambda: len(consumer.connections) == PARTITIONS, timeout=20)
        new = await publish_round(producer, topic, "new")
    await eventually(lambda: len(got) >= PARTITIONS * PER_PARTITION, timeout=30)
    await asyncio.sleep(0.5)
    await consumer.stop()
    assert_exactly(got, new, "new")
    assert all(state.start_applied for state in consumer.partitions.values())


async def test_a_start_at_a_message_count(nsq_cluster_ha: Any) -> None:
    topic, _ = await topic_with(nsq_cluster_ha, ("ch",))
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        answers = await publish_round(producer, topic, "m")
    # A channel that does not exist yet: nothing held from before the start. The 3rd message on.
    consumer, got = await consume_until(nsq_cluster_ha, topic, unique("fresh"), PARTITIONS * (PER_PARTITION - 2),
                                        consume_offset=ConsumeOffset.msg_count(3))
    await consumer.stop()
    assert_exactly_from = {p: answers[p][2:] for p in range(PARTITIONS)}
    by_partition = received_by_partition(got)
    for partition, want in assert_exactly_from.items():
        assert [offset for _, offset in by_partition[partition]] == [a.offset for a in want]


async def test_a_start_is_taken_only_from_the_first_client_and_the_consumer_says_so(
    nsq_cluster_ha: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topic, _ = await topic_with(nsq_cluster_ha, ("shared",))
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await publish_round(producer, topic, "m")
        first, got_first = await consume_until(nsq_cluster_ha, topic, "shared", PARTITIONS * PER_PARTITION)
        late_got: list[Any] = []
        caplog.set_level(logging.WARNING, logger="fastnsq.consumer.positions")
        second = Consumer(topic, "shared", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                          handler=late_got.append, max_in_flight=50, lookupd_poll_interval=0.5,
                          consume_offset=ConsumeOffset.msg_count(1))  # "from the beginning": ignored
        await second.start()
        await eventually(lambda: len(second.partitions) == PARTITIONS, timeout=20)
        more = await publish_round(producer, topic, "more", per_partition=2)
        await eventually(lambda: len(got_first) + len(late_got) >= PARTITIONS * (PER_PARTITION + 2), timeout=30)
        await asyncio.sleep(0.5)
    await first.stop()
    await second.stop()
    assert all(state.start_applied is False for state in second.partitions.values())
    assert "ignores the start msgcount:1" in caplog.text
    bodies = [m.body for m in got_first + late_got]
    assert len(bodies) == len(set(bodies)) == PARTITIONS * (PER_PARTITION + 2)  # nothing read again
    assert {m.body for m in late_got} <= {f"more-{p}-{s}".encode() for p in more for s in range(2)}


async def test_a_start_is_applied_once_and_reconnects_go_on(nsq_cluster_ha: Any) -> None:
    """As go-nsq: the start goes with a partition's first SUB only (a reconnect would rewind)."""
    topic, _ = await topic_with(nsq_cluster_ha, ("ch",), partitions=1)
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await publish_round(producer, topic, "m", partitions=1)
        consumer, got = await consume_until(nsq_cluster_ha, topic, "ch", PER_PARTITION,
                                            consume_offset=ConsumeOffset.msg_count(1))
        old = consumer.connections
        for conn in old:
            conn.abort()
        await eventually(lambda: [c for c in consumer.connections if c not in old], timeout=20, what="the reconnect")
        await asyncio.sleep(0.5)  # the server has seen the old connection go: nothing is sent to it
        await publish_round(producer, topic, "n", partitions=1, per_partition=2)
        await eventually(lambda: len(got) >= PER_PARTITION + 2, timeout=20)
        await asyncio.sleep(0.5)
    await consumer.stop()
    assert [m.body for m in got] == [b"m-0-%d" % i for i in range(PER_PARTITION)] + [b"n-0-0", b"n-0-1"]


async def test_consume_offset_values_are_checked() -> None:
    with pytest.raises(InvalidValueError, match="virtual_queue value must be an int"):
        ConsumeOffset.virtual_queue(-5)
    with pytest.raises(InvalidValueError, match="is not '<type>:<integer>'"):
        ConsumeOffset.parse("timestamp")
    with pytest.raises(InvalidValueError, match="special value must be -1"):
        ConsumeOffset.parse("special:3")
    with pytest.raises(InvalidValueError, match="consume_offset keys are partitions"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], consume_offset={"0": ConsumeOffset.end()})
    with pytest.raises(InvalidValueError, match="ordered=True needs lookupd_http_addresses"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], ordered=True, consume_offset="special:-1")
    assert ConsumeOffset.timestamp(1700000000.9).value == 1700000000


# ---- the wire: what the servers do with SUB_ADVANCED's start ------------------------------------------


async def test_sub_advanced_starts_on_a_cluster_node(nsq_cluster_ha: Any) -> None:
    """Each kind of start, on the first client of a channel that already has a backlog: the
    message the reader held goes out first, then the partition from the start on."""
    topic, leaders = await topic_with(nsq_cluster_ha, ("c1", "c2", "c3", "c4"), partitions=1)
    producer = await connect(leaders[0])
    offsets = []
    for i in range(5):
        producer.out.pub_trace(topic, 0, 1, b"m%d" % i)
        producer.flush()
        offsets.append((await producer.traced()).offset)
    second = await wait_for_next_second()
    for i in range(5, 7):
        producer.out.pub_trace(topic, 0, 1, b"m%d" % i)
        producer.flush()
        offsets.append((await producer.traced()).offset)
    cases = {"c1": (f"virtual_queue:{offsets[3]}", [b"m0", b"m3", b"m4", b"m5", b"m6"]),
             "c2": (f"timestamp:{second}", [b"m0", b"m5", b"m6"]),
             "c3": ("msgcount:2", [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"m6"]),
             "c4": ("special:-1", [b"m0"])}
    for channel, (position, expected) in cases.items():
        client = await connect(leaders[0], heartbeat_interval=1000)
        await client.sub_ha(topic, channel, 0, mode="advanced", position=position, rdy=20)
        got = [m.body for m in await client.messages(len(expected))]
        await client.nothing(0.5)
        client.close()
        # msgcount:2 starts at m1: the held m0 first, then m1 on (the held one is not repeated).
        assert got == expected, (channel, position)


async def test_a_start_from_a_second_client_is_ignored(nsq_cluster_ha: Any) -> None:
    topic, leaders = await topic_with(nsq_cluster_ha, ("c",), partitions=1)
    producer = await connect(leaders[0])
    producer.out.mpub(topic, [b"a", b"b", b"c"], 0)
    producer.flush()
    await producer.ok()
    first = await connect(leaders[0], heartbeat_interval=1000)
    await first.sub_ha(topic, "c", 0, rdy=0)
    second = await connect(leaders[0], heartbeat_interval=1000)
    await second.sub_ha(topic, "c", 0, mode="advanced", position="special:-1", rdy=10)
    assert [m.body for m in await second.messages(3)] == [b"a", b"b", b"c"]  # not moved to the end


async def test_setoffset_moves_one_partition_of_a_node_whatever_its_clients(nsq_cluster_ha: Any) -> None:
    topic, leaders = await topic_with(nsq_cluster_ha, ("c",), partitions=1)
    producer = await connect(leaders[0])
    offsets = []
    for i in range(4):
        producer.out.pub_trace(topic, 0, 1, b"m%d" % i)
        producer.flush()
        offsets.append((await producer.traced()).offset)
    http_address = nsq_cluster_ha.http_addresses[nsq_cluster_ha.tcp_addresses.index(leaders[0])]
    http = NsqdHTTP()
    try:
        state = await http.channel_state(http_address, topic, 0, "c")
        assert (state.exists, state.clients, state.end_offset) == (True, 0, offsets[-1] + 32)
        await http.set_channel_offset(http_address, topic, 0, "c", f"virtual_queue:{offsets[2]}")
        with pytest.raises(Exception, match="CHANNEL_NOT_FOUND"):
            await http.set_channel_offset(http_address, topic, 0, "nope", "special:-1")
    finally:
        await http.close()
    client = await connect(leaders[0], heartbeat_interval=1000)
    await client.sub_ha(topic, "c", 0, rdy=10)
    # The channel had a backlog: the held m0 first.
    assert [m.body for m in await client.messages(3)] == [b"m0", b"m2", b"m3"]


async def test_standalone_nsqd_takes_only_the_end(nsqd_ha: Any) -> None:
    name = unique()
    client = await connect(nsqd_ha.tcp_address, heartbeat_interval=1000)
    await client.create(name, 0)
    for position in (b"timestamp:1", b"msgcount:1"):
        client = await connect(nsqd_ha.tcp_address, heartbeat_interval=1000)
        client.send_raw(command(b"SUB_ADVANCED", name.encode(), b"c", b"0", position))
        await client.fatal("E_INVALID Not supported while coordinator disabled")
    client = await connect(nsqd_ha.tcp_address, heartbeat_interval=1000)
    client.send_raw(command(b"SUB_ADVANCED", name.encode(), b"c", b"0", b"special:2"))
    await client.fatal("E_INVALID not supported offset type")


async def test_a_connection_with_a_start_takes_its_whole_rdy_at_once(nsq_cluster_ha: Any) -> None:
    """A new connection's first RDY is 1 until its first message (so nsqd writes that message at once),
    but not with a start: raised from 1 while the start's first message was in flight, youzan's nsqd
    (b16e68eb) sent that message twice (test_a_start_is_applied_once_and_reconnects_go_on failed on
    the real cluster with b'm-0-0' twice)."""
    import json
    import urllib.request

    topic, leaders = await topic_with(nsq_cluster_ha, ("ch",), partitions=1)
    http_address = nsq_cluster_ha.http_addresses[nsq_cluster_ha.tcp_addresses.index(leaders[0])]

    def ready_counts() -> list[int]:
        with urllib.request.urlopen(f"http://{http_address}/stats?format=json&topic={topic}", timeout=5) as answer:
            stats = json.load(answer)
        stats = stats.get("data", stats)  # the legacy wrapper, where nsqd answers with it
        return [client["ready_count"] for t in stats["topics"] if t["topic_name"] == topic
                for c in t["channels"] if c["channel_name"] == "ch" for client in c["clients"]]

    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        handler=lambda m: None, max_in_flight=50, lookupd_poll_interval=0.5,
                        consume_offset=ConsumeOffset.end())  # (a count beyond an empty partition's end is refused)
    await consumer.start()
    try:
        await eventually(lambda: asyncio.to_thread(ready_counts), timeout=20, what="the consumer's connection")
        await eventually(lambda: asyncio.to_thread(lambda: ready_counts() == [50]), timeout=20,
                         what="RDY 50 before any message")
    finally:
        await consumer.stop()
