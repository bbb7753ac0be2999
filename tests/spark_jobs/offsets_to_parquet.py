"""A Spark driver run as a subprocess by tests/test_spark_cluster.py: nsq readMode=offsets -> parquet.

Trigger.AvailableNow into Spark's file sink, on the master given (the standalone cluster).
The test SIGKILLs this process tree after a micro-batch has committed and runs it again on
the same checkpoint, after more messages were published. Each row passes a pause of
``--pause`` s per Arrow batch, so the kill lands mid-stream. Prints ``READY`` and, at the end,
``DONE <rows written this run>``.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--lookupd", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-batch", type=int, default=20_000)
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    spark = (
        SparkSession.builder.master(args.master)
        .appName("fastnsq-offsets-job")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    pause = args.pause

    def slow(batches):  # type: ignore[no-untyped-def]
        import time

        for batch in batches:
            time.sleep(pause)
            yield batch

    stream = (
        spark.readStream.format("nsq").option("lookupd", args.lookupd).option("topic", args.topic)
        .option("channel", "job").option("readMode", "offsets").option("maxRecordsPerBatch", str(args.max_batch))
        .load()
    )
    rows = stream.select("partition", "offset", "body").mapInArrow(slow, "partition int, offset bigint, body binary")
    query = (
        rows.writeStream.format("parquet").option("path", args.out).option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True).start()
    )
    print("READY", flush=True)
    query.awaitTermination()
    written = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    print(f"DONE {written}", flush=True)
    spark.stop()
    return 0 if query.exception() is None else 3


if __name__ == "__main__":
    sys.exit(main())
