"""Issue 37's acceptance runs of ``readMode=offsets`` on the real youzan cluster, with Spark on a standalone cluster.

1. ``--messages`` (default 1,000,000) bodies published over 4 partitions, each unique.
2. A batch read (``spark.read``) of the offset window ``startingOffsets`` .. ``endingOffsets``
   (JSON: each partition's first message .. its end) into parquet, and a streaming read of the same
   window (``Trigger.AvailableNow``, ``maxOffsetsPerTrigger``) into parquet: compared row for
   row on (partition, offset, body) with ``exceptAll`` both ways, and counted.
3. The streaming read's progress: the lag (``maxOffsetsBehindLatest`` and the sum of
   ``offsetsBehindLatest`` in the source's ``latestOffset``) per micro-batch, falling to 0.
4. ``minPartitions=16`` against the default 4 read tasks: the same window into parquet (rows
   compared with the batch read's) and ``--rounds`` alternated timed reads into Spark's ``noop``.

Results go to ``bench/results/spark-kafka-options-<date>.json`` with the load average. Example::

    .venv/bin/python bench/bench_spark_kafka_options.py --real-ha ~/nsq-real/ha/bin --base-port 20500
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from bench.bench_spark_offsets import busy_cpu_seconds, spark_session

PARTITIONS = 4


def start_cluster(real_ha: str | None, base_port: int) -> tuple[Any, Any]:
    real = None
    if real_ha:
        from fastnsq.testing.real import RealHACluster

        real = RealHACluster(Path(real_ha).expanduser(), standalone=False, base_port=base_port)
        real.start()
        os.environ.update(real.environment())
    from tests.spark_ha import ThreadedHACluster

    return real, ThreadedHACluster()


def window(ha: Any, topic: str) -> tuple[dict[str, int], dict[str, int]]:
    """Each partition's first message and its end, as startingOffsets / endingOffsets JSON."""
    from fastnsq.spark._offsets import OffsetPlanner
    from fastnsq.spark._options import parse_source

    async def ask() -> tuple[dict[str, int], dict[str, int]]:
        planner = OffsetPlanner(parse_source({"lookupd": ha.lookupd_http, "topic": topic, "channel": "b",
                                              "readMode": "offsets"}))
        try:
            start = await planner.initial()
            state = await planner.topic_state()
        finally:
            await planner.close()
        return ({str(p): pos.offset for p, pos in start.items()},
                {str(p): e.end for p, e in state.ends.items()})

    return ha.run(ask())


def reader(spark: Any, ha: Any, topic: str, batch: bool, **options: Any) -> Any:
    r = spark.read if batch else spark.readStream
    r = (r.format("nsq").option("lookupd", ha.lookupd_http).option("topic", topic).option("channel", "bko")
         .option("readMode", "offsets"))
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load().select("partition", "offset", "body")


def timed(what: str, run: Any) -> dict[str, Any]:
    load = os.getloadavg()
    started, cpu = time.monotonic(), busy_cpu_seconds()
    result = run()
    took = time.monotonic() - started
    out = {"what": what, "seconds": took, "machine_cpu_seconds": busy_cpu_seconds() - cpu, "load_before": load,
           "load_after": os.getloadavg()}
    if isinstance(result, dict):
        out.update(result)
    print(json.dumps(out), flush=True)
    return out


def stream_window(spark: Any, ha: Any, topic: str, win: dict[str, str], out: Path, per_trigger: int) -> dict[str, Any]:
    query = (reader(spark, ha, topic, False, maxOffsetsPerTrigger=per_trigger, **win).writeStream.format("parquet")
             .option("path", str(out / "data")).option("checkpointLocation", str(out / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    lag = []
    for progress in query.recentProgress:
        latest = progress["sources"][0].get("latestOffset")
        latest = json.loads(latest) if isinstance(latest, str) else latest
        if latest:
            lag.append({"batch": progress["batchId"], "rows": progress["numInputRows"],
                        "behind": sum(latest["offsetsBehindLatest"].values()),
                        "maxOffsetsBehindLatest": latest["maxOffsetsBehindLatest"]})
    return {"lag_by_batch": lag}


def compare(spark: Any, a: Path, b: Path) -> dict[str, int]:
    left, right = spark.read.parquet(str(a)), spark.read.parquet(str(b))
    return {"rows_a": left.count(), "rows_b": right.count(), "distinct_a": left.select("partition", "offset").distinct().count(),
            "a_not_b": left.exceptAll(right).count(), "b_not_a": right.exceptAll(left).count()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--real-ha", default=None, metavar="BIN")
    parser.add_argument("--base-port", type=int, default=0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from tests.spark_cluster import SparkStandalone

    work = Path(tempfile.mkdtemp(prefix="bench-kafka-options-"))
    real, ha = start_cluster(args.real_ha, args.base_port)
    results: dict[str, Any] = {"argv": sys.argv, "server": real.version if real else "embedded",
                               "messages": args.messages, "size": args.size, "partitions": PARTITIONS,
                               "cpus": os.cpu_count(), "machine": platform.machine(), "steps": []}
    standalone = None
    try:
        topic = f"bko_{int(time.time()) % 100000}"
        ha.create_topic(topic, PARTITIONS)
        per = args.messages // PARTITIONS
        pad = b"x" * max(0, args.size - 16)
        for partition in range(PARTITIONS):
            ha.publish(topic, partition, [b"%d-%07d-" % (partition, i) + pad for i in range(per)], chunk=2_000)
        start, end = window(ha, topic)
        win = {"startingOffsets": json.dumps(start), "endingOffsets": json.dumps(end)}
        results["window"] = win
        standalone = SparkStandalone(work / "spark", workers=args.workers, cores=1, memory="1500m")
        standalone.start()
        spark = spark_session(standalone.master_url)
        standalone.wait_for_executors(args.workers)
        steps = results["steps"]
        steps.append(timed("batch read of the window -> parquet (4 tasks)", lambda: reader(
            spark, ha, topic, True, **win).write.parquet(str(work / "batch"))))
        steps.append(timed(f"streaming read of the window -> parquet (AvailableNow, maxOffsetsPerTrigger "
                           f"{args.per_trigger})", lambda: stream_window(spark, ha, topic, win, work / "stream",
                                                                         args.per_trigger)))
        steps.append(timed("batch minPartitions=16 -> parquet", lambda: reader(
            spark, ha, topic, True, minPartitions=16, **win).write.parquet(str(work / "split"))))
        results["tasks"] = {"default": reader(spark, ha, topic, True, **win).rdd.getNumPartitions(),
                            "minPartitions=16": reader(spark, ha, topic, True, minPartitions=16,
                                                       **win).rdd.getNumPartitions()}
        results["batch_vs_stream"] = compare(spark, work / "batch", work / "stream" / "data")
        results["tasks4_vs_tasks16"] = compare(spark, work / "batch", work / "split")
        print(json.dumps({k: results[k] for k in ("tasks", "batch_vs_stream", "tasks4_vs_tasks16")}), flush=True)
        for round_no in range(args.rounds):
            for split in ((4, 16) if round_no % 2 == 0 else (16, 4)):
                extra = {"minPartitions": 16} if split == 16 else {}
                step = timed(f"noop {split} tasks round {round_no}", lambda extra=extra: reader(
                    spark, ha, topic, True, **extra, **win).write.format("noop").mode("overwrite").save())
                step["rows_per_second"] = args.messages / step["seconds"]
                steps.append(step)
        spark.stop()
    finally:
        if standalone is not None:
            standalone.stop()
        ha.close()
        if real is not None:
            real.stop()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"spark-kafka-options-{time.strftime('%Y%m%d-%H%M')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
