"""The operator's run of ``fastnsq to-file --format parquet`` (issue 48), with kills, checked by DuckDB and Spark.

A fresh nsqd (real, ``--nsqd-bin``; or the embedded one with ``--embedded``), ``to-file``
started with the flags given after ``--``, then ``--count`` JSON orders (~100 bytes, each with
its number ``n``) published at ``--rate`` msg/s. ``--kill-at N,...``: SIGKILL the app (every
process of it) once N messages are published, then start it again at once; with
``--kill-on rotation`` the kill waits for the next "rotating" line of the app's log after N
(a file then being finished, or about to be). Once nsqd's channel is drained the app gets
SIGTERM; then every file is opened (its footer read), and DuckDB and Spark count the rows and
the distinct numbers: lost = published - distinct, duplicates = rows - distinct. Prints one
JSON document (files, sizes, counts, log lines).

    .venv/bin/python bench/parquet_archive.py --count 100000 --rate 2500 -- --rotate-interval 1m
    .venv/bin/python bench/parquet_archive.py --count 100000 --rate 2500 --msg-timeout 10s \\
        --kill-at 20000,40000,60000,80000 --kill-on rotation -- --rotate-size 1000000 --sync-interval 2s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.apps import TOPIC
from fastnsq.benchmark import process_tree
from fastnsq.testing import drain
from fastnsq.testing.process import NSQDProcess

CHANNEL = "archive"


def order(n: int) -> bytes:
    return json.dumps({"n": n, "user": f"u{n % 997}", "sku": f"sku-{n % 5003:05d}", "qty": n % 7 + 1,
                       "price": round((n % 10000) / 100, 2)}, separators=(",", ":")).encode()


class App:
    """to-file as the operator runs it, restartable."""

    def __init__(self, address: str, out: str, flags: list[str], log: Path) -> None:
        self.argv = [sys.executable, "-m", "fastnsq", "to-file", f"--topic={TOPIC}", f"--channel={CHANNEL}",
                     f"--nsqd-tcp-address={address}", f"--output-dir={out}", "--format=parquet", *flags]
        self.log, self.out = log, out
        self.process: subprocess.Popen[bytes] | None = None
        self.kills: list[dict[str, Any]] = []

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=out, start_new_session=True, cwd=ROOT)

    def kill(self, published: int) -> None:
        assert self.process is not None
        for pid in reversed(process_tree(self.process.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        # What the kill left: more than one spool, a rotated one not finished yet (killed during
        # a rotation); a temporary file, a Parquet file being written.
        left = sorted(p.name for p in Path(self.out).rglob(".*") if p.is_file())
        self.kills.append({"published": published, "spools": sum(n.endswith(".spool") for n in left),
                           "tmp_files": sum(n.endswith(".tmp") for n in left)})

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(120)


async def publish(address: str, count: int, rate: float, app: App, kills: list[int], kill_on: str) -> float:
    """``count`` orders at ``rate`` msg/s (an MPUB every 10 ms), killing and restarting ``app`` at ``kills``."""
    from fastnsq import Producer

    began = time.monotonic()
    step = max(1, int(rate / 100))
    pending = sorted(kills)
    async with Producer([address]) as producer:
        for start in range(0, count, step):
            due = began + start / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await producer.mpublish(TOPIC, [order(n) for n in range(start, min(count, start + step))])
            if pending and start + step >= pending[0]:
                pending.pop(0)
                if kill_on == "rotation":
                    await _wait_for_rotation(app)
                app.kill(start + step)
                app.start()
    return time.monotonic() - began


async def _wait_for_rotation(app: App, timeout: float = 60.0) -> None:
    seen = app.log.read_text(errors="replace").count("rotating...")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if app.log.read_text(errors="replace").count("rotating...") > seen:
            return
        await asyncio.sleep(0.002)


def check(out: str, count: int) -> dict[str, Any]:
    import duckdb
    import pyarrow.parquet as pq

    files = sorted(Path(out).rglob("*.parquet"))
    sizes = [p.stat().st_size for p in files]
    row_groups = [pq.read_metadata(p).num_row_groups for p in files]  # every footer read: every file readable
    leftovers = sorted(str(p) for p in Path(out).rglob(".*") if p.is_file())
    source = f"read_parquet('{out}/**/*.parquet', hive_partitioning = true)"
    rows, distinct, in_range = duckdb.connect().execute(
        f"SELECT count(*), count(DISTINCT n), count(DISTINCT n) FILTER (WHERE n BETWEEN 0 AND {count - 1}) "
        f"FROM (SELECT CAST(json_extract(decode(body), '$.n') AS BIGINT) AS n FROM {source})").fetchall()[0]
    spark = spark_counts(out, count)
    return {"files": len(files), "sizes": sizes, "total_bytes": sum(sizes), "row_groups": row_groups,
            "names": [str(p.relative_to(out)) for p in files], "leftovers": leftovers,
            "duckdb": {"rows": rows, "distinct": distinct, "lost": count - in_range, "duplicates": rows - distinct},
            "spark": spark}


def spark_counts(out: str, count: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").appName("parquet-archive")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        numbers = spark.read.parquet(out).select(
            F.get_json_object(F.col("body").cast("string"), "$.n").cast("bigint").alias("n"))
        row = numbers.agg(F.count("*").alias("rows"), F.count_distinct("n").alias("distinct"),
                          F.count_distinct(F.when(F.col("n").between(0, count - 1), F.col("n"))).alias("in_range")
                          ).first()
    finally:
        spark.stop()
    return {"rows": row["rows"], "distinct": row["distinct"], "lost": count - row["in_range"],
            "duplicates": row["rows"] - row["distinct"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nsqd-bin", default=os.path.expanduser("~/nsq-real/bin/nsqd"))
    parser.add_argument("--embedded", action="store_true", help="fastnsq's embedded nsqd instead")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=2500.0)
    parser.add_argument("--kill-at", default="", help="comma-separated message counts")
    parser.add_argument("--kill-on", choices=("now", "rotation"), default="now")
    parser.add_argument("--keep", action="store_true", help="keep the output folder")
    parser.add_argument("--msg-timeout", default="", help="the app's msg_timeout (e.g. 10s: a killed app's "
                        "messages come back sooner; default nsqd's 60s)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then to-file's flags")
    args = parser.parse_args()
    flags = [f for f in args.flags if f != "--"]
    nsqd = NSQDProcess(binary=None if args.embedded else args.nsqd_bin)
    nsqd.start()
    folder = tempfile.mkdtemp(prefix="parquet-archive-")
    out, log = os.path.join(folder, "out"), Path(folder) / "to-file.log"
    try:
        address = f"127.0.0.1:{nsqd.tcp_port}"
        timeout = [f"--consumer-opt=msg_timeout,{args.msg_timeout}"] if args.msg_timeout else []
        app = App(address, out, [*timeout, *flags], log)
        app.start()
        time.sleep(2)  # started and subscribed: the channel takes every message
        kills = [int(k) for k in args.kill_at.split(",") if k]
        publish_s = asyncio.run(publish(address, args.count, args.rate, app, kills, args.kill_on))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if drain.channel_drained_sync(f"127.0.0.1:{nsqd.http_port}", TOPIC, CHANNEL, published=args.count):
                break
            time.sleep(0.2)
        status = app.stop()
        text = log.read_text(errors="replace")
        lines = text.splitlines()
        result = {"count": args.count, "rate": args.rate, "flags": flags, "nsqd": "embedded" if args.embedded
                  else args.nsqd_bin, "publish_s": round(publish_s, 2), "exit_status": status, "kills": app.kills,
                  "log_lines": len(lines), "log_by_level": {lvl: sum(f" {lvl}" in line for line in lines)
                                                            for lvl in ("DEBUG", "INFO", "WARNING", "ERROR")},
                  "restart_lines": [line.split("] ", 1)[-1] for line in lines if "earlier run" in line],
                  **check(out, args.count)}
        print(json.dumps(result, indent=1))
        return 0
    finally:
        nsqd.close()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print("kept", folder, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
