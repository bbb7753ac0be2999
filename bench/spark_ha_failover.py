"""Exactly once through HA leader failovers: the offset source and the producer (issue 61, lines 1-3).

    .venv/bin/python bench/spark_ha_failover.py --real-ha ~/nsq-real/ha/bin --replicas 2 --kills 1
    .venv/bin/python bench/spark_ha_failover.py --real-ha ~/nsq-real/ha/bin --replicas 3 --kills 1
    .venv/bin/python bench/spark_ha_failover.py --real-ha ~/nsq-real/ha/bin --replicas 2 --kills 2
    .venv/bin/python bench/spark_ha_failover.py --rate 500 --down 10 --driver-kill-after 10   # embedded

The HA cluster is the real youzan one (``--real-ha BIN``, a folder with youzan's nsqd and
nsqlookupd, etcd on PATH: :class:`fastnsq.testing.real.RealHACluster`, 3 nsqd), or the
embedded 3-node HA cluster when not given (its killed node is stopped without a failover: its
partitions have no leader until it is back, as with youzan's 2 replicas on 3 nodes). Spark is a
standalone master and two 1-core workers from pyspark's jars (``tests/spark_cluster.py``). On a
topic of ``--partitions`` partitions x ``--replicas`` replicas:

1. a ``fastnsq.Producer`` through the HA lookupd (default options) publishes numbered bodies to
   every partition by number (``mpublish(topic, bodies, partition=p)``, ``--batch`` a publish,
   ``--callers`` tasks a partition) at ``--rate`` messages/s in all, recording each publish as
   acknowledged or raised (the exception's class) and when; a watcher asks the lookupd for the
   topic's writers (``/lookup?access=w``, as the producer's routing does) every 0.1 s and records
   when each partition's leader leaves and comes back;
2. a Spark driver of its own (this script, ``driver``, a process group that can be SIGKILLed)
   runs a streaming query: the ``nsq`` source with ``readMode=offsets`` from ``earliest``,
   trigger 1 s, into Parquet with a checkpoint, and writes every batch's progress to a file;
3. after ``--warmup`` s of batches, the leaders of ``--kills`` partitions (on different nodes) are
   SIGKILLed ``--kill-gap`` s apart, each restarted ``--down`` s after its kill; once every
   partition is listed again, ``--driver-kill-after`` s later the driver is SIGKILLed and started
   again from its checkpoint; ``--publish-after`` s later publishing stops and the query runs
   until it has read every partition to its end (at most ``--catch-up-timeout`` s);
4. the Parquet output (the files Spark's ``_spark_metadata`` log committed) is read with pyarrow.

Reported (a table, and bench/results/spark-ha-failover-<date>.json): acknowledged, rows, distinct
(partition, offset), distinct bodies, duplicated, missing (acknowledged, not in the sink),
delivered though the publish raised, the exceptions by class (``InvalidValueError`` must be
0); per partition each outage the lookupd showed and the seconds from its leader being listed
again to the first acknowledged write after; per kill which partitions the query advanced in the
batches planned while the killed partition had no leader; whether the query stayed up (its
driver alive, the query never terminated) until the planned driver kill; the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

import fastnsq
from fastnsq.lookupd.client import LookupdClient

#: Bodies begin with 14 digits: partition * 10**12 + caller * 10**10 + sequence number.
KEY_DIGITS = 14


def body_key(partition: int, caller: int, seq: int) -> int:
    return partition * 10**12 + caller * 10**10 + seq


def numbered(first: int, count: int, size: int) -> list[bytes]:
    pad = b"." * max(0, size - KEY_DIGITS)
    return [b"%014d" % key + pad for key in range(first, first + count)]


# ---- the HA cluster ------------------------------------------------------------------------------


class HACluster:
    """The HA cluster on a loop thread (``tests/spark_ha.py``): real youzan when ``real_ha`` is given
    (started here), else the embedded one; nodes killed and started by index."""

    def __init__(self, real_ha: Path | None, data_dir: Path) -> None:
        self.real: Any = None
        if real_ha is not None:
            from fastnsq.testing.real import RealHACluster

            # Its data and logs in the work folder: nsqd's log tells what became of a lost write.
            self.real = RealHACluster(real_ha.expanduser().resolve(), standalone=False, data_dir=data_dir)
            self.real.start()
            os.environ.update(self.real.environment())
        from tests.spark_ha import ThreadedHACluster

        self.threaded = ThreadedHACluster()

    @property
    def lookupd_http(self) -> str:
        return self.threaded.lookupd_http

    @property
    def tcp_addresses(self) -> list[str]:
        return list(self.real.tcp_addresses if self.real is not None else self.threaded.cluster.tcp_addresses)

    def describe(self) -> str:
        if self.real is not None:
            return str(self.real.describe())
        return "embedded HA cluster, 3 nodes (a killed node is stopped without a failover)"

    def create_topic(self, topic: str, partitions: int, replicas: int) -> None:
        self.threaded.run(self.threaded.cluster.create_topic(topic, partitions, replicas=replicas, channels=["keep"]))

    def kill(self, index: int) -> None:
        if self.real is not None:
            self.real.kill_nsqd(index, signal.SIGKILL)
        else:
            self.threaded.run(self.threaded.cluster.stop_node(index, fail_over=False))

    def start(self, index: int) -> None:
        if self.real is not None:
            self.real.start_nsqd(index)
        else:
            self.threaded.run(self.threaded.cluster.start_node(index))

    def close(self) -> None:
        self.threaded.close()
        if self.real is not None:
            self.real.stop()


# ---- what the producer and the lookupd did -------------------------------------------------------


@dataclass
class Ledger:
    """Every publish (one MPUB of ``count`` bodies from key ``first``) and what became of it."""

    acked: list[tuple[int, int, int, float]] = field(default_factory=list)  # partition, first, count, when
    raised: list[tuple[int, int, int, float, str, str]] = field(default_factory=list)  # ... class, message
    lookups: list[tuple[float, dict[int, str] | str]] = field(default_factory=list)  # when, leaders or error
    load: list[tuple[float, float]] = field(default_factory=list)  # when, 1-minute load average
    events: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.events.append((time.time(), what))
        print(f"{datetime.now():%H:%M:%S} {what}", flush=True)


async def publish_partition(producer: fastnsq.Producer, topic: str, partition: int, caller: int, rate: float,
                            batch: int, size: int, stop: asyncio.Event, ledger: Ledger) -> None:
    """One caller's numbered publishes to ``partition`` at ``rate`` messages/s; after a stall the
    schedule starts again from now (no catch-up burst)."""
    loop = asyncio.get_running_loop()
    interval = batch / rate
    due = loop.time()
    seq = 0
    while not stop.is_set():
        first = body_key(partition, caller, seq)
        try:
            await producer.mpublish(topic, numbered(first, batch, size), partition=partition)
        except Exception as exc:  # noqa: BLE001 - every way a publish fails is counted
            ledger.raised.append((partition, first, batch, time.time(), type(exc).__name__, str(exc)[:300]))
        else:
            ledger.acked.append((partition, first, batch, time.time()))
        seq += batch
        due += interval
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        elif due < now - 1.0:
            due = now


async def watch_lookupd(lookupd: str, topic: str, stop: asyncio.Event, ledger: Ledger, every: float = 0.1) -> None:
    """The write lookup's leaders each time they change (and the load average every 5 s)."""
    last: dict[int, str] | str | None = None
    sampled = 0.0
    async with LookupdClient(timeout=2.0) as client:
        while not stop.is_set():
            try:
                result = await client.lookup(lookupd, topic, access="w")
                now: dict[int, str] | str = {p: n.address for p, n in sorted(result.partitions.items())}
            except Exception as exc:  # noqa: BLE001 - an unanswered lookup is a state too
                now = f"{type(exc).__name__}: {exc}"[:200]
            if now != last:
                ledger.lookups.append((time.time(), now))
                last = now
            if time.time() - sampled >= 5.0:
                sampled = time.time()
                ledger.load.append((sampled, os.getloadavg()[0]))
            await asyncio.sleep(every)


def outages(ledger: Ledger, partitions: int) -> dict[int, list[list[float | None]]]:
    """Per partition, each [left, back] interval the write lookup did not list it (back None: never)."""
    found: dict[int, list[list[float | None]]] = {p: [] for p in range(partitions)}
    listed = set(range(partitions))
    for when, leaders in ledger.lookups:
        if isinstance(leaders, str):
            continue
        for p in range(partitions):
            if p in listed and p not in leaders:
                found[p].append([when, None])
            elif p not in listed and p in leaders and found[p]:
                found[p][-1][1] = when
        listed = set(leaders)
    return found


def leaders_at(ledger: Ledger, when: float) -> dict[int, str]:
    """The leaders the write lookup listed last before ``when``."""
    found: dict[int, str] = {}
    for at, leaders in ledger.lookups:
        if at > when:
            break
        if isinstance(leaders, dict):
            found = leaders
    return found


def write_gaps(ledger: Ledger, partitions: int) -> dict[str, dict[str, float]]:
    """Per partition, the longest time without an acknowledged write, and when it began."""
    start = ledger.events[0][0] if ledger.events else 0.0
    found = {}
    for partition in range(partitions):
        times = sorted(when for p, _, _, when in ledger.acked if p == partition)
        gaps = [(later - earlier, earlier) for earlier, later in pairwise(times)] or [(0.0, start)]
        longest, since = max(gaps)
        found[str(partition)] = {"longest_s": round(longest, 2), "from_s": round(since - start, 2)}
    return found


def rate_before(ledger: Ledger, kills: list[dict[str, Any]]) -> float:
    """Acknowledged messages/s from the first acknowledgement to the first kill."""
    if not kills or not ledger.acked:
        return 0.0
    first = min(t for *_, t in ledger.acked)
    messages = sum(n for _, _, n, t in ledger.acked if t < kills[0]["at"])
    return round(messages / max(1e-9, kills[0]["at"] - first), 1)


def resume_seconds(ledger: Ledger, partitions: int) -> dict[int, list[dict[str, Any]]]:
    """Per partition and outage: seconds from the lookupd listing a leader again to the first
    acknowledged write after it."""
    acks: dict[int, list[float]] = {p: [] for p in range(partitions)}
    for partition, _, _, when in ledger.acked:
        acks[partition].append(when)
    report: dict[int, list[dict[str, Any]]] = {}
    start = ledger.events[0][0] if ledger.events else 0.0
    for partition, intervals in outages(ledger, partitions).items():
        times = sorted(acks[partition])
        nexts: list[float | None] = [left for left, _ in intervals[1:]] + [None]
        for (left, back), following in zip(intervals, nexts):
            assert left is not None
            first = next((t for t in times if back is not None and t >= back), None)
            report.setdefault(partition, []).append({
                "left_at_s": round(left - start, 2), "back_at_s": None if back is None else round(back - start, 2),
                "unlisted_s": None if back is None else round(back - left, 2),
                # a leader listed for a moment only (youzan's lookupd flapped): no write could resume then
                "listed_for_s": None if following is None or back is None else round(following - back, 2),
                "resume_s": None if first is None or back is None else round(first - back, 3)})
    return report


# ---- the Spark driver, a process of its own ---------------------------------------------------------


class Driver:
    """This script's ``driver`` mode as a process group (a SIGKILL takes its JVM too), restartable."""

    def __init__(self, work: Path, env: dict[str, str], args: list[str]) -> None:
        self.work, self.env, self.args = work, env, args
        self.progress = work / "progress.jsonl"
        self.stop_file = work / "stop"
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.runs += 1
        self.stop_file.unlink(missing_ok=True)
        with open(self.work / f"driver-{self.runs}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "driver", *self.args, "--progress",
                 str(self.progress), "--stop-file", str(self.stop_file), "--run", str(self.runs)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def stop(self, timeout: float = 120.0) -> int | None:
        """Ask the driver to stop its query (the stop file), then end the group whatever it did."""
        if self.proc is None:
            return None
        self.stop_file.touch()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        code = self.proc.poll()
        self.kill()
        return code

    def records(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        found = []
        for line in self.progress.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the SIGKILL
        return found


def _offsets(value: Any) -> dict[str, Any] | None:
    """A source offset from the progress (a JSON string or already an object; ``null`` when
    Spark did not ask, as for a replayed batch)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def batch_record(progress: dict[str, Any], run: int) -> dict[str, Any]:
    source = (progress.get("sources") or [{}])[0]
    start, end = _offsets(source.get("startOffset")), _offsets(source.get("endOffset"))
    counts = {p: c for p, (_, c) in ((end or {}).get("partitions") or {}).items()}
    before = {p: c for p, (_, c) in ((start or {}).get("partitions") or {}).items()}
    return {"event": "batch", "run": run, "batch": progress.get("batchId"), "at": time.time(),
            "started": _epoch(progress["timestamp"]), "ms": (progress.get("durationMs") or {}).get("triggerExecution"),
            "rows": progress.get("numInputRows"), "counts": counts,
            "advanced": {p: c - before.get(p, 0) for p, c in counts.items()},
            "latest": _offsets(source.get("latestOffset"))}


_SLOW_PUT = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*topic (\S+)-(\d+) put messages? .*to cluster slow: (\S+)$")


def slow_puts(data_dir: Path, topic: str, start: float) -> list[dict[str, Any]]:
    """The writes youzan's nsqd logged as held ("put messages N to cluster slow: 4.68s": a new
    leader waits for its ISR, say), from its logs: what a producer cannot make faster."""
    found = []
    day = datetime.fromtimestamp(start, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    for log in sorted(data_dir.rglob("*.log.INFO.*")):
        for line in log.read_text(errors="replace").splitlines():
            match = _SLOW_PUT.match(line)
            if match is None or match[4] != topic:
                continue
            hours, minutes, seconds = int(match[1]), int(match[2]), float(match[3])
            seconds_held = match[6].rstrip("s")
            found.append({"node": log.parent.name, "partition": int(match[5]),
                          "at_s": round(day + hours * 3600 + minutes * 60 + seconds - start, 2),
                          "seconds": seconds_held})
    return sorted(found, key=lambda put: put["at_s"])


def driver_main(argv: list[str]) -> int:
    """The streaming query (readMode=offsets -> Parquet, trigger 1 s), its progress to a file."""
    parser = argparse.ArgumentParser(prog="spark_ha_failover.py driver")
    for name in ("--master", "--lookupd", "--topic", "--checkpoint", "--out", "--progress", "--stop-file"):
        parser.add_argument(name, required=True)
    parser.add_argument("--max-batch", type=int, default=100_000)
    parser.add_argument("--run", type=int, default=1)
    parser.add_argument("--prefetch", action="store_true")
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    spark = (SparkSession.builder.master(args.master).appName(f"fastnsq-ha-failover-{args.run}")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
             .config("spark.cores.max", "2").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    stream = (spark.readStream.format("nsq").option("lookupd", args.lookupd).option("topic", args.topic)
              .option("channel", "failover").option("readMode", "offsets").option("startingOffsets", "earliest")
              .option("maxRecordsPerBatch", str(args.max_batch))
              .option("prefetchRanges", "true" if args.prefetch else "false").load())
    query = (stream.select("partition", "offset", "body").writeStream.format("parquet")
             .option("path", args.out).option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="1 second").start())
    seen: set[tuple[int, str]] = set()
    with open(args.progress, "a") as log:

        def write(record: dict[str, Any]) -> None:
            log.write(json.dumps(record) + "\n")
            log.flush()

        write({"event": "started", "run": args.run, "at": time.time(), "pid": os.getpid()})
        while True:
            for progress in query.recentProgress:
                found = json.loads(progress.json)
                if (found["batchId"], found["timestamp"]) not in seen:
                    seen.add((found["batchId"], found["timestamp"]))
                    write(batch_record(found, args.run))
            if not query.isActive:
                write({"event": "ended", "run": args.run, "at": time.time(), "exception": str(query.exception() or "")})
                return 3
            if os.path.exists(args.stop_file):
                query.stop()
                write({"event": "stopped", "run": args.run, "at": time.time()})
                break
            time.sleep(0.5)
    spark.stop()
    return 0


# ---- the scenario ----------------------------------------------------------------------------------


async def wait_for_rows(driver: Driver, timeout: float) -> None:
    """Until the driver's query has committed a batch with rows (its start-up can take a minute)."""
    deadline = time.monotonic() + timeout
    while not any(r["event"] == "batch" and r["rows"] for r in driver.records()):
        if not driver.alive() or time.monotonic() > deadline:
            log = (driver.work / f"driver-{driver.runs}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the driver's query read nothing within {timeout} s (alive: {driver.alive()}):\n{log}")
        await asyncio.sleep(1.0)


def pick_victim(cluster: HACluster, ledger: Ledger, killed: set[int]) -> tuple[int, int]:
    """(node, partition): the leader of the first partition (1, 2, ..., 0) led by a node not killed yet."""
    leaders = leaders_at(ledger, time.time())
    partitions = sorted(leaders, key=lambda p: (p == 0, p))
    for partition in partitions:
        index = cluster.tcp_addresses.index(leaders[partition])
        if index not in killed:
            return index, partition
    raise RuntimeError(f"no partition is led by a node not killed yet ({leaders}, killed {sorted(killed)})")


async def kill_and_restart(cluster: HACluster, ledger: Ledger, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The leaders of ``--kills`` partitions SIGKILLed ``--kill-gap`` s apart, each back ``--down`` s later."""
    kills: list[dict[str, Any]] = []
    restarts = []

    async def restart(index: int, after: float) -> None:
        await asyncio.sleep(after)
        ledger.mark(f"restart nsqd{index}")
        await asyncio.to_thread(cluster.start, index)
        ledger.mark(f"nsqd{index} answers")

    for k in range(args.kills):
        index, partition = pick_victim(cluster, ledger, {kill["node"] for kill in kills})
        if args.kill_phase is not None:  # the 1 s trigger plans each batch on a whole second: just after one
            now = time.time()
            await asyncio.sleep(math.floor(now) + 1 + args.kill_phase - now)
        ledger.mark(f"SIGKILL nsqd{index} ({cluster.tcp_addresses[index]}), leader of partition {partition}")
        at = time.time()
        await asyncio.to_thread(cluster.kill, index)
        kills.append({"node": index, "partition": partition, "at": at})
        restarts.append(asyncio.create_task(restart(index, args.down - (time.time() - at))))
        if k < args.kills - 1:
            await asyncio.sleep(args.kill_gap)
    await asyncio.gather(*restarts)
    return kills


async def wait_all_listed(ledger: Ledger, partitions: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(leaders_at(ledger, time.time())) == partitions:
            return True
        await asyncio.sleep(0.2)
    return False


def caught_up(records: list[dict[str, Any]], run: int, since: float) -> bool:
    """A batch of ``run`` planned after ``since`` left no partition behind its end, none without a leader."""
    for record in records:
        latest = record.get("latest") or {}
        if (record["event"] == "batch" and record["run"] == run and record["started"] > since and latest
                and latest.get("maxOffsetsBehindLatest") == 0 and not latest.get("partitionsWithoutLeader")):
            return True
    return False


async def scenario(args: argparse.Namespace, cluster: HACluster, driver: Driver, topic: str,
                   ledger: Ledger) -> dict[str, Any]:
    stop_publishing, stop_watching = asyncio.Event(), asyncio.Event()
    watcher = asyncio.create_task(watch_lookupd(cluster.lookupd_http, topic, stop_watching, ledger))
    ledger.mark(f"topic {topic}: {args.partitions} partitions x {args.replicas} replicas; publishing")
    outcome: dict[str, Any] = {}
    async with fastnsq.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as producer:
        rate = args.rate / (args.partitions * args.callers)
        publishers = [asyncio.create_task(publish_partition(producer, topic, p, c, rate, args.batch, args.size,
                                                            stop_publishing, ledger))
                      for p in range(args.partitions) for c in range(args.callers)]
        driver.start()
        ledger.mark("driver 1 started")
        await wait_for_rows(driver, args.startup_timeout)
        ledger.mark(f"the query has committed rows; {args.warmup} s more before the first kill")
        await asyncio.sleep(args.warmup)
        outcome["kills"] = await kill_and_restart(cluster, ledger, args)
        outcome["all_listed_again"] = await wait_all_listed(ledger, args.partitions, args.relist_timeout)
        ledger.mark("every partition listed for writing again" if outcome["all_listed_again"] else
                    f"not every partition listed for writing within {args.relist_timeout} s")
        await asyncio.sleep(args.driver_kill_after)
        outcome["driver_alive_at_kill"] = driver.alive()
        ledger.mark(f"SIGKILL the driver (alive: {driver.alive()})")
        await asyncio.to_thread(driver.kill)
        driver.start()
        ledger.mark("driver 2 started on the same checkpoint")
        await asyncio.sleep(args.publish_after)
        stop_publishing.set()
        await asyncio.gather(*publishers)
        stopped = time.time()
        ledger.mark(f"publishing stopped: {sum(n for *_, n, _ in ledger.acked)} acknowledged, "
                    f"{sum(n for _, _, n, *_ in ledger.raised)} raised")
        outcome["producer"] = producer.snapshot().as_dict()
    deadline = time.monotonic() + args.catch_up_timeout
    while not caught_up(driver.records(), driver.runs, stopped + 1.0) and time.monotonic() < deadline:
        if not driver.alive():
            break
        await asyncio.sleep(1.0)
    outcome["caught_up"] = caught_up(driver.records(), driver.runs, stopped + 1.0)
    ledger.mark("the query read every partition to its end" if outcome["caught_up"] else
                f"the query did not catch up within {args.catch_up_timeout} s (driver alive: {driver.alive()})")
    outcome["driver_2_exit"] = await asyncio.to_thread(driver.stop)
    stop_watching.set()
    await watcher
    return outcome


# ---- what the query did during the outages ---------------------------------------------------------


def query_during_outages(records: list[dict[str, Any]], ledger: Ledger, kills: list[dict[str, Any]],
                         partitions: int) -> list[dict[str, Any]]:
    """Per kill: from the kill until the lookupd lists the killed partition again, the rows each
    partition took in the batches planned meanwhile, and whether the query stayed up."""
    unlisted = outages(ledger, partitions)
    batches = [r for r in records if r["event"] == "batch" and r["run"] == 1]
    report = []
    for kill in kills:
        backs = [b for left, b in unlisted[kill["partition"]] if left is not None and left >= kill["at"] - 1]
        until = backs[0] if backs and backs[0] is not None else time.time()
        window = [b for b in batches if kill["at"] <= b["started"] <= until]
        advanced = {str(p): sum(int(b["advanced"].get(str(p), 0)) for b in window) for p in range(partitions)}
        done = sorted(b["at"] for b in batches if kill["at"] <= b["at"] <= until)
        gaps = [later - earlier for earlier, later in zip([kill["at"], *done], [*done, until])]
        ended = [r for r in records if r["event"] == "ended" and r["run"] == 1 and r["at"] <= until]
        others = [p for p in range(partitions) if p != kill["partition"]]
        report.append({
            "partition": kill["partition"], "node": kill["node"], "window_s": round(until - kill["at"], 1),
            "batches_planned": len(window), "batches_completed": len(done),
            "rows_by_partition": advanced,
            "killed_partition_read": advanced[str(kill["partition"])],
            "others_flowed": any(advanced[str(p)] > 0 for p in others),
            "others_not_flowing": [p for p in others if advanced[str(p)] == 0],
            "longest_without_a_batch_s": round(max(gaps), 1),
            "query_ended": [r["exception"] for r in ended],
        })
    return report


# ---- what the sink holds -----------------------------------------------------------------------------


def committed_files(out: Path) -> tuple[list[Path], int]:
    """The Parquet files the sink's ``_spark_metadata`` log committed, and how many others lie in
    the folder (written by a batch the driver's SIGKILL cut short; Spark's readers skip them too)."""
    paths: set[str] = set()
    for entry in sorted((out / "_spark_metadata").iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".crc"):
            continue
        for line in entry.read_text().splitlines()[1:]:
            item = json.loads(line)
            if item.get("action", "add") == "add":
                paths.add(unquote(urlparse(item["path"]).path))
            else:
                paths.discard(unquote(urlparse(item["path"]).path))
    files = sorted(Path(p) for p in paths)
    stray = len({p for p in out.rglob("*.parquet")} - set(files))
    return files, stray


def count_sink(out: Path, ledger: Ledger, partitions: int) -> dict[str, Any]:
    """Rows, distinct (partition, offset) and bodies in the sink, against what was acknowledged."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files, stray = committed_files(out)
    table = pa.concat_tables([pq.read_table(f, columns=["partition", "offset", "body"]) for f in files]) if files \
        else pa.table({"partition": pa.array([], pa.int32()), "offset": pa.array([], pa.int64()),
                       "body": pa.array([], pa.binary())})
    part = table.column("partition").to_numpy().astype(np.int64)
    offset = table.column("offset").to_numpy().astype(np.int64)
    digits = pc.cast(pc.binary_slice(table.column("body"), 0, KEY_DIGITS), pa.string())
    keys = pc.cast(digits, pa.int64()).to_numpy() if len(table) else np.array([], np.int64)

    def expand(entries: list[tuple[Any, ...]]) -> Any:
        ranges = [np.arange(first, first + count, dtype=np.int64) for _, first, count, *_ in entries]
        return np.unique(np.concatenate(ranges)) if ranges else np.array([], np.int64)

    acked, raised = expand(ledger.acked), expand(ledger.raised)
    stored = np.unique(keys)
    start = ledger.events[0][0] if ledger.events else 0.0
    firsts = np.array([first for _, first, _, _ in ledger.acked], np.int64)
    gone = ~np.isin(firsts, stored) if firsts.size else np.array([], bool)
    lost = [(p, round(when - start, 2)) for (p, _, _, when), g in zip(ledger.acked, gone) if g]
    positions = np.unique(part * (1 << 44) + offset)
    by_partition = {str(p): {"rows": int((part == p).sum()),
                             "acknowledged": int(sum(n for q, _, n, _ in ledger.acked if q == p))}
                    for p in range(partitions)}
    return {
        "acknowledged": int(acked.size), "raised": int(raised.size), "rows": len(table),
        "distinct_partition_offset": int(positions.size), "distinct_bodies": int(stored.size),
        "duplicated": len(table) - int(positions.size), "duplicated_bodies": len(table) - int(stored.size),
        "missing": int(np.setdiff1d(acked, stored).size),
        "missing_sample": [int(k) for k in np.setdiff1d(acked, stored)[:10]],
        "missing_by_partition": {str(p): sum(1 for q, _ in lost if q == p) for p in range(partitions)},
        "missing_publishes_acknowledged_at_s": {str(p): [min((t for q, t in lost if q == p), default=None),
                                                         max((t for q, t in lost if q == p), default=None)]
                                                for p in range(partitions)},
        "delivered_though_raised": int(np.intersect1d(raised, stored).size),
        "unknown_bodies": int(np.setdiff1d(stored, np.union1d(acked, raised)).size),
        "files": len(files), "uncommitted_files_in_folder": stray, "by_partition": by_partition,
    }


def exceptions(ledger: Ledger, start: float) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for partition, _, count, when, kind, message in ledger.raised:
        row = found.setdefault(kind, {"publishes": 0, "messages": 0, "partitions": set(), "first_at_s": when - start,
                                      "last_at_s": when - start, "example": message})
        row["publishes"] += 1
        row["messages"] += count
        row["partitions"].add(partition)
        row["last_at_s"] = when - start
    return {k: {**v, "partitions": sorted(v["partitions"]), "first_at_s": round(v["first_at_s"], 1),
                "last_at_s": round(v["last_at_s"], 1)} for k, v in found.items()}


# ---- the run ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real-ha", type=Path, metavar="BIN", help="youzan's nsqd/nsqlookupd folder (etcd on PATH)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2, choices=[1, 2, 3])
    parser.add_argument("--rate", type=float, default=5000.0, help="messages/s over all partitions")
    parser.add_argument("--callers", type=int, default=2, help="publishing tasks per partition")
    parser.add_argument("--batch", type=int, default=20, help="messages per MPUB")
    parser.add_argument("--size", type=int, default=100, help="bytes per body (>= 14)")
    parser.add_argument("--kills", type=int, default=1, help="leaders of this many partitions killed, in turn")
    parser.add_argument("--kill-gap", type=float, default=20.0, help="seconds between two kills")
    parser.add_argument("--down", type=float, default=60.0, help="seconds from a kill to its node's restart")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of batches before the first kill")
    parser.add_argument("--driver-kill-after", type=float, default=40.0,
                        help="seconds from every partition listed again to the driver's SIGKILL")
    parser.add_argument("--publish-after", type=float, default=20.0,
                        help="seconds of publishing after the driver's restart")
    parser.add_argument("--max-batch", type=int, default=100_000, help="the query's maxRecordsPerBatch")
    parser.add_argument("--prefetch", action="store_true", help="the query's option prefetchRanges=true")
    parser.add_argument("--kill-phase", type=float, metavar="S",
                        help="kill S s after a whole second (the 1 s trigger plans a batch on each): between a "
                             "batch's planning and its read tasks")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--relist-timeout", type=float, default=180.0)
    parser.add_argument("--catch-up-timeout", type=float, default=600.0)
    parser.add_argument("--work", type=Path, help="keep the checkpoint, output and logs here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--no-save", action="store_true")
    return parser.parse_args(argv)


def report(result: dict[str, Any]) -> list[str]:
    sink = result["sink"]
    lines = [(f"replicas {result['replicas']}, kills {result['kills_asked']}, {result['rate']:,.0f} msg/s asked "
             f"({result['published_rate_before_the_kills']:,.0f} acknowledged before the first kill), "
             f"{result['down']:.0f} s down; load average 1 min max {result['load']['max']}, "
             f"mean {result['load']['mean']}"),
             ("| acknowledged | rows | distinct (partition, offset) | distinct bodies | duplicated | missing "
             "| delivered though raised | InvalidValueError | caught up |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
             (f"| {sink['acknowledged']:,} | {sink['rows']:,} | {sink['distinct_partition_offset']:,} "
             f"| {sink['distinct_bodies']:,} | {sink['duplicated']:,} | {sink['missing']:,} "
             f"| {sink['delivered_though_raised']:,} | {result['invalid_value_errors']} | {result['caught_up']} |"),
             "", ("| killed | unlisted (s) | first write after relisted (s) | batches planned / completed meanwhile "
             "| longest without a batch (s) | rows read meanwhile | others flowed | query up |"),
             "|---|---:|---:|---:|---:|---|---|---|"]
    for kill in result["during_outages"]:
        resumes = result["resume"].get(str(kill["partition"])) or []
        unlisted = ", ".join(str(r["unlisted_s"]) for r in resumes) or "never unlisted"
        resumed = ", ".join(str(r["resume_s"]) for r in resumes) or "-"
        lines.append(f"| nsqd{kill['node']}, partition {kill['partition']} | {unlisted} | {resumed} "
                     f"| {kill['batches_planned']} / {kill['batches_completed']} | {kill['longest_without_a_batch_s']} "
                     f"| {kill['rows_by_partition']} | {kill['others_flowed']} | {not kill['query_ended']} |")
    lines.append("")
    for partition, rows in sorted(result["resume"].items()):
        for row in rows:
            flap = "" if row["listed_for_s"] is None else f" (listed for {row['listed_for_s']} s only)"
            lines.append(f"partition {partition}: unlisted at {row['left_at_s']} s for {row['unlisted_s']} s, "
                         f"first acknowledged write {row['resume_s']} s after it was listed again{flap}")
    lines.append(f"longest without an acknowledged write, per partition: {result['write_gaps']}")
    for put in result["server_slow_puts"]:
        lines.append(f"youzan's {put['node']} logged a put to partition {put['partition']} \"to cluster slow\": "
                     f"{put['seconds']} s, ending at {put['at_s']} s")
    if result["sink"]["missing"]:
        lines.append(f"missing by partition: {result['sink']['missing_by_partition']}, acknowledged between "
                     f"(s): {result['sink']['missing_publishes_acknowledged_at_s']}")
    lines.append(f"exceptions: {json.dumps(result['exceptions']) if result['exceptions'] else 'none'}")
    lines.append(f"query up until the planned driver kill: {result['query_alive']}")
    return lines


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.spark_cluster import SparkStandalone

    work = args.work or Path(tempfile.mkdtemp(prefix="spark-ha-failover-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}", flush=True)
    cluster = HACluster(args.real_ha, work / "ha")
    spark = SparkStandalone(work / "spark", workers=2, cores=1, memory="1500m")
    ledger = Ledger()
    try:
        topic = f"sfo{os.getpid() % 10000}_{int(time.time()) % 100000}"
        cluster.create_topic(topic, args.partitions, args.replicas)
        spark.start()
        env = {**spark.environment(), "PYSPARK_DRIVER_PYTHON": sys.executable}
        driver = Driver(work, env, ["--master", spark.master_url, "--lookupd", cluster.lookupd_http, "--topic",
                                    topic, "--checkpoint", str(work / "checkpoint"), "--out", str(work / "out"),
                                    "--max-batch", str(args.max_batch), *(["--prefetch"] if args.prefetch else [])])
        try:
            outcome = fastnsq.run(scenario(args, cluster, driver, topic, ledger))
        finally:
            if driver.alive():
                driver.kill()
        records = driver.records()
    finally:
        spark.stop()
        server = cluster.describe()
        cluster.close()
    (work / "ledger.json").write_text(json.dumps({"acked": ledger.acked, "raised": ledger.raised,
                                                  "lookups": ledger.lookups, "events": ledger.events}))
    sink = count_sink(work / "out", ledger, args.partitions)
    start = ledger.events[0][0]
    loads = [load for _, load in ledger.load] or [0.0]
    during = query_during_outages(records, ledger, outcome["kills"], args.partitions)
    ended_1 = [r for r in records if r["event"] == "ended" and r["run"] == 1]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv,
        "machine": f"{platform.machine()} {os.cpu_count()} cores", "python": platform.python_version(),
        "server": server, "topic": topic, "partitions": args.partitions, "replicas": args.replicas,
        "rate": args.rate, "down": args.down, "kills_asked": args.kills, "sink": sink,
        "published_rate": round(sink["acknowledged"] / max(1e-9, max(t for *_, t in ledger.acked) - start), 1),
        "published_rate_before_the_kills": rate_before(ledger, outcome["kills"]),
        "invalid_value_errors": sum(1 for r in ledger.raised if r[4] == "InvalidValueError"),
        "exceptions": exceptions(ledger, start), "caught_up": outcome["caught_up"],
        "resume": {str(p): rows for p, rows in resume_seconds(ledger, args.partitions).items()},
        "server_slow_puts": slow_puts(work / "ha", topic, start) if args.real_ha else [],
        "during_outages": during, "write_gaps": write_gaps(ledger, args.partitions),
        "query_alive": outcome["driver_alive_at_kill"] and not ended_1,
        "query_ended": [r.get("exception") for r in records if r["event"] == "ended"],
        "driver_2_exit": outcome["driver_2_exit"], "all_listed_again": outcome["all_listed_again"],
        "load": {"max": max(loads), "mean": round(sum(loads) / len(loads), 2),
                 "samples": [(round(t - start), load) for t, load in ledger.load]},
        "kills": [{**k, "at_s": round(k["at"] - start, 2)} for k in outcome["kills"]],
        "events": [(round(t - start, 2), what) for t, what in ledger.events],
        "lookups": [(round(t - start, 2), leaders) for t, leaders in ledger.lookups],
        "batches": [{k: r[k] for k in ("run", "batch", "rows", "ms", "advanced")} | {"started_s": round(
            r["started"] - start, 2)} for r in records if r["event"] == "batch"],
        "producer": outcome["producer"], "work": str(work),
    }
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    if sys.argv[1:2] == ["driver"]:
        return driver_main(sys.argv[2:])
    args = parse_args(sys.argv[1:])
    result = run(args)
    for line in report(result):
        print(line)
    if args.keep or args.work:
        (Path(result["work"]) / "result.json").write_text(json.dumps(result, indent=1))
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"spark-ha-failover-{datetime.now():%Y%m%d-%H%M}.json"
        out.write_text(json.dumps(result, indent=1))
        print(f"\nwritten to {out}")
    sink = result["sink"]
    exact = sink["duplicated"] == 0 and sink["missing"] == 0 and result["invalid_value_errors"] == 0
    return 0 if exact and result["query_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
