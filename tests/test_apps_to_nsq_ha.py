"""``fastnsq to-nsq`` across dialects: upstream nsqd to youzan's partitioned (HA) topics and back.

The HA side is the embedded HA cluster, or the real youzan cluster in ``dev.py test --real-ha``
(this file is in its HA_TESTS); the upstream side is an embedded nsqd in both. A message read
back from an HA topic says its partition and internal id (in the order the partition took it),
so the tests check where each sharding key landed and in what order; the ext header and trace
id are read back too. The faults: the app SIGKILLed mid-stream and started again, and (on a
youzan cluster of the test's own, in the real pass) the leader of a destination partition
SIGKILLed and started again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from fastnsq import ConsumeOffset, Consumer, Producer
from fastnsq.apps.crossing import Crossing, NoPartitionsError
from fastnsq.apps.jsonfilter import json_key
from fastnsq.sharding import murmur3_32, partition_for_key
from fastnsq.testing import NSQD, ExternalCluster, ExternalLookupd, ExternalNSQD
from fastnsq.testing.real import ENV_REAL_HA_BIN, ENV_REAL_HA_NEXT_PORT, RealHACluster
from fastnsq.topology import TopicRoute

from .apps_support import channel_drained, run_to_exit, start
from .helpers import eventually, skip_if_external, unique
from .test_consumer import channel_stats

pytestmark = pytest.mark.timeout(300)


async def read_ha(lookupd: list[str], topic: str, expected: set[bytes], timeout: float = 60.0,
                  from_start: bool = False) -> list[Any]:
    """Every message of the HA ``topic`` until each of ``expected`` came, duplicates included:
    (partition, internal id, body, ext, trace id). On channel "check" (created with the topic),
    or ``from_start``: on a new channel from each partition's first message (what the topic
    holds, whatever became of the channels)."""
    got: list[Any] = []
    options: dict[str, Any] = {"consume_offset": ConsumeOffset.msg_count(0)} if from_start else {}
    consumer = Consumer(topic, unique("verify") if from_start else "check", lookupd_http_addresses=lookupd,
                        max_in_flight=500, lookupd_poll_interval=1, **options,
                        handler=lambda m: got.append((m.partition, m.internal_id, m.body, m.ext, m.trace_id)))
    await consumer.start()
    try:
        try:
            await eventually(lambda: expected <= {g[2] for g in got}, timeout, "every message at the destination")
        except AssertionError as exc:
            missing = expected - {g[2] for g in got}
            raise AssertionError(f"{exc}: {len(got)} came, {len(missing)} missing, e.g. {sorted(missing)[:3]}") from None
        await asyncio.sleep(0.5)  # a duplicate would come now
    finally:
        await consumer.stop()
    return got


async def drained(http_address: str, topic: str, channel: str = "nsq_to_nsq", *, published: int) -> bool:
    return await channel_drained(http_address, topic, channel, published=published)


def docs(count: int, keys: int) -> list[bytes]:
    """JSON documents ``{"user": "u<k>", "seq": i}``, keys in turn, and a few without the field."""
    return [json.dumps({"user": f"u{i % keys}", "seq": i}).encode() if i % 50 else b'{"seq": %d}' % i
            for i in range(count)]


def check_sharded(got: list[Any], partitions: int) -> None:
    """Each key on the partition its hash names, its messages in the order they were published."""
    order: dict[str, list[int]] = defaultdict(list)
    where: dict[str, set[int]] = defaultdict(set)
    for partition, _, body, _, _ in sorted(got, key=lambda g: (g[0], g[1])):
        document = json.loads(body)
        if "user" in document:
            where[document["user"]].add(partition)
            order[document["user"]].append(document["seq"])
    assert where, "no keyed message came"
    for key, found in where.items():
        assert found == {partition_for_key(key, partitions)}, (key, found)
    for key, seqs in order.items():
        assert seqs == sorted(seqs), f"{key}: out of order: {seqs[:20]}"


# ---- pure pieces -------------------------------------------------------------------------------


class _Message:
    def __init__(self, body: bytes, ext: Any = None, trace_id: int | None = None) -> None:
        self.body, self.ext, self.trace_id = body, ext, trace_id


def test_a_batch_splits_by_the_partition_of_its_keys() -> None:
    assert json_key(b'{"k":"a"}', "k") == "a" and json_key(b'{"k":7}', "k") == 7
    assert json_key(b'{"k":[1, 2]}', "k") == "[1,2]" and json_key(b'{"k":null}', "k") is None
    assert json_key(b"not json", "k") is None and json_key(b"[1]", "k") is None
    route = TopicRoute("t", partitions={0: "a:1", 1: "b:1", 2: "a:1"}, partition_num=3, is_ha=True)
    messages = [_Message(json.dumps({"k": f"key{i % 7}"}).encode()) for i in range(70)] + [_Message(b"{}")]
    parts = Crossing("k", murmur3_32).split(route, messages, [m.body for m in messages])
    keyed = [p for p in parts if p.sharding_key is not None]
    assert sum(len(p.messages) for p in parts) == 71 and len(keyed) == len(parts) - 1
    for part in keyed:  # one MPUB per partition: every key in it hashes there
        pids = {partition_for_key(json_key(m.body, "k"), 3) for m in part.messages}
        assert pids == {partition_for_key(part.sharding_key, 3)}
        assert part.publish_options() == {"sharding_key": part.sharding_key}
    assert [p.messages for p in parts if p.sharding_key is None] == [[messages[-1]]]
    upstream = Crossing("k", murmur3_32).split(None, messages, [m.body for m in messages])
    assert len(upstream) == 1 and upstream[0].publish_options() == {}
    with pytest.raises(NoPartitionsError, match="not created yet"):  # requeued: no round robin meanwhile
        Crossing("k", murmur3_32).split(TopicRoute("t"), messages, [m.body for m in messages])
    assert len(Crossing("", murmur3_32).split(TopicRoute("t"), messages, [m.body for m in messages])) == 1


def test_ext_headers_and_trace_ids_go_where_the_destination_takes_them() -> None:
    messages = [_Message(b"a", {"k": "v"}, 5), _Message(b"b", None, 0)]
    bodies = [m.body for m in messages]
    ext_topic = TopicRoute("t", partitions={0: "a:1"}, partition_num=1, extend_support=True, is_ha=True)
    [part] = Crossing("", murmur3_32).split(ext_topic, messages, bodies)
    assert part.publish_options() == {"exts": [{"k": "v", "##trace_id": "5"}, {}]}
    plain_topic = TopicRoute("t", partitions={0: "a:1"}, partition_num=1, is_ha=True)
    [part] = Crossing("", murmur3_32).split(plain_topic, messages, bodies)
    assert part.publish_options() == {"trace_ids": [5, 0]}  # no ext on a topic without them
    untraced = [_Message(b"a", None, 0)]
    assert Crossing("", murmur3_32).split(ext_topic, untraced, [b"a"])[0].publish_options() == {}
    upstream = TopicRoute("t", endpoints={}, is_ha=False)
    assert Crossing("", murmur3_32).split(upstream, messages, bodies)[0].publish_options() == {}


async def test_a_sharding_key_needs_the_destination_lookupd() -> None:
    status, out = await run_to_exit("to-nsq", "-topic=t", "-nsqd-tcp-address=127.0.0.1:4150",
                                    "-destination-nsqd-tcp-address=127.0.0.1:4150", "-sharding-key-json-field=user")
    assert status == 2 and "--sharding-key-json-field needs --destination-lookupd-http-address" in out


# ---- across dialects ---------------------------------------------------------------------------


async def test_upstream_to_a_partitioned_topic_by_a_json_sharding_key(nsq_cluster_ha: Any, tmp_path: Path) -> None:
    topic, target = unique("up"), unique("ha")
    await nsq_cluster_ha.create_topic(target, partitions=4, channels=["check"])
    bodies = docs(4000, keys=40)
    async with NSQD() as source:
        async with Producer([source.tcp_address]) as producer:
            await producer.mpublish(topic, bodies)
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={source.tcp_address}",
                          f"-destination-topic={target}", "-sharding-key-json-field=user", "-max-in-flight=400",
                          *[f"-destination-lookupd-http-address={a}" for a in nsq_cluster_ha.lookupd_http_addresses],
                          log=tmp_path / "log")
        await eventually(lambda: drained(source.http_address, topic, published=len(bodies)), 60, "the source drained")
        assert await app.stop() == 0, app.log()
        [stats] = await channel_stats([source.http_address], topic, "nsq_to_nsq")
    assert stats["requeue_count"] == 0, app.log()  # a clean run: the order below is the publish order
    got = await read_ha(nsq_cluster_ha.lookupd_http_addresses, target, set(bodies))
    assert sorted(g[2] for g in got) == sorted(bodies)  # each once
    check_sharded(got, 4)
    assert len({g[0] for g in got}) == 4


async def test_a_destination_topic_created_later_gets_every_key_on_its_partition(nsq_cluster_ha: Any,
                                                                                  tmp_path: Path) -> None:
    """Started before the HA topic exists: the batches wait (requeued), none goes round robin."""
    topic, target = unique("up"), unique("ha")
    bodies = docs(1000, keys=30)
    async with NSQD() as source:
        async with Producer([source.tcp_address]) as producer:
            await producer.mpublish(topic, bodies)
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={source.tcp_address}",
                          f"-destination-topic={target}", "-sharding-key-json-field=user", "-max-in-flight=100",
                          "-consumer-opt=default_requeue_delay,0.2", "-consumer-opt=backoff_multiplier,0.1",
                          *[f"-destination-lookupd-http-address={a}" for a in nsq_cluster_ha.lookupd_http_addresses],
                          log=tmp_path / "log")
        await eventually(lambda: "not created yet" in app.log(), 30, "a batch waiting for the topic")
        await nsq_cluster_ha.create_topic(target, partitions=3, channels=["check"])
        await eventually(lambda: drained(source.http_address, topic, published=len(bodies)), 90, "the source drained")
        assert await app.stop() == 0, app.log()
    # From each partition's start: the app may publish between the topic's creation and its
    # "check" channel's, which would start after those messages.
    got = await read_ha(nsq_cluster_ha.lookupd_http_addresses, target, set(bodies), from_start=True)
    assert set(Counter(g[2] for g in got)) == set(bodies)
    for key, found in _partitions_of(got).items():
        assert found == {partition_for_key(key, 3)}, (key, found)


async def test_ha_to_ha_carries_ext_headers_and_trace_ids(nsq_cluster_ha: Any, tmp_path: Path) -> None:
    topic, with_ext, without_ext = unique("src"), unique("ext"), unique("plain")
    lookupd = nsq_cluster_ha.lookupd_http_addresses
    await nsq_cluster_ha.create_topic(topic, partitions=2, ext=True, channels=["nsq_to_nsq", "second"])
    await nsq_cluster_ha.create_topic(with_ext, partitions=2, ext=True, channels=["check"])
    await nsq_cluster_ha.create_topic(without_ext, partitions=2, channels=["check"])
    bodies = [b"m%03d" % i for i in range(200)]
    async with Producer(lookupd_http_addresses=lookupd) as producer:
        for i, body in enumerate(bodies):
            await producer.publish(topic, body, ext={"n": str(i)}, trace_id=1000 + i)
    for target, channel in ((with_ext, "nsq_to_nsq"), (without_ext, "second")):
        app = await start("to-nsq", f"-topic={topic}", f"-channel={channel}", f"-destination-topic={target}",
                          *[f"-lookupd-http-address={a}" for a in lookupd],
                          *[f"-destination-lookupd-http-address={a}" for a in lookupd], log=tmp_path / "log")
        got = await read_ha(lookupd, target, set(bodies))
        assert await app.stop() == 0, app.log()
        assert sorted(g[2] for g in got) == bodies
        for _, _, body, ext, trace_id in got:
            i = int(body[1:])
            assert trace_id == 1000 + i  # MPUB_EXT's ##trace_id, or MPUB_TRACE
            if target == with_ext:
                assert ext is not None and ext.get("n") == str(i), ext
            else:
                assert ext is None


async def test_ha_to_upstream(nsq_cluster_ha: Any, tmp_path: Path) -> None:
    topic = unique("src")
    lookupd = nsq_cluster_ha.lookupd_http_addresses
    await nsq_cluster_ha.create_topic(topic, partitions=3, ext=True, channels=["nsq_to_nsq"])
    bodies = [b"h%04d" % i for i in range(3000)]
    async with Producer(lookupd_http_addresses=lookupd) as producer:
        await producer.mpublish(topic, bodies[:1500], exts=[{"k": "v"}] * 1500, trace_ids=[7] * 1500)
        await producer.mpublish(topic, bodies[1500:])
    async with NSQD() as target:
        app = await start("to-nsq", f"-topic={topic}", "-destination-topic=copy",
                          f"-destination-nsqd-tcp-address={target.tcp_address}",
                          *[f"-lookupd-http-address={a}" for a in lookupd], log=tmp_path / "log")
        got: list[bytes] = []
        async with Consumer("copy", "check", nsqd_tcp_addresses=[target.tcp_address], max_in_flight=500,
                            handler=lambda m: got.append(m.body)):
            await eventually(lambda: len(set(got)) >= len(bodies), 60, "every message upstream")
            await asyncio.sleep(0.3)
        assert await app.stop() == 0, app.log()
    assert sorted(got) == bodies  # bodies only: upstream takes no ext header nor trace id


# ---- faults ------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_sigkill_mid_stream_into_a_partitioned_topic_loses_nothing(nsq_cluster_ha: Any, tmp_path: Path) -> None:
    """The app SIGKILLed mid-stream and started again: every message at the destination at
    least once, duplicates at most max in flight (the batches unanswered at the kill)."""
    topic, target = unique("up"), unique("ha")
    lookupd = nsq_cluster_ha.lookupd_http_addresses
    await nsq_cluster_ha.create_topic(target, partitions=4, channels=["check"])
    bodies = docs(60_000, keys=1000)
    async with NSQD() as source:
        async with Producer([source.tcp_address]) as producer:
            for at in range(0, len(bodies), 5000):
                await producer.mpublish(topic, bodies[at:at + 5000])
        args = [f"-topic={topic}", f"-nsqd-tcp-address={source.tcp_address}", f"-destination-topic={target}",
                "-sharding-key-json-field=user", "-max-in-flight=500", "-status-every=0",
                "-consumer-opt=default_requeue_delay,0.5", "-consumer-opt=msg_timeout,3s",
                *[f"-destination-lookupd-http-address={a}" for a in lookupd]]
        app = await start("to-nsq", *args, log=tmp_path / "log")
        await eventually(lambda: relayed(source.http_address, topic, 10_000), 60, "a part relayed")
        await app.kill()
        app = await start("to-nsq", *args, log=tmp_path / "log")
        await eventually(lambda: drained(source.http_address, topic, published=len(bodies)), 120, "the source drained")
        assert await app.stop() == 0, app.log()
    got = await read_ha(lookupd, target, set(bodies), 120)
    counts = Counter(g[2] for g in got)
    duplicates = sum(counts.values()) - len(bodies)
    print(f"\nSIGKILL mid-stream: {len(bodies)} published, {len(counts)} arrived, {duplicates} duplicates")
    assert set(counts) == set(bodies)  # 0 lost
    assert duplicates <= 500
    for key, found in _partitions_of(got).items():
        assert found == {partition_for_key(key, 4)}, (key, found)


def _partitions_of(got: list[Any]) -> dict[str, set[int]]:
    where: dict[str, set[int]] = defaultdict(set)
    for partition, _, body, _, _ in got:
        key = json_key(body, "user")
        if key is not None:
            where[key].add(partition)
    return where


@pytest.fixture
def own_ha_cluster() -> Any:
    """A real youzan cluster of the test's own (a node of it is killed), after the run's ports."""
    bin_dir = os.environ.get(ENV_REAL_HA_BIN, "").strip()
    if not bin_dir:
        pytest.skip(f"a youzan nsqd is SIGKILLed: the real HA pass ({ENV_REAL_HA_BIN}, dev.py test --real-ha)")
    if shutil.which("etcd") is None:
        pytest.skip("needs etcd on PATH")
    base_port = int(os.environ.get(ENV_REAL_HA_NEXT_PORT, "0") or 0)
    with RealHACluster(Path(bin_dir), standalone=False, base_port=base_port) as cluster:
        yield cluster


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_destination_leader_killed_and_back_loses_nothing(own_ha_cluster: Any, tmp_path: Path) -> None:
    """The nsqd leading a destination partition SIGKILLed mid-stream, started again once the
    cluster named a new leader: its keys' messages are requeued meanwhile and go to the new
    leader; every message arrives (each partition has 2 replicas), keys stay on their partitions."""
    cluster = ExternalCluster([ExternalNSQD(t, h) for t, h in zip(own_ha_cluster.tcp_addresses,
                                                                  own_ha_cluster.http_addresses)],
                              ExternalLookupd(own_ha_cluster.lookupd_http_address,
                                              own_ha_cluster.lookupd_tcp_address))
    topic, target = unique("up"), unique("ha")
    lookupd = cluster.lookupd_http_addresses
    leaders = await cluster.create_topic(target, partitions=2, replicas=2, channels=["check"])
    bodies = docs(20_000, keys=200)
    async with NSQD() as source:
        async with Producer([source.tcp_address]) as producer:
            await producer.mpublish(topic, bodies)
        app = await start_sharding(source.tcp_address, topic, target, lookupd, tmp_path)
        await eventually(lambda: relayed(source.http_address, topic, 2_000), 60, "a part relayed")
        victim = own_ha_cluster.tcp_addresses.index(leaders[0])
        own_ha_cluster.kill_nsqd(victim)
        await eventually(lambda: _led_elsewhere(cluster, target, leaders[0]), 120, "a new leader of partition 0")
        own_ha_cluster.start_nsqd(victim)
        await eventually(lambda: drained(source.http_address, topic, published=len(bodies)), 180, "the source drained")
        assert await app.stop() == 0, app.log()
    # Read from each partition's start on a new channel: "check" was created on each leader
    # only, and the replica that took partition 0 over had no copy of it (seen on youzan's
    # 0.3.7-HA.1.13.0: a channel made there starts at the end of the partition).
    got = await read_ha(lookupd, target, set(bodies), 120, from_start=True)
    counts = Counter(g[2] for g in got)
    print(f"\nleader killed: {len(bodies)} published, {len(counts)} arrived, "
          f"{sum(counts.values()) - len(bodies)} duplicates")
    # The dead leader's keys waited: held by to-nsq until a leader answered (the producer waits
    # for a leader lookupd lists, then raises NoConnectionError), or requeued after a timeout.
    log = app.log()
    assert "holding them until it answers" in log or "requeueing them" in log, log
    assert set(counts) == set(bodies)  # 0 lost
    for key, found in _partitions_of(got).items():
        assert found == {partition_for_key(key, 2)}, (key, found)


async def start_sharding(source: str, topic: str, target: str, lookupd: list[str], tmp_path: Path) -> Any:
    """to-nsq from an upstream nsqd to an HA topic by key, quick to requeue and to look up again."""
    return await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={source}", f"-destination-topic={target}",
                       "-sharding-key-json-field=user", "-max-in-flight=100", "-status-every=0",
                       "-consumer-opt=default_requeue_delay,1", "-consumer-opt=backoff_multiplier,0.1",
                       "-producer-opt=publish_timeout,2", "-producer-opt=lookupd_poll_interval,1",
                       *[f"-destination-lookupd-http-address={a}" for a in lookupd], log=tmp_path / "log")


async def relayed(http_address: str, topic: str, count: int) -> bool:
    stats = await channel_stats([http_address], topic, "nsq_to_nsq")
    return bool(stats) and stats[0]["message_count"] - stats[0]["depth"] > count


@pytest.mark.slow
async def test_the_destination_leader_stopped_and_back_loses_nothing_embedded(nsq_cluster_ha: Any,
                                                                              tmp_path: Path) -> None:
    """The embedded cluster's version of the test above: the node leading partition 0 stopped
    mid-stream (the cluster moves its partitions first) and started again 2 s later."""
    skip_if_external(nsq_cluster_ha, "its nodes are stopped (on youzan's, the test above kills one of its own)")
    topic, target = unique("up"), unique("ha")
    lookupd = nsq_cluster_ha.lookupd_http_addresses
    leaders = await nsq_cluster_ha.create_topic(target, partitions=2, channels=["check"])
    bodies = docs(20_000, keys=200)
    async with NSQD() as source:
        async with Producer([source.tcp_address]) as producer:
            await producer.mpublish(topic, bodies)
        app = await start_sharding(source.tcp_address, topic, target, lookupd, tmp_path)
        await eventually(lambda: relayed(source.http_address, topic, 2_000), 60, "a part relayed")
        await nsq_cluster_ha.stop_node(leaders[0])
        await asyncio.sleep(2)
        await nsq_cluster_ha.start_node(leaders[0])
        await eventually(lambda: drained(source.http_address, topic, published=len(bodies)), 120, "the source drained")
        assert await app.stop() == 0, app.log()
    got = await read_ha(lookupd, target, set(bodies), 120)
    counts = Counter(g[2] for g in got)
    print(f"\nleader stopped: {len(bodies)} published, {len(counts)} arrived, "
          f"{sum(counts.values()) - len(bodies)} duplicates")
    assert set(counts) == set(bodies)  # 0 lost
    for key, found in _partitions_of(got).items():
        assert found == {partition_for_key(key, 2)}, (key, found)


async def _led_elsewhere(cluster: ExternalCluster, topic: str, old: str) -> bool:
    leader = (await cluster.partition_leaders(topic)).get(0)
    return leader is not None and leader != old
