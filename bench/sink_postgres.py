"""Ingestion at the sink's limit (issue 59): NSQ into PostgreSQL against the database's own rate.

A real nsqd (``--bin``: nsqd v1.3.0, its default flags but the addresses and a data path of its
own) and a PostgreSQL started by the bench (tests/pgserver.py: Debian's binaries, initdb into a
temporary folder, its defaults: fsync and synchronous_commit on), a table of 7 columns keyed on
``id``, ``--count`` JSON events of about 165 B. Per batch size (``--batches``) and process count
(1 and 2), four ways, each its own 1,000,000 rows into the emptied table:

* ``ceiling-user``: the user's handler below (``Ingest``: an asyncpg pool, COPY of records into a
  temporary staging table, ``INSERT ... ON CONFLICT DO NOTHING``), no NSQ: each process takes
  its share of the events from memory, ``--concurrency`` batches at once;
* ``worker``: ``fastnsq worker sink_postgres:Ingest --batch B,0.25 --processes P`` (the defaults
  plus --processes: the worker's own --concurrency and max in flight), the topic pre-filled;
* ``ceiling-app``: to-postgres's handler (``fastnsq.apps.to_postgres.ToPostgres``), no NSQ, as above;
* ``to-postgres``: ``fastnsq to-postgres --batch-size B --processes P`` (its defaults otherwise).

The NSQ runs are timed from the first poll of nsqd's ``/stats`` that sees a message taken to
the one that sees the channel drained (every message finished, so committed); the ceilings
from their processes' first batch to their last commit. Rounds alternate the order; medians.
Each run checks the table: rows = distinct ids = ``--count`` (0 lost). CPU per row: each
process's user+system seconds over the run (the app's processes, nsqd's, PostgreSQL's; the
ceilings' app and PostgreSQL). From those, each row's "machine bound": the rows/s this machine's
cores could give at that CPU per row, every core busy. Where the NSQ path's bound is below 0.9 x
the measured ceiling, the cores shared by the app, nsqd and the database stop it, not the client.

    python bench/sink_postgres.py --bin ~/nsq-real/bin --rounds 3 [--count 1000000]

Writes ``bench/results/sink_postgres-<date>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

TABLE = ("CREATE TABLE IF NOT EXISTS events (id bigint PRIMARY KEY, ts timestamptz NOT NULL, user_id text, "
         "kind text, value double precision, session text, page text)")
COLUMNS = ["id", "ts", "user_id", "kind", "value", "session", "page"]


def event(i: int) -> bytes:
    """One event, about 165 bytes of JSON."""
    return (b'{"id":%d,"ts":"2026-11-29T10:%02d:%02d.%06dZ","user_id":"user-%07d","kind":"page_view",'
            b'"value":%d.25,"session":"s-%012x","page":"/products/%05d/reviews?sort=recent"}'
            % (i, i // 60 % 60, i % 60, i % 1000000, i % 9999991, i % 1000, i * 2654435761 % (1 << 48), i % 99991))


# ---- the user's handler (what the services write by hand) ---------------------------------


class Ingest:
    """An async batch handler: COPY into a staging table, then INSERT ... ON CONFLICT DO NOTHING."""

    async def setup(self) -> None:
        import asyncpg

        async def stage(conn: Any) -> None:
            await conn.execute("CREATE TEMP TABLE IF NOT EXISTS stage (LIKE events) ON COMMIT DELETE ROWS")

        self.pool = await asyncpg.create_pool(os.environ["BENCH_DSN"], min_size=4, max_size=4, init=stage)

    async def handle(self, batch: Any) -> None:
        records = []
        for message in batch:
            d = json.loads(message.body)
            records.append((d["id"], datetime.fromisoformat(d["ts"]), d["user_id"], d["kind"], d["value"],
                            d["session"], d["page"]))
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.copy_records_to_table("stage", records=records, columns=COLUMNS)
            await conn.execute("INSERT INTO events SELECT * FROM stage ON CONFLICT (id) DO NOTHING")

    async def teardown(self) -> None:
        await self.pool.close()


# ---- a ceiling process: the same handler, the events from memory ----------------------------------


class _Message:
    __slots__ = ("body", "has_responded")
    address = "memory"

    def __init__(self, body: bytes) -> None:
        self.body, self.has_responded = body, False

    def finish(self) -> None:
        self.has_responded = True

    requeue = touch = finish


async def _ceiling_child(kind: str, first: int, stop: int, batch: int, concurrency: int) -> None:
    from fastnsq.apps.to_postgres import ToPostgres

    handler: Any = Ingest() if kind == "user" else ToPostgres(
        dsn=os.environ["BENCH_DSN"], table="events", key="id", concurrency=concurrency)
    await handler.setup()
    batches = [[_Message(event(i)) for i in range(start, min(stop, start + batch))] for start in range(first, stop, batch)]
    queue = iter(batches)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu0, began = time.process_time(), time.time()

    async def lane() -> None:
        for messages in queue:
            await handler.handle(messages)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    ended, cpu = time.time(), time.process_time() - cpu0
    print(json.dumps({"began": began, "ended": ended, "cpu": cpu, "rows": stop - first}), flush=True)
    # The pool's backends stay until the bench has read their CPU seconds: a process gone has none.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await handler.teardown()


async def ceiling(kind: str, processes: int, args: argparse.Namespace, env: dict[str, str],
                  servers: dict[str, Any]) -> dict[str, Any]:
    from fastnsq.benchmark import process_tree

    share = -(-args.count // processes)
    children = []
    for index in range(processes):
        first, stop = index * share, min(args.count, (index + 1) * share)
        children.append(await asyncio.create_subprocess_exec(
            sys.executable, __file__, "ceiling-child", kind, str(first), str(stop), str(args.batch),
            str(args.concurrency), env=env, cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    for child in children:
        assert child.stdout is not None
        assert (await child.stdout.readline()).strip() == b"ready"
    postgres_cpu0 = _cpu(process_tree(servers["postgres"].process.pid))
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        await child.stdin.drain()
    reports = []
    for child in children:
        assert child.stdout is not None
        reports.append(json.loads(await child.stdout.readline()))
    # A backend the pool opened after the start (to-postgres's pool connects as it goes) spent
    # all its CPU seconds within the run.
    postgres_cpu1 = _cpu(process_tree(servers["postgres"].process.pid))
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"done\n")
        await child.stdin.drain()
        await child.wait()
    duration = max(r["ended"] for r in reports) - min(r["began"] for r in reports)
    postgres_cpu = sum(cpu - postgres_cpu0.get(pid, 0.0) for pid, cpu in postgres_cpu1.items())
    return {"rate": args.count / duration, "duration": duration,
            "cpu_us_per_row": {"app": sum(r["cpu"] for r in reports) / args.count * 1e6,
                               "postgres": postgres_cpu / args.count * 1e6}}


# ---- an NSQ run: the worker or to-postgres, on a pre-filled topic --------------------------------


async def prefill(address: str, topic: str, count: int) -> None:
    from fastnsq import Producer

    async with Producer([address]) as producer:
        for start in range(0, count, 1000):
            await producer.mpublish(topic, [event(i) for i in range(start, min(count, start + 1000))])


async def left(session: Any, http_address: str, topic: str) -> int:
    async with session.get(f"http://{http_address}/stats", params={"format": "json", "topic": topic}) as resp:
        data = await resp.json(content_type=None)
    topics = [t for t in data.get("topics") or [] if t["topic_name"] == topic]
    channels = [c for t in topics for c in t["channels"] if c["channel_name"] == "bench"]
    held = sum(c["depth"] + c["in_flight_count"] + c["deferred_count"] for c in channels)
    return sum(t["depth"] for t in topics) + held + (0 if channels else 10**12)


def _cpu(pids: list[int]) -> dict[int, float]:
    from fastnsq.benchmark import process_cpu_seconds

    return {pid: process_cpu_seconds(pid) or 0.0 for pid in pids}


async def through_nsq(way: str, processes: int, args: argparse.Namespace, env: dict[str, str],
                      servers: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    from fastnsq.benchmark import process_tree
    from fastnsq.testing import drain

    nsqd, postgres = servers["nsqd"], servers["postgres"]
    topic = f"sink_{os.getpid()}_{time.monotonic_ns()}"
    began = time.monotonic()
    await prefill(nsqd.tcp_address, topic, args.count)
    prefill_seconds = time.monotonic() - began
    common = ["--topic", topic, "--channel", "bench", "--nsqd-tcp-address", nsqd.tcp_address,
              "--processes", str(processes)]
    if way == "worker":
        command = [sys.executable, "-m", "fastnsq", "worker", "sink_postgres:Ingest", *common,
                   "--batch", f"{args.batch},0.25", "--log-level", "WARNING", *args.worker_arg]
    else:
        command = [sys.executable, "-m", "fastnsq", "to-postgres", *common, "--dsn", postgres.dsn, "--table",
                   "events", "--key", "id", "--batch-size", str(args.batch), "--log-level", "warn"]
    app = await asyncio.create_subprocess_exec(*command, cwd=HERE, env=env)
    try:
        async with aiohttp.ClientSession() as session:
            t0 = None
            cpu0: dict[int, float] = {}
            pids: dict[str, list[int]] = {}
            while True:
                remaining = await left(session, nsqd.http_address, topic)
                now = time.perf_counter()
                if t0 is None and remaining < args.count:
                    t0, taken0 = now, args.count - remaining
                    tree = process_tree(app.pid)
                    pids = {"supervisor": tree[:1], "app": tree[1:], "nsqd": [nsqd.pid],
                            "postgres": process_tree(postgres.process.pid)}
                    cpu0 = _cpu([p for group in pids.values() for p in group])
                if remaining == 0 and await drain.channel_drained([nsqd.http_address], topic, "bench",
                                                                  published=args.count):
                    t1 = now
                    break
                if app.returncode is not None:
                    raise SystemExit(f"{way} exited with {app.returncode}")
                await asyncio.sleep(0.05)
            # A backend opened after t0 (to-postgres's pool connects as it goes, or reconnects) spent
            # all its CPU seconds within the run; one that ended before t1 is left out.
            pids["postgres"] = sorted(set(pids["postgres"]) | set(process_tree(postgres.process.pid)))
            cpu1 = _cpu([p for group in pids.values() for p in group])
        rows_run = args.count - taken0
        cpu = {group: sum(cpu1[p] - cpu0.get(p, 0.0) for p in members if cpu1[p] >= cpu0.get(p, 0.0)) / rows_run * 1e6
               for group, members in pids.items()}
        app.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(app.wait(), 120)
    finally:
        if app.returncode is None:
            app.kill()
    return {"rate": rows_run / (t1 - t0), "duration": t1 - t0, "cpu_us_per_row": cpu, "exit_status": status,
            "prefill_seconds": prefill_seconds}


# ---- rounds -------------------------------------------------------------------------------------

WAYS = ("ceiling-user", "worker", "ceiling-app", "to-postgres")


async def one(way: str, processes: int, args: argparse.Namespace, env: dict[str, str],
              servers: dict[str, Any]) -> dict[str, Any]:
    postgres = servers["postgres"]
    postgres.psql("TRUNCATE events")
    postgres.psql("CHECKPOINT")
    load = os.getloadavg()[0]
    if way.startswith("ceiling"):
        run = await ceiling(way.split("-")[1], processes, args, env, servers)
    else:
        run = await through_nsq(way, processes, args, env, servers)
    rows, distinct = map(int, postgres.psql("SELECT count(*), count(DISTINCT id) FROM events").split("|"))
    return {"way": way, "processes": processes, "batch": args.batch, **run, "rows": rows, "distinct": distinct,
            "lost": args.count - distinct, "load_average_1m": load}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from fastnsq.testing.process import NSQDProcess
    from tests.pgserver import PostgresServer

    postgres = PostgresServer()
    postgres.start()
    nsqd = NSQDProcess(*args.nsqd_flag, binary=Path(args.bin).expanduser() / "nsqd")
    nsqd.start()
    servers = {"nsqd": nsqd, "postgres": postgres}
    root = Path(args.root).resolve()  # the fastnsq the NSQ runs import (another checkout: a before/after)
    env = {**os.environ, "BENCH_DSN": postgres.dsn,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), str(HERE), os.environ.get("PYTHONPATH")]))}
    results: dict[str, Any] = {"runs": [], "nsqd_argv": nsqd.argv(nsqd.tcp_address, nsqd.http_address),
                               "postgres": postgres.psql("SELECT version()")}
    try:
        postgres.psql(TABLE)
        for round_index in range(args.rounds):
            for batch in args.batches:
                for processes in args.processes:
                    ways = args.ways if round_index % 2 == 0 else tuple(reversed(args.ways))
                    for way in ways:
                        args.batch = batch
                        run = await one(way, processes, args, env, servers)
                        run["round"] = round_index
                        results["runs"].append(run)
                        print(json.dumps(run), flush=True)
    finally:
        nsqd.stop()
        postgres.remove()
    return results


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for batch in sorted({r["batch"] for r in results["runs"]}):
        for processes in sorted({r["processes"] for r in results["runs"]}):
            runs = {way: [r for r in results["runs"] if r["way"] == way and r["batch"] == batch
                          and r["processes"] == processes] for way in WAYS}
            median = {way: statistics.median(r["rate"] for r in found) for way, found in runs.items() if found}
            for way, ceiling_way in (("worker", "ceiling-user"), ("to-postgres", "ceiling-app")):
                if not (runs[way] and runs[ceiling_way]):
                    continue
                cpu = {group: statistics.median(r["cpu_us_per_row"][group] for r in runs[way])
                       for group in runs[way][0]["cpu_us_per_row"]}
                ceiling_cpu = {group: statistics.median(r["cpu_us_per_row"].get(group, float("nan"))
                                                        for r in runs[ceiling_way])
                               for group in runs[ceiling_way][0]["cpu_us_per_row"]}
                rows.append({
                    "batch": batch, "processes": processes, "way": way, "median_rate": median[way],
                    "ceiling": ceiling_way, "median_ceiling": median[ceiling_way],
                    "ratio": median[way] / median[ceiling_way], "rates": [round(r["rate"]) for r in runs[way]],
                    "ceiling_rates": [round(r["rate"]) for r in runs[ceiling_way]],
                    "cpu_us_per_row": cpu,
                    "ceiling_cpu_us_per_row": ceiling_cpu,
                    "machine_bound_rows_per_s": {"way": machine_bound(cpu), "ceiling": machine_bound(ceiling_cpu)},
                    "lost": sum(r["lost"] for r in runs[way]), "exit_0": all(r["exit_status"] == 0 for r in runs[way]),
                })
    return rows


def machine_bound(cpu_us_per_row: dict[str, float]) -> float:
    """Rows/s with every core of this machine busy at the measured CPU per row of every process taking part.

    The NSQ path's processes (the app's, nsqd's, PostgreSQL's) share the machine's cores with the
    database, so where this bound is below 0.9 x the ceiling the machine, not the client, stops the run.
    """
    return (os.cpu_count() or 1) * 1e6 / sum(v for v in cpu_us_per_row.values() if not math.isnan(v))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ceiling-child":
        sys.path.insert(0, str(ROOT))
        kind, first, stop, batch, concurrency = sys.argv[2], *map(int, sys.argv[3:7])
        asyncio.run(_ceiling_child(kind, first, stop, batch, concurrency))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="folder with the real nsqd")
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, nargs="+", default=[400, 1000])
    parser.add_argument("--concurrency", type=int, default=4, help="the ceilings' batches at once per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    parser.add_argument("--nsqd-flag", action="append", default=[],
                        help="a flag for nsqd (default: none but its addresses and data path; e.g. "
                             "--nsqd-flag=--max-rdy-count=5000)")
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="one more argument for fastnsq worker (--worker-arg=--concurrency --worker-arg=2)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--root", default=str(ROOT), help="the fastnsq checkout the NSQ runs use (default this one)")
    parser.add_argument("--out", default=str(HERE / "results" / f"sink_postgres-{time.strftime('%Y-%m-%d-%H%M')}.json"))
    args = parser.parse_args()
    results = asyncio.run(bench(args))
    results["summary"] = summarize(results)
    results["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "shared": True}
    results["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "batch")}
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    for row in results["summary"]:
        bound = row["machine_bound_rows_per_s"]
        print(f"batch {row['batch']:>5} x{row['processes']} {row['way']:<12} {row['median_rate']:>9,.0f} rows/s "
              f"/ {row['ceiling']} {row['median_ceiling']:>9,.0f} = {row['ratio']:.2f}  lost {row['lost']}  "
              f"cpu us/row {json.dumps({k: round(v, 1) for k, v in row['cpu_us_per_row'].items()})} "
              f"ceiling's {json.dumps({k: round(v, 1) for k, v in row['ceiling_cpu_us_per_row'].items()})}; "
              f"all {os.cpu_count()} cores busy would give {bound['way']:,.0f} / {bound['ceiling']:,.0f} rows/s "
              f"(at most {bound['way'] / row['median_ceiling']:.2f} of the measured ceiling)")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
