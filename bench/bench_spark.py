"""Throughput of the `nsq` Spark data source on this machine: source into parquet, DataFrame into nsqd.

The embedded nsqd (fastnsq.testing) runs alone in a child process; Spark runs
``local[2]`` in this one, bound to 127.0.0.1. Bodies are ``--size`` bytes (100).

- ``source``: ``--messages`` are published first (untimed); then
  ``spark.readStream.format("nsq")`` -> parquet file sink (default trigger: a new
  micro-batch as soon as the last one ends). Reported: messages per second from
  ``start()`` to the moment nsqd has them all FINed ("with startup"), and the same
  after the first non-empty micro-batch ("steady": the first one also starts the
  Python workers and takes the whole in-flight window at once). Throughput is bounded by
  the messages held in flight per batch: ``--max-in-flight`` over
  ``--connections`` connections (nsqd caps RDY at 2500 per connection).
- ``sink``: a cached DataFrame of ``--rows`` rows is written with
  ``df.write.format("nsq")``, ``--repeat`` times; the first run is cold (Python
  workers start), the best of the others is "warm". Rows per second, counted only
  after ``save()`` returned (every MPUB answered OK).

Prints a table and writes JSON to bench/results/. Example::

    /work/venv/bin/python bench/bench_spark.py                     # both, 160,000 in flight
    /work/venv/bin/python bench/bench_spark.py --only source --max-in-flight 2500 --connections 1
    /work/venv/bin/python bench/bench_spark.py --only sink --rows 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from fastnsq.testing import drain
from fastnsq.testing.process import NSQDProcess


def start_nsqd(bin_dir: str | None) -> NSQDProcess:
    """An nsqd in a child process (so its CPU is not this process's GIL): fastnsq's embedded
    one, or a real one from ``bin_dir``."""
    if bin_dir is None:
        nsqd = NSQDProcess("--msg-timeout", "120")
    else:
        nsqd = NSQDProcess(*REAL_NSQD_FLAGS, binary=Path(bin_dir).expanduser() / "nsqd")
    nsqd.start()
    return nsqd


def describe(nsqd: NSQDProcess) -> str:
    """What the results say of the server: the embedded one, or the real one's /info version."""
    if not nsqd.real:
        return "fastnsq's embedded nsqd (fastnsq.testing, one child process), msg_timeout 120 s"
    with urllib.request.urlopen(f"http://{nsqd.http_address}/info", timeout=10) as response:
        version = json.loads(response.read())["version"]
    return f"nsqd {version} (real, {nsqd.describe()})"


def topic_stats(nsqd: NSQDProcess, topic: str) -> dict[str, Any]:
    url = f"http://{nsqd.http_address}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as response:
        topics = json.loads(response.read()).get("topics") or []
    return topics[0] if topics else {}


def delete_topic(nsqd: NSQDProcess, topic: str) -> None:
    request = urllib.request.Request(f"http://{nsqd.http_address}/topic/delete?topic={topic}", method="POST")
    try:
        urllib.request.urlopen(request, timeout=10).read()
    except OSError:
        pass


def create_channel(nsqd: NSQDProcess, topic: str, channel: str) -> None:
    _post(f"http://{nsqd.http_address}/topic/create?topic={topic}")
    _post(f"http://{nsqd.http_address}/channel/create?topic={topic}&channel={channel}")


#: The real nsqd's flags: every message of the runs in memory (the issue's setting).
REAL_NSQD_FLAGS = ["--mem-queue-size=2000000"]


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10).read()


def publish(address: str, topic: str, count: int, size: int) -> float:
    """Fill ``topic`` (untimed for the source benchmark); returns messages per second."""
    import asyncio

    from fastnsq import Producer
    from fastnsq.loop import run

    body = b"x" * size

    async def main() -> None:
        async with Producer([address]) as producer:
            batch = [body] * 2000
            pending = []
            for sent in range(0, count, len(batch)):
                pending.append(asyncio.ensure_future(producer.mpublish(topic, batch[: min(len(batch), count - sent)])))
                if len(pending) >= 16:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)

    started = time.perf_counter()
    run(main())
    return count / (time.perf_counter() - started)


def spark_session(shuffle_partitions: int = 2) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fastnsq-bench")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def bench_source(spark: Any, nsqds: list[NSQDProcess], args: argparse.Namespace) -> dict[str, Any]:
    """``--messages`` split evenly over the nsqds, read by one query (option nsqd lists them all)."""
    topic = f"bench_src_{os.getpid()}_{int(time.time())}"
    if args.channel_first:
        for nsqd in nsqds:
            create_channel(nsqd, topic, "spark")
    # Without --channel-first there is no channel yet: nsqd keeps the messages in the topic
    # and hands them to the first channel.
    shares = [args.messages * (i + 1) // len(nsqds) - args.messages * i // len(nsqds) for i in range(len(nsqds))]
    fill = [publish(nsqd.tcp_address, topic, share, args.size) for nsqd, share in zip(nsqds, shares)]
    work = Path(tempfile.mkdtemp(prefix="fastnsq-bench-"))
    available_now = args.trigger == "available-now"
    try:
        stream = (
            spark.readStream.format("nsq")
            .option("nsqd", ",".join(n.tcp_address for n in nsqds))
            .option("nsqdHttp", ",".join(n.http_address for n in nsqds))
            .option("topic", topic)
            .option("channel", "spark")
            .option("maxInFlight", str(args.max_in_flight))
            .option("connectionsPerNsqd", str(args.connections))
            .option("numPartitions", str(args.partitions))
            .option("readMode", args.read_mode)
            .option("rowTransport", args.row_transport)
            .load()
        )
        started = time.perf_counter()
        writer = stream.select("id", "body", "timestamp").writeStream.format(args.sink)
        if args.sink == "parquet":
            writer = writer.option("path", str(work / "out"))
        if available_now:
            writer = writer.trigger(availableNow=True)
        query = writer.option("checkpointLocation", str(work / "checkpoint")).start()
        first_batch: float | None = None
        done_at: float | None = None
        stopped_by_itself = False
        deadline = started + args.timeout
        while time.perf_counter() < deadline:
            progress = query.lastProgress
            if first_batch is None and progress and progress.get("numInputRows", 0) > 0:
                # lastProgress reports a batch after it ended: back-date to its start.
                first_batch = time.perf_counter() - progress["durationMs"].get("triggerExecution", 0) / 1000
            if available_now:
                if not query.isActive:
                    done_at, stopped_by_itself = time.perf_counter(), True
                    break
            elif drain.channel_drained_sync([n.http_address for n in nsqds], topic, "spark", published=args.messages):
                done_at = time.perf_counter()
                break
            time.sleep(0.05)
        progress = query.recentProgress
        query.stop()
        if done_at is None:
            raise RuntimeError(f"the source did not finish {args.messages} messages within {args.timeout} s")
        batches = [p for p in progress if p.get("numInputRows", 0) > 0]
        if args.verbose:
            for p in batches:
                print(p["batchId"], p["numInputRows"], p["durationMs"], flush=True)
        rows = distinct = None
        if args.sink == "parquet":
            written = spark.read.parquet(str(work / "out"))
            rows, distinct = written.count(), written.select("id").distinct().count()
        channels = [_channel(nsqd, topic) for nsqd in nsqds]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for nsqd in nsqds:
            delete_topic(nsqd, topic)
    # Steady: after the first non-empty batch (which also starts the Python workers and
    # fills the whole in-flight window at once), until nsqd has every message FINed.
    first = batches[0] if batches else None
    steady_rows = args.messages - (first["numInputRows"] if first else 0)
    steady_from = (first_batch or started) + (first["durationMs"]["triggerExecution"] / 1000 if first else 0)
    startup = (first_batch or started) - started
    return {
        "messages": args.messages,
        "trigger": args.trigger,
        "channel_before_publishing": args.channel_first,
        "rows_written": rows,
        "distinct_ids_written": distinct,
        "stopped_by_itself": stopped_by_itself if available_now else None,
        "channel_after": {k: sum(c.get(k, 0) for c in channels) for k in  # summed over the nsqds
                          ("depth", "in_flight_count", "deferred_count", "message_count", "requeue_count",
                           "timeout_count")},
        "msg_per_s_steady": steady_rows / max(1e-9, done_at - steady_from),
        "msg_per_s_with_startup": args.messages / (done_at - started),
        "seconds_to_first_batch": startup,
        "seconds": done_at - started,
        "micro_batches": len(batches),
        "mean_batch_rows": sum(p["numInputRows"] for p in batches) / max(1, len(batches)),
        # Spark's own timings per micro-batch (ms): the JVM's warm-up shows in the first ones.
        "batches": [{"batch": p["batchId"], "rows": p["numInputRows"], "duration_ms": p["durationMs"]}
                    for p in batches],
        "publish_msg_per_s": sum(fill) / len(fill),
    }


def _channel(nsqd: NSQDProcess, topic: str) -> dict[str, Any]:
    return next(iter(topic_stats(nsqd, topic).get("channels") or []), {})


def bench_sink(spark: Any, nsqd: NSQDProcess, args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    body = F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit("x" * (args.size - 12))).cast("binary")
    df = spark.range(args.rows, numPartitions=args.partitions).select(body.alias("body")).cache()
    assert df.count() == args.rows
    runs = []
    for run in range(args.repeat):
        topic = f"bench_sink_{os.getpid()}_{run}"
        started = time.perf_counter()
        df.write.format("nsq").mode("append").option("nsqd", nsqd.tcp_address).option("topic", topic).save()
        elapsed = time.perf_counter() - started
        published = topic_stats(nsqd, topic).get("message_count", 0)
        if published != args.rows:
            raise RuntimeError(f"run {run}: nsqd has {published} messages, expected {args.rows}")
        runs.append(args.rows / elapsed)
        delete_topic(nsqd, topic)
    df.unpersist()
    return {
        "rows": args.rows,
        "rows_per_s_cold": runs[0],
        "rows_per_s_warm": max(runs[1:]) if len(runs) > 1 else runs[0],
        "runs_rows_per_s": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("source", "sink"), default=None)
    parser.add_argument("--messages", type=int, default=1_000_000, help="source: messages to read")
    parser.add_argument("--rows", type=int, default=2_000_000, help="sink: rows to write per run")
    parser.add_argument("--size", type=int, default=100, help="body size in bytes")
    parser.add_argument("--max-in-flight", type=int, default=160_000, help="source option maxInFlight")
    parser.add_argument("--connections", type=int, default=64, help="source option connectionsPerNsqd")
    parser.add_argument("--partitions", type=int, default=2, help="source numPartitions / sink partitions")
    parser.add_argument("--sink", choices=("parquet", "noop"), default="parquet",
                        help="source: where the stream goes (noop measures the source alone)")
    parser.add_argument("--row-transport", choices=("plan", "tcp"), default="plan",
                        help="source option rowTransport: rows inside the plan, or fetched by the read tasks over TCP")
    parser.add_argument("--read-mode", choices=("partitioned", "simple"), default="partitioned",
                        help="source option readMode")
    parser.add_argument("--repeat", type=int, default=3, help="sink runs (the first is cold)")
    parser.add_argument("--trigger", choices=("default", "available-now"), default="default",
                        help="source: Spark's default trigger, or Trigger.AvailableNow (must stop by itself)")
    parser.add_argument("--channel-first", action="store_true",
                        help="source: create the channel before publishing (else the backlog waits in the topic)")
    parser.add_argument("--nsqds", type=int, default=1,
                        help="source: this many nsqd, the messages split evenly (sink: the first one)")
    parser.add_argument("--real", default=None, metavar="BIN",
                        help=f"a real nsqd from this folder, started with {' '.join(REAL_NSQD_FLAGS)}")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/")
    parser.add_argument("--verbose", action="store_true", help="print each micro-batch's rows and durations")
    args = parser.parse_args()

    nsqds: list[NSQDProcess] = []
    results: dict[str, Any] = {}
    try:
        for _ in range(args.nsqds):
            nsqds.append(start_nsqd(args.real))
        nsqd = nsqds[0]
        spark = spark_session()
        import pyspark

        if args.only in (None, "sink"):
            results["sink"] = bench_sink(spark, nsqd, args)
        if args.only in (None, "source"):
            results["source"] = bench_source(spark, nsqds, args)
        spark.stop()
    finally:
        server = "; ".join(describe(n) for n in nsqds)
        for n in nsqds:
            n.close()

    print(f"\nfastnsq Spark data source, {args.size}-byte bodies, PySpark {pyspark.__version__}, "
          f"local[2], {os.cpu_count()} CPUs; server: {server}")
    if "source" in results:
        r = results["source"]
        print(f"  source -> {args.sink:<7} : {r['msg_per_s_steady']:>10,.0f} msg/s steady   "
              f"({r['msg_per_s_with_startup']:,.0f} with startup; {r['micro_batches']} batches of "
              f"~{r['mean_batch_rows']:,.0f}; {args.nsqds} nsqd, maxInFlight={args.max_in_flight}, "
              f"connectionsPerNsqd={args.connections}, rowTransport={args.row_transport})")
        print(f"    trigger {r['trigger']}: {r['rows_written']} rows, {r['distinct_ids_written']} distinct ids, "
              f"first batch after {r['seconds_to_first_batch']:.1f} s, stopped by itself: {r['stopped_by_itself']}; "
              f"channel after: {r['channel_after']}")
    if "sink" in results:
        r = results["sink"]
        print(f"  DataFrame -> nsqd : {r['rows_per_s_warm']:>10,.0f} rows/s warm     "
              f"({r['rows_per_s_cold']:,.0f} cold; {r['rows']:,} rows, {args.partitions} partitions)")
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        record = {
            "benchmark": "bench_spark",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {"cpus": os.cpu_count(), "processor": platform.machine()},
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "args": vars(args),
            "server": server,
            "results": results,
            "command": " ".join([os.path.relpath(sys.executable, ROOT), "bench/bench_spark.py", *sys.argv[1:]]),
        }
        path = RESULTS / f"bench_spark_{stamp}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"  wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
