"""Consumer against nsqd and nsqlookupd: the NSQ client guide's rules, end to end.

These use the server fixtures (embedded by default, real servers through the
FASTNSQ_TEST_* variables). RDY is sampled on the server side, through nsqd's own
/stats, so the checks hold whatever the client believes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

import aiohttp
import pytest

from fastnsq import Consumer, Producer
from fastnsq.errors import InvalidValueError
from fastnsq.recovery import MIN_POLL_GAP
from fastnsq.testing import is_external
from fastnsq.testing.counting import QueryCounter

from .helpers import Slack, eventually, skip_if_external, unique


async def publish_spread(addresses: list[str], topic: str, count: int, *, size: int = 100) -> list[bytes]:
    """Publish ``count`` distinct bodies spread evenly over every nsqd (MPUB batches of 500)."""
    bodies = [b"%08d-" % i + b"x" * (size - 9) for i in range(count)]
    for index, address in enumerate(addresses):
        async with Producer([address]) as producer:
            mine = bodies[index :: len(addresses)]
            for start in range(0, len(mine), 500):
                await producer.mpublish(topic, mine[start : start + 500])
    return bodies


async def channel_stats(http_addresses: list[str], topic: str, channel: str) -> list[dict]:
    """nsqd's own view of the channel on each node (GET /stats?format=json)."""
    found = []
    async with aiohttp.ClientSession() as session:
        for address in http_addresses:
            async with session.get(f"http://{address}/stats", params={"format": "json", "topic": topic}) as resp:
                data = await resp.json(content_type=None)
            for t in data.get("topics") or []:
                if t["topic_name"] == topic:
                    found += [c for c in t["channels"] if c["channel_name"] == channel]
    return found


async def test_two_consumers_three_nsqd_hundred_thousand_messages(nsq_cluster):
    """100,000 messages over 3 nsqd, two consumers sharing a channel with max_in_flight 200:
    every message handled at least once; each consumer's RDY sum as it sent it never above
    200, and as the nsqds see it never above 200 in two samples in a row.

    Why two: moving RDY between connections (a third nsqd joins: 100/100 becomes 67/67/66)
    goes out on three sockets at once, and each nsqd applies its own when it reads it; a
    sample reads the three /stats one after the other, so it can meet the old 100 on one
    nsqd and the new 67 and 66 on the others (seen once on nsq master: 233). No client can
    order commands across connections, so nsqd's sum is only bounded once they are applied."""
    topic, channel = unique("bulk"), "shared"
    total = 100_000
    bodies = await publish_spread(nsq_cluster.tcp_addresses, topic, total)
    seen: Counter[bytes] = Counter()
    done = asyncio.Event()

    def handle(message):
        seen[message.body] += 1
        if len(seen) == total:
            done.set()

    consumers = [
        Consumer(topic, channel, lookupd_http_addresses=nsq_cluster.lookupd_http_addresses, handler=handle,
                 max_in_flight=200, client_id=f"consumer-{i}", lookupd_poll_interval=1.0)
        for i in range(2)
    ]
    samples: list[dict[str, int]] = []
    sent: list[int] = []  # each consumer's RDY sum as it sent it, sampled as often

    async def sample() -> None:
        while not done.is_set():
            sent.extend(sum(c.rdy for c in consumer.snapshot().connections) for consumer in consumers)
            per_client: Counter[str] = Counter()
            for ch in await channel_stats(nsq_cluster.http_addresses, topic, channel):
                for client in ch["clients"]:
                    per_client[client["client_id"]] += client["ready_count"]
            samples.append(dict(per_client))
            await asyncio.sleep(0)  # back to back: the run may take under a second

    for consumer in consumers:
        await consumer.start()
    sampler = asyncio.create_task(sample())
    await asyncio.wait_for(done.wait(), 120)
    await sampler
    reports = [await consumer.stop() for consumer in consumers]
    assert set(seen) == set(bodies), f"lost {total - len(set(seen) & set(bodies))}"
    assert len(samples) >= 5, f"only {len(samples)} RDY samples"
    assert max(sent) <= 200, f"a consumer sent RDY summing to {max(sent)} > max_in_flight 200"
    clients = {client for s in samples for client in s}
    held = max(min(a.get(c, 0), b.get(c, 0)) for a, b in itertools.pairwise(samples) for c in clients)
    assert held <= 200, f"a consumer held RDY {held} > max_in_flight 200 in two samples in a row"
    assert all(r.abandoned == 0 for r in reports)
    # Both consumers got a share, from all three nsqd.
    assert all(c.total_received > 0 for c in consumers)
    leftover = await channel_stats(nsq_cluster.http_addresses, topic, channel)
    assert sum(c["in_flight_count"] + c["depth"] for c in leftover) == 0


async def test_an_nsqd_added_at_run_time_is_consumed_within_one_poll_interval(nsq_cluster):
    """The consumer polls lookupd on a grid of ``lookupd_poll_interval`` from its start, so an nsqd
    listed at run time is connected by the next poll. Counted, not timed: every gap between two
    polls is at least the interval (no poll pushed back by the two-a-second cap: start()'s own poll
    and a short moment while the first connections open once made the second poll come 0.5 s late,
    shifting every later one), and the message is handled by the first poll after the listing, or
    the one after it on a loaded machine."""
    if is_external(nsq_cluster) and not nsq_cluster.can_add_nodes:
        pytest.skip("adds an nsqd to the real cluster: needs the real binaries (FASTNSQ_TEST_REAL_BIN)")
    topic = unique("grow")
    await publish_spread(nsq_cluster.tcp_addresses, topic, 3)
    handled: dict[bytes, float] = {}
    interval = 1.0
    async with QueryCounter(nsq_cluster.lookupd_http_addresses[0]) as lookupd:
        consumer = Consumer(topic, "ch", lookupd_http_addresses=[lookupd.address],
                            handler=lambda m: handled.setdefault(m.body, time.monotonic()), max_in_flight=10,
                            lookupd_poll_interval=interval, lookupd_poll_jitter=0.0)
        await consumer.start()
        await eventually(lambda: len(handled) == 3, what="the first three messages")
        node = await nsq_cluster.add_node()
        async with Producer([node.tcp_address]) as producer:
            await producer.publish(topic, b"from the new node")
        listed_at = await listed(nsq_cluster.lookupd_http_addresses[0], topic, node.tcp_address)
        await eventually(lambda: b"from the new node" in handled, timeout=interval * 5)
        polls = lookupd.times("/lookup")
        connected = len(consumer.connections)
        await consumer.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    # Each wait is the interval, from one poll's end to the next poll's start; the proxy sees a
    # poll's /lookup after its /listlookup (the first poll's, answered 404 by upstream), so a gap
    # may look shorter by that round trip: but not by the half second of the cap (0.499 s before).
    assert gaps and min(gaps) > interval - MIN_POLL_GAP / 2, f"polls closer than the interval: {gaps}"
    made_after_listing = [at for at in polls if listed_at <= at <= handled[b"from the new node"]]
    assert 1 <= len(made_after_listing) <= 2, (listed_at, polls, handled)
    assert connected == 4


async def listed(lookupd_http: str, topic: str, tcp_address: str) -> float:
    """When (time.monotonic()) the lookupd at ``lookupd_http`` first lists ``tcp_address`` for ``topic``."""
    port = int(tcp_address.rpartition(":")[2])
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"http://{lookupd_http}/lookup", params={"topic": topic}) as response:
                producers = (await response.json(content_type=None)).get("producers", [])
            if any(p.get("tcp_port") == port for p in producers):
                return time.monotonic()
            await asyncio.sleep(0.01)


async def test_backoff_engages_on_failures_and_recovers(nsqd):
    topic = unique("backoff")
    await publish_spread([nsqd.tcp_address], topic, 20)
    failures_left = 3
    levels: list[int] = []
    handled: list[bytes] = []
    consumer: Consumer

    def handle(message):
        nonlocal failures_left
        levels.append(consumer.backoff_level)
        if failures_left:
            failures_left -= 1
            raise RuntimeError("downstream is down")
        handled.append(message.body)

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=5,
                        backoff_multiplier=0.05, default_requeue_delay=0, max_attempts=0, hold_failed=False)
    await consumer.start()
    await eventually(lambda: len(set(handled)) == 20, timeout=20, what="all messages after recovering")
    assert max(levels) >= 1, "backoff never engaged"
    await eventually(lambda: consumer.backoff_level == 0, what="backoff to step back down to 0")
    assert consumer.snapshot().connections[0].rdy == 5  # full RDY again after recovering
    await consumer.stop()


async def test_give_up_hook_fires_past_max_attempts(nsqd):
    topic = unique("poison")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"poison")
        await producer.publish(topic, b"fine")
    given_up: list[tuple[bytes, int]] = []
    calls: Counter[bytes] = Counter()

    def handle(message):
        calls[message.body] += 1
        if message.body == b"poison":
            raise ValueError("cannot process")

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=2,
                        max_attempts=2, default_requeue_delay=0, max_backoff_duration=0, hold_failed=False,
                        give_up_handler=lambda m: given_up.append((m.body, m.attempts)))
    await consumer.start()
    await eventually(lambda: given_up, timeout=10, what="the give-up hook")
    assert given_up == [(b"poison", 3)]
    assert calls == {b"poison": 2, b"fine": 1}  # the third delivery went to the hook, not the handler
    await asyncio.sleep(0.3)
    stats = await channel_stats([nsqd.http_address], topic, "ch")
    assert stats[0]["depth"] == 0 and stats[0]["in_flight_count"] == 0  # FINed, not redelivered
    await consumer.stop()


async def test_stop_under_load_leaves_nothing_in_flight_and_loses_nothing(nsqd):
    topic = unique("drain")
    bodies = await publish_spread([nsqd.tcp_address], topic, 3000)
    finished: set[bytes] = set()
    gate = asyncio.Event()

    async def slow(message):
        await asyncio.sleep(0.01)
        if len(finished) >= 300:
            # Held until the stop has begun, so that it meets handlers still running however
            # late a loaded machine runs this test (a timing alone once let all 3000 finish first).
            await gate.wait()
        finished.add(message.body)

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=slow, max_in_flight=200)
    await consumer.start()
    await eventually(lambda: len(finished) >= 300, what="some progress")
    stopping = asyncio.create_task(consumer.stop(timeout=5.0))
    await asyncio.sleep(0.1)
    gate.set()  # the held handlers finish inside the stop's drain
    report = await stopping
    assert not report.timed_out and report.abandoned == 0
    assert report.finished > 0
    await asyncio.sleep(0.2)
    stats = (await channel_stats([nsqd.http_address], topic, "ch"))[0]
    assert stats["in_flight_count"] == 0
    assert stats["client_count"] == 0
    # What was not finished is back in the channel: nothing lost.
    rest: list[bytes] = []
    again = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: rest.append(m.body),
                     max_in_flight=500)
    await again.start()
    await eventually(lambda: finished | set(rest) >= set(bodies), timeout=20, what="every message")
    await again.stop()


async def held_by_stuck_handlers(nsqd, count: int) -> tuple[str, Consumer]:
    """A new topic's ``count`` messages, each held by a handler that will not return for 30 s."""
    topic = unique("deadline")
    await publish_spread([nsqd.tcp_address], topic, count)
    started = 0

    async def stuck(message):
        nonlocal started
        started += 1
        await asyncio.sleep(30)

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=stuck, max_in_flight=count)
    await consumer.start()
    # All of them: the first comes alone (a connection's first RDY is 1), the rest after it.
    await eventually(lambda: started == count, what=f"{count} handlers started")
    return topic, consumer


async def test_stop_deadline_requeues_what_handlers_still_hold(nsqd):
    topic, consumer = await held_by_stuck_handlers(nsqd, 5)
    report = await consumer.stop(timeout=0.3)
    assert report.timed_out and report.abandoned == 5
    await eventually(lambda: _requeued_count(nsqd, topic, 5), timeout=10, what="5 messages back in the channel")


async def test_stop_deadline_holds_when_nsqd_does_not_answer_cls(nsqd):
    """An nsqd that answers nothing (CLS included) does not stretch stop() past its timeout,
    and the report says the deadline passed with the held messages requeued."""
    skip_if_external(nsqd, "stalls the server (fault injection)")
    topic, consumer = await held_by_stuck_handlers(nsqd, 5)
    nsqd.faults.stall(3.0)  # nothing leaves the server: CLS goes unanswered
    async with Slack() as slack:
        report = await consumer.stop(timeout=0.5)
    assert report.timed_out and report.abandoned == 5
    # 0.5 s and the close, not CLS's own 5 s nor the 3 s stall; plus the slack measured meanwhile.
    assert report.duration < 0.5 + slack.allowance(0.5), (report, slack)
    await eventually(lambda: _requeued_count(nsqd, topic, 5), timeout=10, what="5 messages back in the channel")


async def _requeued_count(nsqd, topic: str, count: int) -> bool:
    stats = (await channel_stats([nsqd.http_address], topic, "ch"))[0]
    return stats["in_flight_count"] == 0 and stats["depth"] + stats["deferred_count"] == count


async def test_batches_yield_on_starvation_before_max_wait(nsqd):
    topic = unique("starved")
    await publish_spread([nsqd.tcp_address], topic, 10)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10)
    await consumer.start()
    loop = asyncio.get_running_loop()
    async with Slack() as slack:
        start = loop.time()
        async for batch in consumer.batches(max_size=100, max_wait=10.0):
            waited = loop.time() - start
            assert len(batch) == 10  # fewer than max_size...
            assert consumer.is_starved()
            batch.finish()
            break
    # Handed over on starvation: the delivery's time (slack included), not max_wait's 10 s.
    assert waited < slack.allowance(1.0), f"waited {waited:.2f} s ({slack}): should not have waited for max_wait"
    await consumer.stop()


async def test_batches_wait_for_max_wait_when_not_starved(nsqd):
    topic = unique("notstarved")
    await publish_spread([nsqd.tcp_address], topic, 3)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10)
    await consumer.start()
    loop = asyncio.get_running_loop()
    start = loop.time()
    async for batch in consumer.batches(max_size=100, max_wait=0.5):
        assert len(batch) == 3 and not consumer.is_starved()
        assert loop.time() - start >= 0.45
        batch.finish()
        break
    await consumer.stop()


class LoopPasses:
    """Counts event-loop passes: a callback that reschedules itself with call_soon."""

    def __init__(self) -> None:
        self.count = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def starved_consumer(nsqd, name: str, count: int = 3000, max_in_flight: int = 2500) -> Consumer:
    """A consumer holding at least 85 % of ``max_in_flight`` unanswered messages."""
    topic = unique(name)
    await publish_spread([nsqd.tcp_address], topic, count)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=max_in_flight)
    await consumer.start()
    await eventually(consumer.is_starved, what="the consumer to hold its max_in_flight")
    return consumer


async def test_async_for_that_never_awaits_still_gives_the_loop_passes(nsqd):
    # Otherwise its FINs (written at the end of a pass) and nsqd's refills wait until
    # the whole max_in_flight is drained: a stop-and-go pipeline at half speed.
    consumer = await starved_consumer(nsqd, "iterpasses")
    passes = LoopPasses()
    seen_at: list[int] = []
    async for message in consumer:
        message.finish()
        seen_at.append(passes.count)
        if len(seen_at) == 2000:  # all of them queued before the loop started
            break
    passes.stop()
    assert seen_at[-1] - seen_at[0] >= 2000 // 256 - 1, seen_at[::256]
    await consumer.stop()


async def test_batches_give_the_loop_a_pass_between_batches(nsqd):
    consumer = await starved_consumer(nsqd, "batchpasses")
    passes = LoopPasses()
    seen_at: list[int] = []
    async for batch in consumer.batches(max_size=250, max_wait=10.0):
        assert len(batch) == 250
        batch.finish()
        seen_at.append(passes.count)
        if len(seen_at) == 8:  # 2000 messages, all queued before the loop started
            break
    passes.stop()
    assert all(b > a for a, b in itertools.pairwise(seen_at)), seen_at
    await consumer.stop()


async def test_async_for_and_explicit_answers(nsqd):
    topic = unique("iter")
    await publish_spread([nsqd.tcp_address], topic, 4)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=4)
    await consumer.start()
    seen: Counter[bytes] = Counter()
    async for message in consumer:
        seen[message.body] += 1
        if seen[message.body] == 1 and message.body.startswith(b"00000000"):
            message.requeue(0, backoff=False)  # comes back once
        else:
            message.touch()
            message.finish()
        if sum(seen.values()) == 5:
            break
    assert len(seen) == 4 and max(seen.values()) == 2
    await consumer.stop()


async def test_async_handler_runs_concurrently_up_to_max_in_flight(nsqd):
    topic = unique("async")
    await publish_spread([nsqd.tcp_address], topic, 50)
    running = 0
    peak = 0
    done: list[bytes] = []

    async def handle(message):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        done.append(message.body)

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=10)
    await consumer.start()
    await eventually(lambda: len(done) == 50, timeout=10)
    assert 2 <= peak <= 10
    await consumer.stop()


async def test_async_handler_that_never_awaits_is_finished_and_leaves_no_task(nsqd):
    """3.12+: an eager task that completes at once is never kept; 3.11: each handler's task (it
    needs one from its first step, tests/test_async_handler_task.py) is dropped once done."""
    topic = unique("eager")
    await publish_spread([nsqd.tcp_address], topic, 20)
    done: list[bytes] = []

    async def handle(message):
        done.append(message.body)  # never awaits

    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=20)
    await consumer.start()
    await eventually(lambda: len(done) == 20)
    await eventually(lambda: consumer.snapshot().finished == 20 and not consumer._dispatch.tasks,
                     what="every message finished, no task kept")
    await consumer.stop()


async def test_max_in_flight_below_connection_count_starves_no_nsqd(nsq_cluster):
    """mif 1 over 3 nsqd: RDY rotates, so every nsqd's messages get through (go-nsq #179, nsqjs #242)."""
    topic = unique("rotate")
    bodies = await publish_spread(nsq_cluster.tcp_addresses, topic, 6)
    got: list[bytes] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
                        handler=lambda m: got.append(m.body), max_in_flight=1,
                        low_rdy_idle_timeout=1.0, rdy_redistribute_interval=0.1)
    await consumer.start()
    await eventually(lambda: sorted(got) == sorted(bodies), timeout=20, what="messages from every nsqd")
    await consumer.stop()


async def test_set_max_in_flight_zero_pauses(nsqd):
    topic = unique("pause")
    await publish_spread([nsqd.tcp_address], topic, 10)
    got: list[bytes] = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: got.append(m.body),
                        max_in_flight=0)
    await consumer.start()
    await asyncio.sleep(0.3)
    assert got == []
    consumer.set_max_in_flight(5)
    await eventually(lambda: len(got) == 10)
    await consumer.stop()


async def test_direct_nsqd_reconnects_after_restart():
    from fastnsq.testing import NSQD

    async with NSQD() as nsqd:
        topic = unique("reconnect")
        got: list[bytes] = []
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: got.append(m.body),
                            max_in_flight=10, reconnect_delay=0.05)
        await consumer.start()
        await nsqd.stop()
        await asyncio.sleep(0.2)
        await nsqd.start()
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.publish(topic, b"after restart")
        await eventually(lambda: got == [b"after restart"], timeout=10, what="the consumer to reconnect")
        await consumer.stop()


def test_bad_options_name_the_option():
    for kwargs, words in [
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_attempts": 70000}, "max_attempts"),
        ({"backoff_strategy": "pynsq"}, "backoff_strategy"),
        ({"low_rdy_idle_timeout": 0.1}, "low_rdy_idle_timeout"),
        ({"heartbeat_interval": None}, "heartbeat_interval"),
        ({"bogus_option": 1}, "unknown Consumer option"),
    ]:
        with pytest.raises(InvalidValueError, match=words):
            Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], **kwargs)
    with pytest.raises(InvalidValueError, match="invalid channel name"):
        Consumer("t", "bad channel", nsqd_tcp_addresses=["127.0.0.1:4150"])


async def test_sync_consumer_with_worker_threads(nsqd):
    from fastnsq.sync import Consumer as SyncConsumer

    topic = unique("syncc")
    await publish_spread([nsqd.tcp_address], topic, 30)
    import threading

    handled: list[bytes] = []
    threads: set[str] = set()

    def handle(message):
        threads.add(threading.current_thread().name)
        if message.body.startswith(b"00000000") and message.attempts == 1:
            message.requeue(0, backoff=False)
            return
        handled.append(message.body)

    def blocking():
        consumer = SyncConsumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, workers=4)
        consumer.start()
        import time

        deadline = time.monotonic() + 15
        while len(set(handled)) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        return consumer.stop()

    report = await asyncio.get_running_loop().run_in_executor(None, blocking)
    assert len(set(handled)) == 30
    assert all(name.startswith("fastnsq-handler") for name in threads)
    assert not report.timed_out


def test_max_requeue_delay_is_documented_as_its_default_and_its_limit() -> None:
    """Issue 36: the docstring said 900 s and the README "at most 60 min", which read as a
    contradiction. Both are true (go-nsq's MaxRequeueDelay: default 15m, max 60m; nsqd 1.3's
    --max-req-timeout, 1h, clamps REQ): the code keeps them and every place says both."""
    from pathlib import Path

    from fastnsq.consumer import CONSUMER_DEFAULTS

    assert CONSUMER_DEFAULTS["max_requeue_delay"] == 900
    for limit in ("max_requeue_delay", "default_requeue_delay"):
        Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], **{limit: 3600})
        with pytest.raises(InvalidValueError, match=limit):
            Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], **{limit: 3601})
    doc = " ".join((Consumer.__doc__ or "").split())
    assert "``max_requeue_delay`` (900.0 s): The longest automatic requeue delay (go-nsq's 15 min; both at most 3600" in doc
    consuming = (Path(__file__).resolve().parents[1] / "docs" / "consuming.md").read_text()
    row = next(line for line in consuming.splitlines() if line.startswith("| `default_requeue_delay`"))
    assert "| 90, 900 |" in row and "at most 3600" in row and "`--max-req-timeout` (1 h" in row


@pytest.mark.parametrize("published", ["before the connection", "after its subscription"])
async def test_a_connections_first_message_is_not_held_in_nsqds_output_buffer(nsqd, published):
    """nsqd writes a message out at once only when the connection is then no longer ready;
    with more RDY it waits for the output buffer's tick (here made 30 s) or a heartbeat (20 s, which
    nsqd flushes with). The ticker starts at IDENTIFY, so this hits a new or reconnected connection
    (an idle one has a tick waiting). A connection's first RDY is 1 until its first message, so
    that message comes at once; the rest of the RDY follows it."""
    topic = unique("first")
    handled: list[bytes] = []
    async with Producer([nsqd.tcp_address]) as producer:
        if published == "before the connection":
            await producer.publish(topic, b"first")
        consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: handled.append(m.body),
                            max_in_flight=10, output_buffer_timeout=30, heartbeat_interval=20, express_lane=False)
        await consumer.start()
        try:
            if published != "before the connection":
                await producer.publish(topic, b"first")
            await eventually(lambda: handled == [b"first"], timeout=10, what="the first message, before the 30 s tick")
            async def holds_the_rest() -> bool:
                channels = await channel_stats([nsqd.http_address], topic, "ch")
                return [client["ready_count"] for ch in channels for client in ch["clients"]] == [10]

            await eventually(holds_the_rest, what="nsqd holding the rest of the RDY")
        finally:
            await consumer.stop()
