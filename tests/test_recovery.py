"""Back within a second (issue 45): the recovery rule (:mod:`fastnsq.recovery`) and every face under it.

The rule's parts with a fake clock where one decides (cadence, recall), then each face against
an nsqd that goes down for a few seconds and comes back on its ports: the consumer through
lookupd (polling every 60 s, the default) and direct, the async and blocking producers, the
worker with ``--split-nsqd``; each must work again within a second of nsqd answering, and no
publish may fail after that with a cause from before. While nsqd is down, a counting listener
on its port and a counting proxy in front of lookupd check the caps: at most 5 connection
attempts a second per nsqd, 2 lookupd queries a second. The 5-minute outages are
bench/recovery.py's, not the suite's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from fastnsq import Consumer, Producer
from fastnsq import sync as blocking_api
from fastnsq.errors import NoConnectionError
from fastnsq.recovery import (
    EMPTY_POLL,
    FAST_PHASE,
    FAST_POLL,
    MAX_ATTEMPTS_PER_SECOND,
    MIN_POLL_GAP,
    PollCadence,
    Recall,
    Redial,
)
from fastnsq.testing import NSQLookupd
from fastnsq.testing.counting import AttemptCounter, QueryCounter, most_in_a_second
from fastnsq.testing.real import RealLookupdServer

from .helpers import Slack, eventually, unique
from .test_faults import REAL_BIN, Server
from .test_worker import start_worker

pytestmark = pytest.mark.timeout(120)

#: Within this long of nsqd answering again, every face works on a quiet machine (the issue's
#: second: the rule's own worst case is a 0.4 s wait plus a connect and a SUB). A test adds the
#: slack it measured from nsqd's start to the check (``within``), not a fixed margin (issue 63).
WITHIN = 1.0


def within(slack: Slack) -> float:
    """WITHIN plus what a busy machine delayed this process by meanwhile."""
    return WITHIN + slack.allowance(0.0)
OUTAGE = 3.0  # longer than the old backoffs' first steps: the old code took 1.8 s direct, 60 s via lookupd


# ---- the rule's parts ------------------------------------------------------------------------------


async def test_redial_probes_each_address_at_most_five_times_a_second_then_opens_the_rest() -> None:
    """Three connections wanted at one dead address: one probe a round, never two attempts within
    0.21 s; once the address answers, the other two open in the same round."""
    alive = False
    starts: list[float] = []
    opened: list[str] = []

    def attempt(key: str) -> Any:
        async def connect() -> None:
            starts.append(asyncio.get_running_loop().time())
            if not alive:
                raise ConnectionRefusedError("refused")
            opened.append(key)
        return connect

    redial = Redial(delay=0.01, max_delay=0.01)  # asked to hurry: the cap still holds
    for key in ("a", "b", "c"):
        redial.missing("10.0.0.1:4150", key, attempt(key), ConnectionRefusedError("refused"))
    await asyncio.sleep(1.5)
    gaps = [b - a for a, b in pairwise(starts)]
    assert len(starts) >= 5 and min(gaps) >= 1 / MAX_ATTEMPTS_PER_SECOND - 0.002, gaps
    assert len(starts) <= 1.5 * MAX_ATTEMPTS_PER_SECOND + 1
    assert redial.error("10.0.0.1:4150") is not None and not opened
    alive = True
    await eventually(lambda: not redial.pending(), timeout=2, what="every key opened")
    assert sorted(opened) == ["a", "b", "c"]
    await redial.close()


async def test_hurry_starts_a_round_now_unless_one_began_within_the_cap() -> None:
    starts: list[float] = []

    async def refused() -> None:
        starts.append(asyncio.get_running_loop().time())
        raise ConnectionRefusedError("refused")

    redial = Redial(delay=30.0, max_delay=30.0)  # the wait alone would take 15-30 s
    redial.missing("10.0.0.1:4150", "k", refused, ConnectionRefusedError("refused"))
    await asyncio.sleep(0.25)
    assert redial.hurry() is True  # 0.25 s since the caller's attempt: a round now
    await eventually(lambda: len(starts) == 1, timeout=1, what="the hurried round")
    assert redial.hurry() is False  # tried just now: its cause is current
    await redial.close()


async def test_dropping_the_last_key_stops_the_rounds() -> None:
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("refused")

    redial = Redial(delay=0.2, max_delay=0.2)
    redial.missing("10.0.0.1:4150", "k", refused)
    await asyncio.sleep(0.5)
    redial.drop("k")
    seen = calls
    await asyncio.sleep(0.5)
    assert seen >= 1 and calls == seen and not redial.pending()
    await redial.close()


def test_cadence_polls_fast_while_short_then_backs_off_to_the_interval() -> None:
    now = [0.0]
    cadence = PollCadence(60.0, 0.3, clock=lambda: now[0], rng=random.Random(3))
    assert all(51.0 <= cadence.next_wait() <= 69.0 for _ in range(50))  # regular waits are jittered
    assert cadence.set_short(True) is True and cadence.set_short(True) is False
    assert all(FAST_POLL[0] <= cadence.next_wait() <= FAST_POLL[1] for _ in range(50))
    assert FAST_POLL[0] >= MIN_POLL_GAP  # fast polls stay within 2 a second
    now[0] = FAST_PHASE + 1
    waits = [cadence.next_wait() for _ in range(12)]
    assert waits[0] < waits[3] < waits[6] and 51.0 <= waits[-1] <= 69.0  # doubling back to the interval
    cadence.set_short(False)
    assert 51.0 <= cadence.next_wait() <= 69.0


def test_recall_keeps_what_lookupd_stopped_listing_for_a_while() -> None:
    now = [0.0]
    recall: Recall[str] = Recall(10.0, clock=lambda: now[0])
    assert recall.wanted({"a", "b"}) == {"a", "b"}
    now[0] = 9.0
    assert recall.wanted({"a"}) == {"a", "b"} and recall.kept("b")
    now[0] = 10.5
    assert recall.wanted({"a"}) == {"a"} and not recall.kept("b") and not recall.kept("never listed")


# ---- counting what the clients do while nsqd is down -------------------------------------------------


async def test_while_nsqd_is_down_attempts_and_lookupd_queries_stay_under_their_caps() -> None:
    """A consumer through lookupd, a direct one and a producer (publishing every 20 ms, each
    publish asking for a fresh attempt) lose their nsqd; for 3 s its port only counts."""
    lookupd = await start_lookupd()
    server = await start_server(lookupd)
    topic = unique("caps")
    try:
        async with QueryCounter(lookupd.http_address) as proxy:
            via_lookupd = Consumer(topic, "a", lookupd_http_addresses=[proxy.address], handler=lambda m: None,
                                   client_id="via_lookupd")
            direct = Consumer(topic, "b", nsqd_tcp_addresses=[server.tcp_address], handler=lambda m: None,
                              client_id="direct")
            producer = Producer([server.tcp_address], client_id="producer")
            await producer.start()
            await producer.publish(topic, b"first")
            await direct.start()
            await via_lookupd.start()
            await eventually(lambda: via_lookupd.connections and direct.connections, 10, "both consumers")
            await server.down(kill=False)
            began = time.monotonic()
            failures: list[str] = []
            async with AttemptCounter(server.tcp_address) as listener:
                while time.monotonic() - began < 3.0:
                    with contextlib.suppress(NoConnectionError):
                        await producer.publish(topic, b"while down")
                        failures.append("a publish went through while nsqd was down")
                    await asyncio.sleep(0.02)
            during = [t for t in proxy.requests if t >= began]
            await server.start()
            await producer.close()
            await via_lookupd.stop()
            await direct.stop()
        assert not failures
        for client in ("via_lookupd", "direct", "producer"):
            assert 1 <= most_in_a_second(listener.times(client)) <= MAX_ATTEMPTS_PER_SECOND, (client, listener.attempts)
        assert 2 <= len(during) and most_in_a_second(during) <= 2, during  # polled fast, within the cap
    finally:
        await stop_all(server, lookupd)


# ---- every face, back within a second ----------------------------------------------------------------


async def start_lookupd() -> Any:
    lookupd: Any = NSQLookupd() if REAL_BIN is None else RealLookupdServer(REAL_BIN)
    await lookupd.start()
    return lookupd


def test_cadence_of_a_client_holding_no_nsqd_never_waits_longer_than_empty_poll() -> None:
    """A consumer started while every nsqd was down has only lookupd to find one: after the fast
    phase its polls stay EMPTY_POLL apart at most, however long that lasts, not the 60 s interval."""
    now = [0.0]
    cadence = PollCadence(60.0, 0.3, clock=lambda: now[0], rng=random.Random(5))
    assert cadence.set_short(True, empty=True) is True
    assert all(FAST_POLL[0] <= cadence.next_wait() <= FAST_POLL[1] for _ in range(20))
    now[0] = 10 * FAST_PHASE
    waits = [cadence.next_wait() for _ in range(40)]
    assert waits[0] < waits[2] and max(waits) == EMPTY_POLL
    cadence.set_short(True)  # a connection now: short of another nsqd only, so back towards the interval
    assert 51.0 <= [cadence.next_wait() for _ in range(12)][-1] <= 69.0


async def start_server(lookupd: Any) -> Server:
    server = Server(lookupd_tcp_addresses=[lookupd.tcp_address])
    await server.start()
    return server


async def stop_all(server: Server, lookupd: Any) -> None:
    await server.close()
    await (lookupd.stop() if REAL_BIN is None else lookupd.close())


async def outage(server: Server, seconds: float = OUTAGE) -> float:
    """nsqd down (SIGTERM: a real one unregisters from lookupd) for ``seconds``; when it answers again."""
    await server.down(kill=False)
    await asyncio.sleep(seconds)
    await server.start()
    return time.monotonic()


async def publish_one(address: str, topic: str, body: bytes) -> None:
    async with Producer([address]) as producer:
        await producer.publish(topic, body)


@pytest.mark.parametrize("via", ["lookupd", "direct"])
async def test_a_consumer_consumes_again_within_a_second_of_nsqd_answering(via: str) -> None:
    """Defaults everywhere (lookupd_poll_interval 60 s): the old code waited for the next poll
    through lookupd (up to 60 s), and direct out its backoff, which had grown to 4-8 s by the
    end of an 8 s outage (recovering within a second only when an attempt happened to fall there)."""
    lookupd = await start_lookupd()
    server = await start_server(lookupd)
    topic = unique(f"back_{via}")
    handled: dict[bytes, float] = {}
    where: dict[str, Any] = ({"lookupd_http_addresses": [lookupd.http_address]} if via == "lookupd"
                             else {"nsqd_tcp_addresses": [server.tcp_address]})
    consumer = Consumer(topic, "ch", handler=lambda m: handled.setdefault(m.body, time.monotonic()), **where)
    try:
        await publish_one(server.tcp_address, topic, b"before")
        await consumer.start()
        await eventually(lambda: b"before" in handled, 10, "the message before the outage")
        back = await outage(server, OUTAGE if via == "lookupd" else 8.0)
        async with Slack() as slack:
            await publish_one(server.tcp_address, topic, b"after")
            await eventually(lambda: b"after" in handled, 15, "the message after the outage")
        assert handled[b"after"] - back <= within(slack), (handled[b"after"] - back, slack)
    finally:
        await consumer.stop()
        await stop_all(server, lookupd)


@pytest.mark.parametrize("topic_kind", ["known", "new"])
async def test_a_consumer_started_while_nsqd_is_down_consumes_within_a_second_of_its_first_publish(
        topic_kind: str) -> None:
    """Through lookupd, started while its nsqd is down: "known", a topic nsqd had before (it
    registers it again as it starts), "new", one no nsqd has until the publish. The old code
    asked lookupd again after a random 0-18 s, then every 51-69 s: 11 s and 50 s on a real nsqd."""
    lookupd = await start_lookupd()
    server = await start_server(lookupd)
    topic = unique(f"down_at_start_{topic_kind}")
    handled: dict[bytes, float] = {}
    if topic_kind == "known":
        await publish_one(server.tcp_address, topic, b"before")
    await server.down(kill=False)
    consumer = Consumer(topic, "ch", lookupd_http_addresses=[lookupd.http_address],
                        handler=lambda m: handled.setdefault(m.body, time.monotonic()))
    try:
        await consumer.start()
        await asyncio.sleep(OUTAGE)
        await server.start()
        await publish_one(server.tcp_address, topic, b"after")
        published = time.monotonic()
        async with Slack() as slack:
            await eventually(lambda: b"after" in handled, 15, "the message published after nsqd started")
        assert handled[b"after"] - published <= within(slack), (handled[b"after"] - published, slack)
    finally:
        await consumer.stop()
        await stop_all(server, lookupd)


async def test_the_blocking_consumer_through_lookupd_too() -> None:
    lookupd = await start_lookupd()
    server = await start_server(lookupd)
    topic = unique("back_sync")
    handled: dict[bytes, float] = {}
    consumer = blocking_api.Consumer(topic, "ch", lookupd_http_addresses=[lookupd.http_address],
                                     handler=lambda m: handled.setdefault(m.body, time.monotonic()))
    try:
        await publish_one(server.tcp_address, topic, b"before")
        await asyncio.to_thread(consumer.start)
        await eventually(lambda: b"before" in handled, 10, "the message before the outage")
        back = await outage(server)
        async with Slack() as slack:
            await publish_one(server.tcp_address, topic, b"after")
            await eventually(lambda: b"after" in handled, 10, "the message after the outage")
        assert handled[b"after"] - back <= within(slack), (handled[b"after"] - back, slack)
    finally:
        await asyncio.to_thread(consumer.stop)
        await stop_all(server, lookupd)


async def test_the_async_producer_starts_without_nsqd_fails_fast_then_publishes_within_a_second() -> None:
    """The ASGI lifespan: ``async with Producer(...)`` while nsqd is down; a publish raises at once
    with what an attempt made for it got; one waiting (fail_fast=False) is answered as nsqd opens."""
    lookupd = await start_lookupd()
    server = await start_server(lookupd)
    topic = unique("lazy")
    await server.down(kill=False)
    try:
        async with Producer([server.tcp_address]) as producer, \
                Producer([server.tcp_address], fail_fast=False) as waiting:
            async with Slack() as slack:
                began = time.monotonic()
                with pytest.raises(NoConnectionError, match=r"Errno 111|refused") as caught:
                    await producer.publish(topic, b"down")
                took = time.monotonic() - began
            # At once (a refused dial, 0.5 s on a quiet machine), plus the slack measured meanwhile.
            assert took < 0.5 + slack.allowance(0.0) and server.tcp_address in str(caught.value), (took, slack)
            pending = asyncio.create_task(waiting.publish(topic, b"waits", timeout=30))
            await asyncio.sleep(OUTAGE)
            await server.start()
            back = time.monotonic()
            async with Slack() as slack:
                assert await pending == b"OK"
                answered = time.monotonic() - back
                outcomes = await publish_every(producer, topic, back, seconds=2.0)
            assert answered <= within(slack), (answered, slack)
        assert first_success(outcomes) - back <= within(slack), (outcomes, slack)
        assert not [o for o in outcomes if o[1] is not None and o[0] > back + within(slack)], (outcomes, slack)
    finally:
        await stop_all(server, lookupd)


async def publish_every(producer: Any, topic: str, since: float, seconds: float,
                        interval: float = 0.05) -> list[tuple[float, str | None]]:
    """Publishes every ``interval`` until ``since + seconds``: (time, error or None) each."""
    outcomes: list[tuple[float, str | None]] = []
    while time.monotonic() < since + seconds:
        try:
            await producer.publish(topic, b"x")
            outcomes.append((time.monotonic(), None))
        except NoConnectionError as exc:
            outcomes.append((time.monotonic(), str(exc)))
        await asyncio.sleep(interval)
    return outcomes


def first_success(outcomes: list[tuple[float, str | None]]) -> float:
    return next(at for at, error in outcomes if error is None)


async def test_the_blocking_producer_gives_no_stale_cause_and_fails_fast_mid_publish() -> None:
    """The first publish after nsqd is back, well after its last failure, goes through (the old
    code raised the stale "refused" once); a publish under way when nsqd dies fails in well
    under a second (the old code waited out its backoff, 8-10 s)."""
    lookupd = await start_lookupd()
    server = await start_server(lookupd)
    topic = unique("stale")
    producer = await asyncio.to_thread(blocking_api.Producer, [server.tcp_address], thread_connections=0)
    try:
        assert await asyncio.to_thread(producer.publish, topic, b"up") == b"OK"
        await server.down(kill=False)
        async with Slack() as slack:
            began = time.monotonic()
            with pytest.raises(NoConnectionError, match=r"Errno 111|refused"):
                await asyncio.to_thread(producer.publish, topic, b"in flight as nsqd dies")
            took = time.monotonic() - began
        assert took < within(slack), (took, slack)  # not its backoff waited out (8-10 s)
        await asyncio.sleep(OUTAGE)
        await server.start()
        back = time.monotonic()
        async with Slack() as slack:
            await asyncio.sleep(0.5)  # the last failure is 0.5 s older than nsqd's start: stale now
            assert await asyncio.to_thread(producer.publish, topic, b"first after") == b"OK"
            took = time.monotonic() - back
        assert took <= within(slack), (took, slack)
    finally:
        await asyncio.to_thread(producer.close)
        await stop_all(server, lookupd)


async def test_the_worker_with_split_nsqd_consumes_again_within_a_second(tmp_path: Path) -> None:
    """Two processes, two nsqd, lookupd polled every 5 s; one nsqd is down for 6 s, so a poll
    falls inside the outage. Its child has it back within a second (the old supervisor dropped
    it at that poll and gave it back at the next one, up to 5 s later; a minute by default)."""
    if REAL_BIN is not None:
        pytest.skip("the embedded servers' test (the real servers' run is bench/recovery.py)")
    lookupd = await start_lookupd()
    first, second = await start_server(lookupd), await start_server(lookupd)
    topic = unique("wk_back")
    worker = None
    try:
        await publish_one(first.tcp_address, topic, b"one")
        await publish_one(second.tcp_address, topic, b"two")
        worker = await start_worker(tmp_path, "wk_jobs:handle", "--topic", topic, "--channel", "work",
                                    "--processes", "2", "--split-nsqd", "--lookupd-http-address",
                                    lookupd.http_address, "--consumer-opt", "lookupd_poll_interval=5")
        await eventually(lambda: {"one", "two"} <= set(worker.lines("handled")), 20, "both nsqd's messages")
        back = await outage(second, 6.0)
        async with Slack() as slack:
            await publish_one(second.tcp_address, topic, b"after")
            while "after" not in worker.lines("handled"):
                assert time.monotonic() - back < 15, "the message after the outage was not handled"
                await asyncio.sleep(0.02)
            took = time.monotonic() - back
        # Within a second (not the next 5 s poll), plus the slack measured meanwhile.
        assert took <= within(slack), (took, slack)
        assert await worker.stop() == 0
    finally:
        if worker is not None and worker.process.returncode is None:
            worker.process.kill()
        await second.close()
        await stop_all(first, lookupd)
