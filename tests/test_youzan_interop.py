"""fastnsq and youzan/go-nsq on one HA cluster: each publishes, the other consumes, and the reverse.

youzan/go-nsq's own Consumer and TopicProducerMgr run in bench/go/src/yz_driver (built against
youzan/go-nsq v1.7.2-HA's public source, outside the checkout: bench/yz_driver.py). Per feature
(plain, sharded, traced, ext, gzip/snappy/lz4 bodies, ordered, start positions), every body and
header must arrive identical on the other side, nothing lost. Each cell prints one
``INTEROP <direction> <feature> ...`` line (run with ``-s`` to see the matrix).

On a real youzan cluster (``dev.py test --real-ha``) and, as a check of the embedded servers
against youzan's own client, on the embedded HA cluster; skipped without Go or youzan/go-nsq's
sources.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from fastnsq import Consumer, Producer
from fastnsq.bodies import COMPRESS_KEY, SIZE_KEY
from fastnsq.consumer.positions import ConsumeOffset
from fastnsq.sharding import partition_for_key

from .helpers import eventually, unique

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import yz_driver

pytestmark = pytest.mark.timeout(300)

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3}
N = 40  # messages per cell
THRESHOLD = 1024


@pytest.fixture(scope="module")
def driver() -> Path:
    try:
        return yz_driver.build()
    except yz_driver.DriverUnavailable as exc:
        pytest.skip(str(exc))


def bodies(count: int, *, big: bool = False, seed: int = 0) -> list[bytes]:
    """Distinct bodies with every byte value about (newlines, NULs, spaces); big ones compress."""
    rng = random.Random(seed)
    made = []
    for i in range(count):
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
        if big:
            text = b"".join(b"row %d.%d of a compressible body\n" % (i, k) for k in range(60))
            made.append(b"%d|" % i + text + noise)
        else:
            made.append(b"%d|" % i + noise)
    return made


async def new_topic(cluster: Any, *, partitions: int = 3, ext: bool = False, channels: tuple[str, ...] = ("ch",)
                    ) -> tuple[str, dict[int, str]]:
    topic = unique("yz")
    placed = await cluster.create_topic(topic, partitions=partitions, ext=ext, channels=list(channels))
    return topic, {p: (cluster.tcp_addresses[v] if isinstance(v, int) else v) for p, v in placed.items()}


async def fastnsq_consume(cluster: Any, topic: str, count: int, channel: str = "ch", *, until: Any = None,
                          **options: Any) -> list[Any]:
    """fastnsq's Consumer until ``count`` messages (or ``until(messages)``), then half a second more."""
    got: list[Any] = []
    options.setdefault("max_in_flight", 50)
    consumer = Consumer(topic, channel, lookupd_http_addresses=cluster.lookupd_http_addresses, handler=got.append,
                        lookupd_poll_interval=0.5, **options)
    await consumer.start()
    done = (lambda: until(got)) if until is not None else (lambda: len(got) >= count)
    try:
        await eventually(done, timeout=60, what=f"{count} messages in fastnsq")
        await asyncio.sleep(0.5)  # and nothing more
    finally:
        await consumer.stop()
    return got


def report(direction: str, feature: str, sent: int, received: int, identical: bool, **extra: Any) -> None:
    details = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"\nINTEROP {direction} {feature}: sent={sent} received={received} lost={sent - min(sent, received)} "
          f"identical={identical} {details}".rstrip())


def go_sub(driver: Path, cluster: Any, topic: str, *flags: str) -> yz_driver.Subscriber:
    return yz_driver.Subscriber(driver, topic, f"-lookupd={cluster.lookupd_http_addresses[0]}", *flags)


# ---- go-nsq publishes, fastnsq consumes --------------------------------------------------------------


async def test_go_to_fastnsq_plain_and_mpub(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    sent = bodies(N, seed=1)
    requests = [{"kind": "plain", "body": yz_driver.b64(b)} for b in sent[: N // 2]]
    requests.append({"kind": "mpub", "body": "", "bodies": [yz_driver.b64(b) for b in sent[N // 2:]]})
    answers = await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic, requests)
    assert all(a["ok"] for a in answers), answers
    got = await fastnsq_consume(nsq_cluster_ha, topic, N)
    identical = Counter(m.body for m in got) == Counter(sent)
    report("go->fastnsq", "plain", N, len(got), identical, partitions=len({m.partition for m in got}))
    assert identical


async def test_go_to_fastnsq_sharded(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    sent = bodies(N, seed=2)
    keys = [f"user-{i % 8}" for i in range(N)]
    requests = [{"kind": "sharded", "body": yz_driver.b64(b), "key": k} for b, k in zip(sent, keys)]
    answers = await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic, requests)
    assert all(a["ok"] for a in answers), answers
    got = await fastnsq_consume(nsq_cluster_ha, topic, N)
    where = {m.body: m.partition for m in got}
    same_partition = all(where[b] == partition_for_key(k, 3) for b, k in zip(sent, keys))
    identical = set(where) == set(sent) and len(got) == N
    report("go->fastnsq", "sharded", N, len(got), identical, murmur3_partition_agrees=same_partition)
    assert identical and same_partition


async def test_go_to_fastnsq_traced(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    sent = bodies(N, seed=3)
    requests = [{"kind": "trace", "body": yz_driver.b64(b), "partition": i % 3, "trace_id": 10_000 + i}
                for i, b in enumerate(sent)]
    answers = await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic, requests)
    assert all(a["ok"] for a in answers), answers
    got = {m.body: m for m in await fastnsq_consume(nsq_cluster_ha, topic, N, enable_trace=True)}
    identical = set(got) == set(sent) and all(
        (got[b].trace_id, got[b].internal_id, got[b].offset, got[b].partition)
        == (10_000 + i, answers[i]["id"], answers[i].get("offset", 0), i % 3)
        for i, b in enumerate(sent))
    report("go->fastnsq", "traced", N, len(got), identical, checked="trace_id,internal_id,offset,partition")
    assert identical


async def test_go_to_fastnsq_ext(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha, ext=True)
    sent = bodies(N, seed=4)
    headers = [{"k": f"v{i}", "unicode": "é✓", "n": str(i)} for i in range(N)]
    requests = [{"kind": "ext", "body": yz_driver.b64(b), "ext": h, "trace_id": 500 + i}
                for i, (b, h) in enumerate(zip(sent, headers))]
    answers = await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic, requests)
    assert all(a["ok"] for a in answers), answers
    got = {m.body: m for m in await fastnsq_consume(nsq_cluster_ha, topic, N)}
    identical = set(got) == set(sent) and all(
        got[b].ext == {**h, "##trace_id": str(500 + i)} and got[b].trace_id == 500 + i
        for i, (b, h) in enumerate(zip(sent, headers)))
    report("go->fastnsq", "ext", N, len(got), identical)
    assert identical


@pytest.mark.parametrize("codec", CODECS)
async def test_go_to_fastnsq_compressed(nsq_cluster_ha: Any, driver: Path, codec: str) -> None:
    topic, _ = await new_topic(nsq_cluster_ha, ext=True, channels=("ch", "raw"))
    sent = bodies(N, big=True, seed=5)
    headers = [{"k": f"v{i}"} for i in range(N)]
    requests = [{"kind": "ext", "body": yz_driver.b64(b), "ext": h} for b, h in zip(sent, headers)]
    answers = await yz_driver.publish(
        driver, nsq_cluster_ha.lookupd_http_addresses[0], topic, requests,
        f"-compress-codec={codec}", f"-compress-topics={topic}", f"-compress-size={THRESHOLD}")
    assert all(a["ok"] for a in answers), answers
    got = {m.body: m for m in await fastnsq_consume(nsq_cluster_ha, topic, N)}
    raw = await fastnsq_consume(nsq_cluster_ha, topic, N, channel="raw", disable_message_decompress=True)
    compressed = all(m.ext[COMPRESS_KEY] == str(CODECS[codec]) and len(m.body) < int(m.ext[SIZE_KEY]) for m in raw)
    identical = set(got) == set(sent) and all(got[b].ext == h for b, h in zip(sent, headers))
    report("go->fastnsq", codec, N, len(got), identical, compressed_on_the_wire=compressed)
    assert identical and compressed


async def test_go_to_fastnsq_ordered(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    requests = [{"kind": "partition", "body": yz_driver.b64(b"%d:%03d" % (seq % 3, seq // 3)), "partition": seq % 3}
                for seq in range(3 * N)]
    answers = await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic, requests)
    assert all(a["ok"] for a in answers), answers
    got = await fastnsq_consume(nsq_cluster_ha, topic, 3 * N, ordered=True)
    order = defaultdict(list)
    for m in got:
        order[m.partition].append(m.body)
    in_order = all(order[p] == [b"%d:%03d" % (p, s) for s in range(N)] for p in range(3))
    report("go->fastnsq", "ordered", 3 * N, len(got), in_order, per_partition_order=in_order)
    assert in_order


async def test_a_start_set_by_go_nsq_is_where_fastnsq_goes_on(nsq_cluster_ha: Any, driver: Path) -> None:
    """go-nsq, the channel's first client, starts it at a time and reads a few; fastnsq then reads
    the rest of that channel: together exactly what was published from then."""
    topic, leaders = await new_topic(nsq_cluster_ha, channels=("late",))
    if len(set(leaders.values())) != len(leaders):
        # go-nsq sends the start with SUB_ADVANCED, which a node leading two partitions applies to either.
        pytest.skip(f"two partitions share a leader ({leaders}): go-nsq's start would land on either")
    before = bodies(N, seed=6)
    await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic,
                            [{"kind": "plain", "body": yz_driver.b64(b)} for b in before])
    second = int(time.time()) + 1
    await asyncio.sleep(second - time.time() + 0.05)
    after = bodies(N, seed=7)
    await yz_driver.publish(driver, nsq_cluster_ha.lookupd_http_addresses[0], topic,
                            [{"kind": "plain", "body": yz_driver.b64(b)} for b in after])
    go = go_sub(driver, nsq_cluster_ha, topic, "-channel=late", f"-offset=timestamp:{second}",
                "-offset-partitions=0,1,2", "-max-in-flight=1", "-count=5", "-idle=20s")
    await go.start()
    go_got = [r["body"] for r in await go.messages()]
    wanted = set(after) - set(go_got)
    rest = await fastnsq_consume(nsq_cluster_ha, topic, 0, channel="late",
                                 until=lambda got: wanted <= {m.body for m in got})
    both = Counter(go_got) + Counter(m.body for m in rest)
    # go-nsq hands out the message each channel held from before the start (fastnsq finishes it unseen).
    held = [b for b in both if b in set(before)]
    identical = set(both) - set(held) == set(after)
    report("go->fastnsq", "start position", N, sum(both[b] for b in after), identical,
           by_go=len(go_got), by_fastnsq=len(rest), held_messages_go_handed_out=len(held))
    assert identical and len(held) <= 3


# ---- fastnsq publishes, go-nsq consumes --------------------------------------------------------------


async def test_fastnsq_to_go_plain_and_mpub(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    sent = bodies(N, seed=11)
    go = go_sub(driver, nsq_cluster_ha, topic, f"-count={N}")
    await go.start()
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await asyncio.gather(*(producer.publish(topic, b) for b in sent[: N // 2]))
        await producer.mpublish(topic, sent[N // 2:])
    got = await go.messages()
    identical = Counter(r["body"] for r in got) == Counter(sent)
    report("fastnsq->go", "plain", N, len(got), identical, partitions=len({r["partition"] for r in got}))
    assert identical


async def test_fastnsq_to_go_sharded(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    sent = bodies(N, seed=12)
    keys = [f"order-{i % 8}" for i in range(N)]
    go = go_sub(driver, nsq_cluster_ha, topic, f"-count={N}")
    await go.start()
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        for b, k in zip(sent, keys):
            await producer.publish(topic, b, sharding_key=k)
    got = {r["body"]: r for r in await go.messages()}
    agrees = all(int(got[b]["partition"]) == partition_for_key(k, 3) for b, k in zip(sent, keys))
    identical = set(got) == set(sent)
    report("fastnsq->go", "sharded", N, len(got), identical, murmur3_partition_agrees=agrees)
    assert identical and agrees


async def test_fastnsq_to_go_traced(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    sent = bodies(N, seed=13)
    go = go_sub(driver, nsq_cluster_ha, topic, f"-count={N}", "-trace")
    await go.start()
    answers = []
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        for i, b in enumerate(sent):
            answers.append(await producer.publish(topic, b, trace_id=20_000 + i, partition=i % 3))
    got = {r["body"]: r for r in await go.messages()}
    identical = set(got) == set(sent) and all(
        (got[b]["trace_id"], got[b]["internal_id"], got[b]["offset"], got[b]["raw_size"], got[b]["partition"])
        == (20_000 + i, answers[i].internal_id, answers[i].offset, answers[i].size, str(i % 3))
        for i, b in enumerate(sent))
    report("fastnsq->go", "traced", N, len(got), identical, checked="trace_id,internal_id,offset,raw_size,partition")
    assert identical


async def test_fastnsq_to_go_ext(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha, ext=True)
    sent = bodies(N, seed=14)
    headers = [{"k": f"v{i}", "unicode": "é✓", "nested": {"a": [1, 2]}} for i in range(N)]
    go = go_sub(driver, nsq_cluster_ha, topic, f"-count={N}")
    await go.start()
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await producer.mpublish(topic, sent[:10], exts=headers[:10])
        for i in range(10, N):
            await producer.publish(topic, sent[i], ext=headers[i], trace_id=700 + i)
    got = {r["body"]: r for r in await go.messages()}
    identical = set(got) == set(sent) and all(
        got[b]["ext_ver"] == 4 and json.loads(got[b]["ext"]) == (h if i < 10 else {**h, "##trace_id": str(700 + i)})
        for i, (b, h) in enumerate(zip(sent, headers)))
    report("fastnsq->go", "ext", N, len(got), identical)
    assert identical


@pytest.mark.parametrize("codec", CODECS)
async def test_fastnsq_to_go_compressed(nsq_cluster_ha: Any, driver: Path, codec: str) -> None:
    topic, _ = await new_topic(nsq_cluster_ha, ext=True)
    sent = bodies(N, big=True, seed=15)
    headers = [{"k": f"v{i}"} for i in range(N)]
    go = go_sub(driver, nsq_cluster_ha, topic, f"-count={N}")
    await go.start()
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses, topics_for_compress=[topic],
                        message_size_for_compress=THRESHOLD, client_compress_decodec=codec) as producer:
        for b, h in zip(sent, headers):
            await producer.publish(topic, b, ext=h)
    got = {r["body"]: r for r in await go.messages()}
    # youzan/go-nsq v1.7.2 decompresses but keeps the two keys in the header it hands out.
    identical = set(got) == set(sent) and all(
        json.loads(got[b]["ext"]) == {**h, COMPRESS_KEY: str(CODECS[codec]), SIZE_KEY: str(len(b))}
        for b, h in zip(sent, headers))
    report("fastnsq->go", codec, N, len(got), identical, decompressed_by_go=set(got) == set(sent))
    assert identical


async def test_fastnsq_to_go_ordered(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha)
    go = go_sub(driver, nsq_cluster_ha, topic, f"-count={3 * N}", "-ordered")
    await go.start()
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        for seq in range(N):
            for p in range(3):
                await producer.publish(topic, b"%d:%03d" % (p, seq), partition=p)
    got = await go.messages()
    order = defaultdict(list)
    for r in got:
        order[int(r["partition"])].append(r["body"])
    in_order = all(order[p] == [b"%d:%03d" % (p, s) for s in range(N)] for p in range(3))
    report("fastnsq->go", "ordered", 3 * N, len(got), in_order, per_partition_order=in_order)
    assert in_order


async def test_a_start_set_by_fastnsq_is_where_go_nsq_goes_on(nsq_cluster_ha: Any, driver: Path) -> None:
    topic, _ = await new_topic(nsq_cluster_ha, channels=("late",))
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        before = bodies(N, seed=16)
        for b in before:
            await producer.publish(topic, b)
        second = int(time.time()) + 1
        await asyncio.sleep(second - time.time() + 0.05)
        after = bodies(N, seed=17)
        for b in after:
            await producer.publish(topic, b)
    first: list[Any] = []

    async def slowly(message: Any) -> None:  # fastnsq reads a few, then go-nsq the rest
        first.append(message)
        await asyncio.sleep(0.1)

    consumer = Consumer(topic, "late", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        handler=slowly, max_in_flight=1, lookupd_poll_interval=0.5,
                        consume_offset=ConsumeOffset.timestamp(second))
    await consumer.start()
    await eventually(lambda: len(first) >= 5, timeout=30)
    await consumer.stop()
    go = go_sub(driver, nsq_cluster_ha, topic, "-channel=late", "-idle=5s")
    await go.start()
    rest = [r["body"] for r in await go.messages()]
    both = Counter(m.body for m in first) + Counter(rest)
    # A partition fastnsq had not read from yet still held its message from before the start,
    # and go-nsq (no start of its own) hands it out.
    held = [b for b in both if b in set(before)]
    identical = set(both) - set(held) == set(after)
    report("fastnsq->go", "start position", N, sum(both[b] for b in after), identical,
           by_fastnsq=len(first), by_go=len(rest), duplicates=sum(both.values()) - len(both),
           held_messages_go_handed_out=len(held))
    assert identical and len(held) <= 3 and all(m.body not in set(before) for m in first)
