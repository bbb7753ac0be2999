"""``fastnsq to-nsq``: nsq_to_nsq's command line on fastnsq, run as a real process between two nsqd.

The destination is a second nsqd (embedded, or a real nsqd 1.3.0 in the real pass): every
message arrives, a message is FINed only once the destination answered its MPUB, the JSON
filter passes what nsq_to_nsq passes (side by side with nsq's own binary in the real pass),
and neither a SIGKILL of the app nor a destination that goes away loses anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fastnsq import Consumer, Producer
from fastnsq.apps.hostpool import HostPool
from fastnsq.apps.jsonfilter import JsonFilter, Verdict
from fastnsq.recovery import RETRY_DELAY
from fastnsq.testing import NSQD
from fastnsq.testing.process import free_port
from fastnsq.testing.proxy import FaultProxy
from fastnsq.testing.real import RealNSQDServer, real_bin_dir

from .apps_support import Source, channel_drained, create_channels, go_app, run_to_exit, start, start_go
from .helpers import Slack, eventually, stats_json, unique
from .test_consumer import channel_stats, publish_spread


@contextlib.asynccontextmanager
async def destination() -> AsyncIterator[Any]:
    """A second nsqd of the kind the run is judged against."""
    folder = real_bin_dir()
    server: Any = RealNSQDServer(folder) if folder is not None else NSQD()
    await server.start()
    try:
        yield server
    finally:
        await server.close() if hasattr(server, "close") else await server.stop()


async def received(address: str, topic: str, expected: int, timeout: float = 30.0) -> list[bytes]:
    """Every body the destination topic holds (at least ``expected`` distinct ones), read on a
    channel of ours, duplicates included."""
    bodies: list[bytes] = []
    consumer = Consumer(topic, "check", nsqd_tcp_addresses=[address], handler=lambda m: bodies.append(m.body),
                        max_in_flight=1000)
    await consumer.start()
    try:
        try:
            # ``timeout`` without a message more: a loaded machine reads 100,000 slowly, not never.
            await eventually(lambda: len(set(bodies)) >= expected, timeout, f"{expected} messages at the destination",
                             progress=lambda: len(bodies))
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {len(bodies)} came, {len(set(bodies))} distinct") from None
        await asyncio.sleep(0.3)  # a duplicate would come now
    finally:
        await consumer.stop()
    return bodies


async def drained(nsqd: Any, topic: str, channel: str = "nsq_to_nsq", *, published: int) -> bool:
    return await channel_drained(nsqd.http_address, topic, channel, published=published)



# ---- pure pieces -------------------------------------------------------------------------------


def test_json_filter_passes_what_nsq_to_nsq_passes() -> None:
    only_a = JsonFilter("kind", "a", ["n", "kind"])
    assert only_a.apply(b'{"kind":"a","n":1.0,"x":2}') == (Verdict.PASS, b'{"kind":"a","n":1}')
    assert only_a.apply(b'{"kind":"b","n":1}')[0] is Verdict.DROP
    assert only_a.apply(b'{"n":1}')[0] is Verdict.REQUEUE  # a value required and no field: backoff
    assert only_a.apply(b"not json")[0] is Verdict.DROP
    assert JsonFilter("kind").apply(b'{"n":1}')[0] is Verdict.DROP  # no value required: dropped quietly
    numbers = JsonFilter("n", "2")
    assert [numbers.apply(b)[0] for b in (b'{"n":2}', b'{"n":2.0}', b'{"n":"2"}', b'{"n":3}', b'{"n":[2]}')] == [
        Verdict.PASS, Verdict.PASS, Verdict.PASS, Verdict.DROP, Verdict.DROP]
    assert JsonFilter(whitelist=["s"]).apply(b'{"s":"<&>"}')[1] == b'{"s":"\\u003c\\u0026\\u003e"}'
    assert not JsonFilter().active and JsonFilter().apply(b"x") == (Verdict.PASS, b"x")


def test_hostpool_skips_a_failed_destination_then_tries_it_again() -> None:
    now = [0.0]
    pool = HostPool(["a", "b", "c"], "hostpool", clock=lambda: now[0])
    assert [pool.get() for _ in range(4)] == ["a", "b", "c", "a"]
    pool.mark("b", False)
    assert [pool.get() for _ in range(4)] == ["c", "a", "c", "a"]
    now[0] = 31.0  # past the first 30 s: one try, the next wait 60 s
    assert pool.get() == "b" and pool.get() == "c"
    pool.mark("b", True)
    assert sorted(pool.get() for _ in range(3)) == ["a", "b", "c"]
    for host in ("a", "b", "c"):
        pool.mark(host, False)
    assert pool.get() == "a"  # all down: all taken back
    rr = HostPool(["a", "b"], "round-robin")
    rr.mark("a", False)
    assert [rr.get() for _ in range(3)] == ["a", "b", "a"]


async def test_bad_usage_is_named() -> None:
    status, out = await run_to_exit("to-nsq", "-topic=t", "-nsqd-tcp-address=127.0.0.1:4150")
    assert status == 2 and "--destination-nsqd-tcp-address required" in out
    status, out = await run_to_exit("to-nsq", "-nsqd-tcp-address=127.0.0.1:4150",
                                    "-destination-nsqd-tcp-address=127.0.0.1:4150")
    assert status == 2 and "--topic and --channel are required" in out
    status, out = await run_to_exit("to-nsq", "-topic=t", "-mode=random", "-nsqd-tcp-address=127.0.0.1:4150")
    assert status == 2 and "--mode" in out and "'random'" in out


# ---- relaying ----------------------------------------------------------------------------------


async def test_relays_every_message_in_batches(nsqd, tmp_path: Path) -> None:
    topic = unique("tonsq")
    bodies = await publish_spread([nsqd.tcp_address], topic, 5000)
    port = free_port()
    async with destination() as target:
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-destination-nsqd-tcp-address={target.tcp_address}", "-destination-topic=copy",
                          "-max-in-flight=1000", "-status-every=1000", f"--metrics-port={port}", log=tmp_path / "log")
        source = Source(nsqd.http_address, topic, "nsq_to_nsq")
        await eventually(lambda: source.drained(5000), 30, "the source drained", progress=source.done)
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            metrics = await resp.text()  # the runtime's /metrics, the app's consumer in it
        finished = re.search(rf'^nsq_consumer_messages_finished_total{{[^}}]*topic="{topic}"[^}}]*}} (\S+)$', metrics,
                             re.MULTILINE)
        assert finished is not None and float(finished.group(1)) == 5000, metrics[:2000]
        assert await app.stop() == 0, app.log()
        assert "[aggregate]: finished 1" in app.log()  # the status line, every 1000 messages or so
        assert sorted(await received(target.tcp_address, "copy", 5000)) == sorted(bodies)
    [stats] = await channel_stats([nsqd.http_address], topic, "nsq_to_nsq")
    assert stats["message_count"] == 5000 and stats["requeue_count"] == 0


async def test_json_filter_and_two_destinations_round_robin(nsqd, tmp_path: Path) -> None:
    topic = unique("tonsq")
    docs = [json.dumps({"kind": "a" if i % 3 else "b", "n": i, "pad": "x" * 10}).encode() for i in range(600)]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [*docs, *[b"not json"] * 10])
    async with destination() as one, destination() as two:
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-destination-nsqd-tcp-address={one.tcp_address}",
                          f"-destination-nsqd-tcp-address={two.tcp_address}", "-mode=round-robin",
                          "-require-json-field=kind", "-require-json-value=a", "-whitelist-json-field=n",
                          "-max-in-flight=40", log=tmp_path / "log")
        source = Source(nsqd.http_address, topic, "nsq_to_nsq")
        await eventually(lambda: source.drained(600), 30, "the source drained", progress=source.done)
        assert await app.stop() == 0, app.log()
        each: list[list[bytes]] = [[], []]
        consumers = [Consumer(topic, "check", nsqd_tcp_addresses=[d.tcp_address], max_in_flight=500,
                              handler=lambda m, mine=mine: mine.append(m.body)) for d, mine in zip((one, two), each)]
        for consumer in consumers:
            await consumer.start()
        await eventually(lambda: sum(map(len, each)) >= 400, 20, "400 messages at the destinations")
        for consumer in consumers:
            await consumer.stop()
    got = each[0] + each[1]
    assert sorted(json.loads(b)["n"] for b in got) == [i for i in range(600) if i % 3]
    assert len(each[0]) >= 40 and len(each[1]) >= 40  # batches of at most 10 (40 in flight) took turns
    assert all(json.loads(b).keys() == {"n"} for b in got)


@pytest.mark.slow
async def test_sigkill_mid_stream_and_the_destination_down_lose_nothing(nsqd, tmp_path: Path) -> None:
    """The app's worker SIGKILLed mid-stream and started again while the destination is stopped,
    the destination back once the new worker has failed to publish to it: every body at the destination at least once, duplicates at
    most max in flight (the batches unanswered at the kill)."""
    topic = unique("tonsq")
    bodies = await publish_spread([nsqd.tcp_address], topic, 100_000)
    async with destination() as target:
        await create_channels(target.http_address, "copy", "check")
        args = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", "-destination-topic=copy",
                f"-destination-nsqd-tcp-address={target.tcp_address}", "-max-in-flight=500", "-status-every=0",
                "-consumer-opt=default_requeue_delay,0.5", "-consumer-opt=backoff_multiplier,0.1",
                "-consumer-opt=msg_timeout,3s",  # a killed worker's messages come back in 3 s, not 60
                "-producer-opt=publish_timeout,1"]
        app = await start("to-nsq", *args, log=tmp_path / "log")

        source = Source(nsqd.http_address, topic, "nsq_to_nsq")
        await eventually(lambda: source.taken(10_000), 30, "a part relayed", progress=source.done)
        await app.kill()
        await target.stop()  # a clean stop: what it acknowledged stays
        app = await start("to-nsq", *args, log=tmp_path / "log")
        # The destination stays down until the new worker has failed to publish to it (a fixed
        # 2 s was shorter than a start on a loaded machine: the worker then never saw it down).
        await eventually(lambda: "holding them until it answers" in app.log(), 30,
                         "a publish to the stopped destination")
        await asyncio.sleep(1)
        await target.start()
        await eventually(lambda: source.drained(100_000), 90, "the source drained", progress=source.done)
        assert await app.stop() == 0, app.log()
        counts = Counter(await received(target.tcp_address, "copy", len(bodies), 60))
    assert "drained:" not in app.log().split("started (pid")[1]  # the first worker died without a drain
    assert set(counts) == set(bodies)
    assert sum(counts.values()) - len(bodies) <= 500


@pytest.mark.slow
@pytest.mark.skipif(real_bin_dir() is None, reason="a real nsqd is SIGKILLed: the real pass")
async def test_the_destination_nsqd_killed_and_back_loses_nothing(nsqd, tmp_path: Path) -> None:
    """The destination, a real nsqd that keeps what it acknowledged through a SIGKILL
    (``--mem-queue-size=0 --sync-every=1``: with nsqd's defaults a killed nsqd loses up to its
    last 2,500 acknowledged messages, ~500 in a run here), SIGKILLed mid-stream and started again
    2 s later: every message arrives; what was unanswered at the kill was requeued and sent again."""
    topic = unique("tonsq")
    bodies = await publish_spread([nsqd.tcp_address], topic, 10_000)
    target = RealNSQDServer(real_bin_dir(), "--mem-queue-size=0", "--sync-every=1")  # type: ignore[arg-type]
    await target.start()
    try:
        await create_channels(target.http_address, "copy", "check")
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          "-destination-topic=copy", f"-destination-nsqd-tcp-address={target.tcp_address}",
                          "-max-in-flight=500", "-status-every=0", "-consumer-opt=default_requeue_delay,0.5",
                          "-consumer-opt=backoff_multiplier,0.1", "-producer-opt=publish_timeout,1",
                          log=tmp_path / "log")

        source = Source(nsqd.http_address, topic, "nsq_to_nsq")
        await eventually(lambda: source.taken(3_000), 30, "a part relayed", progress=source.done)
        await target.kill()
        await asyncio.sleep(2)
        await target.start()
        await eventually(lambda: source.drained(10_000), 90, "the source drained", progress=source.done)
        assert await app.stop() == 0, app.log()
        counts = Counter(await received(target.tcp_address, "copy", len(bodies), 60))
    finally:
        await target.close()
    assert "holding them until it answers" in app.log()
    assert set(counts) == set(bodies)  # 0 lost


async def test_a_destination_down_holds_the_batches_and_relays_again_within_a_second(nsqd, tmp_path: Path) -> None:
    """Issue 45: the one destination stops for 3 s. The batches that find it down are held (their
    messages touched), not requeued: no attempt spent, no backoff to wait out (the old code
    requeued them with backoff, and the relay came back seconds after the destination did)."""
    topic = unique("tonsq")
    await publish_spread([nsqd.tcp_address], topic, 10)
    async with destination() as target:
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-destination-nsqd-tcp-address={target.tcp_address}", "-destination-topic=copy",
                          "-status-every=0", log=tmp_path / "log")
        await received(target.tcp_address, "copy", 10)
        await target.stop()  # a clean stop: what it holds stays
        await publish_spread([nsqd.tcp_address], topic, 10)
        await asyncio.sleep(3.0)
        arrived: list[float] = []
        async with Slack() as slack:
            await target.start()
            back = asyncio.get_running_loop().time()
            consumer = Consumer("copy", "check", nsqd_tcp_addresses=[target.tcp_address], max_in_flight=100,
                                handler=lambda m: arrived.append(asyncio.get_running_loop().time()))
            await consumer.start()
            try:
                await eventually(lambda: len(arrived) >= 10, 15, "the held messages at the destination")
            finally:
                slack.stop()
                await consumer.stop()
        assert await app.stop() == 0, app.log()
    assert "holding them until it answers" in app.log()
    # Relayed again at the recovery rule's next dial (RETRY_DELAY, 0.4 s at most), not after a
    # backoff: plus a connect, an MPUB, the check consumer's SUB and the slack measured meanwhile.
    assert arrived[9] - back <= RETRY_DELAY + slack.allowance(0.6), (arrived[9] - back, slack)
    [stats] = await channel_stats([nsqd.http_address], topic, "nsq_to_nsq")
    assert stats["message_count"] == 20 and stats["requeue_count"] == 0


async def test_a_black_holed_destination_gets_no_more_batches(nsqd, tmp_path: Path) -> None:
    """Issue 57: of two destinations, B goes silent (a proxy dropping every byte). Once B's
    connection is suspect (suspect_after, 0.5 s), the batches go to A: the relay goes on. Before,
    every other batch went to B and waited its whole publish_timeout (10 s), and those batches
    soon held all of max in flight: nothing reached A until B was marked down."""
    topic = unique("tonsq_hole")
    async with destination() as one, NSQD() as two, FaultProxy(two.tcp_address) as proxy:
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-destination-nsqd-tcp-address={one.tcp_address}",
                          f"-destination-nsqd-tcp-address={proxy.address}", "-destination-topic=copy",
                          "-max-in-flight=40", "-status-every=0", log=tmp_path / "log")
        arrived: list[bytes] = []
        consumer = Consumer("copy", "check", nsqd_tcp_addresses=[one.tcp_address], max_in_flight=500,
                            handler=lambda m: arrived.append(m.body))
        await consumer.start()
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.mpublish(topic, [b"warm%d" % i for i in range(20)])
            await eventually(lambda: len(arrived) >= 5, 15, "the relay under way to A")
            proxy.drop()
            for second in range(3):
                await producer.mpublish(topic, [b"m%d-%d" % (second, i) for i in range(100)])
                await asyncio.sleep(1.0)
            during = {body for body in arrived if body.startswith(b"m")}
        await consumer.stop()
        proxy.undrop()
        assert await app.stop() == 0, app.log()
    # Published 0-2 s into the hole, read by 3 s: all but what B held before it turned suspect.
    assert len(during) >= 200, (len(during), app.log()[-2000:])


async def test_a_slow_destination_is_re_sent_from_once(nsqd, tmp_path: Path) -> None:
    """Of two destinations, B's answers are held 0.9 s (it has every batch), four times, 2.5 s
    apart. The first time, the batches B holds are sent to A (B might be hung); B then answers
    them after all: slow, not dead. The later times its batches wait for it (re-sent only past
    SLOW_HOLD). Before, every stall re-sent, and duplicated, what B held."""
    topic = unique("tonsq_slow")
    async with destination() as one, NSQD() as two, FaultProxy(two.tcp_address) as proxy:
        app = await start("to-nsq", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-destination-nsqd-tcp-address={one.tcp_address}",
                          f"-destination-nsqd-tcp-address={proxy.address}", "-destination-topic=copy",
                          "-max-in-flight=40", "-status-every=0", log=tmp_path / "log")
        async with Producer([nsqd.tcp_address]) as producer:
            stop = asyncio.Event()

            async def publisher() -> None:
                sent = 0
                while not stop.is_set():
                    await producer.mpublish(topic, [b"m%d" % (sent + i) for i in range(5)])
                    sent += 5
                    await asyncio.sleep(0.025)

            async def relaying_to_b() -> bool:
                stats = await stats_json(two.http_address, "copy")
                return any(t["topic_name"] == "copy" and t["message_count"] > 0 for t in stats["topics"] or [])

            running = asyncio.ensure_future(publisher())
            # Until to-nsq relays to B (not a fixed second: under load its worker took longer to
            # start, the first stall found B holding nothing and the first count was 0).
            await eventually(relaying_to_b, 30, "to-nsq relaying to B")
            counts = []
            for _ in range(4):
                await proxy.stall(0.9, "down")
                await asyncio.sleep(2.5)
                counts.append(app.log().count(" instead (they may arrive twice)"))
            stop.set()
            await running
        assert await app.stop() == 0, app.log()
    assert counts[0] >= 1, app.log()[-2000:]  # B held batches at the first stall: sent to A
    assert counts[-1] - counts[0] <= 1, (counts, app.log()[-2000:])


# ---- beside nsq's own nsq_to_nsq (the real pass) ------------------------------------------------


@pytest.mark.skipif(not go_app("nsq_to_nsq"), reason="nsq's nsq_to_nsq is run beside ours in the real pass")
async def test_same_messages_as_nsq_to_nsq(nsqd, tmp_path: Path) -> None:
    topic = unique("tonsq")
    await create_channels(nsqd.http_address, topic, "go", "ours")
    docs = [json.dumps({"kind": ["a", "b", 1][i % 3], "n": i * 1.0, "s": "<é>", "z": None}).encode()
            for i in range(300)] + [b"[1]", b"{}", b"nope"]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, docs)
    async with destination() as target:
        for name, starter in (("go", start_go), ("ours", start)):
            app = await starter("nsq_to_nsq" if name == "go" else "to-nsq", f"-topic={topic}", f"-channel={name}",
                                f"-nsqd-tcp-address={nsqd.tcp_address}", f"-destination-topic={name}",
                                f"-destination-nsqd-tcp-address={target.tcp_address}", "-require-json-field=kind",
                                "-whitelist-json-field=n", "-whitelist-json-field=s", "-whitelist-json-field=z",
                                log=tmp_path / f"{name}.log")
            await eventually(lambda name=name: drained(nsqd, topic, name, published=303), 30, f"{name} drained")
            assert await app.stop() == 0, app.log()
        go = await received(target.tcp_address, "go", 200)
        ours = await received(target.tcp_address, "ours", 200)
    assert sorted(ours) == sorted(go) and len(go) == 300  # every doc with a kind, re-encoded alike
