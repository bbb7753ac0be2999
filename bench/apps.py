"""nsq's apps beside fastnsq's: nsq_to_file / to-file, nsq_to_nsq / to-nsq, nsq_to_http / to-http.

Each measurement: a fresh real nsqd (``--mem-queue-size=10000000``) pre-filled with
``--count`` messages of ``--size`` bytes on one topic, then one app started with the same
flags (``--max-in-flight``, ``--sync-interval``...) and timed from its start until nsqd's
channel is drained (depth 0, nothing in flight: every message FINed, which each app does only
once the output holds it). CPU seconds of the app (every process of it) and of nsqd (and of
the destination nsqd for to-nsq) are read from /proc. Go and fastnsq alternate within each
round, and the order flips every round; medians over ``--rounds``.

The cases: ``file`` (plain), ``file-gzip`` (``--gzip --gzip-level 1`` for both; the topic's
bodies are distinct numbers and, once drained, the files are read back by ``gzip -dc`` and by
Python's gzip, untimed: every body a line, or the run fails),
``file-parquet`` (ours only, ``--format parquet --rotate-size 32MiB``: files finished from their
spools while it runs; its rate beside plain to-file's, and ``rate_to_exit`` counting the stop
that finishes the last file; the topic's bodies are distinct numbers and, once drained, the
files are read back by pyarrow and by Spark, untimed: the same count and bodies, or the run fails), ``nsq`` (into
a second real nsqd), ``http`` (``--post`` to a sink answering 200, ``-n 100``, a request per
message for both) and ``http-batch`` (ours with ``--batch 100``, beside Go's one request per
message). The sink is nginx (one worker, keep-alive, ``return 200``), or an aiohttp server
with ``--sink aiohttp``.

    .venv/bin/python bench/apps.py --rounds 3 --out bench/results/apps-DATE.json
    .venv/bin/python bench/apps.py --cases file --count 20000 --rounds 1      # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastnsq.benchmark import process_cpu_seconds, process_tree
from fastnsq.testing import drain
from fastnsq.testing.process import NSQDProcess, free_port

REAL_NSQD_FLAGS = ("--mem-queue-size=10000000",)
TOPIC = "bench"
CASES = ("file", "file-gzip", "file-parquet", "nsq", "http", "http-batch")
OURS_ONLY = ("http-batch", "file-parquet")  # Go's nsq_to_file has no Parquet, nsq_to_http no batch
GO_BINARY = {"file": "nsq_to_file", "nsq": "nsq_to_nsq", "http": "nsq_to_http"}

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 65;
    client_body_buffer_size 1m;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok"; }}
    }}
}}
"""

AIOHTTP_SINK = """\
import sys
from aiohttp import web
async def answer(request):
    await request.read()
    return web.Response(text="ok")
app = web.Application()
app.router.add_route("*", "/{tail:.*}", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


# ---- the servers -------------------------------------------------------------------------------


def start_nsqd(binary: str) -> NSQDProcess:
    nsqd = NSQDProcess(*REAL_NSQD_FLAGS, binary=binary)
    nsqd.start()
    return nsqd


def fill(address: str, count: int, size: int, *, distinct: bool = False) -> None:
    """``count`` bodies of ``size`` bytes on TOPIC, in MPUBs of 5,000 (before the channel exists:
    the channel the app makes then takes them all, as nsqd copies a topic's backlog to its first one).
    ``distinct``: body i is i, zero-padded to ``size`` digits (to check what was written)."""
    import asyncio

    from fastnsq import Producer

    async def publish() -> None:
        body = b"x" * size
        async with Producer([address]) as producer:
            for start in range(0, count, 5000):
                stop = min(count, start + 5000)
                await producer.mpublish(TOPIC, [str(i).zfill(size).encode() for i in range(start, stop)]
                                        if distinct else [body] * (stop - start))

    asyncio.run(publish())


def channel_state(http_port: int, channel: str) -> tuple[int, int, int]:
    """(depth, in flight, messages the channel took) of TOPIC/channel, from nsqd's /stats."""
    url = f"http://127.0.0.1:{http_port}/stats?format=json&topic={TOPIC}&channel={channel}"
    with urllib.request.urlopen(url, timeout=5) as response:
        stats = json.load(response)
    for topic in stats.get("topics") or []:
        for found in topic.get("channels") or []:
            if found["channel_name"] == channel:
                return found["depth"], found["in_flight_count"], found["message_count"]
    return -1, -1, 0


class Sink:
    """The HTTP server both apps post to."""

    def __init__(self, kind: str) -> None:
        self.kind, self.port = kind, free_port()
        self.folder = tempfile.mkdtemp(prefix="bench-sink-")
        if kind == "nginx":
            conf = Path(self.folder) / "nginx.conf"
            conf.write_text(NGINX_CONF.format(prefix=self.folder, port=self.port))
            argv = [shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(conf), "-p", self.folder]
        else:
            script = Path(self.folder) / "sink.py"
            script.write_text(AIOHTTP_SINK)
            argv = [sys.executable, str(script), str(self.port)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=1).read()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the {kind} sink did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


# ---- one measurement ---------------------------------------------------------------------------


def app_command(case: str, impl: str, args: argparse.Namespace, source: str, extra: dict[str, str]) -> list[str]:
    """The command line of one app: the same flags, in Go's one-dash spelling, for both."""
    kind = case.split("-")[0]
    flags = [f"-topic={TOPIC}", f"-nsqd-tcp-address={source}", f"-max-in-flight={args.max_in_flight}"]
    if kind == "file":
        flags += [f"-output-dir={extra['dir']}", f"-sync-interval={args.sync_interval}"]
        if case == "file-gzip":
            flags += ["-gzip", f"-gzip-level={args.gzip_level}"]
        elif case == "file-parquet":  # rotated during the run: files are finished while it archives
            flags += ["-format=parquet", f"-rotate-size={args.parquet_rotate_size}"]
    elif kind == "nsq":
        flags += [f"-destination-nsqd-tcp-address={extra['destination']}"]
    else:
        flags += [f"-post={extra['url']}", f"-n={args.n}"]
        if case == "http-batch" and impl == "fastnsq":
            flags += [f"-batch={args.batch}"]
    if impl == "go":
        return [str(Path(args.go_bin).expanduser() / GO_BINARY[kind]), *flags]
    return [sys.executable, "-m", "fastnsq", f"to-{kind}", *flags]


def measure(case: str, impl: str, args: argparse.Namespace, sink: Sink | None) -> dict[str, Any]:
    kind = case.split("-")[0]
    nsqd = start_nsqd(args.nsqd_bin)
    destination = start_nsqd(args.nsqd_bin) if kind == "nsq" else None
    folder = tempfile.mkdtemp(prefix="bench-apps-", dir=args.work_dir)
    try:
        source = f"127.0.0.1:{nsqd.tcp_port}"
        fill(source, args.count, args.size, distinct=case in ("file-parquet", "file-gzip"))
        extra = {"dir": folder, "url": f"http://127.0.0.1:{sink.port}/in" if sink else "",
                 "destination": f"127.0.0.1:{destination.tcp_port}" if destination else ""}
        channel = {"file": "nsq_to_file", "nsq": "nsq_to_nsq", "http": "nsq_to_http"}[kind]
        nsqd_cpu0 = process_cpu_seconds(nsqd.pid or 0) or 0.0
        dest_cpu0 = process_cpu_seconds(destination.pid or 0) or 0.0 if destination else 0.0
        log = open(Path(folder).parent / f"bench-apps-{case}-{impl}.log", "wb")  # noqa: SIM115 - closed below
        began = time.perf_counter()
        app = subprocess.Popen(app_command(case, impl, args, source, extra), stdout=log, stderr=log,
                               start_new_session=True)
        pids: list[int] = []
        deadline = began + args.timeout
        while True:
            time.sleep(0.02)
            # The channel starts empty and takes the topic's backlog as nsqd pumps it over:
            # done when it took every message and holds none (fastnsq.testing.drain).
            if drain.channel_drained_sync(f"127.0.0.1:{nsqd.http_port}", TOPIC, channel, published=args.count):
                break
            if app.poll() is not None or time.perf_counter() > deadline:
                depth, in_flight, taken = channel_state(nsqd.http_port, channel)
                raise RuntimeError(f"{impl} {case}: exited or timed out (took {taken}, depth {depth}, in flight "
                                   f"{in_flight}); see {log.name}")
        elapsed = time.perf_counter() - began
        pids = process_tree(app.pid)
        app_cpu = sum(process_cpu_seconds(pid) or 0.0 for pid in pids)
        nsqd_cpu = (process_cpu_seconds(nsqd.pid or 0) or 0.0) - nsqd_cpu0
        dest_cpu = (process_cpu_seconds(destination.pid or 0) or 0.0) - dest_cpu0 if destination else 0.0
        stopping = time.perf_counter()
        app.send_signal(signal.SIGTERM)
        app.wait(60)
        stop_s = time.perf_counter() - stopping  # Parquet: the last file finished from its spool
        log.close()
        checked = read_back_parquet(folder, args.count, args.size) if case == "file-parquet" else \
            read_back_gzip(folder, args.count, args.size) if case == "file-gzip" else {}
        return {**checked,
            "case": case, "impl": impl, "count": args.count, "seconds": elapsed, "rate": args.count / elapsed,
            "app_cpu_s": app_cpu, "app_us_per_msg": app_cpu / args.count * 1e6,
            "nsqd_cpu_s": nsqd_cpu, "nsqd_us_per_msg": nsqd_cpu / args.count * 1e6,
            "destination_nsqd_cpu_s": dest_cpu, "processes": len(pids),
            "stop_s": stop_s, "rate_to_exit": args.count / (elapsed + stop_s),
        }
    finally:
        nsqd.close()
        if destination is not None:
            destination.close()
        shutil.rmtree(folder, ignore_errors=True)


def read_back_gzip(folder: str, count: int, size: int) -> dict[str, Any]:
    """The gzip files read back twice, untimed: by ``gzip -dc`` (the readers nsq_to_file's files
    have) and by Python's :mod:`gzip`; each must give exactly the ``count`` distinct bodies fill()
    published, a line each (or RuntimeError)."""
    import gzip

    names = sorted(name for name in os.listdir(folder) if name.endswith(".gz"))
    expected = [str(i).zfill(size).encode() for i in range(count)]
    by_tool: list[bytes] = []
    by_python: list[bytes] = []
    for name in names:
        path = os.path.join(folder, name)
        by_tool += subprocess.run(["gzip", "-dc", path], check=True, capture_output=True).stdout.splitlines()
        with gzip.open(path, "rb") as file:
            by_python += file.read().splitlines()
    for reader, lines in (("gzip -dc", by_tool), ("Python's gzip", by_python)):
        if sorted(lines) != expected:
            raise RuntimeError(f"{reader} read {len(lines)} lines from {len(names)} file(s) in {folder}, "
                               f"not the {count} bodies published")
    return {"gzip_files": len(names), "gzip_d_lines": len(by_tool), "python_gzip_lines": len(by_python)}


def read_back_parquet(folder: str, count: int, size: int) -> dict[str, Any]:
    """The Parquet files read by pyarrow and by Spark: ``count`` rows whose bodies are exactly
    the numbers 0 .. count-1 fill() published (pyarrow compares every body; Spark counts the
    rows and the distinct numbers within range), or RuntimeError."""
    import pyarrow.dataset as ds

    began = time.perf_counter()
    bodies = ds.dataset(folder, format="parquet").to_table(columns=["body"]).column("body").to_pylist()
    expected = [str(i).zfill(size).encode() for i in range(count)]
    if len(bodies) != count or sorted(bodies) != expected:
        raise RuntimeError(f"pyarrow read {len(bodies)} rows from {folder}, not the {count} bodies published")
    pyarrow_s = time.perf_counter() - began
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").appName("bench-apps-parquet")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        began = time.perf_counter()
        numbers = spark.read.parquet(folder).selectExpr("CAST(CAST(body AS STRING) AS BIGINT) AS n",
                                                        "length(body) AS size")
        row = numbers.agg(F.count("*").alias("rows"), F.count("n").alias("parsed"), F.min("size").alias("shortest"),
                          F.count_distinct(F.when((F.col("n") >= 0) & (F.col("n") < count), F.col("n")))
                          .alias("distinct")).first()
        spark_s = time.perf_counter() - began
    finally:
        spark.stop()
    rows, parsed, shortest, distinct = row["rows"], row["parsed"], row["shortest"], row["distinct"]
    if not rows == parsed == distinct == count or shortest != size:
        raise RuntimeError(f"Spark read {rows} rows, {parsed} numbers, {distinct} distinct in range, the shortest "
                           f"body {shortest} bytes; published {count} distinct numbers of {size} bytes")
    files = len([name for name in os.listdir(folder) if name.endswith(".parquet")])
    if any(name.startswith(".") for name in os.listdir(folder)):
        raise RuntimeError(f"{folder}: a spool or a temporary file left after the app stopped")
    return {"parquet_files": files, "pyarrow_rows": len(bodies), "spark_rows": rows, "spark_distinct": distinct,
            "pyarrow_read_s": pyarrow_s, "spark_read_s": spark_s}


# ---- the rounds ---------------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for case in dict.fromkeys(r["case"] for r in results):
        medians: dict[str, dict[str, float]] = {}
        for impl in ("go", "fastnsq"):
            mine = [r for r in results if r["case"] == case and r["impl"] == impl]
            if mine:
                medians[impl] = {key: statistics.median(r[key] for r in mine)
                                 for key in ("rate", "app_us_per_msg", "nsqd_us_per_msg")}
        row = {"case": case, **{f"{impl}_{k}": v for impl, m in medians.items() for k, v in m.items()}}
        if len(medians) == 2:
            row["speedup"] = medians["fastnsq"]["rate"] / medians["go"]["rate"]
        rows.append(row)
    plain = next((r for r in rows if r["case"] == "file" and "fastnsq_rate" in r), None)
    for row in rows:  # Parquet's rate beside plain to-file's and nsq_to_file's (Go has no Parquet)
        if row["case"] == "file-parquet" and plain is not None and "fastnsq_rate" in row:
            row["of_plain_to_file"] = row["fastnsq_rate"] / plain["fastnsq_rate"]
            mine = [r for r in results if r["case"] == "file-parquet"]
            row["fastnsq_rate_to_exit"] = statistics.median(r["rate_to_exit"] for r in mine)
            row["parquet_files"] = statistics.median(r["parquet_files"] for r in mine)
            if "go_rate" in plain:
                row["of_nsq_to_file"] = row["fastnsq_rate"] / plain["go_rate"]
                row["to_exit_of_nsq_to_file"] = row["fastnsq_rate_to_exit"] / plain["go_rate"]
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':<11} {'go msg/s':>10} {'ours msg/s':>11} {'x':>6} {'go us/msg':>10} {'ours us/msg':>12} "
          f"{'nsqd us/msg go/ours':>20}")
    for row in rows:
        print(f"{row['case']:<11} {row.get('go_rate', 0):>10,.0f} {row.get('fastnsq_rate', 0):>11,.0f} "
              f"{row.get('speedup', 0):>6.2f} {row.get('go_app_us_per_msg', 0):>10.2f} "
              f"{row.get('fastnsq_app_us_per_msg', 0):>12.2f} "
              f"{row.get('go_nsqd_us_per_msg', 0):>9.2f} / {row.get('fastnsq_nsqd_us_per_msg', 0):<8.2f}"
              + (f"  ({row['of_plain_to_file']:.2f}x plain to-file's rate)" if "of_plain_to_file" in row else "")
              + (f"  ({row['of_nsq_to_file']:.2f}x nsq_to_file's; to the last file finished "
                 f"{row['fastnsq_rate_to_exit']:,.0f} msg/s, {row['to_exit_of_nsq_to_file']:.2f}x)"
                 if "of_nsq_to_file" in row else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nsqd-bin", default=os.path.expanduser("~/nsq-real/bin/nsqd"))
    parser.add_argument("--go-bin", default="~/nsq-real/bin", help="the folder of nsq_to_file, nsq_to_nsq, nsq_to_http")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--http-count", type=int, default=0, help="messages for the http cases (default --count)")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--sync-interval", default="1s")
    parser.add_argument("--gzip-level", type=int, default=1)
    parser.add_argument("--parquet-rotate-size", type=int, default=32 << 20,
                        help="file-parquet's --rotate-size: a few files finished during the run (default 32 MiB)")
    parser.add_argument("--n", type=int, default=100, help="concurrent requests (nsq_to_http's -n)")
    parser.add_argument("--batch", type=int, default=100, help="to-http --batch in the http-batch case")
    parser.add_argument("--sink", choices=("nginx", "aiohttp"), default="nginx")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--work-dir", default=None, help="where the files go (default: the system's temp dir)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    results: list[dict[str, Any]] = []
    sink = Sink(args.sink) if any(c.startswith("http") for c in cases) else None
    try:
        for round_index in range(args.rounds):
            order = ("go", "fastnsq") if round_index % 2 == 0 else ("fastnsq", "go")
            for case in cases:
                for impl in order:
                    if case in OURS_ONLY and impl == "go":
                        continue  # Go has no batch (its number is the http case's) and no Parquet
                    run_args = argparse.Namespace(**vars(args))
                    if case.startswith("http") and args.http_count:
                        run_args.count = args.http_count
                    result = measure(case, impl, run_args, sink)
                    result["round"] = round_index
                    results.append(result)
                    print(f"round {round_index} {case:<10} {impl:<8} {result['rate']:>10,.0f} msg/s  "
                          f"app {result['app_us_per_msg']:.2f} us/msg  nsqd {result['nsqd_us_per_msg']:.2f} us/msg"
                          + (f"  {result['parquet_files']} files, stop {result['stop_s']:.2f} s"
                             if "parquet_files" in result else ""), flush=True)
    finally:
        if sink is not None:
            sink.close()
    for result in results:  # http-batch's Go line is the http case's (a request per message)
        if result["case"] == "http" and result["impl"] == "go" and "http-batch" in cases:
            results.append({**result, "case": "http-batch"})
    rows = summarize(results)
    print_table(rows)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "when": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": {k: v for k, v in vars(args).items()},
            "nsqd": "1.3.0 (real)", "summary": rows, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
