"""``fastnsq worker``: the real command run as a subprocess against servers, real signals, real HTTP.

Each test starts ``python -m fastnsq worker`` on a handler module written to the test's
folder (every handled body is appended to a file per process, so the test can tell a
message handled twice from one handled once), scrapes the supervisor's ``/metrics``,
``/healthz`` and ``/readyz``, and asks nsqd's own ``/stats`` what was finished, requeued
or left in flight. The settings, the assignment of nsqd and the merging of metrics are
also tested on their own (pure functions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fastnsq.runner.assign import rebalance
from fastnsq.runner.gather import Gatherer, render
from fastnsq.runner.settings import SettingsError, merge
from fastnsq.testing import NSQD
from fastnsq.testing.process import free_port

from .helpers import Slack, eventually, unique
from .test_consumer import channel_stats, publish_spread

ROOT = Path(__file__).resolve().parent.parent

HANDLERS = r'''
import os, threading, time

OUT = os.environ["WK_OUT"]
SLEEP = float(os.environ.get("WK_SLEEP", "0"))

def _record(kind, line):
    with open(os.path.join(OUT, f"{kind}-{os.getpid()}"), "a") as f:
        f.write(line + "\n")

def handle(message):
    if SLEEP:
        time.sleep(SLEEP)
    _record("handled", message.body.decode())

def fail(message):
    raise RuntimeError("this handler always fails")

def threaded(message):
    _record("handled", message.body.decode())
    _record("threads", threading.current_thread().name)

def batch(messages):
    _record("batches", str(len(messages)))
    for message in messages:
        _record("handled", message.body.decode())

_running = [0]

async def slow_batch(messages):
    """An async batch handler (a database write): how many run at once is recorded."""
    import asyncio
    _running[0] += 1
    _record("running", str(_running[0]))
    await asyncio.sleep(SLEEP)
    _running[0] -= 1
    _record("batches", str(len(messages)))
    for message in messages:
        _record("handled", message.body.decode())

class Job:
    def setup(self):
        _record("setup", "1")
    def handle(self, message):
        handle(message)
    def teardown(self):
        _record("teardown", "1")

class Reopens:
    def handle(self, message):
        handle(message)
    def hup(self):
        _record("hup", "1")

class Rows:
    """The stdlib sqlite3 with --threads: a connection belongs to the thread that opened it."""
    def __init__(self):
        self.local = threading.local()
        self.path = os.path.join(OUT, f"rows-{os.getpid()}.db")
    def setup(self):
        import sqlite3
        self.db = sqlite3.connect(self.path)  # on the loop's thread: fails in a handler thread
        self.db.execute("create table if not exists rows (body text)")
        self.db.commit()
    def setup_thread(self):
        import sqlite3
        self.local.db = sqlite3.connect(self.path, timeout=60)  # three threads write the file
        _record("thread_setup", threading.current_thread().name)
    def teardown_thread(self):
        self.local.db.close()
        _record("thread_teardown", threading.current_thread().name)

class RowsOnce(Rows):
    def handle(self, message):
        with self.db:
            self.db.execute("insert into rows values (?)", (message.body.decode(),))
        _record("handled", message.body.decode())

class RowsPerThread(Rows):
    def handle(self, message):
        try:
            with self.local.db as db:
                db.execute("insert into rows values (?)", (message.body.decode(),))
        except Exception as exc:
            _record("errors", repr(exc))
            raise
        _record("handled", message.body.decode())

class Broken:
    def setup(self):
        raise ValueError("database unreachable")
    def handle(self, message):
        pass
'''


class Worker:
    """A running ``fastnsq worker`` and the folder its handlers write to."""

    def __init__(self, process: asyncio.subprocess.Process, port: int, folder: Path) -> None:
        self.process, self.port, self.folder = process, port, folder

    def lines(self, kind: str) -> list[str]:
        found: list[str] = []
        for path in self.folder.glob(f"{kind}-*"):
            found += path.read_text().splitlines()
        return found

    def log(self) -> str:
        return (self.folder / "worker.log").read_text()

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{self.port}{path}") as resp:
            return resp.status, await resp.text()

    async def status(self, path: str = "/healthz") -> int:
        try:
            return (await self.get(path))[0]
        except aiohttp.ClientError:
            return 0

    async def health(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
            return dict(await resp.json())

    async def metric(self, name: str) -> float:
        """The sum of a metric's samples in the group's /metrics."""
        _, text = await self.get("/metrics")
        return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    async def stop(self, *, signals: int = 1, timeout: float = 20.0) -> int:
        for index in range(signals):
            if index:
                await asyncio.sleep(0.1)
            if self.process.returncode is None:  # a later signal after the exit: the test's assertions say so
                self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), timeout)


async def start_worker(folder: Path, *args: str, sleep: float = 0.0) -> Worker:
    (folder / "wk_jobs.py").write_text(HANDLERS)
    port = free_port()
    env = {**os.environ, "WK_OUT": str(folder), "WK_SLEEP": str(sleep),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = (folder / "worker.log").open("wb")  # the worker inherits it; our copy is closed after the spawn
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fastnsq", "worker", *args, "--metrics-port", str(port),
        cwd=folder, env=env, stdout=log, stderr=log,
    )
    log.close()
    worker = Worker(process, port, folder)
    await eventually(lambda: _answers(worker), 20, "the worker's /healthz")
    return worker


async def _answers(worker: Worker) -> bool:
    if worker.process.returncode is not None:
        raise AssertionError(f"the worker exited ({worker.process.returncode}):\n{worker.log()}")
    return await worker.status() != 0


@pytest.fixture
async def cleanup():
    """Kill whatever worker a failed test left running (its children then drain on their own)."""
    workers: list[Worker] = []
    yield workers
    for worker in workers:
        if worker.process.returncode is None:
            worker.process.kill()
            await worker.process.wait()


def _consume_args(topic: str, *servers: str) -> list[str]:
    args = ["--topic", topic, "--channel", "work"]
    for address in servers:
        args += ["--nsqd-tcp-address", address]
    return args


# ---- pure pieces -----------------------------------------------------------------------------


def test_settings_flags_beat_environment_beat_file_beat_defaults() -> None:
    file_values = {"topic": "from_file", "channel": "file_channel", "processes": 3, "drain_timeout": "1m",
                   "nsqd_tcp_address": ["127.0.0.1:1"], "consumer": {"max_attempts": 7, "msg_timeout": "30s"}}
    environ = {"FASTNSQ_WORKER_TOPIC": "from_env", "FASTNSQ_WORKER_PROCESSES": "2",
               "FASTNSQ_CONSUMER_MAX_ATTEMPTS": "8"}
    flags = {"target": "m:f", "topic": "from_flag", "consumer_opt": ["max_attempts=9"]}
    settings = merge(flags, environ, file_values)
    assert (settings.topic, settings.channel, settings.processes) == ("from_flag", "file_channel", 2)
    assert settings.drain_timeout == 60.0 and settings.nsqd_tcp_addresses == ["127.0.0.1:1"]
    assert settings.consumer_options["max_attempts"] == 9 and settings.consumer_options["msg_timeout"] == 30.0
    assert settings.max_in_flight == 200  # the default: 100 per process
    assert merge({**flags, "consumer_opt": []}, environ, file_values).consumer_options["max_attempts"] == 8
    assert merge({"target": "m:f"}, {}, file_values).topic == "from_file"


def test_log_level_takes_any_case_from_every_source_and_names_a_wrong_one() -> None:
    """nsq's apps take debug/warn, the worker DEBUG/WARNING: each source takes either (a lower-case
    FASTNSQ_WORKER_LOG_LEVEL once reached logging as "Unknown level: 'debug'")."""
    base = {"target": "m:f", "topic": "t", "channel": "c", "nsqd_tcp_address": ["127.0.0.1:1"]}
    assert merge(base, {"FASTNSQ_WORKER_LOG_LEVEL": "warn"}, {}).log_level == "WARNING"
    assert merge(base, {}, {"log_level": "Error"}).log_level == "ERROR"
    with pytest.raises(SettingsError, match=r"FASTNSQ_WORKER_LOG_LEVEL='loud'.*DEBUG, INFO, WARNING, ERROR"):
        merge(base, {"FASTNSQ_WORKER_LOG_LEVEL": "loud"}, {})


def test_max_in_flight_is_split_and_adds_up() -> None:
    base = {"target": "m:f", "topic": "t", "channel": "c", "nsqd_tcp_address": ["127.0.0.1:1"]}
    settings = merge({**base, "max_in_flight": 7, "processes": 3}, {}, {})
    assert [settings.share_of(i) for i in range(3)] == [3, 2, 2]
    with pytest.raises(SettingsError, match=r"max_in_flight 2 is below --processes 3"):
        merge({**base, "max_in_flight": 2, "processes": 3}, {}, {})
    with pytest.raises(SettingsError, match=r"--consumer-opt.*max_atempts"):
        merge({**base, "consumer_opt": ["max_atempts=3"]}, {}, {})
    # --split-nsqd keeps one connection per nsqd: no express lane unless asked for.
    assert merge({**base, "split_nsqd": True}, {}, {}).consumer_options["express_lane"] is False


def test_rebalance_moves_as_few_nsqd_as_possible() -> None:
    first = rebalance({}, ["a", "b", "c"], 2)
    assert sorted(first[0] + first[1]) == ["a", "b", "c"] and {len(first[0]), len(first[1])} == {1, 2}
    grown = rebalance(first, ["a", "b", "c", "d"], 2)
    assert [len(grown[0]), len(grown[1])] == [2, 2]
    assert all(set(first[i]) & set(grown[i]) == set(first[i]) - {"d"} for i in range(2))  # nothing moved
    shrunk = rebalance(grown, ["a"], 2)
    assert sorted(shrunk[0] + shrunk[1]) == ["a"]
    assert rebalance({}, ["a"], 3) == {0: ["a"], 1: [], 2: []}


def test_gathering_adds_counters_keeps_exited_ones_and_takes_the_highest_backoff() -> None:
    def child(finished: int, in_flight: int, level: int) -> str:
        return (
            "# TYPE nsq_consumer_messages_finished_total counter\n"
            f'nsq_consumer_messages_finished_total{{channel="c",topic="t"}} {finished}\n'
            "# TYPE nsq_consumer_in_flight gauge\n"
            f'nsq_consumer_in_flight{{channel="c",topic="t"}} {in_flight}\n'
            "# TYPE nsq_consumer_backoff_level gauge\n"
            f'nsq_consumer_backoff_level{{channel="c",topic="t"}} {level}\n'
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7e9\n"
        )

    gatherer = Gatherer()
    gatherer.retire(child(5, 3, 4))  # a child that exited: its counter stays, its gauges go
    text = render(gatherer.merge([child(10, 1, 0), child(20, 2, 2)])).decode()
    assert 'nsq_consumer_messages_finished_total{channel="c",topic="t"} 35.0' in text
    assert 'nsq_consumer_in_flight{channel="c",topic="t"} 3.0' in text
    assert 'nsq_consumer_backoff_level{channel="c",topic="t"} 2.0' in text
    assert "process_start_time_seconds" not in text


def test_gathering_drops_the_created_stamps_but_not_a_gauge_named_so() -> None:
    """A counter's NAME_created family goes whole (its HELP and TYPE used to stay, with no sample);
    a gauge of the user's whose name ends in _created is no stamp: its samples stay."""
    text = (
        "# TYPE jobs_total counter\njobs_total 3\n"
        "# TYPE jobs_created gauge\njobs_created 1.7e9\n"
        "# TYPE batch_created gauge\nbatch_created 4\n"
    )
    merged = render(Gatherer().merge([text, text])).decode()
    assert "jobs_created" not in merged
    assert "jobs_total 6.0" in merged
    assert "batch_created 8.0" in merged


class _FakeChild:
    """A child process as the supervisor sees it: its pipe (what it was sent, what it says) and its exit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.sent: list[dict[str, Any]] = []
        self.says: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def receive(self) -> dict[str, Any] | None:
        return await self.says.get()

    def close(self) -> None:
        self.says.put_nowait(None)

    async def wait(self) -> int:
        status = self.returncode = await self.exited
        return status


async def test_a_scrape_waits_for_no_child_that_has_exited(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics asks every live child for a fresh report and waits for them: a child that exits
    instead (the group's drain) ends its part of the wait, its counters kept. The wait lasted
    REPORT_WAIT (2 s) after such a child had gone, and the group's exit waited for the scrape
    (aiohttp's cleanup lets a request finish): the supervisor exited 1.4-2 s after its children."""
    from fastnsq.runner import supervisor as supervising
    from fastnsq.runner.settings import WorkerSettings
    from fastnsq.runner.supervisor import Supervisor

    monkeypatch.setattr(supervising, "REPORT_WAIT", 3600.0)  # the scrape ends by events, or not at all
    group = Supervisor(WorkerSettings(target="m:h", topic="t", channel="c", processes=2))
    children = [_FakeChild(100), _FakeChild(101)]
    for slot, child in zip(group.slots, children):
        slot.process, slot.channel = child, child  # type: ignore[assignment]
        group._spawn_task(group._listen(slot, child))  # type: ignore[arg-type]
        group._spawn_task(group._wait(slot, child))  # type: ignore[arg-type]
    counted = "# TYPE jobs_total counter\njobs_total {}\n"
    group.slots[1].metrics = counted.format(7)  # the exiting child's last report
    group.stopping = True  # draining: an exit is no crash
    scrape = asyncio.create_task(group.metrics_families())
    await eventually(lambda: all(c.sent and c.sent[-1]["type"] == "report" for c in children), 10, "two asks")
    children[0].says.put_nowait({"type": "report", "id": children[0].sent[-1]["id"], "metrics": counted.format(5)})
    children[1].exited.set_result(0)  # exits without answering
    families = await asyncio.wait_for(scrape, 60)  # before: REPORT_WAIT
    [jobs] = [family for family in families if family.name == "jobs"]
    assert jobs.samples == {("jobs_total", ()): 12.0}
    children[0].exited.set_result(0)
    await asyncio.wait_for(group._done.wait(), 60)
    for task in list(group._tasks):
        task.cancel()


async def test_a_failed_batch_of_one_is_logged_in_the_singular(caplog: pytest.LogCaptureFixture) -> None:
    """The worker's log said "requeueing 1 messages", and a failed batch logged its traceback at
    WARNING without the error in the line (issue 58)."""
    from fastnsq.runner.child import Child
    from fastnsq.runner.loading import Handler
    from fastnsq.runner.settings import WorkerSettings

    class Batch(list[int]):
        requeued = 0

        def requeue(self) -> None:
            self.requeued += 1

    def fail(batch: Any) -> None:
        raise RuntimeError("the batch failed")

    child = Child(WorkerSettings(target="m:fail", topic="t", channel="c"), 0, Handler("m:fail", fail, False),
                  None, None)  # type: ignore[arg-type]
    for size in (1, 2):
        batch, running = Batch(range(size)), asyncio.Semaphore(0)
        with caplog.at_level(logging.DEBUG, logger="fastnsq.worker"):
            await child._answer_batch(batch, running)
        assert batch.requeued == 1 and not running.locked()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    # One line each, naming the error; the traceback only at DEBUG (it was ~35 lines at WARNING).
    assert [r.getMessage() for r in warnings] == [
        "batch handler raised RuntimeError: the batch failed; requeueing 1 message",
        "batch handler raised RuntimeError: the batch failed; requeueing 2 messages",
    ]
    assert not any(r.exc_info for r in warnings)
    assert [r.exc_info[0] for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info] == [RuntimeError] * 2


async def test_handler_threads_set_up_and_tear_down_each_thread() -> None:
    """Each thread runs setup_thread() before its first call and teardown_thread() after its
    last; a setup that raises fails start() (the others tear down); close() cancels calls not
    begun; an async setup_thread() is refused when the target loads."""
    import threading

    from fastnsq.runner.loading import LoadError, _describe
    from fastnsq.runner.threads import HandlerThreads

    local, events = threading.local(), []

    def setup_thread() -> None:
        local.name = threading.current_thread().name
        events.append(("setup", local.name))

    def teardown_thread() -> None:
        events.append(("teardown", local.name))

    threads = HandlerThreads(3, setup_thread, teardown_thread)
    await threads.start()
    names = await asyncio.gather(*(threads.run(lambda _: local.name, i) for i in range(30)))
    assert set(names) <= {name for kind, name in events if kind == "setup"} and len(events) == 3
    with pytest.raises(ZeroDivisionError):
        await threads.run(lambda n: 1 / n, 0)
    gate = threading.Event()
    busy = [asyncio.ensure_future(threads.run(lambda _: gate.wait(5), i)) for i in range(3)]
    queued = asyncio.ensure_future(threads.run(lambda _: events.append(("ran", "late")), None))
    await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(threads.close())
    await asyncio.sleep(0.05)
    gate.set()
    await closing
    assert all(task.result() is True for task in busy) and queued.cancelled()
    assert sorted(name for kind, name in events if kind == "teardown") == sorted(
        name for kind, name in events if kind == "setup")

    calls = []

    def fails_once() -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise OSError("database unreachable")

    broken = HandlerThreads(3, fails_once, lambda: calls.append("teardown"))
    with pytest.raises(OSError, match="database unreachable"):
        await broken.start()
    assert calls.count("teardown") == 2  # the two set up have ended

    class AsyncSetup:
        async def setup_thread(self) -> None: ...
        def handle(self, message: Any) -> None: ...

    with pytest.raises(LoadError, match=r"setup_thread\(\) is a coroutine function"):
        _describe("m:AsyncSetup", AsyncSetup())


# ---- the command ---------------------------------------------------------------------------


async def test_a_module_that_does_not_import_is_exit_status_2(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fastnsq", "worker", "no_such_module_here:handle", "--topic", "t", "--channel", "c",
        "--nsqd-tcp-address", "127.0.0.1:1", cwd=tmp_path, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert "no module named 'no_such_module_here'" in err.decode(), err
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fastnsq", "worker", "json:dumps", "--topic", "t", "--channel", "c",
        "--nsqd-tcp-address", "127.0.0.1:1", "--processes", "4", "--max-in-flight", "3",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2 and "max_in_flight 3 is below --processes 4" in err.decode(), err


def _marked_processes(mark: str) -> dict[int, str]:
    """The live processes whose environment carries ``FASTNSQ_TEST_MARK=mark``, with their command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"FASTNSQ_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_the_child_started_at_the_commands_start_leaves_quietly_when_no_group_runs(tmp_path: Path) -> None:
    """The entry point starts worker 0's process before the flags are checked; a command refused
    after that (exit 2) leaves one error line, and its early child exits on its own, silent."""
    mark = f"refused-{os.getpid()}-{time.monotonic_ns()}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fastnsq", "worker", "json:dumps", "--topic", "t", "--channel", "c",
        "--nsqd-tcp-address", "127.0.0.1:1", "--processes", "4", "--max-in-flight", "3",
        env={**os.environ, "FASTNSQ_TEST_MARK": mark}, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)  # EOF once the early child is gone too
    assert process.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "max_in_flight 3 is below --processes 4" in lines[0], err
    await eventually(lambda: not _marked_processes(mark), 10, "no process of the refused command left")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_worker_0_is_the_child_started_at_the_commands_start(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes asked, two children run: worker 0 is the one the entry point started
    (adopted, not started a second time), worker 1 the supervisor's; FASTNSQ_EARLY_CHILD=0 turns it off."""
    for early in ("1", "0"):
        mark = f"adopted-{early}-{os.getpid()}-{time.monotonic_ns()}"
        monkeypatch.setenv("FASTNSQ_TEST_MARK", mark)
        monkeypatch.setenv("FASTNSQ_EARLY_CHILD", early)
        worker = await start_worker(tmp_path, "wk_jobs:handle", *_consume_args(f"early{early}", nsqd.tcp_address),
                                    "--processes", "2")
        cleanup.append(worker)
        await eventually(lambda w=worker: "worker 1 started" in w.log(), 20, "both workers started")
        children = {pid for pid, command in _marked_processes(mark).items() if "fastnsq.runner.child" in command}
        started = {int(pid) for pid in re.findall(r"worker \d started \(pid (\d+)", worker.log())}
        assert children == started and len(children) == 2, (children, worker.log())
        first, second = (re.search(rf"worker {index} started \(pid \d+(, at the command's start)?\)", worker.log())
                         for index in (0, 1))
        assert first is not None and second is not None, worker.log()
        assert (first.group(1) is not None, second.group(1)) == (early == "1", None), worker.log()
        assert await worker.stop() == 0


async def test_two_processes_handle_every_message_once_with_hooks_and_group_metrics(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """Two children share max_in_flight 50 and each run setup() once; /metrics' finished is nsqd's
    message count; every body is handled exactly once; SIGTERM: teardown() in each, exit 0."""
    topic, total = unique("wk"), 2000
    await publish_spread([nsqd.tcp_address], topic, total)
    worker = await start_worker(tmp_path, "wk_jobs:Job", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--max-in-flight", "50", sleep=0.001)
    cleanup.append(worker)

    async def finished() -> bool:
        return await worker.metric("nsq_consumer_messages_finished_total") == total

    await eventually(finished, 60, "the group's finished count")
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["message_count"] == total == await worker.metric("nsq_consumer_messages_finished_total")
    agents = sorted(client["user_agent"].split()[-1] for client in stats["clients"])
    assert agents == ["worker=0", "worker=1"], stats["clients"]
    assert await worker.metric("nsq_consumer_max_in_flight") == 50
    assert len(worker.lines("setup")) == 2
    assert await worker.stop() == 0
    handled = worker.lines("handled")
    assert len(handled) == len(set(handled)) == total
    assert len(worker.lines("teardown")) == 2
    assert len(list(tmp_path.glob("handled-*"))) == 2, "both processes handled messages"


#: A handler's own metrics, one of each kind a handler may register: a counter, a histogram with
#: the issue's buckets, a summary, and a gauge in each of prometheus_client's multiprocess modes
#: (the group adds gauges up whatever the mode: the children's registries are their own).
USER_METRICS = r"""
import prometheus_client

MODES = sorted(getattr(prometheus_client.Gauge, "_MULTIPROC_MODES", ("all", "liveall", "livesum", "max", "min", "sum")))

def make(registry):
    return (
        prometheus_client.Counter("demo_handled", "messages handled", ["kind"], registry=registry),
        prometheus_client.Histogram("demo_batch_size", "batch sizes", buckets=(1, 10, 50, 100, 400),
                                    registry=registry),
        prometheus_client.Summary("demo_seconds", "handling time", registry=registry),
        [prometheus_client.Gauge(f"demo_{mode}_level", f"a level, multiprocess_mode={mode}",
                                 multiprocess_mode=mode, registry=registry) for mode in MODES],
    )

def observe(metrics, size):
    handled, batch_size, seconds, gauges = metrics
    for kind in ("a", "b"):
        handled.labels(kind).inc()
    for value in (size, 5, 70, 500):
        batch_size.observe(value)
    seconds.observe(0.001)
    for gauge in gauges:
        gauge.set(size)
"""

USER_HANDLER = """
import os, prometheus_client
from wk_metrics import make, observe

METRICS = make(prometheus_client.REGISTRY)

def handle(message):
    observe(METRICS, len(message.body))
    with open(os.path.join(os.environ["WK_OUT"], f"handled-{os.getpid()}"), "a") as f:
        f.write(message.body.decode() + "\\n")
"""


async def _group_metrics_with_user_metrics(nsqd: Any, folder: Path, cleanup: list[Worker]) -> str:
    """The group's /metrics text once both processes handled messages with USER_METRICS."""
    (folder / "wk_metrics.py").write_text(USER_METRICS)
    (folder / "wk_user.py").write_text(USER_HANDLER)
    topic, total = unique("wk"), 400
    worker = await start_worker(folder, "wk_user:handle", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--max-in-flight", "2")
    cleanup.append(worker)

    async def both_subscribed() -> bool:
        return all(child.get("connections") for child in (await worker.health())["workers"])

    await eventually(both_subscribed, 30, "both processes subscribed")  # then nsqd gives each its part
    await publish_spread([nsqd.tcp_address], topic, total)
    await eventually(lambda: len(worker.lines("handled")) == total, 60, "every message handled")
    assert len(list(folder.glob("handled-*"))) == 2, "both processes handled messages"
    await eventually(lambda: _at_least(lambda: worker.metric("demo_handled_total"), 2 * total), 20,
                     "both processes' reports")
    _, text = await worker.get("/metrics")
    assert await worker.stop() == 0
    return text


def _single_process_text() -> str:
    """What one process's prometheus_client serves for USER_METRICS (a registry of its own)."""
    import prometheus_client

    names: dict[str, Any] = {}
    exec(USER_METRICS, names)  # noqa: S102 - the test's own text
    registry = prometheus_client.CollectorRegistry()
    names["observe"](names["make"](registry), 9)
    return prometheus_client.generate_latest(registry).decode()


def _shape(text: str) -> list[tuple[str, str, list[tuple[str, dict[str, str]]]]]:
    """The demo_* families as prometheus_client's parser reads them: name, type, samples in order."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(family.name, family.type, [(sample.name, sample.labels) for sample in family.samples])
            for family in text_string_to_metric_families(text) if family.name.startswith("demo_")]


async def test_group_metrics_order_buckets_as_one_process_does_and_leave_no_empty_family(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """Two processes, a handler registering each kind of metric: the group's /metrics, read by
    prometheus_client's parser, holds the families and samples one process serves, in its order
    (buckets by increasing le, +Inf last; sorted as text, "+Inf" came first and "100.0" before
    "50.0"), but the *_created stamps, whose families used to be left with no sample."""
    pytest.importorskip("prometheus_client", reason="/metrics needs the 'metrics' extra")
    from prometheus_client.parser import text_string_to_metric_families

    text = await _group_metrics_with_user_metrics(nsqd, tmp_path, cleanup)
    families = list(text_string_to_metric_families(text))
    buckets = [sample.labels["le"] for family in families if family.name == "demo_batch_size"
               for sample in family.samples if sample.name == "demo_batch_size_bucket"]
    assert buckets == ["1.0", "10.0", "50.0", "100.0", "400.0", "+Inf"]
    one = [family for family in _shape(_single_process_text()) if not family[0].endswith("_created")]
    assert _shape(text) == one, text
    stamps = [family.name for family in families if family.name.endswith("_created")]
    assert not stamps, f"*_created families (with no sample under them before): {stamps}\n{text}"
    for family in families:  # fastnsq's own histograms too
        if family.type == "histogram":
            bounds = [float(sample.labels["le"]) for sample in family.samples if sample.name.endswith("_bucket")]
            assert bounds == sorted(bounds) and (not bounds or bounds[-1] == float("inf")), family.name
    values = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
              for family in families for sample in family.samples}
    assert values[("demo_batch_size_count", ())] == 4 * 400
    assert values[("demo_batch_size_bucket", (("le", "50.0"),))] == 400  # of 100 (the body's size), 5, 70, 500
    assert values[("demo_handled_total", (("kind", "a"),))] == 400


async def test_group_metrics_pass_promtool_check_metrics(nsqd: Any, tmp_path: Path, cleanup: list[Worker]) -> None:
    """Prometheus's own parser and linter (promtool, Debian's package ``prometheus``) on the same text."""
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian's package 'prometheus', or Prometheus's release tarball)")
    pytest.importorskip("prometheus_client", reason="/metrics needs the 'metrics' extra")
    text = await _group_metrics_with_user_metrics(nsqd, tmp_path, cleanup)
    checker = await asyncio.create_subprocess_exec(promtool, "check", "metrics", stdin=asyncio.subprocess.PIPE,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    said, _ = await asyncio.wait_for(checker.communicate(text.encode()), 60)
    assert checker.returncode == 0, f"{said.decode()}\n{text}"
    assert "demo_batch_size_bucket" in text


async def test_sigterm_mid_run_drains_and_loses_nothing(nsqd: Any, tmp_path: Path, cleanup: list[Worker]) -> None:
    """SIGTERM twice while handlers run: the drain is not turned into a kill; exit 0 within the
    drain timeout; every message is handled or back in nsqd's queue, none in flight, none lost."""
    topic, total = unique("wk"), 400
    await publish_spread([nsqd.tcp_address], topic, total)
    worker = await start_worker(tmp_path, "wk_jobs:handle", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--max-in-flight", "10", "--drain-timeout", "5",
                                "--threads", "1", sleep=0.1)
    cleanup.append(worker)
    # One thread, 0.1 s a message, 5 in flight per process (held while the thread works): the
    # drain lasts about 0.5 s, and the second SIGTERM comes 0.1 s after the first, within it.
    await eventually(lambda: len(worker.lines("handled")) >= 20, 30, "some messages handled")
    async with Slack() as slack:
        began = time.monotonic()
        assert await worker.stop(signals=2, timeout=15) == 0
        took = time.monotonic() - began
    assert took < 5 + slack.allowance(2.0), (took, slack)  # within --drain-timeout (not turned into a kill)
    assert "already draining" in worker.log()
    handled = worker.lines("handled")
    assert len(handled) == len(set(handled)) < total
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["in_flight_count"] == 0
    assert stats["depth"] + stats["deferred_count"] + len(handled) == total, stats


async def test_sighup_is_logged_passed_to_hup_and_never_fatal(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """SIGHUP to the supervisor (logrotate's habit): logged, each child runs the handler's hup();
    a handler without one logs that it has none; the group goes on consuming, and drains with 0."""
    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 20)
    worker = await start_worker(tmp_path, "wk_jobs:Reopens", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2")
    cleanup.append(worker)
    await eventually(lambda: len(worker.lines("handled")) == 20, 30, "the first messages")
    worker.process.send_signal(signal.SIGHUP)
    await eventually(lambda: _alive(worker) and len(worker.lines("hup")) == 2, 10, "hup() in each process")
    assert "SIGHUP: passed to every worker" in worker.log()
    await publish_spread([nsqd.tcp_address], topic, 20)
    await eventually(lambda: len(worker.lines("handled")) == 40, 30, "messages after the SIGHUP")
    assert await worker.stop() == 0

    plain = tmp_path / "plain"
    plain.mkdir()
    worker = await start_worker(plain, "wk_jobs:handle", *_consume_args(topic, nsqd.tcp_address))
    cleanup.append(worker)
    await eventually(lambda: _is(worker, "/healthz", 200), 15, "/healthz 200")
    worker.process.send_signal(signal.SIGHUP)
    await eventually(lambda: _alive(worker) and "has no hup(); nothing to do" in worker.log(), 10, "the child's line")
    assert await worker.status() == 200
    assert await worker.stop() == 0


#: A supervisor whose group stops as soon as it runs (no child started), then a SIGTERM to
#: itself after run() returned and its event loop closed: the moment a second SIGTERM lands
#: when a drain ends quickly.
LATE_SIGNAL = """
import asyncio, os, signal, sys
from fastnsq.runner import Supervisor, WorkerSettings

async def main():
    supervisor = Supervisor(WorkerSettings(target="m:h", topic="t", channel="c"))
    async def no_child(slot):
        pass
    supervisor._start = no_child
    asyncio.get_running_loop().call_soon(supervisor.begin_stop)
    return await supervisor.run()

status = asyncio.run(main())
os.kill(os.getpid(), signal.SIGTERM)
print("alive after the late SIGTERM, status", status, flush=True)
sys.exit(status)
"""


async def test_a_signal_after_the_group_stopped_changes_nothing() -> None:
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", LATE_SIGNAL,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, (process.returncode, err.decode())
    assert b"alive after the late SIGTERM, status 0" in out


@pytest.mark.slow
async def test_a_killed_child_is_restarted_and_its_messages_come_back(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """SIGKILL one child: the supervisor says why and restarts it; what it held in flight comes
    back from nsqd after msg_timeout (2 s here) and is handled: every body at least once."""
    topic, total = unique("wk"), 300
    bodies = {b.decode() for b in await publish_spread([nsqd.tcp_address], topic, total)}
    worker = await start_worker(tmp_path, "wk_jobs:handle", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--max-in-flight", "10", "--consumer-opt", "msg_timeout=2s",
                                sleep=0.02)
    cleanup.append(worker)
    await eventually(lambda: len(worker.lines("handled")) >= 30, 30, "some messages handled")
    victim = (await worker.health())["workers"][0]["pid"]
    await worker.metric("nsq_consumer_messages_finished_total")  # a fresh report from each child...
    os.kill(victim, signal.SIGKILL)  # ...just before the kill: the victim's count is in the supervisor

    async def restarted() -> bool:
        first = (await worker.health())["workers"][0]
        return bool(first["alive"] and first["pid"] != victim and first["restarts"] == 1)

    await eventually(restarted, 20, "worker 0 restarted")
    await eventually(lambda: set(worker.lines("handled")) == bodies, 40, "every message handled")
    # Each message was finished once, by one process or another; the group's counter keeps the
    # dead child's part (its last report: all but the few it finished in the instant before the
    # kill), and counts nothing twice.
    async def group_finished() -> float:
        return await worker.metric("nsq_consumer_messages_finished_total")

    await eventually(lambda: _at_least(group_finished, total - 5), 10, "the group's finished count")
    assert await group_finished() <= total
    assert await worker.stop() == 0
    assert "was killed by SIGKILL; restarting it" in worker.log()


async def test_a_handler_that_always_raises_backs_off_without_crashing(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 20)
    worker = await start_worker(tmp_path, "wk_jobs:fail", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--consumer-opt", "default_requeue_delay=0",
                                "--consumer-opt", "hold_failed=false", "--backoff-grace", "1")
    cleanup.append(worker)
    pids = [w["pid"] for w in (await worker.health())["workers"]]

    async def backing_off() -> bool:
        return await worker.metric("nsq_consumer_backoff_level") >= 1

    await eventually(backing_off, 20, "the consumer's backoff")
    await asyncio.sleep(1.0)
    status = await worker.health()
    assert [w["pid"] for w in status["workers"]] == pids and all(w["restarts"] == 0 for w in status["workers"])
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["requeue_count"] >= 1
    # Still connected (healthy), but in backoff past --backoff-grace: not ready, and it says why.
    await eventually(lambda: _is(worker, "/readyz", 503), 20, "/readyz 503 while stuck in backoff")
    _, body = await worker.get("/readyz")
    assert "stuck in backoff" in body and await worker.status("/healthz") == 200
    assert await worker.stop() == 0


async def test_in_flight_is_what_the_processes_hold_and_rdy_bounds_nsqds_count(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """Handlers holding messages: /healthz's in_flight, /metrics' nsq_consumer_in_flight and
    nsqd's in_flight_count agree. A fast handler holds none whenever asked while nsqd counts
    the messages on their way, up to the RDY /healthz reports: in_flight <= nsqd's <= rdy."""
    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 200)
    worker = await start_worker(tmp_path, "wk_jobs:handle", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--max-in-flight", "10", "--threads", "2", sleep=0.3)
    cleanup.append(worker)
    figures: list[tuple[int, float, int]] = []

    async def all_three_agree() -> bool:
        workers = (await worker.health())["workers"]
        on_nsqd = sum(c["in_flight_count"] for c in await channel_stats([nsqd.http_address], topic, "work"))
        figures.append((sum(w.get("in_flight", 0) for w in workers), await worker.metric("nsq_consumer_in_flight"), on_nsqd))
        return figures[-1] == (10, 10, 10)

    await eventually(all_three_agree, 20, "in flight by the workers, their metric and nsqd")
    assert sum(w.get("rdy", 0) for w in (await worker.health())["workers"]) == 10
    _, text = await worker.get("/metrics")  # counters of events not seen yet: at 0, not absent
    assert re.search(r'^nsq_consumer_errors_total\{[^}]*code="E_FIN_FAILED"[^}]*\} 0\.0$', text, re.MULTILINE)
    assert await worker.stop(timeout=30) == 0

    fast = tmp_path / "fast"
    fast.mkdir()
    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 50_000)
    worker = await start_worker(fast, "wk_jobs:handle", *_consume_args(topic, nsqd.tcp_address),
                                "--processes", "2", "--max-in-flight", "100")
    cleanup.append(worker)
    samples: list[tuple[int, int, int]] = []
    while len(samples) < 10 and await worker.metric("nsq_consumer_messages_finished_total") < 45_000:
        workers = (await worker.health())["workers"]
        channels = await channel_stats([nsqd.http_address], topic, "work")
        if channels and len(channels[0]["clients"]) == 2 and sum(w.get("rdy", 0) for w in workers) == 100:
            samples.append((sum(w.get("in_flight", 0) for w in workers), channels[0]["in_flight_count"], 100))
        await asyncio.sleep(0.1)
    assert len(samples) >= 3, samples
    assert all(held <= on_nsqd <= rdy for held, on_nsqd, rdy in samples), samples
    assert any(held < on_nsqd for held, on_nsqd, _ in samples), samples
    assert await worker.stop() == 0


async def test_threads_have_their_own_setup_and_readiness_sees_a_handler_failing_every_message(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """sqlite3 opened in setup() and used from --threads fails every message (the connection
    belongs to the loop's thread): /readyz says so, with backoff off and the failed messages held
    and retried (hold_failed, the default), and with hold_failed=false. Opened in
    setup_thread(), in each handler thread, every message is stored once; teardown_thread()
    runs in each thread at the drain."""
    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 100)
    failing = tmp_path / "failing"
    failing.mkdir()
    worker = await start_worker(failing, "wk_jobs:RowsOnce", *_consume_args(topic, nsqd.tcp_address),
                                "--threads", "2", "--backoff-grace", "1", "--consumer-opt", "max_backoff_duration=0",
                                "--consumer-opt", "default_requeue_delay=0", "--consumer-opt", "max_attempts=0")
    cleanup.append(worker)
    await _until_not_ready_because(worker, "its failed messages, held and retried, still fail", 30)
    assert await worker.status("/healthz") == 200
    assert not worker.lines("handled")
    assert await worker.stop() == 0

    go_nsq = failing / "go-nsq"
    go_nsq.mkdir()
    worker = await start_worker(go_nsq, "wk_jobs:RowsOnce", *_consume_args(topic, nsqd.tcp_address),
                                "--threads", "2", "--backoff-grace", "1", "--consumer-opt", "max_backoff_duration=0",
                                "--consumer-opt", "default_requeue_delay=0", "--consumer-opt", "max_attempts=0",
                                "--consumer-opt", "hold_failed=false")
    cleanup.append(worker)
    await _until_not_ready_because(worker, "the handler failed every message", 30)
    assert await worker.stop() == 0

    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 100)
    worker = await start_worker(tmp_path, "wk_jobs:RowsPerThread", *_consume_args(topic, nsqd.tcp_address),
                                "--threads", "3", "--processes", "2", "--backoff-grace", "1")
    cleanup.append(worker)
    await eventually(lambda: len(worker.lines("handled")) == 100, 30, "every message stored")
    assert not worker.lines("errors")
    # Ready: each child's health comes every second, the first one before it connected.
    await eventually(lambda: _is(worker, "/readyz", 200), 10, "/readyz 200")
    assert await worker.stop() == 0
    import sqlite3

    stored: list[str] = []
    for path in tmp_path.glob("rows-*.db"):
        with contextlib.closing(sqlite3.connect(path)) as db:
            stored += [row[0] for row in db.execute("select body from rows")]
    assert len(stored) == len(set(stored)) == 100
    assert sorted(worker.lines("thread_setup")) == sorted(worker.lines("thread_teardown"))
    assert len(worker.lines("thread_setup")) == 6  # three threads in each of two processes


async def test_healthz_is_503_until_an_nsqd_is_reachable(tmp_path: Path, cleanup: list[Worker]) -> None:
    """No nsqd listening: /healthz and /readyz 503; once one starts on that port, 200."""
    port = free_port()
    worker = await start_worker(tmp_path, "wk_jobs:handle", *_consume_args(unique("wk"), f"127.0.0.1:{port}"),
                                "--consumer-opt", "max_reconnect_delay=0.5")
    cleanup.append(worker)
    await asyncio.sleep(1.0)
    assert await worker.status("/healthz") == 503 and await worker.status("/readyz") == 503
    async with NSQD(tcp_port=port):
        await eventually(lambda: _is(worker, "/healthz", 200), 15, "/healthz 200")
        assert await worker.status("/readyz") == 200
        assert await worker.stop() == 0


async def _until_not_ready_because(worker: Worker, reason: str, timeout: float) -> None:
    """Wait for /readyz to be 503 for ``reason``; the last answer is in the failure."""
    last: list[tuple[int, str]] = []

    async def not_ready() -> bool:
        last[:] = [await worker.get("/readyz")]
        return last[0][0] == 503 and reason in last[0][1]

    try:
        await eventually(not_ready, timeout, f"/readyz 503: {reason}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last /readyz: {last}") from None


def _alive(worker: Worker) -> bool:
    """True while the supervisor runs; its exit fails the test at once, with its log."""
    if worker.process.returncode is not None:
        raise AssertionError(f"the supervisor exited ({worker.process.returncode}):\n{worker.log()}")
    return True


async def _at_least(read: Any, low: float) -> bool:
    return bool(await read() >= low)


async def _is(worker: Worker, path: str, status: int) -> bool:
    return await worker.status(path) == status


async def test_split_nsqd_gives_each_nsqd_to_one_process(
    nsq_cluster: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """--split-nsqd over 3 nsqd and 2 processes: each nsqd has exactly one connection from the
    group, both processes have some, and every message is handled once."""
    topic, total = unique("wk"), 900
    await publish_spread(nsq_cluster.tcp_addresses, topic, total)
    args = ["--topic", topic, "--channel", "work", "--processes", "2", "--split-nsqd",
            "--consumer-opt", "lookupd_poll_interval=0.5"]
    for address in nsq_cluster.lookupd_http_addresses:
        args += ["--lookupd-http-address", address]
    worker = await start_worker(tmp_path, "wk_jobs:handle", *args)
    cleanup.append(worker)

    async def finished() -> bool:
        return await worker.metric("nsq_consumer_messages_finished_total") == total

    await eventually(finished, 60, "every message finished")
    channels: list[dict[str, Any]] = []

    async def one_connection_each() -> bool:
        # A move (an idle process takes an nsqd of a busy one) leaves an nsqd without a
        # connection for a moment, never with two (tests/test_worker_moves.py polls for that).
        channels[:] = await channel_stats(nsq_cluster.http_addresses, topic, "work")
        assert all(len(c["clients"]) <= 1 for c in channels), channels
        return [len(c["clients"]) for c in channels] == [1, 1, 1]

    await eventually(one_connection_each, 10, "one connection from the group on each nsqd")
    agents = sorted(c["clients"][0]["user_agent"].split()[-1] for c in channels)
    assert set(agents) == {"worker=0", "worker=1"}
    assert sum(c["message_count"] for c in channels) == total
    assert await worker.stop() == 0
    handled = worker.lines("handled")
    assert len(handled) == len(set(handled)) == total


async def test_batches_and_threads(nsqd: Any, tmp_path: Path, cleanup: list[Worker]) -> None:
    """--batch hands the handler batches of at most max_size; --threads runs a blocking handler
    in worker threads."""
    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 500)
    worker = await start_worker(tmp_path, "wk_jobs:batch", *_consume_args(topic, nsqd.tcp_address),
                                "--batch", "50,0.1", "--max-in-flight", "200")
    cleanup.append(worker)
    await eventually(lambda: len(worker.lines("handled")) == 500, 30, "every message in a batch")
    assert await worker.stop() == 0
    sizes = [int(n) for n in worker.lines("batches")]
    assert sum(sizes) == 500 and max(sizes) <= 50
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["depth"] == stats["in_flight_count"] == 0

    topic = unique("wk")
    await publish_spread([nsqd.tcp_address], topic, 50)
    threaded = tmp_path / "threaded"
    threaded.mkdir()
    worker = await start_worker(threaded, "wk_jobs:threaded", *_consume_args(topic, nsqd.tcp_address),
                                "--threads", "3")
    cleanup.append(worker)
    await eventually(lambda: len(worker.lines("handled")) == 50, 30, "every message in a thread")
    assert await worker.stop() == 0
    assert all(name.startswith("fastnsq-worker") for name in worker.lines("threads"))


async def test_async_batches_run_concurrency_at_once_with_room_in_flight(
    nsqd: Any, tmp_path: Path, cleanup: list[Worker]
) -> None:
    """An async batch handler ran one batch at a time per process (issue 59: a handler sleeping
    1 s took 10 s for 10 batches): --concurrency N runs N at once (default 4), and without
    --max-in-flight each process holds N+1 batches, so they come full."""
    for concurrency, expected in ((None, 4), ("2", 2)):
        topic, folder = unique("wk"), tmp_path / f"c{concurrency}"
        folder.mkdir()
        await publish_spread([nsqd.tcp_address], topic, 200)
        extra = ["--concurrency", concurrency] if concurrency else []
        worker = await start_worker(folder, "wk_jobs:slow_batch", *_consume_args(topic, nsqd.tcp_address),
                                    "--batch", "20,5", *extra, sleep=0.5)
        cleanup.append(worker)
        await eventually(lambda w=worker: len(w.lines("handled")) == 200, 60, "every message in a batch")
        assert await worker.stop() == 0
        assert max(int(n) for n in worker.lines("running")) == expected
        assert sorted(set(worker.lines("batches"))) == ["20"]  # room for every batch at once, and one filling
        assert "holds fewer than" not in worker.log()
    # A max in flight that cannot hold them is said in one line.
    topic = unique("wk")
    worker = await start_worker(tmp_path, "wk_jobs:slow_batch", *_consume_args(topic, nsqd.tcp_address),
                                "--batch", "20,5", "--max-in-flight", "50")
    cleanup.append(worker)
    assert await worker.stop() == 0
    [line] = [line for line in worker.log().splitlines() if "holds fewer than" in line]
    assert "max_in_flight 50 (50 per process) holds fewer than 4 batches of 20" in line
    assert "give --max-in-flight 100" in line


def test_the_default_max_in_flight_holds_the_batches_at_once() -> None:
    settings = merge({"target": "m:f", "topic": "t", "channel": "c", "batch": (400, 0.25), "processes": 2}, {}, {})
    assert (settings.concurrency, settings.max_in_flight) == (4, 2 * 5 * 400)
    settings = merge({"target": "m:f", "topic": "t", "channel": "c", "batch": (10, 0.25), "concurrency": 1}, {}, {})
    assert settings.max_in_flight == 100  # never below the default without --batch
    assert merge({"target": "m:f", "topic": "t", "channel": "c"}, {"FASTNSQ_WORKER_CONCURRENCY": "8"},
                 {}).concurrency == 8
    with pytest.raises(SettingsError, match="--concurrency 0: must be at least 1"):
        merge({"target": "m:f", "topic": "t", "channel": "c", "concurrency": 0}, {}, {})


def test_a_share_above_nsqds_rdy_cap_gets_more_connections_per_nsqd() -> None:
    """nsqd caps each connection's RDY at --max-rdy-count (2,500 by default): batches of 1,000 at 4
    at once need 5,000 in flight per process, so 2 connections to each nsqd (3 for 5,001)."""
    base = {"target": "m:f", "topic": "t", "channel": "c"}
    settings = merge({**base, "batch": (1000, 0.25)}, {}, {})
    assert (settings.max_in_flight, settings.consumer_options["connections_per_nsqd"]) == (5000, 2)
    assert merge({**base, "max_in_flight": 5001}, {}, {}).consumer_options["connections_per_nsqd"] == 3
    assert "connections_per_nsqd" not in merge({**base, "batch": (400, 0.25)}, {}, {}).consumer_options
    halves = merge({**base, "batch": (1000, 0.25), "processes": 2, "max_in_flight": 5000}, {}, {})
    assert "connections_per_nsqd" not in halves.consumer_options  # 2,500 per process
    given = merge({**base, "batch": (1000, 0.25)}, {"FASTNSQ_CONSUMER_CONNECTIONS_PER_NSQD": "1"}, {})
    assert given.consumer_options["connections_per_nsqd"] == 1  # the user's choice stands
    assert merge({**base, "max_in_flight": 10**6}, {}, {}).consumer_options["connections_per_nsqd"] == 64
    split = merge({**base, "batch": (1000, 0.25), "split_nsqd": True}, {}, {})
    assert "connections_per_nsqd" not in split.consumer_options  # --split-nsqd: one connection per nsqd


@pytest.mark.slow
async def test_a_crash_loop_ends_the_group_with_status_3(tmp_path: Path) -> None:
    (tmp_path / "wk_jobs.py").write_text(HANDLERS)
    env = {**os.environ, "WK_OUT": str(tmp_path)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fastnsq", "worker", "wk_jobs:Broken", "--topic", "t", "--channel", "c",
        "--nsqd-tcp-address", "127.0.0.1:1", "--max-restarts", "2", cwd=tmp_path, env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 30)
    text = err.decode()
    assert process.returncode == 3, text
    assert "ValueError: database unreachable" in text and "giving up (exit status 3)" in text


async def test_split_nsqd_rebalances_as_nsqd_come_and_go(tmp_path: Path, cleanup: list[Worker]) -> None:
    """Embedded lookupd and nsqd started and stopped by the test: a second nsqd goes to the idle
    process (one connection each), and when it leaves, the assignment drops it."""
    from fastnsq.testing import NSQLookupd

    topic = unique("wk")
    async with NSQLookupd() as lookupd, NSQD(lookupd_tcp_addresses=[lookupd.tcp_address]) as first:
        await publish_spread([first.tcp_address], topic, 50)
        worker = await start_worker(tmp_path, "wk_jobs:handle", "--topic", topic, "--channel", "work",
                                    "--processes", "2", "--split-nsqd", "--lookupd-http-address",
                                    lookupd.http_address, "--consumer-opt", "lookupd_poll_interval=0.3")
        cleanup.append(worker)

        async def assigned() -> list[list[str]]:
            return [w["assigned"] for w in (await worker.health())["workers"]]

        async def assignment_is(expected: list[list[str]]) -> bool:
            return sorted(await assigned()) == sorted(expected)

        await eventually(lambda: assignment_is([[first.tcp_address], []]), 15, "the first nsqd assigned")
        async with NSQD(lookupd_tcp_addresses=[lookupd.tcp_address]) as second:
            await publish_spread([second.tcp_address], topic, 50)
            await eventually(lambda: assignment_is([[first.tcp_address], [second.tcp_address]]), 15,
                             "the second nsqd given to the idle process")
            await eventually(lambda: len(worker.lines("handled")) == 100, 15, "both nsqd's messages")
            channels = await channel_stats([first.http_address, second.http_address], topic, "work")
            assert [len(c["clients"]) for c in channels] == [1, 1]
        await eventually(lambda: assignment_is([[first.tcp_address], []]), 15, "the second nsqd dropped")
        assert await worker.stop() == 0


def test_a_config_file_is_read_and_an_unknown_key_named(tmp_path: Path) -> None:
    from fastnsq.runner.settings import read_config_file

    good = tmp_path / "worker.toml"
    good.write_text('target = "m:f"\ntopic = "t"\nchannel = "c"\nprocesses = "auto"\nbatch = [10, 0.5]\n'
                    'lookupd_http_addresses = ["127.0.0.1:4161"]\n[consumer]\nmsg_timeout = "2m"\nsnappy = true\n')
    settings = merge({}, {}, read_config_file(str(good)))
    assert settings.processes >= 1 and settings.batch == (10, 0.5)
    assert settings.lookupd_http_addresses == ["127.0.0.1:4161"] and settings.nsqd_tcp_addresses == []
    assert settings.consumer_options == {"msg_timeout": 120.0, "snappy": True}
    bad = tmp_path / "bad.toml"
    bad.write_text('topik = "t"\n')
    with pytest.raises(SettingsError, match=r"bad.toml: unknown setting\(s\) topik"):
        read_config_file(str(bad))
