"""The blocking consumer (``fastnsq.sync.Consumer``): signals, the drain, snapshots, batches.

Signals are tested on a child process running ``Consumer.run()`` against the test's nsqd,
whose own ``/stats`` then says what was left in flight.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastnsq.sync import Consumer

from .helpers import Slack, eventually, unique
from .test_consumer import channel_stats, publish_spread

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

# Four handlers hold a message each until the test creates the release file (at most HOLD
# seconds); msg_timeout is long so that nsqd does not take back what a dead process left in
# flight before the test looks.
SIGNAL_GAP = 0.3  # between the two SIGTERMs
HURRY = 1.0  # run()'s hurry_timeout: how long a second signal lets the drain go on

CHILD = r"""
import os, sys, threading, time
from fastnsq.sync import Consumer

address, topic, release, hold, mode = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
printing = threading.Lock()  # one line per handler, not interleaved
kept = []

def handle(message):
    with printing:
        print("handling " + message.body[:8].decode(), flush=True)
    if mode == "keep":  # answered later, by other code (as a batching handler does): never here
        message.disable_auto_response()
        kept.append(message)
        return
    until = time.monotonic() + hold
    while not os.path.exists(release) and time.monotonic() < until:
        time.sleep(0.01)

consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[address], handler=handle, workers=4,
                    msg_timeout=60.0)
report = consumer.run()
final = consumer.snapshot()
print(f"REPORT finished={report.finished} requeued={report.requeued} abandoned={report.abandoned} "
      f"timed_out={report.timed_out} duration={report.duration:.2f} "
      f"snapshot_finished={final.finished} snapshot_in_flight={final.in_flight}", flush=True)
"""


async def _run_child(
    nsqd: Any, topic: str, tmp_path: Path, *, signals: int, release_after: float | None, hold: float = 8.0,
    mode: str = "hold",
) -> tuple[int | None, dict[str, str], str]:
    """Start the child, wait until its four handlers hold a message, send ``signals`` SIGTERMs
    0.3 s apart, release the handlers ``release_after`` seconds after the last one (None: never);
    the child's exit status, its report's fields and its stderr."""
    release = tmp_path / "release"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, nsqd.tcp_address, topic, str(release), str(hold), mode,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV,
    )
    assert child.stdout is not None and child.stderr is not None
    try:
        for _ in range(4):
            line = await asyncio.wait_for(child.stdout.readline(), 30)
            assert line.startswith(b"handling"), line
        for index in range(signals):
            if index:
                await asyncio.sleep(SIGNAL_GAP)
            os.kill(child.pid, signal.SIGTERM)
        if release_after is not None:
            await asyncio.sleep(release_after)
            release.touch()
        out, err = await asyncio.wait_for(child.communicate(), 60)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    report = {}
    for line in out.decode().splitlines():
        if line.startswith("REPORT "):
            report = dict(field.split("=") for field in line.split()[1:])
    return child.returncode, report, err.decode()


async def _left_in_channel(nsqd: Any, topic: str) -> dict[str, int]:
    await asyncio.sleep(0.2)  # the last REQs reach nsqd before the child's connection closes
    stats = (await channel_stats([nsqd.http_address], topic, "ch"))[0]
    return {"in_flight": stats["in_flight_count"], "queued": stats["depth"] + stats["deferred_count"]}


async def test_a_second_sigterm_hurries_the_drain_and_still_requeues_what_is_held(nsqd, tmp_path):
    """Handlers hold their messages 8 s; SIGTERM twice 0.3 s apart: the drain ends about a second
    after the second signal (not at run()'s 30 s deadline), the four held messages go back to
    nsqd, the report is printed and the process exits 0."""
    topic = unique("twosig")
    await publish_spread([nsqd.tcp_address], topic, 10)
    async with Slack() as slack:
        status, report, err = await _run_child(nsqd, topic, tmp_path, signals=2, release_after=None)
    assert status == 0, err
    assert report, f"no StopReport printed; stderr: {err}"
    # Abandoned, not finished: the drain ended before the handlers' 8 s hold did.
    assert report["abandoned"] == "4" and report["requeued"] == "4" and report["finished"] == "0"
    assert report["timed_out"] == "True"
    # Hurried: the 0.3 s between the signals and hurry_timeout (1 s), not run()'s 30 s deadline;
    # plus the slack this machine showed meanwhile (the child's own is the same machine's).
    assert float(report["duration"]) < SIGNAL_GAP + HURRY + slack.allowance(0.5), (report, slack)
    assert report["snapshot_in_flight"] == "0"
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 10}


async def test_a_second_sigterm_requeues_messages_kept_past_their_handler(nsqd, tmp_path):
    """Handlers that disable the auto response and keep their messages (to answer them later):
    the second signal requeues those too, as the held ones."""
    topic = unique("twosigkept")
    await publish_spread([nsqd.tcp_address], topic, 10)
    async with Slack() as slack:
        status, report, err = await _run_child(nsqd, topic, tmp_path, signals=2, release_after=None, mode="keep")
    assert status == 0, err
    assert report["abandoned"] == "4" and report["requeued"] == "4" and report["timed_out"] == "True"
    assert float(report["duration"]) < SIGNAL_GAP + HURRY + slack.allowance(0.5), (report, slack)
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 10}


async def test_a_second_sigterm_still_lets_handlers_about_to_return_finish(nsqd, tmp_path):
    """A duplicated SIGTERM with handlers that return 0.1 s after it: they finish within the
    hurried drain (run()'s hurry_timeout, 1 s); nothing is abandoned."""
    topic = unique("twosigquick")
    await publish_spread([nsqd.tcp_address], topic, 10)
    status, report, err = await _run_child(nsqd, topic, tmp_path, signals=2, release_after=0.1)
    assert status == 0, err
    assert report["finished"] == "4" and report["abandoned"] == "0" and report["timed_out"] == "False"
    assert report["snapshot_finished"] == "4"
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 6}


async def test_one_sigterm_drains_handlers_to_the_end(nsqd, tmp_path):
    """One SIGTERM: the handlers, released 2 s later (past any hurry), finish their messages."""
    topic = unique("onesig")
    await publish_spread([nsqd.tcp_address], topic, 10)
    status, report, err = await _run_child(nsqd, topic, tmp_path, signals=1, release_after=2.0)
    assert status == 0, err
    assert report["finished"] == "4" and report["abandoned"] == "0" and report["timed_out"] == "False"
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 6}


async def test_snapshot_after_run_and_stop_gives_the_final_counts(nsqd):
    topic = unique("snapafter")
    await publish_spread([nsqd.tcp_address], topic, 20)
    handled: list[bytes] = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: handled.append(m.body),
                        workers=2)

    def blocking() -> tuple[Any, Any, Any]:
        reports: list[Any] = []
        runner = threading.Thread(target=lambda: reports.append(consumer.run()))  # not main: no signals
        runner.start()
        deadline = time.monotonic() + 15
        while len(handled) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        stopped = consumer.stop()
        runner.join(10)
        return reports[0], stopped, consumer.snapshot()

    from_run, from_stop, final = await asyncio.get_running_loop().run_in_executor(None, blocking)
    assert from_run is from_stop  # one drain, one report
    assert (final.received, final.finished, final.in_flight) == (20, 20, 0)
    assert consumer.snapshot() == final  # and again, unchanged
    consumer.set_max_in_flight(5)  # the other calls do not raise after the stop either
    consumer.pause_partition(None)
    assert not consumer.is_starved()


async def test_blocking_batches_answered_from_other_threads(nsqd):
    topic = unique("syncbatch")
    bodies = set(await publish_spread([nsqd.tcp_address], topic, 250))
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=100)
    finished: set[bytes] = set()
    requeued: set[bytes] = set()
    attempts: dict[bytes, int] = {}

    def blocking() -> Any:
        with consumer, ThreadPoolExecutor(4) as workers:
            answers = []
            for batch in consumer.batches(max_size=30, max_wait=0.5):
                for message in batch:
                    attempts[message.body] = message.attempts
                if not requeued:  # the first batch goes back once, from a worker thread
                    requeued.update(message.body for message in batch)
                    answers.append(workers.submit(batch.requeue, 0, False))
                else:
                    finished.update(message.body for message in batch)
                    answers.append(workers.submit(batch.finish))
                if finished >= bodies:
                    break
            for answer in answers:
                answer.result(10)
        return consumer.snapshot()

    final = await asyncio.get_running_loop().run_in_executor(None, blocking)
    assert finished == bodies
    assert all(attempts[body] == 2 for body in requeued)
    assert final.finished == 250 and final.requeued == len(requeued) and final.in_flight == 0
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 0}


async def test_a_batch_held_at_the_stop_deadline_is_requeued(nsqd):
    topic = unique("batchdeadline")
    await publish_spread([nsqd.tcp_address], topic, 10)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10)

    def blocking() -> tuple[int, Any]:
        consumer.start()
        batches = consumer.batches(max_size=10, max_wait=1.0)
        batch = next(batches)
        report = consumer.stop(timeout=0.5)  # the batch is never answered
        batch.finish()  # after the stop: its messages were requeued, nothing more is sent
        assert list(batches) == []
        return len(batch), report

    held, report = await asyncio.get_running_loop().run_in_executor(None, blocking)
    assert held >= 8  # yielded when starved (85 % of RDY in flight) or full
    assert report.timed_out and report.abandoned == held and report.requeued == 10
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 10}


async def test_is_starved_and_set_max_in_flight_zero_pauses(nsqd):
    topic = unique("syncstarve")
    await publish_spread([nsqd.tcp_address], topic, 20)
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=0)

    def blocking() -> None:
        with consumer:
            time.sleep(0.3)
            assert consumer.snapshot().received == 0 and not consumer.is_starved()
            consumer.set_max_in_flight(10)
            assert consumer.max_in_flight == 10
            deadline = time.monotonic() + 10
            while consumer.snapshot().in_flight < 10 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert consumer.snapshot().in_flight == 10
            assert consumer.is_starved()  # ten held of an RDY of ten: nsqd sends nothing more
            batch = next(consumer.batches(max_size=100, max_wait=5.0))
            batch.finish()

    await asyncio.get_running_loop().run_in_executor(None, blocking)


async def test_pause_and_resume_from_a_thread(nsqd):
    topic = unique("syncpause")
    handled: list[bytes] = []
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=lambda m: handled.append(m.body),
                        workers=2)

    def blocking() -> None:
        with consumer:
            consumer.pause_partition(None)  # an upstream nsqd's connections have no partition
            assert consumer.partitions[None].paused
            from fastnsq.sync import Producer

            with Producer([nsqd.tcp_address]) as producer:
                producer.mpublish(topic, [b"%d" % i for i in range(5)])
            time.sleep(0.5)
            assert handled == []
            consumer.resume_partition(None)
            deadline = time.monotonic() + 10
            while len(handled) < 5 and time.monotonic() < deadline:
                time.sleep(0.02)

    await asyncio.get_running_loop().run_in_executor(None, blocking)
    await eventually(lambda: sorted(handled) == [b"%d" % i for i in range(5)])


async def test_an_async_batch_held_at_the_stop_deadline_is_requeued(nsqd):
    """What docs/operating.md says of the async consumer: a batch still unanswered at the deadline
    is requeued and counted in ``abandoned``; answering it afterwards sends nothing."""
    from fastnsq import Consumer as AsyncConsumer

    topic = unique("asyncbatchdeadline")
    await publish_spread([nsqd.tcp_address], topic, 10)
    consumer = AsyncConsumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10)
    await consumer.start()
    async for batch in consumer.batches(max_size=10, max_wait=1.0):
        break
    report = await consumer.stop(timeout=0.5)
    batch.finish()
    assert report.timed_out and report.abandoned == len(batch) and report.requeued == 10
    assert consumer.snapshot().finished == 0
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 10}


async def test_iterating_gives_every_message_and_requeues_what_a_break_left(nsqd):
    """``for message in consumer``: every message once; a break gives back what was taken and not handed out."""
    topic = unique("synciter")
    bodies = set(await publish_spread([nsqd.tcp_address], topic, 300))

    def blocking() -> tuple[set[bytes], set[bytes], Any]:
        seen: set[bytes] = set()
        with Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=50) as consumer:
            deadline = time.monotonic() + 10
            while consumer.snapshot().in_flight < 50 and time.monotonic() < deadline:
                time.sleep(0.01)  # 50 delivered and queued: the first take is all of them
            for message in consumer:  # the first run leaves after 10, with 40 more taken
                seen.add(message.body)
                message.finish()
                if len(seen) == 10:
                    break
            first = set(seen)
            for message in consumer:  # the rest, the requeued ones included, from a thread pool's worker
                seen.add(message.body)
                message.finish()
                if seen >= bodies:
                    break
        return first, seen, consumer.snapshot()

    first, seen, final = await asyncio.get_running_loop().run_in_executor(None, blocking)
    assert len(first) == 10
    assert seen == bodies
    assert final.finished == 300 and final.in_flight == 0
    assert final.requeued == 40  # the first break gave back what it had taken and not handed out
    assert await _left_in_channel(nsqd, topic) == {"in_flight": 0, "queued": 0}


def test_iterating_a_consumer_with_a_handler_is_refused() -> None:
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:1"], handler=print)
    try:
        iter(consumer)
        raise AssertionError("iterating a consumer with a handler was accepted")
    except RuntimeError as exc:
        assert "has a handler" in str(exc)
