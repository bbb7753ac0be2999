"""Rows/s of the `nsq` source on an HA topic: ``readMode=offsets`` next to the driver-side source.

For each partition count (``--partitions``, default 1 2 4 8) one topic is created on the HA
cluster and ``--messages`` bodies of ``--size`` bytes are published to it (spread evenly over
its partitions, untimed). Then, for each Spark master (``local[2]`` and a standalone cluster
of ``--workers`` 1-core workers started from pyspark's jars), alternated rounds read the whole
topic with both sources into Spark's ``noop`` sink, default trigger, until every message has
been counted in the query's progress, at most 80,000 rows per micro-batch for both:

* ``offsets``: ``readMode=offsets`` from ``startingOffsets=earliest`` (a fresh checkpoint);
* ``driver``: ``readMode=partitioned`` with ``ha=true`` and ``lookupd`` on a fresh channel that
  each partition's leader moved to offset 0 first (a new youzan channel starts at the end),
  ``maxInFlight`` 160,000 over 64 connections in all (``connectionsPerNsqd`` 64 / partitions).

Reported per run: the machine's busy CPU time per row (every process: Spark, its Python
workers, the nsqd; from /proc/stat, start() to the last row), rows/s "steady" (the rows after the first micro-batch over the time from its
end to the end of the last) and "with start-up" (all rows over the time from ``start()``).
Medians per (master, partitions, source) and the offsets/driver ratio go to a table and
``bench/results/spark-offsets-<date>.json``.

The HA cluster: the real youzan one from ``--real-ha BIN`` (started here: etcd + lookupd + 3
nsqd, replicas 2), or the embedded one when not given. Example::

    .venv/bin/python bench/bench_spark_offsets.py --real-ha ~/nsq-real/ha/bin --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))


#: Rows per micro-batch for both sources (the driver-side source takes at most half its
#: maxInFlight, 160,000, per batch anyway).
BATCH_ROWS = 80_000


def spark_session(master: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    builder = (SparkSession.builder.master(master).appName("fastnsq-bench-offsets")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "2g"))
    if master.startswith("spark://"):
        builder = builder.config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


class Cluster:
    """The HA cluster on a loop thread (tests/spark_ha.py), started from ``--real-ha`` when given."""

    def __init__(self, real_ha: str | None) -> None:
        self.real = None
        if real_ha:
            from fastnsq.testing.real import RealHACluster

            self.real = RealHACluster(Path(real_ha).expanduser(), standalone=False)
            self.real.start()
            os.environ.update(self.real.environment())
        from tests.spark_ha import ThreadedHACluster

        self.ha = ThreadedHACluster()
        self.version = self.real.version if self.real else "embedded"

    def reset_channel(self, topic: str, channel: str) -> None:
        """A channel on every partition's leader, moved to the partition's first message."""
        from fastnsq.nsqd_http import NsqdHTTP
        from fastnsq.spark._offsets import OffsetPlanner
        from fastnsq.spark._options import parse_source

        async def reset() -> None:
            options = parse_source({"lookupd": self.ha.lookupd_http, "topic": topic, "channel": channel,
                                    "readMode": "offsets"})
            planner, http = OffsetPlanner(options), NsqdHTTP()
            try:
                state = await planner.topic_state()
                for partition, leader in state.leaders.items():
                    await http.create_channel(leader.http, topic, partition, channel)
                    await http.set_channel_offset(leader.http, topic, partition, channel,
                                                  f"virtual_queue:{state.ends[partition].start}")
            finally:
                await planner.close()
                await http.close()

        self.ha.run(reset())

    def close(self) -> None:
        self.ha.close()
        if self.real is not None:
            self.real.stop()


def busy_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy (not idle or waiting on I/O), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


_CATEGORIES = ("java", "python", "nsqd", "nsqlookupd", "etcd")


def cpu_by_process_kind() -> dict[str, float]:
    """CPU seconds used so far by the live processes of each kind (Spark's JVMs, Python: this
    driver and Spark's Python workers, the nsqd, ...), by their /proc command name."""
    from fastnsq.benchmark import process_cpu_seconds

    found = dict.fromkeys(_CATEGORIES, 0.0)
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            name = comm.read_text()
        except OSError:
            continue
        kind = next((k for k in _CATEGORIES if name.startswith(k)), None)
        seconds = process_cpu_seconds(int(comm.parent.name)) if kind is not None else None
        if kind is not None and seconds is not None:
            found[kind] += seconds
    return found


def run_query(spark: Any, cluster: Cluster, topic: str, partitions: int, source: str, expected: int, work: Path,
              timeout: float) -> dict[str, Any]:
    reader = (spark.readStream.format("nsq").option("lookupd", cluster.ha.lookupd_http).option("topic", topic)
              .option("maxRecordsPerBatch", str(BATCH_ROWS)))
    if source == "offsets":
        reader = reader.option("readMode", "offsets").option("channel", "bench")
    else:
        channel = f"drv{int(time.time() * 1000) % 10**9}"
        cluster.reset_channel(topic, channel)
        # The same window for every partition count: 64 connections in all (each partition is
        # an endpoint of its own), 2,500 RDY each (nsqd's max) = maxInFlight 160,000.
        connections = max(1, 64 // partitions)
        reader = (reader.option("ha", "true").option("channel", channel).option("maxInFlight", "160000")
                  .option("connectionsPerNsqd", str(connections)).option("numPartitions", "2"))
    stream = reader.load()
    checkpoint = tempfile.mkdtemp(dir=work)
    started, cpu_started, kinds_started = time.monotonic(), busy_cpu_seconds(), cpu_by_process_kind()
    query = stream.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    marks: list[tuple[float, int]] = []  # (when a batch ended, rows so far)
    seen_batches: set[int] = set()
    rows = 0
    try:
        deadline = started + timeout
        while rows < expected and time.monotonic() < deadline:
            for progress in query.recentProgress:
                batch = progress["batchId"]
                if batch not in seen_batches and progress["numInputRows"]:
                    seen_batches.add(batch)
                    rows += int(progress["numInputRows"])
                    marks.append((time.monotonic(), rows))
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.05)
    finally:
        cpu = busy_cpu_seconds() - cpu_started
        kinds = cpu_by_process_kind()
        query.stop()
    if rows < expected:
        raise RuntimeError(f"{source}: {rows} of {expected} rows within {timeout} s")
    first_end, first_rows = marks[0]
    last_end = marks[-1][0]
    steady = (rows - first_rows) / (last_end - first_end) if last_end > first_end else float("nan")
    return {"rows": rows, "batches": len(marks), "steady": steady, "with_startup": rows / (last_end - started),
            "seconds": last_end - started, "cpu_seconds": cpu, "cpu_us_per_row": cpu / rows * 1e6,
            "cpu_us_per_row_by_process": {k: (kinds[k] - kinds_started[k]) / rows * 1e6 for k in kinds}}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--real-ha", default=None, metavar="BIN", help="youzan's nsqd/nsqlookupd folder")
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--masters", nargs="+", default=["local", "standalone"], choices=["local", "standalone"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()

    from tests.spark_cluster import SparkStandalone

    work = Path(tempfile.mkdtemp(prefix="bench-spark-offsets-"))
    cluster = Cluster(args.real_ha)
    runs: list[dict[str, Any]] = []
    try:
        topics = {}
        for partitions in args.partitions:
            topic = f"bso{partitions}_{int(time.time()) % 100000}"
            cluster.ha.create_topic(topic, partitions)
            per = args.messages // partitions
            body = b"x" * args.size
            for partition in range(partitions):
                cluster.ha.publish(topic, partition, [body] * per)
            topics[partitions] = (topic, per * partitions)
        for master in args.masters:
            standalone = None
            if master == "standalone":
                standalone = SparkStandalone(work / "spark", workers=args.workers, cores=1, memory="1500m")
                standalone.start()
            spark = spark_session(standalone.master_url if standalone else "local[2]")
            try:
                for round_no in range(args.rounds):
                    for partitions, (topic, expected) in topics.items():
                        order = ("offsets", "driver") if (round_no + partitions) % 2 == 0 else ("driver", "offsets")
                        for source in order:
                            result = run_query(spark, cluster, topic, partitions, source, expected, work, args.timeout)
                            result.update(master=master, partitions=partitions, source=source, round=round_no)
                            runs.append(result)
                            print(f"{master:10} p={partitions} {source:7} round {round_no}: steady "
                                  f"{result['steady']:9,.0f} rows/s, with start-up {result['with_startup']:9,.0f} "
                                  f"({result['batches']} batches, {result['seconds']:.1f} s, machine CPU "
                                  f"{result['cpu_us_per_row']:.1f} us/row: " + ", ".join(
                                      f"{k} {v:.1f}" for k, v in result["cpu_us_per_row_by_process"].items())
                                  + ")", flush=True)
            finally:
                spark.stop()
                if standalone is not None:
                    standalone.stop()
    finally:
        cluster.close()
    table = summarize(runs)
    for line in table:
        print(line)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"spark-offsets-{time.strftime('%Y%m%d-%H%M')}.json"
        out.write_text(json.dumps({
            "server": cluster.version, "cluster": "etcd + youzan nsqlookupd + 3 youzan nsqd, replicas 2" if args.real_ha
            else "embedded HA cluster, 3 nodes", "messages": args.messages, "size": args.size,
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "argv": sys.argv, "runs": runs, "table": table}, indent=1))
        print(f"wrote {out}")
    return 0


def _median(runs: list[dict[str, Any]], key: tuple[str, int, str], field: str) -> float:
    return statistics.median(r[field] for r in runs if (r["master"], r["partitions"], r["source"]) == key)


def summarize(runs: list[dict[str, Any]]) -> list[str]:
    lines = [("| master | partitions | offsets steady | driver steady | ratio | offsets with start-up | "
              "driver with start-up | ratio |"), "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for master, partitions in sorted({(r["master"], r["partitions"]) for r in runs}):
        o_s, d_s = (_median(runs, (master, partitions, s), "steady") for s in ("offsets", "driver"))
        o_w, d_w = (_median(runs, (master, partitions, s), "with_startup") for s in ("offsets", "driver"))
        lines.append(f"| {master} | {partitions} | {o_s:,.0f} | {d_s:,.0f} | {o_s / d_s:.2f}x | {o_w:,.0f} | "
                     f"{d_w:,.0f} | {o_w / d_w:.2f}x |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
