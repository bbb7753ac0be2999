"""A Spark driver run as a subprocess by tests/test_spark.py: nsq -> foreachBatch -> parquet.

The test SIGKILLs this process tree in the middle of a micro-batch and starts it
again on the same checkpoint. Each micro-batch is written to its own directory
(``<out>/batch=<id>``, overwritten when Spark re-runs the batch), then the batch
sleeps ``--batch-sleep`` seconds, so a kill lands inside a batch. The job stops by
itself once ``--expect`` distinct ids are in the output.

Lines on stdout (flushed) tell the test where it is: ``READY``, ``BATCH_START <id> <rows>``,
``BATCH_WRITTEN <id> <rows>`` (its parquet is on disk, Spark has not committed the batch),
``BATCH_DONE <id> <rows>``, ``DONE <distinct ids>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nsqd", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=200)
    parser.add_argument("--msg-timeout-ms", type=int, default=3000)
    parser.add_argument("--batch-sleep", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=150.0)
    args = parser.parse_args()

    import pyarrow.dataset as ds
    from pyspark.sql import SparkSession

    from fastnsq.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fastnsq-spark-job")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    done = threading.Event()

    def distinct_ids() -> int:
        if not os.path.isdir(args.out):
            return 0
        table = ds.dataset(args.out, format="parquet", partitioning="hive").to_table(columns=["id"])
        return len(set(table.column("id").to_pylist()))

    def handle(batch_df, batch_id: int) -> None:
        rows = batch_df.count()
        print(f"BATCH_START {batch_id} {rows}", flush=True)
        if rows:
            batch_df.select("id", "body", "attempts").write.mode("overwrite").parquet(
                os.path.join(args.out, f"batch={batch_id}")
            )
        print(f"BATCH_WRITTEN {batch_id} {rows}", flush=True)
        time.sleep(args.batch_sleep)
        print(f"BATCH_DONE {batch_id} {rows}", flush=True)
        seen = distinct_ids()
        if seen >= args.expect:
            print(f"DONE {seen}", flush=True)
            done.set()

    stream = (
        spark.readStream.format("nsq")
        .option("nsqd", args.nsqd)
        .option("topic", args.topic)
        .option("channel", args.channel)
        .option("maxRecordsPerBatch", str(args.max_batch))
        .option("maxInFlight", str(args.max_batch * 2))
        .option("msgTimeoutMs", str(args.msg_timeout_ms))
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(handle)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    print("READY", flush=True)
    finished = done.wait(args.timeout)
    query.stop()
    spark.stop()
    return 0 if finished else 3


if __name__ == "__main__":
    sys.exit(main())
