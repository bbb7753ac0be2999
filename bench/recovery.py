"""Back within a second (issue 45): seconds from nsqd answering again to each client's first success.

    python bench/recovery.py --real ~/nsq-real/bin --outages 3,15,45,300   # real nsqd + nsqlookupd
    python bench/recovery.py --outages 3,15                                 # the embedded servers
    python bench/recovery.py --real ~/nsq-real/bin --rates                  # attempts a second while down
    python bench/recovery.py --real ~/nsq-real/bin --down-at-start 5,90     # every face started while nsqd is down
    python bench/recovery.py --real ~/nsq-real/bin --rolling                # 3 nsqd restarted in turn
    python bench/recovery.py --ha ~/nsq-real/ha/bin                         # an HA partition leader killed

**Table** (the default): one nsqlookupd and one nsqd registered with it (``--lookupd-tcp-address``,
a data path kept across restarts); a message is published every 20 ms through nsqd's HTTP
``/pub``, and every face runs at once, with its defaults:

* consumers, each on a channel of its own: fastnsq's ``Consumer`` and ``fastnsq.sync.Consumer``
  through lookupd and direct, ``fastnsq worker`` (1 process, lookupd), ``fastnsq worker
  --split-nsqd`` (2 processes), ``fastnsq to-file`` (``--sync-interval 0.1s``: it FINs after
  each fsync) and ``fastnsq to-nsq`` (to a topic of the same nsqd), go-nsq v1.1.0's Consumer
  through lookupd and direct (``recovery_bench``, bench/go/src/gonsq_recovery);
* producers, each publishing every 50 ms to a topic of its own: fastnsq's ``Producer`` (started
  before the outage) and ``fastnsq.sync.Producer``, go-nsq's Producer (``Publish``).

For each outage of D seconds: SIGTERM, D seconds down, started again on the same ports and data;
the clock starts at the first ``/ping`` nsqd answers (polled every 10 ms) and stops, for each
face, at its first success: for a consumer, the first FIN nsqd counts for its channel (its
``/stats`` polled every 25 ms: nsqd's counters start at 0 at each start); for a producer, its
first acknowledged publish. A publish that fails later than 1 s after nsqd answered is listed
with its error (none may: "no publish fails with an old cause").

**Down at start** (``--down-at-start D,...``): the same faces, each started while nsqd is down
(its topic created before, so nsqd registers it with lookupd again as it starts), nsqd started D
seconds later; the same clock. A face that exits meanwhile is marked so (go-nsq's direct
consumer: ``ConnectToNSQD`` refuses to start without its nsqd).

**Rates** (``--rates``): the same faces, one outage of ``--rates-outage`` seconds during which a
counting listener holds nsqd's TCP port (it reads each connection's IDENTIFY for the client's
``client_id``, then closes it) and each face that uses lookupd asks it through a counting proxy
of its own: the most connection attempts and lookupd queries each face made within any one
second while nsqd was down.

**Rolling** (``--rolling``): three nsqd behind one nsqlookupd, a fastnsq Producer per nsqd
publishing every 10 ms (each body names its nsqd), ``fastnsq worker --split-nsqd --processes 3``
recording what it handles; each nsqd in turn is down for ``--rolling-down`` s. Reports what
was lost (acknowledged, never handled) and, per restart, how long after the nsqd answered its
messages were handled again, and the longest pause of the other nsqd's streams meanwhile.

**HA** (``--ha BIN``): a youzan cluster (etcd, nsqlookupd, three nsqd; fastnsq.testing.real's
RealHACluster), a topic of 2 partitions with 3 replicas; a Producer through lookupd publishes
every 10 ms to partition 0 and every 10 ms to either, a Consumer through lookupd reads (both with
their defaults). The leader of partition 0 is SIGKILLed; lookupd's write lookup is polled every
25 ms for the new leader. Reports the seconds from lookupd listing it to the producer's first
publish acknowledged on partition 0 and to the consumer's connection to it (and its first
message from it), and what was lost (acknowledged, never consumed). The killed node starts
again after ``--ha-restart-after`` s and rejoins as a replica.

Writes bench/results/recovery-<mode>-<server>-<date>.json and .md and prints the table. The
machine's load moves these numbers by tens of ms; the go-nsq columns come from the same runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

TOPIC = "recovery"
#: How long a face may take to work again before the bench writes it down as "> this".
GIVE_UP = 90.0
CONSUMERS = ("async_lookupd", "async_direct", "sync_lookupd", "sync_direct", "worker", "worker_split",
             "to_file", "to_nsq", "go_lookupd", "go_direct")
PRODUCERS = ("async_producer", "sync_producer", "go_producer")
LABELS = {
    "async_lookupd": "`Consumer(lookupd_http_addresses=...)`",
    "async_direct": "`Consumer(nsqd_tcp_addresses=...)`",
    "sync_lookupd": "`fastnsq.sync.Consumer`, lookupd",
    "sync_direct": "`fastnsq.sync.Consumer`, direct",
    "worker": "`fastnsq worker` (lookupd)",
    "worker_split": "`fastnsq worker --split-nsqd` (2 processes)",
    "to_file": "`fastnsq to-file`",
    "to_nsq": "`fastnsq to-nsq`",
    "go_lookupd": "go-nsq Consumer, lookupd",
    "go_direct": "go-nsq Consumer, direct",
    "async_producer": "`Producer` (async, started before the outage)",
    "sync_producer": "`fastnsq.sync.Producer`",
    "go_producer": "go-nsq Producer",
}


# ---- the worker's handler (``fastnsq worker recovery:Record``) ----------------------------------


class Record:
    """Handled messages, one line each (``body<TAB>monotonic ns``) in ``$BENCH_OUT/handled-<pid>``;
    without BENCH_OUT it only handles."""

    def setup(self) -> None:
        folder = os.environ.get("BENCH_OUT")
        self.out = open(Path(folder) / f"handled-{os.getpid()}", "a", buffering=1) if folder else None  # noqa: SIM115

    def handle(self, message: Any) -> None:
        if self.out is not None:
            self.out.write(f"{message.body.decode()}\t{time.monotonic_ns()}\n")

    def teardown(self) -> None:
        if self.out is not None:
            self.out.close()


# ---- the servers ---------------------------------------------------------------------------------


class Servers:
    """nsqlookupd (a real process, or fastnsq's embedded one in this process) and ``count`` nsqd."""

    def __init__(self, real: Path | None, count: int) -> None:
        self.real = real
        self.count = count
        self.lookupd: Any = None
        self.nsqd: list[Any] = []

    async def start(self) -> None:
        from fastnsq.testing.process import NSQDProcess, NSQLookupdProcess

        if self.real is not None:
            self.lookupd = NSQLookupdProcess(self.real / "nsqlookupd")
            await asyncio.to_thread(self.lookupd.start)
            lookupd_tcp = self.lookupd.tcp_address
        else:
            from fastnsq.testing import NSQLookupd

            self.lookupd = NSQLookupd()
            await self.lookupd.start()
            lookupd_tcp = self.lookupd.tcp_address
        binary = None if self.real is None else self.real / "nsqd"
        for _ in range(self.count):
            nsqd = NSQDProcess(binary=binary, lookupd_tcp_addresses=[lookupd_tcp])
            await asyncio.to_thread(nsqd.start)
            self.nsqd.append(nsqd)

    @property
    def lookupd_http(self) -> str:
        return str(self.lookupd.http_address)

    def describe(self) -> str:
        return f"real nsqd and nsqlookupd ({self.real})" if self.real else "fastnsq's embedded nsqd and nsqlookupd"

    async def close(self) -> None:
        for nsqd in self.nsqd:
            await asyncio.to_thread(nsqd.close)
        if self.lookupd is not None:
            await (asyncio.to_thread(self.lookupd.close) if self.real else self.lookupd.stop())


async def restart(nsqd: Any, down: float, session: Any, during: Any = None) -> tuple[float, float]:
    """SIGTERM ``nsqd``, keep it down ``down`` s (running ``during`` meanwhile, an async context
    manager), start it on the same ports and data; returns (stopped at, first /ping answered at)."""
    await asyncio.to_thread(nsqd.stop)
    stopped = time.monotonic()
    async with during if during is not None else contextlib.nullcontext():
        await asyncio.sleep(max(0.0, stopped + down - time.monotonic()))
    starting = asyncio.create_task(asyncio.to_thread(nsqd.start))
    while True:  # nsqd.start polls /ping every 50 ms; this clock wants 10
        with contextlib.suppress(Exception):
            async with session.get(f"http://{nsqd.http_address}/ping", timeout=0.5) as resp:
                if resp.status == 200:
                    back = time.monotonic()
                    break
        if starting.done():
            starting.result()  # raises if nsqd did not start
        await asyncio.sleep(0.01)
    await starting
    return stopped, back


async def finishes(session: Any, http_address: str, topic: str) -> dict[str, int]:
    """FINs nsqd counted per channel of ``topic`` since it started (its clients' finish counts)."""
    async with session.get(f"http://{http_address}/stats", params={"format": "json", "topic": topic},
                           timeout=2) as resp:
        data = await resp.json(content_type=None)
    counts: dict[str, int] = {}
    for found in data.get("topics") or []:
        if found["topic_name"] == topic:
            for channel in found["channels"]:
                counts[channel["channel_name"]] = sum(c.get("finish_count", 0) for c in channel.get("clients") or [])
    return counts


# ---- the faces -------------------------------------------------------------------------------------


@dataclass
class Publishes:
    """What one producer face saw: (monotonic time of the answer, error or None)."""

    outcomes: list[tuple[float, str | None]] = field(default_factory=list)

    def first_success(self, since: float) -> float | None:
        return next((t for t, error in self.outcomes if error is None and t >= since), None)

    def failures(self, since: float) -> list[tuple[float, str]]:
        return [(t, error) for t, error in self.outcomes if error is not None and t >= since]


class Faces:
    """Every face of the table, started and stopped together."""

    def __init__(self, servers: Servers, args: argparse.Namespace, lookupd_for: dict[str, str] | None = None) -> None:
        self.servers = servers
        self.args = args
        self.nsqd = servers.nsqd[0]
        self.lookupd_for = lookupd_for or {}  # face -> lookupd address (a counting proxy, --rates)
        self.publishes = {name: Publishes() for name in PRODUCERS}
        self.out = Path(tempfile.mkdtemp(prefix="fastnsq-recovery-"))
        self._stop = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._threads: list[threading.Thread] = []
        self._processes: list[asyncio.subprocess.Process] = []
        self.process_names: list[str] = []  # the face of each process, in order
        self._closers: list[Any] = []

    def lookupd(self, face: str) -> str:
        return self.lookupd_for.get(face, self.servers.lookupd_http)

    async def start(self, go_binary: Path | None) -> None:
        import fastnsq
        import fastnsq.sync

        tcp = self.nsqd.tcp_address
        noop = lambda message: None  # returning finishes it
        for face, where in (("async_lookupd", {"lookupd_http_addresses": [self.lookupd("async_lookupd")]}),
                            ("async_direct", {"nsqd_tcp_addresses": [tcp]})):
            consumer = fastnsq.Consumer(TOPIC, face, handler=noop, max_in_flight=10, client_id=face, **where)
            await consumer.start()
            self._closers.append(consumer.stop)
        for face, where in (("sync_lookupd", {"lookupd_http_addresses": [self.lookupd("sync_lookupd")]}),
                            ("sync_direct", {"nsqd_tcp_addresses": [tcp]})):
            blocking = fastnsq.sync.Consumer(TOPIC, face, handler=noop, workers=2, client_id=face, **where)
            await asyncio.to_thread(blocking.start)
            self._closers.append(lambda c=blocking: asyncio.to_thread(c.stop))
        producer = fastnsq.Producer([tcp], client_id="async_producer")
        await producer.start()
        self._closers.append(producer.close)
        self._tasks.append(asyncio.create_task(self._publish_async(producer)))
        blocking_producer = fastnsq.sync.Producer([tcp], client_id="sync_producer")
        thread = threading.Thread(target=self._publish_blocking, args=(blocking_producer,), daemon=True)
        thread.start()
        self._threads.append(thread)
        self._closers.append(lambda: asyncio.to_thread(blocking_producer.close))
        await self._start_processes(go_binary)

    async def _start_processes(self, go_binary: Path | None) -> None:
        from fastnsq.testing.process import free_port

        tcp = self.nsqd.tcp_address
        fastnsq_cmd = [sys.executable, "-m", "fastnsq"]
        common = ["--log-level", "WARNING"]
        commands: dict[str, list[str]] = {
            "worker": [*fastnsq_cmd, "worker", "recovery:Record", "--topic", TOPIC, "--channel", "worker",
                       "--lookupd-http-address", self.lookupd("worker"), "--metrics-port", str(free_port()),
                       "--consumer-opt", "client_id=worker", *common],
            "worker_split": [*fastnsq_cmd, "worker", "recovery:Record", "--topic", TOPIC, "--channel", "worker_split",
                             "--processes", "2", "--split-nsqd", "--lookupd-http-address",
                             self.lookupd("worker_split"), "--metrics-port", str(free_port()),
                             "--consumer-opt", "client_id=worker_split", *common],
            "to_file": [*fastnsq_cmd, "to-file", "--topic", TOPIC, "--channel", "to_file", "--lookupd-http-address",
                        self.lookupd("to_file"), "--output-dir", str(self.out / "files"), "--sync-interval", "0.1s",
                        "--metrics-port", str(free_port()), "--consumer-opt", "client_id,to_file",
                        "--log-level", "warn"],
            "to_nsq": [*fastnsq_cmd, "to-nsq", "--topic", TOPIC, "--channel", "to_nsq", "--lookupd-http-address",
                       self.lookupd("to_nsq"), "--destination-nsqd-tcp-address", tcp, "--destination-topic",
                       "recovery_out", "--metrics-port", str(free_port()), "--consumer-opt", "client_id,to_nsq",
                       "--producer-opt", "client_id,to_nsq_out", "--log-level", "warn"],
        }
        if go_binary is not None:
            commands["go_lookupd"] = [str(go_binary), "-mode", "sub", "-topic", TOPIC, "-channel", "go_lookupd",
                                      "-lookupd-http-address", self.lookupd("go_lookupd"), "-client-id", "go_lookupd"]
            commands["go_direct"] = [str(go_binary), "-mode", "sub", "-topic", TOPIC, "-channel", "go_direct",
                                     "-nsqd-tcp-address", tcp, "-client-id", "go_direct"]
            commands["go_producer"] = [str(go_binary), "-mode", "pub", "-topic", "recovery_pub_go_producer",
                                       "-nsqd-tcp-address", tcp, "-client-id", "go_producer"]
        (self.out / "files").mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for face, command in commands.items():
            self.process_names.append(face)
            log = _log_file(self.out / f"{face}.log")
            stdout = asyncio.subprocess.PIPE if face == "go_producer" else log
            process = await asyncio.create_subprocess_exec(*command, cwd=HERE, env=env, stdout=stdout, stderr=log,
                                                           start_new_session=True)
            self._processes.append(process)
            if face == "go_producer":
                self._tasks.append(asyncio.create_task(self._read_go_publishes(process)))

    @property
    def processes(self) -> list[asyncio.subprocess.Process]:
        return self._processes

    async def _publish_async(self, producer: Any) -> None:
        record = self.publishes["async_producer"].outcomes
        number = 0
        while not self._stop.is_set():
            number += 1
            try:
                await producer.publish("recovery_pub_async_producer", b"%d" % number)
                record.append((time.monotonic(), None))
            except Exception as exc:  # noqa: BLE001 - what the face saw is the measure
                record.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
            await asyncio.sleep(0.05)

    def _publish_blocking(self, producer: Any) -> None:
        record = self.publishes["sync_producer"].outcomes
        number = 0
        while not self._stop.is_set():
            number += 1
            try:
                producer.publish("recovery_pub_sync_producer", b"%d" % number)
                record.append((time.monotonic(), None))
            except Exception as exc:  # noqa: BLE001 - what the face saw is the measure
                record.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
            time.sleep(0.05)

    async def _read_go_publishes(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        record = self.publishes["go_producer"].outcomes
        async for line in process.stdout:
            with contextlib.suppress(ValueError):
                outcome = json.loads(line)
                record.append((outcome["t"] / 1e9, None if outcome["ok"] else outcome.get("err", "error")))

    async def close(self) -> None:
        self._stop.set()
        for process in self._processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                await asyncio.wait_for(process.wait(), 40)
            except asyncio.TimeoutError:
                process.kill()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for thread in self._threads:
            thread.join(5)
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                await close()


def _log_file(path: Path) -> Any:
    """A child's output file (the child keeps it open; ours goes with the bench)."""
    return path.open("ab")


# ---- table mode --------------------------------------------------------------------------------------


async def first_successes(faces: Faces, session: Any, since: float, deadline: float,
                          wanted: tuple[str, ...]) -> dict[str, float | None]:
    """Seconds from ``since`` to each face's first success, None for those without one by ``deadline``."""
    found: dict[str, float | None] = {}
    while time.monotonic() < deadline and len(found) < len(wanted):
        with contextlib.suppress(Exception):
            counts = await finishes(session, faces.nsqd.http_address, TOPIC)
            now = time.monotonic()
            for face in wanted:
                if face in CONSUMERS and face not in found and counts.get(face, 0) > 0:
                    found[face] = now - since
        for face in wanted:
            if face in PRODUCERS and face not in found:
                at = faces.publishes[face].first_success(since)
                if at is not None:
                    found[face] = max(0.0, at - since)
        await asyncio.sleep(0.025)
    return {face: found.get(face) for face in wanted}


async def table(args: argparse.Namespace, go_binary: Path | None) -> dict[str, Any]:
    import aiohttp

    servers = Servers(args.real, 1)
    await servers.start()
    faces = Faces(servers, args)
    wanted = tuple(f for f in (*CONSUMERS, *PRODUCERS) if go_binary is not None or not f.startswith("go_"))
    rows: list[dict[str, Any]] = []
    try:
        await faces.start(go_binary)
        async with aiohttp.ClientSession() as session:
            feeder = asyncio.create_task(feed(session, faces.nsqd.http_address))
            try:
                warm = await first_successes(faces, session, time.monotonic() - 3600, time.monotonic() + 60, wanted)
                missing = [face for face, took in warm.items() if took is None]
                if missing:
                    raise SystemExit(f"not working before the first outage: {missing}; logs in {faces.out}")
                for down in args.outages:
                    stopped, back = await restart(faces.nsqd, down, session)
                    took = await first_successes(faces, session, back, back + max(GIVE_UP, down), wanted)
                    late = {face: [(round(t - back, 3), e) for t, e in faces.publishes[face].failures(back + 1.0)]
                            for face in PRODUCERS if face in wanted}
                    row = {"outage_s": down, "down_for_s": round(back - stopped, 3),
                           "seconds_to_first_success": {f: None if t is None else round(t, 3) for f, t in took.items()},
                           "publishes_failed_later_than_1s": late}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    await asyncio.sleep(args.settle)
            finally:
                feeder.cancel()
    finally:
        await faces.close()
        await servers.close()
    return {"rows": rows, "faces": wanted, "servers": servers.describe()}


async def down_at_start(args: argparse.Namespace, go_binary: Path | None) -> dict[str, Any]:
    """Every face started while its nsqd is down (the topic known from before: nsqd registers it
    again as it starts), nsqd started D s later; seconds from its first /ping to each face's first
    success. A face that exits meanwhile (go-nsq's ConnectToNSQD refuses to start) has none."""
    import aiohttp

    servers = Servers(args.real, 1)
    await servers.start()
    nsqd = servers.nsqd[0]
    wanted = tuple(f for f in (*CONSUMERS, *PRODUCERS) if go_binary is not None or not f.startswith("go_"))
    rows: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{nsqd.http_address}/topic/create", params={"topic": TOPIC}) as resp:
                resp.raise_for_status()
            for down in args.down_at_start:
                await asyncio.to_thread(nsqd.stop)
                faces = Faces(servers, args)
                try:
                    await faces.start(go_binary)
                    _, back = await restart(nsqd, down, session, during=None)
                    feeder = asyncio.create_task(feed(session, nsqd.http_address))
                    try:
                        took = await first_successes(faces, session, back, back + max(GIVE_UP, down), wanted)
                    finally:
                        feeder.cancel()
                    exited = [face for face, process in zip(faces.process_names, faces.processes, strict=True)
                              if process.returncode is not None]
                finally:
                    await faces.close()
                row = {"down_at_start_s": down, "seconds_to_first_success":
                       {f: None if t is None else round(t, 3) for f, t in took.items()}, "exited_while_down": exited}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        await servers.close()
    return {"rows": rows, "faces": wanted, "servers": servers.describe()}


def down_at_start_markdown(result: dict[str, Any]) -> str:
    downs = [row["down_at_start_s"] for row in result["rows"]]
    lines = [("Seconds from nsqd's first /ping to each face's first success, every face started while nsqd "
              "was down (its topic known from before), nsqd started D s later."), "",
             "| face | " + " | ".join(f"D = {d:g} s" for d in downs) + " |", "|---|" + "---:|" * len(downs)]
    for face in result["faces"]:
        cells = []
        for row in result["rows"]:
            took = row["seconds_to_first_success"][face]
            cells.append("exited" if face in row["exited_while_down"] else "none" if took is None else f"{took:.2f}")
        lines.append(f"| {face} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


async def feed(session: Any, http_address: str) -> None:
    """A message every 20 ms through nsqd's HTTP /pub (failures ignored: nsqd may be down)."""
    number = 0
    while True:
        number += 1
        with contextlib.suppress(Exception):
            async with session.post(f"http://{http_address}/pub", params={"topic": TOPIC}, data=b"%d" % number,
                                    timeout=1) as resp:
                await resp.read()
        await asyncio.sleep(0.02)


def table_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = ["| face | " + " | ".join(f"D = {r['outage_s']:g} s" for r in rows) + " |",
             "|---|" + "---:|" * len(rows)]
    for face in result["faces"]:
        cells = []
        for row in rows:
            took = row["seconds_to_first_success"][face]
            cells.append(f"> {max(GIVE_UP, row['outage_s']):g}" if took is None else f"{took:.2f}")
        lines.append(f"| {LABELS[face]} | " + " | ".join(cells) + " |")
    late = sum(len(v) for row in rows for v in row["publishes_failed_later_than_1s"].values())
    lines += ["", f"Publishes that failed later than 1 s after nsqd answered: {late}."]
    return "\n".join(lines) + "\n"


# ---- rates mode ------------------------------------------------------------------------------------


async def rates(args: argparse.Namespace, go_binary: Path | None) -> dict[str, Any]:
    import aiohttp

    from fastnsq.testing.counting import AttemptCounter, QueryCounter, most_in_a_second

    servers = Servers(args.real, 1)
    await servers.start()
    lookupd_faces = ("async_lookupd", "sync_lookupd", "worker", "worker_split", "to_file", "to_nsq", "go_lookupd")
    proxies = {face: QueryCounter(servers.lookupd_http) for face in lookupd_faces}
    for proxy in proxies.values():
        await proxy.start()
    faces = Faces(servers, args, {face: proxy.address for face, proxy in proxies.items()})
    wanted = tuple(f for f in (*CONSUMERS, *PRODUCERS) if go_binary is not None or not f.startswith("go_"))
    try:
        await faces.start(go_binary)
        async with aiohttp.ClientSession() as session:
            feeder = asyncio.create_task(feed(session, faces.nsqd.http_address))
            try:
                await first_successes(faces, session, time.monotonic() - 3600, time.monotonic() + 60, wanted)
                listener = AttemptCounter(faces.nsqd.tcp_address)
                stopped, back = await restart(faces.nsqd, args.rates_outage, session, during=listener)
                took = await first_successes(faces, session, back, back + GIVE_UP, wanted)
            finally:
                feeder.cancel()
    finally:
        await faces.close()
        await servers.close()
        for proxy in proxies.values():
            await proxy.close()
    window = (stopped, back)
    attempts = {face: most_in_a_second(listener.times(face), *window) for face in (*wanted, "to_nsq_out")}
    queries = {face: most_in_a_second(proxy.requests, *window) for face, proxy in proxies.items()}
    totals = Counter(client for client, at in listener.attempts if window[0] <= at < window[1])
    return {"outage_s": args.rates_outage, "window_s": round(window[1] - window[0], 3),
            "most_attempts_in_a_second": attempts, "most_lookupd_queries_in_a_second": queries,
            "attempts_in_window": dict(totals), "seconds_to_first_success": took, "servers": servers.describe()}


def rates_markdown(result: dict[str, Any]) -> str:
    lines = ["| face | connection attempts / s (most) | lookupd queries / s (most) |", "|---|---:|---:|"]
    for face, attempts in result["most_attempts_in_a_second"].items():
        queries = result["most_lookupd_queries_in_a_second"].get(face)
        lines.append(f"| {LABELS.get(face, face)} | {attempts} | {'–' if queries is None else queries} |")
    return "\n".join(lines) + f"\n\nnsqd down {result['outage_s']} s; counted over {result['window_s']} s.\n"


# ---- rolling mode ------------------------------------------------------------------------------------


async def rolling(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    import fastnsq
    from fastnsq.testing.process import free_port

    servers = Servers(args.real, 3)
    await servers.start()
    out = Path(tempfile.mkdtemp(prefix="fastnsq-recovery-rolling-"))
    topic = f"rolling_{os.getpid()}"
    acked: dict[str, float] = {}
    stop = asyncio.Event()

    async def publish(index: int, producer: Any) -> None:
        number = 0
        while not stop.is_set():
            number += 1
            body = f"{index}-{number}"
            with contextlib.suppress(Exception):
                await producer.publish(topic, body.encode())
                acked[body] = time.monotonic()
            await asyncio.sleep(0.01)

    env = {**os.environ, "BENCH_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    producers = [fastnsq.Producer([nsqd.tcp_address]) for nsqd in servers.nsqd]
    worker = None
    restarts = []
    try:
        for producer in producers:
            await producer.start()
        publishers = [asyncio.create_task(publish(i, p)) for i, p in enumerate(producers)]
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fastnsq", "worker", "recovery:Record", "--topic", topic, "--channel", "rolling",
            "--processes", str(args.rolling_processes), "--split-nsqd", "--lookupd-http-address",
            servers.lookupd_http, "--metrics-port", str(free_port()), "--log-level", "WARNING",
            cwd=HERE, env=env, start_new_session=True)
        async with aiohttp.ClientSession() as session:
            await asyncio.sleep(args.settle)
            for index, nsqd in enumerate(servers.nsqd):
                stopped, back = await restart(nsqd, args.rolling_down, session)
                restarts.append({"nsqd": index, "stopped": stopped, "back": back})
                await asyncio.sleep(args.settle)
        stop.set()
        await asyncio.gather(*publishers)
        handled = await _wait_handled(out, set(acked), 60.0)
    finally:
        stop.set()
        if worker is not None and worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
            await asyncio.wait_for(worker.wait(), 60)
        for producer in producers:
            await producer.close()
        await servers.close()
    return _rolling_figures(acked, handled, restarts, args, servers.describe())


async def _wait_handled(out: Path, acked: set[str], timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        handled: dict[str, float] = {}
        for path in out.glob("handled-*"):
            for line in path.read_text().splitlines():
                body, _, at = line.partition("\t")
                if at:
                    handled.setdefault(body, int(at) / 1e9)
        if acked <= set(handled) or time.monotonic() > deadline:
            return handled
        await asyncio.sleep(0.5)


def _rolling_figures(acked: dict[str, float], handled: dict[str, float], restarts: list[dict[str, Any]],
                     args: argparse.Namespace, servers: str) -> dict[str, Any]:
    streams: dict[int, list[float]] = defaultdict(list)
    for body, at in handled.items():
        streams[int(body.partition("-")[0])].append(at)
    for times in streams.values():
        times.sort()
    rows = []
    for item in restarts:
        index, stopped, back = item["nsqd"], item["stopped"], item["back"]
        after = [t for t in streams[index] if t >= back]
        others = max((_longest_gap(streams[i], stopped, back) for i in streams if i != index), default=0.0)
        rows.append({"nsqd": index, "down_s": round(back - stopped, 3),
                     "handled_again_after_s": round(after[0] - back, 3) if after else None,
                     "longest_pause_of_the_others_s": round(others, 3)})
    lost = sorted(set(acked) - set(handled))
    return {"servers": servers, "processes": args.rolling_processes, "down_s": args.rolling_down,
            "acknowledged": len(acked), "handled": len(handled), "lost": len(lost), "lost_sample": lost[:10],
            "restarts": rows}


def _longest_gap(times: list[float], start: float, end: float) -> float:
    inside = [t for t in times if start - 1.0 <= t <= end + 1.0]
    return max((b - a for a, b in pairwise(inside)), default=end - start)


def rolling_markdown(result: dict[str, Any]) -> str:
    lines = ["| nsqd restarted | down (s) | its messages handled again after (s) | longest pause of the others (s) |",
             "|---|---:|---:|---:|"]
    for row in result["restarts"]:
        again = "never" if row["handled_again_after_s"] is None else f"{row['handled_again_after_s']:.2f}"
        lines.append(f"| {row['nsqd']} | {row['down_s']:.1f} | {again} | {row['longest_pause_of_the_others_s']:.2f} |")
    return "\n".join(lines) + (f"\n\n{result['acknowledged']:,} acknowledged, {result['handled']:,} handled, "
                               f"{result['lost']} lost; `fastnsq worker --split-nsqd --processes {result['processes']}`.\n")


# ---- HA mode ----------------------------------------------------------------------------------------------


async def ha(args: argparse.Namespace) -> dict[str, Any]:
    from ha_failover import external

    import fastnsq
    from fastnsq.testing.real import RealHACluster

    cluster = RealHACluster(args.ha, standalone=False)
    await asyncio.to_thread(cluster.start)
    try:
        harness = external(cluster)
        topic = f"recovery_ha_{os.getpid()}_{int(time.time())}"
        victim_address = (await harness.create_topic(topic, 2, replicas=3, channels=["plain"]))[0]
        victim = cluster.tcp_addresses.index(victim_address)
        lookupd = [cluster.lookupd_http_address]
        handled: dict[bytes, float] = {}
        consumer = fastnsq.Consumer(topic, "plain", lookupd_http_addresses=lookupd, max_in_flight=200,
                                    handler=lambda m: handled.setdefault(m.body, time.monotonic()))
        await consumer.start()
        producer = fastnsq.Producer(lookupd_http_addresses=lookupd)
        await producer.start()
        acked: dict[bytes, float] = {}
        stop = asyncio.Event()

        async def publish(name: str, **where: Any) -> None:
            number = 0
            while not stop.is_set():
                number += 1
                body = f"{name}-{number}".encode()
                with contextlib.suppress(Exception):
                    await producer.publish(topic, body, **where)
                    acked[body] = time.monotonic()
                await asyncio.sleep(0.01)

        publishers = [asyncio.create_task(publish("p0", partition=0)), asyncio.create_task(publish("any"))]
        await asyncio.sleep(args.settle)
        killed = time.monotonic()
        await asyncio.to_thread(cluster.kill_nsqd, victim)
        listed, new_leader, connected = await _new_leader(harness, consumer, topic, victim_address, killed)
        await asyncio.sleep(args.ha_restart_after - (time.monotonic() - killed))
        await asyncio.to_thread(cluster.start_nsqd, victim)
        await asyncio.sleep(args.settle)
        stop.set()
        await asyncio.gather(*publishers)
        deadline = time.monotonic() + 120
        while not set(acked) <= set(handled) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await producer.close()
        await consumer.stop()
    finally:
        await asyncio.to_thread(cluster.stop)
    p0_after = [t for body, t in acked.items() if body.startswith(b"p0-") and t > killed]
    consumed_after = [handled[b] for b, t in acked.items() if b.startswith(b"p0-") and t > killed and b in handled]
    lost = sorted(set(acked) - set(handled))
    since = (lambda at: None if at is None or listed is None else round(at - listed, 3))
    return {"servers": cluster.describe(), "killed_leader": victim_address, "new_leader": new_leader,
            "listed_after_kill_s": None if listed is None else round(listed - killed, 3),
            "producer_first_p0_publish_after_listing_s": since(min(p0_after, default=None)),
            "consumer_connected_after_listing_s": since(connected),
            "consumer_first_p0_message_after_listing_s": since(min(consumed_after, default=None)),
            "acknowledged": len(acked), "consumed": len(set(handled) & set(acked)), "lost": len(lost),
            "lost_sample": [b.decode() for b in lost[:10]]}


async def _new_leader(harness: Any, consumer: Any, topic: str, victim: str,
                      killed: float) -> tuple[float | None, str | None, float | None]:
    """Polls lookupd's write lookup every 25 ms until it names another leader for partition 0,
    then the consumer until it holds a connection to it: (listed at, the new leader, connected at)."""
    listed = leader = None
    while listed is None and time.monotonic() - killed < GIVE_UP * 2:
        with contextlib.suppress(Exception):
            now = (await harness.partition_leaders(topic)).get(0)
            if now is not None and now != victim:
                listed, leader = time.monotonic(), now
        await asyncio.sleep(0.025)
    while listed is not None and time.monotonic() - listed < GIVE_UP:
        if any(c.address == leader and c.partition == 0 for c in consumer.snapshot().connections):
            return listed, leader, time.monotonic()
        await asyncio.sleep(0.025)
    return listed, leader, None


def ha_markdown(result: dict[str, Any]) -> str:
    def cell(value: Any) -> str:
        return "never" if value is None else f"{value:.2f}"

    return "\n".join([
        "| after the leader of partition 0 was SIGKILLed | seconds |", "|---|---:|",
        f"| nsqlookupd lists a new leader (after the kill) | {cell(result['listed_after_kill_s'])} |",
        (f"| `Producer`: first publish acknowledged on partition 0 (after the listing) | "
         f"{cell(result['producer_first_p0_publish_after_listing_s'])} |"),
        (f"| `Consumer`: connected to the new leader (after the listing) | "
         f"{cell(result['consumer_connected_after_listing_s'])} |"),
        (f"| `Consumer`: first message of partition 0 from it (after the listing) | "
         f"{cell(result['consumer_first_p0_message_after_listing_s'])} |"),
        "", f"{result['acknowledged']:,} acknowledged, {result['consumed']:,} consumed, {result['lost']} lost.", "",
    ])


# ---- main -----------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, help="folder with real nsqd, nsqlookupd (and recovery_bench)")
    parser.add_argument("--go-bin", type=Path, help="go-nsq's recovery_bench (default: built into --real's folder)")
    parser.add_argument("--no-go", action="store_true", help="leave go-nsq's faces out")
    parser.add_argument("--outages", default="3,15,45,300", help="seconds nsqd stays down, comma-separated")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between two outages")
    parser.add_argument("--rates", action="store_true", help="count connection attempts and lookupd queries")
    parser.add_argument("--rates-outage", type=float, default=10.0)
    parser.add_argument("--down-at-start", default="",
                        help="seconds nsqd stays down after every face started, comma-separated (that mode)")
    parser.add_argument("--rolling", action="store_true", help="3 nsqd restarted in turn under a worker")
    parser.add_argument("--rolling-down", type=float, default=10.0)
    parser.add_argument("--rolling-processes", type=int, default=3)
    parser.add_argument("--ha", type=Path, help="folder of youzan's HA nsqd and nsqlookupd: the HA mode")
    parser.add_argument("--ha-restart-after", type=float, default=30.0)
    args = parser.parse_args()
    args.real = args.real.expanduser() if args.real else None
    args.ha = args.ha.expanduser() if args.ha else None
    args.outages = [float(x) for x in args.outages.split(",") if x]
    args.down_at_start = [float(x) for x in args.down_at_start.split(",") if x]
    go_binary = None
    if not args.no_go and not args.rolling and not args.ha:
        if args.go_bin is not None:
            go_binary = args.go_bin.expanduser()
        elif args.real is not None:
            import go_build

            go_binary = go_build.build(args.real, program="gonsq_recovery")
    logging.basicConfig(level=logging.ERROR)  # the faces' warnings while nsqd is down are the expected ones
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    mode = ("ha" if args.ha else "rolling" if args.rolling else "rates" if args.rates
            else "down-at-start" if args.down_at_start else "table")
    runner = {"rolling": lambda: rolling(args), "rates": lambda: rates(args, go_binary),
              "table": lambda: table(args, go_binary), "ha": lambda: ha(args),
              "down-at-start": lambda: down_at_start(args, go_binary)}[mode]
    result = asyncio.run(runner())
    text = {"rolling": rolling_markdown, "rates": rates_markdown, "table": table_markdown,
            "ha": ha_markdown, "down-at-start": down_at_start_markdown}[mode](result)
    stamp = datetime.now()
    server = "youzan" if args.ha else "real" if args.real else "embedded"
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
            "machine": f"{platform.machine()} {os.cpu_count()} cores", "load_average_1m": os.getloadavg()[0],
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    out = HERE / "results" / f"recovery-{mode}-{server}-{stamp:%Y%m%d-%H%M}"
    Path(f"{out}.json").write_text(json.dumps({**meta, **result}, indent=1))
    Path(f"{out}.md").write_text(f"# Recovery ({mode}), {result['servers']}\n\n{text}\n`{meta['command']}`; "
                                 f"{meta['date']}; load {meta['load_average_1m']:.2f}.\n")
    print(text)
    print(f"written to {out}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
