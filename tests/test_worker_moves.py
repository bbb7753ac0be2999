"""``fastnsq worker --split-nsqd`` moving work: an nsqd goes from a busy process to an idle one.

Three nsqd (embedded, or real ones in a real-server run) on free ports, a group
of two processes given ``--nsqd-tcp-address`` for each: the supervisor's first share gives
worker 0 two nsqd and worker 1 one. The test fills worker 1's nsqd with a few messages and
worker 0's with many, so that worker 1 runs dry while worker 0 has two nsqd with messages:
one of them must move. nsqd's own ``/stats`` is polled all along (every message handled
exactly once, never two connections of the group on one nsqd); a SIGTERM that lands while
an nsqd is being let go loses nothing. Also: the move policy on its own, a Consumer given
its nsqd only after it started, and ``Consumer.stop`` racing ``disconnect_from_nsqd``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fastnsq import Consumer
from fastnsq.errors import InvalidValueError
from fastnsq.runner.assign import pick_move
from fastnsq.testing import NSQD, drain
from fastnsq.testing.process import NSQDProcess
from fastnsq.testing.real import real_bin_dir

from .helpers import eventually, unique
from .test_consumer import channel_stats
from .test_worker import Worker, start_worker


@pytest.fixture
async def cleanup() -> AsyncIterator[list[Worker]]:
    """Kill whatever worker a failed test left running."""
    workers: list[Worker] = []
    yield workers
    for worker in workers:
        if worker.process.returncode is None:
            worker.process.kill()
            await worker.process.wait()


# ---- the move policy, on its own ---------------------------------------------------------------


def test_an_idle_child_takes_a_busy_nsqd_from_a_child_with_two() -> None:
    held = {0: ["a:1", "c:3"], 1: ["b:2"]}
    assert pick_move(held, {0: ["a:1", "c:3"], 1: []}, [1]) == ("c:3", 0, 1)
    # The donor keeps one: a child with a single busy nsqd gives nothing (no ping-pong).
    assert pick_move(held, {0: ["a:1"], 1: []}, [1]) is None
    # Nobody idle, or the idle one is the donor itself: nothing moves.
    assert pick_move(held, {0: ["a:1", "c:3"], 1: ["b:2"]}, []) is None
    assert pick_move({0: ["a:1", "c:3"]}, {0: ["a:1", "c:3"]}, [0]) is None
    # An nsqd reported busy that the child no longer holds (let go a moment ago) does not count.
    assert pick_move({0: ["a:1"], 1: ["b:2", "c:3"]}, {0: ["a:1", "c:3"], 1: []}, [1]) is None
    # Several idle children: the one holding the fewest nsqd takes it.
    held = {0: ["a:1", "b:2", "c:3"], 1: ["d:4"], 2: []}
    assert pick_move(held, {0: ["a:1", "b:2"]}, [1, 2]) == ("b:2", 0, 2)


async def test_activity_says_busy_while_an_nsqd_delivers_then_idle() -> None:
    """A child's activity, sampled from a real consumer: busy while an nsqd delivers (and just
    after it was connected), idle once it ran dry and nothing is in flight; a change is reported."""
    from fastnsq.runner.activity import WINDOW, Activity

    topic = unique("wkmove")
    async with three_nsqd() as servers:
        await _prefill(servers[:1], topic, [300])
        release = asyncio.Event()

        async def held(message: Any) -> None:
            await release.wait()

        consumer = Consumer(topic, "work", nsqd_tcp_addresses=[], handler=held, max_in_flight=10)
        await consumer.start()
        activity = Activity(consumer)
        try:
            activity.sample()
            assert activity.state == {"busy": [], "idle": True}  # no nsqd yet: ready to take one
            await consumer.connect_to_nsqd(servers[0].tcp_address)
            assert activity.sample() and activity.state["busy"] == [servers[0].tcp_address]
            await eventually(lambda: consumer.snapshot().in_flight == 10, 10, "a full window")
            activity.sample()  # the watch samples every INTERVAL: deliveries seen at the next one
            await asyncio.sleep(WINDOW + 0.05)
            activity.sample()  # nothing delivered lately, but messages held: neither busy nor idle
            assert activity.state == {"busy": [], "idle": False}
            release.set()
            await eventually(lambda: activity.sample() or activity.state["busy"], 5, "deliveries again")
            await eventually(lambda: consumer.snapshot().finished == 300, 20, "all finished")
            activity.sample()
            await asyncio.sleep(WINDOW + 0.05)
            assert activity.sample() and activity.state == {"busy": [], "idle": True}
        finally:
            await consumer.stop(5)


# ---- servers ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def three_nsqd() -> AsyncIterator[list[Any]]:
    """Three nsqd on free ports (two runs of these tests on one machine must not collide): real
    ones in a real-server run (``dev.py test --real``), else embedded ones."""
    real_bin = real_bin_dir()
    if real_bin is not None:
        servers = [NSQDProcess(binary=real_bin / "nsqd") for _ in range(3)]
        try:
            for server in servers:
                server.start()
            yield servers
        finally:
            for server in servers:
                server.close()
        return
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(NSQD()) for _ in range(3)]


class StatsWatch:
    """Polls every nsqd's /stats for the channel until stopped: the most clients seen on each."""

    def __init__(self, servers: list[Any], topic: str) -> None:
        self.servers, self.topic = servers, topic
        self.most = [0] * len(servers)
        self.polls = 0
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            for index, server in enumerate(self.servers):
                found = await channel_stats([server.http_address], self.topic, "work")
                clients = len(found[0]["clients"]) if found else 0
                self.most[index] = max(self.most[index], clients)
            self.polls += 1
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _prefill(servers: list[Any], topic: str, counts: list[int]) -> int:
    """``counts[i]`` distinct messages on nsqd i (see :func:`_bodies`); how many in all."""
    from fastnsq import Producer

    bodies = _bodies(servers, counts)
    for server in servers:
        mine = [b for b in bodies if b.startswith(server.tcp_address.encode() + b"-")]
        async with Producer([server.tcp_address]) as producer:
            for start in range(0, len(mine), 500):
                await producer.mpublish(topic, mine[start : start + 500])
    return len(bodies)


def _split_args(topic: str, servers: list[Any], *more: str) -> list[str]:
    args = ["--topic", topic, "--channel", "work", "--processes", "2", "--split-nsqd", *more]
    for server in servers:
        args += ["--nsqd-tcp-address", server.tcp_address]
    return args


async def _left(servers: list[Any], topic: str) -> int:
    """Messages nsqd still holds for the channel: queued, in flight or deferred."""
    channels = await channel_stats([s.http_address for s in servers], topic, "work")
    return sum(c["depth"] + c["in_flight_count"] + c["deferred_count"] for c in channels)


def _first_share(servers: list[Any]) -> tuple[list[str], list[str]]:
    """The supervisor's first share of three nsqd over two children: sorted, alternating."""
    addresses = sorted(s.tcp_address for s in servers)
    return [addresses[0], addresses[2]], [addresses[1]]


# ---- the group -------------------------------------------------------------------------------


async def test_an_idle_process_takes_an_nsqd_and_every_message_is_handled_once(
    tmp_path: Path, cleanup: list[Worker]
) -> None:
    """Worker 1's nsqd runs dry first; one of worker 0's two nsqd moves to it. nsqd's /stats,
    polled every few ms throughout, never shows two connections of the group on one nsqd."""
    topic = unique("wkmove")
    async with three_nsqd() as servers:
        by_address = {s.tcp_address: s for s in servers}
        zero, one = _first_share(servers)
        ordered = [by_address[zero[0]], by_address[zero[1]], by_address[one[0]]]
        total = await _prefill(ordered, topic, [300, 300, 10])
        watch = StatsWatch(servers, topic)
        worker = await start_worker(tmp_path, "wk_jobs:handle", *_split_args(topic, servers, "--max-in-flight", "20"),
                                    sleep=0.003)
        cleanup.append(worker)
        try:
            await eventually(lambda: _moves_at_least(worker, 1), 30, "an nsqd moved to the idle process")
            await eventually(lambda: _nothing_left(servers, topic, total), 60, "every message finished")
        finally:
            await watch.stop()
        health = await worker.health()
        assigned = sorted(len(w["assigned"]) for w in health["workers"])
        assert assigned == [1, 2] and sorted(a for w in health["workers"] for a in w["assigned"]) == sorted(by_address)
        assert watch.polls > 10 and watch.most == [1, 1, 1], watch.most
        assert await worker.metric("nsq_worker_nsqd_moves_total") >= 1
        assert "moving nsqd" in worker.log()
        assert await worker.stop() == 0
        handled = worker.lines("handled")
        assert len(handled) == len(set(handled)) == total
        channels = await channel_stats([s.http_address for s in servers], topic, "work")
        assert sum(c["message_count"] for c in channels) == total
        assert sum(c["requeue_count"] + c["timeout_count"] for c in channels) == 0


async def test_a_sigterm_while_an_nsqd_is_let_go_loses_nothing(tmp_path: Path, cleanup: list[Worker]) -> None:
    """A slow handler makes letting go of an nsqd take a while (its messages in flight are
    finished first); SIGTERM the group the moment the move starts: exit 0, no message handled
    twice, every message either handled or back in nsqd's queue."""
    topic = unique("wkmove")
    async with three_nsqd() as servers:
        by_address = {s.tcp_address: s for s in servers}
        zero, one = _first_share(servers)
        ordered = [by_address[zero[0]], by_address[zero[1]], by_address[one[0]]]
        total = await _prefill(ordered, topic, [200, 200, 2])
        # 0.1 s a message on the child's loop: the let-go finishes what the leaving connection holds
        # (up to 20) first, a second or more, which outlasts this test's reaction to the log line
        # even under load (at 0.02 s the move once ended 2 ms before the SIGTERM, two spinners beside).
        worker = await start_worker(tmp_path, "wk_jobs:handle", *_split_args(topic, servers, "--max-in-flight", "40"),
                                    sleep=0.1)
        cleanup.append(worker)
        letting_go = "moved to another worker (or left): disconnecting"
        await eventually(lambda: letting_go in worker.log(), 30, "worker 0 letting go of an nsqd")
        assert await worker.stop(timeout=40) == 0
        handled = worker.lines("handled")
        assert len(handled) == len(set(handled)), "a message handled twice"
        assert "assigned nsqd" not in worker.log(), "the stop came after the move, not during it"
        left = await _left(servers, topic)
        assert len(handled) + left == total, (len(handled), left, total)
        channels = await channel_stats([s.http_address for s in servers], topic, "work")
        assert all(c["in_flight_count"] == 0 and not c["clients"] for c in channels), channels
        assert sum(c["timeout_count"] for c in channels) == 0


async def test_a_process_killed_while_it_lets_an_nsqd_go(tmp_path: Path, cleanup: list[Worker]) -> None:
    """SIGKILL of worker 0 while it lets an nsqd go: its connections die with it, which counts as
    let go: the idle worker takes the nsqd, worker 0 is restarted with the one left to it, its
    messages in flight come back after msg_timeout and are handled; never two connections."""
    topic = unique("wkmove")
    async with three_nsqd() as servers:
        by_address = {s.tcp_address: s for s in servers}
        zero, one = _first_share(servers)
        ordered = [by_address[zero[0]], by_address[zero[1]], by_address[one[0]]]
        total = await _prefill(ordered, topic, [150, 150, 2])
        watch = StatsWatch(servers, topic)
        worker = await start_worker(tmp_path, "wk_jobs:handle", *_split_args(
            topic, servers, "--max-in-flight", "40", "--consumer-opt", "msg_timeout=2s"), sleep=0.02)
        cleanup.append(worker)
        try:
            await eventually(lambda: "disconnecting" in worker.log(), 30, "worker 0 letting go of an nsqd")
            [pid] = [w["pid"] for w in (await worker.health())["workers"] if w["index"] == 0]
            os.kill(pid, signal.SIGKILL)
            await eventually(lambda: _restarted(worker), 20, "worker 0 restarted")
            await eventually(lambda: _nothing_left(servers, topic, total), 60, "every message finished")
        finally:
            await watch.stop()
        assert watch.most == [1, 1, 1], watch.most
        health = await worker.health()
        assert sorted(a for w in health["workers"] for a in w["assigned"]) == sorted(by_address)
        assert await worker.stop() == 0
        handled = worker.lines("handled")
        assert set(handled) == {b.decode() for b in _bodies(ordered, [150, 150, 2])}
        # At most what the killed process held in flight comes back: all of --max-in-flight (40) when
        # it alone held the nsqd's messages (40 of 40 seen once, the real pass under two spinners).
        assert len(handled) <= total + 40, "more handled twice than worker 0 held in flight"


def _bodies(servers: list[Any], counts: list[int]) -> list[bytes]:
    number, bodies = 0, []
    for server, count in zip(servers, counts):
        bodies += [b"%s-%08d" % (server.tcp_address.encode(), number + i) for i in range(count)]
        number += count
    return bodies


async def _restarted(worker: Worker) -> bool:
    return any(w["index"] == 0 and w["restarts"] >= 1 and w["alive"] for w in (await worker.health())["workers"])


async def _moves_at_least(worker: Worker, count: int) -> bool:
    return int((await worker.health()).get("nsqd_moves", 0)) >= count


async def _nothing_left(servers: list[Any], topic: str, total: int) -> bool:
    """Every message of ``topic`` taken by the channel and none left in nsqd (fastnsq.testing.drain)."""
    return await drain.channel_drained([s.http_address for s in servers], topic, "work", published=total)


# ---- the Consumer underneath -----------------------------------------------------------------


async def test_a_consumer_given_its_nsqd_after_it_started() -> None:
    """``nsqd_tcp_addresses=[]``: the consumer runs with no nsqd until connect_to_nsqd (what a
    --split-nsqd child with none assigned does); given nothing at all it is still refused."""
    with pytest.raises(InvalidValueError, match="give nsqd_tcp_addresses"):
        Consumer("t", "c")
    topic = unique("wkmove")
    async with three_nsqd() as servers:
        await _prefill(servers[:1], topic, [20])
        got: list[bytes] = []
        consumer = Consumer(topic, "work", nsqd_tcp_addresses=[], handler=lambda m: got.append(m.body),
                            max_in_flight=10)
        await consumer.start()
        try:
            assert consumer.connections == []
            await consumer.connect_to_nsqd(servers[0].tcp_address)
            await eventually(lambda: len(got) == 20, 10, "the messages of the nsqd given later")
        finally:
            await consumer.stop(5)
        assert len(set(got)) == 20


async def test_stop_while_disconnecting_from_an_nsqd_sends_cls_once() -> None:
    """Consumer.stop() racing disconnect_from_nsqd(): nsqd takes a second CLS as a fatal error
    (E_INVALID) and drops the connection with its messages in flight, which would then time out
    and be handled again. stop() leaves a connection already closing alone."""
    topic = unique("wkmove")
    async with three_nsqd() as servers:
        await _prefill(servers[:1], topic, [50])
        handled: list[bytes] = []

        async def slow(message: Any) -> None:
            await asyncio.sleep(0.05)
            handled.append(message.body)

        consumer = Consumer(topic, "work", nsqd_tcp_addresses=[servers[0].tcp_address], handler=slow,
                            max_in_flight=10)
        await consumer.start()
        await eventually(lambda: consumer.snapshot().in_flight >= 5, 10, "messages in flight")
        leaving = asyncio.get_running_loop().create_task(consumer.disconnect_from_nsqd(servers[0].tcp_address, 5))
        await asyncio.sleep(0.01)  # CLS sent, its messages still being handled
        report = await consumer.stop(5)
        await leaving
        assert "E_INVALID" not in consumer.snapshot().errors, consumer.snapshot().errors
        assert report.abandoned == 0
        [stats] = await channel_stats([servers[0].http_address], topic, "work")
        assert stats["in_flight_count"] == 0 and stats["timeout_count"] == 0
        assert stats["depth"] + len(handled) == 50 and len(set(handled)) == len(handled)


async def test_disconnect_returns_once_nsqd_has_dropped_the_client() -> None:
    """disconnect_from_nsqd ends its side of the connection and waits for nsqd to close its own,
    which nsqd does after removing the client from the channel: when it returns, /stats lists no
    client, so the next worker's connection is the only one nsqd ever shows."""
    topic = unique("wkmove")
    async with three_nsqd() as servers:
        await _prefill(servers[:2], topic, [30, 30])
        consumer = Consumer(topic, "work", nsqd_tcp_addresses=[s.tcp_address for s in servers[:2]],
                            handler=lambda m: None, max_in_flight=10)
        await consumer.start()
        try:
            await eventually(lambda: consumer.snapshot().received >= 10, 10, "messages")
            for server in servers[:2]:
                await consumer.disconnect_from_nsqd(server.tcp_address, 5)
                [stats] = await channel_stats([server.http_address], topic, "work")
                assert stats["clients"] == [], stats["clients"]
        finally:
            await consumer.stop(5)


async def test_two_runs_at_once_do_not_collide() -> None:
    """Two runs of this file on one machine at once (two sessions, two CI jobs): a test's nsqd
    take free ports, so the same test twice at once passes twice."""
    await asyncio.gather(test_a_consumer_given_its_nsqd_after_it_started(),
                         test_a_consumer_given_its_nsqd_after_it_started())
