"""Gray failures (issue 57): an nsqd that hangs (SIGSTOP of its process) or sits behind a black
hole (a proxy that drops every byte) refuses nothing; the clients must notice and route around it.

The hung nsqd runs in a child process (:class:`fastnsq.testing.process.NSQDProcess`: the real
binary in a real-server run, else the embedded nsqd); the black hole is
:class:`fastnsq.testing.proxy.FaultProxy` in front of an embedded nsqd. The tests count
failed publishes and messages; the few bounds on time are the configured timeout plus what
:class:`tests.helpers.Slack` measures of the machine's load.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

import fastnsq.sync
from fastnsq import Consumer, Producer, liveness
from fastnsq.config import ConnectionOptions
from fastnsq.conn import Connection
from fastnsq.errors import NoConnectionError, NsqdDown, PublishTimeoutError
from fastnsq.producer.pool import FAIL_FAST_WAIT
from fastnsq.producer.suspects import PROBES_IN_A_ROW, RECALL, SLOW_HOLD, Suspects
from fastnsq.testing import NSQD
from fastnsq.testing.process import NSQDProcess
from fastnsq.testing.proxy import FaultProxy
from fastnsq.testing.real import real_bin_dir

from .helpers import Slack, eventually, stats_json, topic_entry, unique

#: Publishes while B is faulted, one every PACE s: some are on B's connection when it hangs.
COUNT, PACE = 60, 0.01


@pytest.fixture
def two_nsqd() -> Iterator[tuple[NSQDProcess, NSQDProcess]]:
    """A and B, each an nsqd in a process of its own (real ones in a real-server run)."""
    real = real_bin_dir()
    servers = [NSQDProcess(binary=None if real is None else real / "nsqd") for _ in range(2)]
    try:
        for server in servers:
            server.start()
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.resume()  # a failed test may leave B stopped: SIGTERM would wait for ever
            server.close()


async def depth(http_address: str, topic: str) -> int:
    """Messages nsqd holds for ``topic`` (no channel: they stay in the topic)."""
    stats = await stats_json(http_address, topic)
    try:
        return int(topic_entry(stats, topic)["depth"])
    except StopIteration:
        return 0


async def paced(producer: Producer, topic: str) -> list[BaseException]:
    """COUNT publishes, PACE s apart, each awaited in a task of its own; the failures."""
    tasks = []
    for index in range(COUNT):
        tasks.append(asyncio.ensure_future(producer.publish(topic, b"m%d" % index)))
        await asyncio.sleep(PACE)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


async def delivered(servers: tuple[NSQDProcess, NSQDProcess], topic: str, at_least: int) -> int:
    async def total() -> int:
        return sum([await depth(server.http_address, topic) for server in servers])

    await eventually(lambda: _at_least(total, at_least), timeout=20, what=f"{at_least} messages on A and B")
    return await total()


async def _at_least(total, count: int) -> bool:
    return await total() >= count


# ---- Producer([A, B]) with B hung -----------------------------------------------------------------


@pytest.mark.parametrize("coalesce", [True, False])
async def test_producer_routes_around_a_hung_nsqd(two_nsqd, coalesce):
    """B SIGSTOPped: no publish fails while A answers (before: those B held waited the whole
    publish_timeout and raised PublishTimeoutError, half of them); what B held was sent again
    on A, counted in ``rerouted``; after SIGCONT each message is there once or, for those
    rerouted, at most twice."""
    a, b = two_nsqd
    topic = unique("hung")
    async with Producer([a.tcp_address, b.tcp_address], publish_timeout=5, coalesce=coalesce) as producer:
        await asyncio.gather(*(producer.publish(topic, b"warm") for _ in range(10)))
        b.pause()
        try:
            failures = await paced(producer, topic)
        finally:
            b.resume()
        assert failures == [], failures[:3]
        stats = producer.snapshot()
        assert stats.rerouted >= 1, stats  # B held something when it hung, or none went to B
        assert stats.failed == 0, stats
    total = await delivered(two_nsqd, topic, 10 + COUNT)
    assert total <= 10 + COUNT + stats.rerouted


def test_blocking_producer_routes_around_a_hung_nsqd(two_nsqd):
    """fastnsq.sync.Producer (its calling threads' own connections, then the loop's): B hung,
    no publish raises; rerouted counts what B was left with."""
    a, b = two_nsqd
    topic = unique("hung_sync")
    failures: list[BaseException] = []
    with fastnsq.sync.Producer([a.tcp_address, b.tcp_address], publish_timeout=5) as producer:
        for _ in range(10):
            producer.publish(topic, b"warm")

        def publisher() -> None:
            for index in range(COUNT // 2):
                try:
                    producer.publish(topic, b"s%d" % index)
                except Exception as exc:  # noqa: BLE001 - counted
                    failures.append(exc)
                time.sleep(PACE)

        threads = [threading.Thread(target=publisher) for _ in range(2)]
        b.pause()
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            b.resume()
        stats = producer.snapshot()
    assert failures == [], failures[:3]
    assert stats.failed == 0, stats
    total = asyncio.run(delivered(two_nsqd, topic, 10 + COUNT))
    assert total <= 10 + COUNT + stats.rerouted


def test_blocking_producer_sends_to_a_hung_nsqd_again_once_it_answers(two_nsqd):
    """The calling threads' own connections go round the nsqd as the loop's do. Before, a thread
    took back the connection it had just used: one thread sent every publish to one nsqd, and
    once B's connections were dropped in its hang, B got no publish again (a trial: 0 of 1,500
    in 15 s after SIGCONT, while the loop's pool had taken B back). Counted in calls, not time:
    B must take one of those made after its probation can have ended."""
    a, b = two_nsqd
    topic = unique("rotation_sync")
    with fastnsq.sync.Producer([a.tcp_address, b.tcp_address], publish_timeout=5) as producer:
        producer.publish(topic, b"first")  # the loop validates the topic: the threads' path takes the rest
        for _ in range(40):
            producer.publish(topic, b"one thread")
        spread = [asyncio.run(depth(server.http_address, topic)) for server in (a, b)]
        assert min(spread) >= 15, spread  # round robin: about 20 each

        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            b.pause()
            try:
                for _ in range(COUNT // 4):
                    list(threads.map(lambda index: producer.publish(topic, b"during %d" % index), range(4)))
                    time.sleep(PACE)
            finally:
                b.resume()
        held_by_b = asyncio.run(depth(b.http_address, topic))
        for calls in range(1, 3001):  # about 2 s of probes on a quiet machine: ~200 calls
            producer.publish(topic, b"after")
            time.sleep(PACE)
            if calls % 20 == 0 and asyncio.run(depth(b.http_address, topic)) > held_by_b:
                break
        assert asyncio.run(depth(b.http_address, topic)) > held_by_b, f"B took none of {calls} calls"
        assert producer.snapshot().failed == 0


# ---- Producer([A, B]) with B black-holed ----------------------------------------------------------


async def test_producer_routes_around_a_black_hole():
    """B behind a proxy that drops every byte both ways (the connection stays open, nothing
    comes back): no publish fails."""
    async with NSQD() as a, NSQD() as b, FaultProxy(b.tcp_address) as proxy:
        topic = unique("hole")
        async with Producer([a.tcp_address, proxy.address], publish_timeout=5) as producer:
            await asyncio.gather(*(producer.publish(topic, b"warm") for _ in range(10)))
            proxy.drop()
            failures = await paced(producer, topic)
            assert failures == [], failures[:3]
            assert producer.snapshot().failed == 0
            proxy.undrop()


@contextlib.asynccontextmanager
async def publishing_every_pace(producer: Producer, topic: str) -> AsyncIterator[list[asyncio.Future[bytes]]]:
    """A publish task started every PACE s while the block runs; the list of them."""
    stop = asyncio.Event()
    calls: list[asyncio.Future[bytes]] = []

    async def publisher() -> None:
        while not stop.is_set():
            calls.append(asyncio.ensure_future(producer.publish(topic, b"m%d" % len(calls))))
            await asyncio.sleep(PACE)

    running = asyncio.ensure_future(publisher())
    try:
        yield calls
    finally:
        stop.set()
        await running


async def test_a_slow_nsqd_is_re_sent_from_once():
    """A slow, not dead, nsqd: B's answers held 0.9 s (it has every publish), four times, 2.5 s
    apart. The first spell re-sends what B held (it might have been hung); B then answered all
    of it, so in the later spells what it holds waits for its answers (re-sent only past
    SLOW_HOLD). Before, every spell re-sent, and duplicated, what B held
    (164 duplicates in the bench's minute of 30 % loss)."""
    async with NSQD() as a, NSQD() as b, FaultProxy(b.tcp_address) as proxy:
        topic = unique("slow")
        async with Producer([a.tcp_address, proxy.address], publish_timeout=5) as producer:
            await asyncio.gather(*(producer.publish(topic, b"warm") for _ in range(10)))
            async with publishing_every_pace(producer, topic) as calls:
                first = 0
                for cycle in range(4):
                    await proxy.stall(0.9, "down")
                    await asyncio.sleep(2.5)
                    if cycle == 0:
                        first = producer.snapshot().rerouted
            results = await asyncio.gather(*calls, return_exceptions=True)
            stats = producer.snapshot()
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], failures[:3]
        assert first >= 1, stats  # B held publishes in the first spell: re-sent
        assert stats.rerouted - first <= 2, (first, stats)
        total = sum([await depth(server.http_address, topic) for server in (a, b)])
        assert total <= 10 + len(calls) + stats.rerouted


async def test_a_slow_nsqds_later_spells_reroute_within_a_short_publish_timeout():
    """publish_timeout 2 s; B's answers held 2.5 s, twice, B back in the rotation between. The
    second spell holds what B holds for half the timeout (1 s), then re-sends it: nothing fails
    while A answers. Before, it was held for SLOW_HOLD (3 s) and every publish B held failed at
    its 2 s deadline."""
    async with NSQD() as a, NSQD() as b, FaultProxy(b.tcp_address) as proxy:
        topic = unique("slowshort")
        async with Producer([a.tcp_address, proxy.address], publish_timeout=2) as producer:
            await asyncio.gather(*(producer.publish(topic, b"warm") for _ in range(10)))
            async with publishing_every_pace(producer, topic) as calls:
                await proxy.stall(2.5, "down")  # the first spell re-sends all; B then answers all: slow
                rerouted_first = producer.snapshot().rerouted
                await _taking_publishes_again(b.http_address, topic)  # its probes passed
                await proxy.stall(2.5, "down")
                await asyncio.sleep(0.5)
            results = await asyncio.gather(*calls, return_exceptions=True)
            stats = producer.snapshot()
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], (len(failures), failures[:3])
        assert rerouted_first >= 1 and stats.rerouted > rerouted_first, (rerouted_first, stats)


async def _taking_publishes_again(http_address: str, topic: str) -> None:
    """Until B's depth of ``topic`` grows (a publish task runs every PACE s)."""
    before = await depth(http_address, topic)

    async def grew() -> bool:
        return await depth(http_address, topic) > before

    await eventually(grew, timeout=30, what="B taking publishes again")


async def test_a_flapping_nsqd_takes_no_publish_until_its_link_is_clean():
    """B's answers held 3.5 s, three times, 0.5 s apart (a lossy link's late answers, drawn
    out): the first spell re-sends what B held; after it B is on probation, and its probes
    (each a handshake of its own, through the same stalls) fail, so B holds and re-sends
    nothing more. Once the link stays clean, B takes publishes again. Before, B was back at
    once after its first spell, then after a 1 s rest on trial, and each spell re-sent what
    B had held SLOW_HOLD (3 s): duplicates the first spell's re-sends did not account for."""
    async with NSQD() as a, NSQD() as b, FaultProxy(b.tcp_address) as proxy:
        topic = unique("flap")
        async with Producer([a.tcp_address, proxy.address], publish_timeout=10) as producer:
            await asyncio.gather(*(producer.publish(topic, b"warm") for _ in range(10)))
            async with publishing_every_pace(producer, topic) as calls:
                await proxy.stall(3.5, "down")
                first = producer.snapshot().rerouted
                for _ in range(2):
                    await asyncio.sleep(0.5)
                    await proxy.stall(3.5, "down")
                await asyncio.sleep(0.5)
                later = producer.snapshot().rerouted - first
                await _taking_publishes_again(b.http_address, topic)
            results = await asyncio.gather(*calls, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], failures[:3]
        assert first >= 1, first  # B held publishes when its first stall began: re-sent
        assert later == 0, (first, later)


# ---- Producer([B]) alone ----------------------------------------------------------------------------


async def test_lone_hung_nsqd_publish_raises_at_its_timeout(two_nsqd):
    """Producer([B]), B hung: each publish raises PublishTimeoutError at publish_timeout, not
    up to a sweep later (the sweeper looked every second: calls waited up to 1 s more)."""
    _, b = two_nsqd
    timeout = 2.0
    async with Producer([b.tcp_address], publish_timeout=timeout, coalesce=False) as producer:
        await producer.publish(unique("lone"), b"warm")
        b.pause()
        try:
            async with Slack() as slack:
                async def timed(start_after: float) -> float:
                    await asyncio.sleep(start_after)
                    began = time.monotonic()
                    with pytest.raises(PublishTimeoutError):
                        await producer.publish("lone", b"x")
                    return time.monotonic() - began

                took = await asyncio.gather(*(timed(i * 0.13) for i in range(8)))
        finally:
            b.resume()
    assert max(took) < timeout + 0.1 + slack.allowance(0.05), (took, slack)


@pytest.mark.parametrize("fail_fast", [True, False])
@pytest.mark.parametrize(("coalesce", "method"), [(True, "publish"), (False, "publish"), (True, "mpublish")])
async def test_lone_publish_ends_at_its_timeout_when_the_connection_dies_meanwhile(two_nsqd, coalesce, method,
                                                                                   fail_fast):
    """Producer([B]), B hung, its connection declared dead (dead_after = 2 heartbeats) about when
    the publishes it holds reach publish_timeout: each call still ends within publish_timeout of
    its start. Before, a publish failed by the dying connection was retried with a deadline of
    its own: it raised NsqdDown FAIL_FAST_WAIT later (10.2 s for a 10 s timeout in the bench),
    or, without fail_fast, waited a second publish_timeout. The same for mpublish's fast path."""
    _, b = two_nsqd
    timeout = 2.0
    topic = unique("lone_dies")
    async with Producer([b.tcp_address], publish_timeout=timeout, heartbeat_interval=1.0, coalesce=coalesce,
                        fail_fast=fail_fast) as producer:
        await producer.publish(topic, b"warm")
        b.pause()
        try:
            async with Slack() as slack:
                async def timed(start_after: float) -> float:
                    await asyncio.sleep(start_after)
                    began = time.monotonic()
                    with pytest.raises((PublishTimeoutError, NoConnectionError)):
                        if method == "mpublish":
                            await producer.mpublish(topic, [b"x", b"y"])
                        else:
                            await producer.publish(topic, b"x")
                    return time.monotonic() - began

                took = await asyncio.gather(*(timed(i * 0.1) for i in range(12)))
        finally:
            b.resume()
    assert max(took) < timeout + 0.1 + slack.allowance(0.05), (took, slack)


def test_lone_blocking_publish_ends_at_its_timeout(two_nsqd):
    """fastnsq.sync.Producer([B]), B hung, its loop connection declared dead about when the calls
    reach publish_timeout: each call ends within publish_timeout of its start, whether a thread's
    own connection, a new one (its IDENTIFY unanswered) or the loop takes it. Before, a thread
    opening a connection waited dial_timeout + 5 s for IDENTIFY, then the loop's path for
    publish_timeout x (1 + max_retries) + 5 s."""
    _, b = two_nsqd
    timeout = 2.0
    topic = unique("lone_sync")
    took: list[float] = []
    errors: list[BaseException] = []

    def publisher(start_after: float) -> None:
        time.sleep(start_after)
        began = time.monotonic()
        try:
            producer.publish(topic, b"x")
        except (PublishTimeoutError, NoConnectionError) as exc:
            errors.append(exc)
        took.append(time.monotonic() - began)

    with fastnsq.sync.Producer([b.tcp_address], publish_timeout=timeout, heartbeat_interval=1.0) as producer:
        producer.publish(topic, b"warm")
        threads = [threading.Thread(target=publisher, args=(i * 0.15,)) for i in range(10)]
        b.pause()
        try:
            with Slack() as slack:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        finally:
            b.resume()
    assert len(errors) == len(threads), errors
    assert max(took) < timeout + 0.1 + slack.allowance(0.05), (sorted(took), slack)


async def _fail_fast_calls(publish, seconds: float) -> list[float]:
    """How long each of the publishes made over ``seconds`` took to raise NsqdDown."""
    took = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        with pytest.raises(NsqdDown):
            await publish()
        took.append(time.monotonic() - began)
        await asyncio.sleep(0.05)
    return took


def _assert_only_a_fresh_attempt_is_waited_for(took: list[float]) -> None:
    """A call waits FAIL_FAST_WAIT for a reconnect attempt from the attempt's start: the call that
    starts one may wait, the calls while it hangs in its handshake raise at once. Before, each
    waited FAIL_FAST_WAIT anew for the same hung attempt (a lower bound: load cannot shorten it)."""
    waited = [t for t in took if t >= FAIL_FAST_WAIT]
    assert len(waited) <= len(took) // 4, sorted(took)


async def test_fail_fast_once_a_hung_nsqds_connection_is_dead(two_nsqd):
    """Producer([B]), fail_fast, B hung: once B's connection is declared dead, every publish
    raises NsqdDown within FAIL_FAST_WAIT, while reconnect attempts hang in their handshake
    (the kernel of a stopped nsqd accepts the connect) and after they time out."""
    _, b = two_nsqd
    topic = unique("dead_fast")
    async with Producer([b.tcp_address], publish_timeout=1.5, heartbeat_interval=1.0, fail_fast=True) as producer:
        await producer.publish(topic, b"warm")
        b.pause()
        try:
            await eventually(lambda: not producer.connections, timeout=10, what="B's connection declared dead")
            async with Slack() as slack:
                took = await _fail_fast_calls(lambda: producer.publish(topic, b"x"), 4.0)
        finally:
            b.resume()
    assert len(took) >= 10 and max(took) < FAIL_FAST_WAIT + slack.allowance(0.05), (took, slack)
    _assert_only_a_fresh_attempt_is_waited_for(took)


async def test_fail_fast_behind_a_black_hole():
    """The same behind a black hole (a proxy dropping every byte both ways; new connects are
    accepted and go silent): once the connection is dead, NsqdDown within FAIL_FAST_WAIT."""
    async with NSQD() as b, FaultProxy(b.tcp_address) as proxy:
        topic = unique("hole_fast")
        async with Producer([proxy.address], publish_timeout=1.5, heartbeat_interval=1.0,
                            fail_fast=True) as producer:
            await producer.publish(topic, b"warm")
            proxy.drop()
            await eventually(lambda: not producer.connections, timeout=10, what="the connection declared dead")
            async with Slack() as slack:
                took = await _fail_fast_calls(lambda: producer.publish(topic, b"x"), 4.0)
            proxy.undrop()
    assert len(took) >= 10 and max(took) < FAIL_FAST_WAIT + slack.allowance(0.05), (took, slack)
    _assert_only_a_fresh_attempt_is_waited_for(took)


def test_blocking_fail_fast_once_a_hung_nsqds_connection_is_dead(two_nsqd):
    """fastnsq.sync.Producer([B]), fail_fast, B hung and its connection dead: each call raises
    NsqdDown within FAIL_FAST_WAIT, during the hung handshakes and after they time out."""
    _, b = two_nsqd
    topic = unique("dead_fast_sync")
    with fastnsq.sync.Producer([b.tcp_address], publish_timeout=1.5, heartbeat_interval=1.0,
                               fail_fast=True) as producer:
        producer.publish(topic, b"warm")
        b.pause()
        try:
            deadline = time.monotonic() + 10
            while producer.snapshot().connections and time.monotonic() < deadline:
                time.sleep(0.05)
            took = []
            with Slack() as slack:
                end = time.monotonic() + 4.0
                while time.monotonic() < end:
                    began = time.monotonic()
                    with pytest.raises(NsqdDown):
                        producer.publish(topic, b"x")
                    took.append(time.monotonic() - began)
                    time.sleep(0.05)
        finally:
            b.resume()
    assert len(took) >= 10 and max(took) < FAIL_FAST_WAIT + slack.allowance(0.05), (took, slack)
    _assert_only_a_fresh_attempt_is_waited_for(took)


async def test_handshake_within_the_publish_timeout(two_nsqd):
    """A producer started while its nsqd hangs: the kernel accepts the connect, IDENTIFY is never
    answered; start() gives up within publish_timeout (+ dial_timeout), not HANDSHAKE_TIMEOUT (10 s)."""
    _, b = two_nsqd
    b.pause()
    try:
        producer = Producer([b.tcp_address], publish_timeout=1.5)
        async with Slack() as slack:
            began = time.monotonic()
            await producer.start()  # lazy_connect: returns with the attempt failed
            took = time.monotonic() - began
        await producer.close(timeout=0)
    finally:
        b.resume()
    assert took < 1.5 + slack.allowance(0.3), (took, slack)


async def test_an_unanswered_handshake_says_so_in_its_error():
    """A hung nsqd accepts the connect and never answers IDENTIFY: the error says what happened
    (the reconnect WARNING quotes an error's text, and for this one said only "TimeoutError")."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        host, port = silent.getsockname()
        conn = Connection(f"{host}:{port}", ConnectionOptions())
        with pytest.raises(asyncio.TimeoutError) as caught:
            await conn.connect(handshake_timeout=0.2)
    assert str(caught.value) == (f"nsqd {host}:{port} accepted the connection but did not answer the "
                                 "handshake within 0.2 s")


# ---- the defaults and the sockets ----------------------------------------------------------------


def test_default_liveness_notices_within_ten_seconds():
    """A hung or black-holed nsqd is declared dead within 10 s with the defaults (it was 60 s)."""
    options = ConnectionOptions()
    assert options.dead_after is not None and options.dead_after <= 10
    assert options.identify_body()["heartbeat_interval"] <= 5000


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="the platform has no TCP_USER_TIMEOUT")
async def test_sockets_end_a_black_hole_themselves(nsqd):
    """Unacknowledged writes end the socket after dead_after (TCP_USER_TIMEOUT), keepalive on:
    TCP's own retransmission backoff would keep a black-holed connection ~15 minutes."""
    async with Producer([nsqd.tcp_address]) as producer:
        sock = producer.connections[0]._transport.get_extra_info("socket")
        dead_after = producer.options.dead_after
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(dead_after * 1000)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1


def _kernel_caps_rto() -> bool:
    """Linux 6.15+ takes TCP_RTO_MAX_MS (older kernels refuse the option)."""
    if liveness.TCP_RTO_MAX_MS is None:
        return False
    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, liveness.TCP_RTO_MAX_MS, 5000)
        except OSError:
            return False
        return probe.getsockopt(socket.IPPROTO_TCP, liveness.TCP_RTO_MAX_MS) == 5000


@pytest.mark.skipif(not _kernel_caps_rto(), reason="the kernel has no TCP_RTO_MAX_MS (Linux 6.15+)")
async def test_sockets_retransmit_at_least_once_a_second(nsqd):
    """After a lossy spell a socket's retransmission wait has doubled to seconds (up to 120 s by
    default): each face's sockets cap it at 1 s, so what they hold goes out within a second of
    the loss ending."""
    consumer = Consumer(unique("rto"), "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda message: None)
    async with Producer([nsqd.tcp_address]) as producer, consumer:
        await eventually(lambda: consumer.connections, 10, "the consumer connected")
        for conn in (producer.connections[0], consumer.connections[0]):
            sock = conn._transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, liveness.TCP_RTO_MAX_MS) == liveness.RTO_MAX_MS == 1000


async def test_reconnect_failures_are_logged_once_then_summarised(caplog):
    """A producer whose nsqd is refused: the first failed reconnect round is a WARNING with its
    cause, the next ones within 30 s are not (they were silent: nothing said nsqd was missing)."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        host, port = spare.getsockname()
        address = f"{host}:{port}"  # bound, not listening: connects are refused
        producer = Producer([address])
        with caplog.at_level("WARNING"):
            await producer.start()
            with contextlib.suppress(Exception):
                await producer.publish(unique("refused"), b"x", timeout=1.5)
            await asyncio.sleep(1.0)  # a few reconnect rounds
            await producer.close(timeout=0)
    lines = [r.getMessage() for r in caplog.records if "cannot reconnect" in r.getMessage()]
    assert len(lines) == 1, lines
    assert address in lines[0]


async def test_connect_does_not_wait_out_a_dropped_syn():
    """A listener whose accept queue is full drops SYNs, as a black hole does; it is freed 0.3 s
    into a connect with dial_timeout=0.9. The kernel would send the first SYN again only at
    1 s: a single connect times out; a connect joined by another every 0.25 s gets through."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        host, port = listener.getsockname()
        filler = socket.create_connection((host, port))  # fills the accept queue
        try:
            loop = asyncio.get_running_loop()

            def free() -> None:
                accepted, _ = listener.accept()
                accepted.close()

            loop.call_later(0.3, free)
            conn = Connection(f"{host}:{port}", ConnectionOptions(dial_timeout=0.9))
            connecting = asyncio.ensure_future(conn.connect(handshake_timeout=0.5))
            # Nothing answers IDENTIFY here: the attempt times out either way; what counts is
            # whether a connection reached the listener's queue once it had room.
            with pytest.raises(asyncio.TimeoutError):
                await connecting
            listener.setblocking(False)
            try:
                reached, _ = listener.accept()
            except BlockingIOError:
                pytest.fail("no connect reached the listener after its queue was freed")
            reached.close()
        finally:
            filler.close()


class _Conn:
    """What the suspect rule reads of a connection, set by hand."""

    def __init__(self) -> None:
        self.address = "b:4150"
        self.is_ha = False
        self.answered = 0
        self.pending = 0
        self.since: float | None = None
        self.cutoffs: list[float] = []  # what reroute() asked to fail: written before each

    def unanswered_since(self) -> float | None:
        return self.since

    def expire_pending(self, written_before: float, error) -> int:
        self.cutoffs.append(written_before)
        return self.pending


def test_a_slow_nsqds_later_spells_hold_what_it_holds():
    """The re-send rule: the first spell of a run re-sends all B holds (cut-off: now); B answers
    it all (slow, not dead); in the next spell only what is SLOW_HOLD old is re-sent; a spell
    after RECALL is a new run (all again)."""
    rule, conn = Suspects(0.5, logging.getLogger("test")), _Conn()
    conn.since, conn.pending = 0.0, 3
    rule.check([conn], 0.6)
    rule.reroute(0.6, Exception)
    assert conn.cutoffs == [0.6]
    conn.answered, conn.since, conn.pending = 3, None, 0
    rule.check([conn], 0.8)  # answered: the spell ends, 0.8 s after its oldest went out
    _pass_probes(rule, conn.address)
    assert conn not in rule.out
    conn.since, conn.pending = 5.0, 2
    rule.check([conn], 5.6)
    rule.reroute(5.6, Exception)
    assert conn.cutoffs[-1] == pytest.approx(5.6 - SLOW_HOLD)
    conn.answered, conn.since, conn.pending = 5, None, 0
    rule.check([conn], 7.0)
    _pass_probes(rule, conn.address)
    conn.since, conn.pending = 100.0, 1
    rule.check([conn], 100.6)
    rule.reroute(100.6, Exception)
    assert conn.cutoffs[-1] == 100.6


def test_a_slow_nsqds_hold_fits_a_short_publish_timeout():
    """With publish_timeout 2 s a held publish of a slow nsqd is re-sent at 1 s, within its
    deadline: held SLOW_HOLD (3 s), it failed at 2 s while another nsqd answered."""
    rule, conn = Suspects(0.5, logging.getLogger("test"), publish_timeout=2.0), _Conn()
    conn.since, conn.pending = 0.0, 3
    rule.check([conn], 0.6)
    rule.reroute(0.6, Exception)
    conn.answered, conn.since, conn.pending = 3, None, 0
    rule.check([conn], 0.8)  # answered all: slow, not dead
    conn.since, conn.pending = 5.0, 2
    rule.check([conn], 5.6)
    rule.reroute(5.6, Exception)
    assert conn.cutoffs[-1] == pytest.approx(5.6 - 1.0)
    assert Suspects(0.5, logging.getLogger("test")).slow_hold == SLOW_HOLD  # the default 10 s


def _pass_probes(rule: Suspects, address: str) -> None:
    for _ in range(PROBES_IN_A_ROW):
        rule.probed(address, True)


def test_an_nsqd_that_answers_again_takes_publishes_after_its_probes():
    """B answered what it held: it is on probation, out of the rotation, until PROBES_IN_A_ROW
    probes in a row passed; a failed probe starts the count again. Before, B took publishes
    at once after its first spell (and a lossy B held, and had re-sent, a new share of them)."""
    rule, conn = Suspects(0.5, logging.getLogger("test")), _Conn()
    conn.since, conn.pending = 0.0, 3
    assert rule.check([conn], 0.6) and conn in rule.out
    conn.answered, conn.since, conn.pending = 3, None, 0
    assert rule.check([conn], 1.0)  # answered all: suspect no more, on probation
    assert conn in rule.out and rule.probing() == {conn.address}
    for _ in range(PROBES_IN_A_ROW - 1):
        assert not rule.probed(conn.address, True)
    assert not rule.probed(conn.address, False)  # a lossy link fails one: the count starts again
    for _ in range(PROBES_IN_A_ROW - 1):
        assert not rule.probed(conn.address, True)
    assert conn in rule.out
    assert rule.probed(conn.address, True)
    assert conn not in rule.out and rule.probing() == set()
    assert rule.probe_bound == 0.125  # a quarter of suspect_after: a retransmission (>= 0.2 s) fails it


def test_a_new_connection_to_a_recently_suspect_nsqd_starts_on_probation():
    """A lossy link's connection may die of it (nothing read for dead_after) while suspect: its
    successor takes no publish until its nsqd passed its probes. One to an nsqd not suspect
    within RECALL takes its full share at once."""
    rule, old = Suspects(0.5, logging.getLogger("test")), _Conn()
    old.since, old.pending = 0.0, 50
    rule.check([old], 0.6)
    rule.forget(old)  # declared dead while suspect
    new = _Conn()
    assert rule.joined(new, 14.0) and new in rule.out
    other = _Conn()
    other.address = "a:4150"
    assert not rule.joined(other, 14.0) and other not in rule.out
    _pass_probes(rule, new.address)
    assert new not in rule.out
    assert not rule.joined(_Conn(), 14.0 + RECALL)


def test_a_connection_on_probation_used_for_want_of_another_can_turn_suspect():
    """Every connection out of the rotation is used (Producer([B]) alone): one on probation
    that holds a publish suspect_after turns suspect again, its probation over."""
    rule, conn = Suspects(0.5, logging.getLogger("test")), _Conn()
    assert rule.joined(conn, 0.0) is False
    conn.since, conn.pending = 1.0, 1
    rule.check([conn], 1.6)
    conn.answered, conn.since, conn.pending = 1, None, 0
    rule.check([conn], 1.7)
    assert conn in rule.probation
    conn.since, conn.pending = 2.0, 1
    assert rule.check([conn], 2.6)
    assert conn in rule.suspect and conn not in rule.probation
