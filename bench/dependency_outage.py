"""A database that goes away (issue 58): seconds from PostgreSQL accepting connections again to full flow.

    python bench/dependency_outage.py --real ~/nsq-real/bin --outages 5,40          # both modes
    python bench/dependency_outage.py --real ~/nsq-real/bin --outages 300 --modes ready

A real nsqd (``--real BIN``, its default flags), the bench's own PostgreSQL 15 cluster
(Debian's binaries, ``--pg-bin``, initdb into a temporary folder and run as the ``postgres``
user on a free port), and ``fastnsq worker ingest:CLASS --processes 2 --batch 400,0.25
--max-in-flight 4000`` with an asyncpg batch handler: COPY into a temporary staging table,
``INSERT ... ON CONFLICT (id) DO NOTHING`` into ``events``. A publisher sends ``--rate``
JSON events a second (~165 B, MPUBs of 50 every 10 ms) the whole run.

For each outage of D seconds, after ``--warmup`` seconds of flow: ``pg_ctl stop -m fast``,
D seconds down, ``pg_ctl start``. The clock starts at the first connection PostgreSQL
accepts (asyncpg, polled every 20 ms) and stops at the first moment from which the
channel's FINs (nsqd's ``/stats``, polled every 50 ms; a FIN is sent after the batch's
commit) run at >= 90 % of the publish rate over the next 0.5 s; ``/readyz`` is polled
every 50 ms (the first 200 after the return). After ``--after`` seconds the run ends and
reports: the rows in ``events`` against the ids published, the messages given up (the
worker's metric), and what nsqd still holds (deferred requeues wait out their delays).

Modes: ``ready`` is the handler with ``ready()`` (a ``SELECT 1`` through its pool: the
consumer's ready_check); ``defaults`` the same handler without it (backoff and requeue
delays as before issue 58); ``go-nsq`` is go-nsq v1.1.0's Consumer with its defaults but
MaxInFlight 4000 (``outage_bench``, built from bench/go/src/gonsq_outage by go_build.py):
2 goroutines write batches of 400 / 250 ms, one multi-row ``INSERT ... ON CONFLICT DO
NOTHING`` each through a minimal hand-written PostgreSQL protocol client (no Go driver can
be fetched here), FIN on success, ``Requeue(-1)`` on failure (go-nsq's backoff). Its
given-up count is its "giving up" log lines; it has no /readyz. ``consumer`` is the plain
``Consumer`` (one process, no worker): ``batches(400, 0.25)``, the same handler and
``ready_check=ready``, ``max_in_flight`` 4000.

Writes bench/results/dependency_outage-<date>.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastnsq import Producer
from fastnsq.testing.process import free_port
from fastnsq.testing.real import RealNSQDServer, version_of

HANDLER = r'''
import json, os
import asyncpg

DSN = os.environ["INGEST_DSN"]
STAGING = ("CREATE TEMP TABLE IF NOT EXISTS staging (id bigint, ts double precision, payload text) "
           "ON COMMIT DELETE ROWS")


class Ingest:
    """COPY into a staging table, INSERT ... ON CONFLICT DO NOTHING: the issue's handler."""

    async def setup(self):
        self.pool = await asyncpg.create_pool(DSN, min_size=1, max_size=4)

    async def teardown(self):
        await self.pool.close()

    async def handle(self, batch):
        rows = []
        for message in batch:
            event = json.loads(message.body)
            rows.append((event["id"], event["ts"], event["payload"]))
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute(STAGING)
                await conn.copy_records_to_table("staging", records=rows)
                await conn.execute("INSERT INTO events SELECT * FROM staging ON CONFLICT (id) DO NOTHING")


class IngestReady(Ingest):
    async def ready(self):
        async with self.pool.acquire() as conn:
            await conn.fetchval("SELECT 1")


async def consume(topic, address):
    """The plain Consumer (no worker): batches() and the same handler, one process."""
    import fastnsq

    ingest = IngestReady()
    await ingest.setup()
    async with fastnsq.Consumer(topic, "ingest", nsqd_tcp_addresses=[address], max_in_flight=4000,
                                ready_check=ingest.ready) as consumer:
        async for batch in consumer.batches(400, 0.25):
            try:
                await ingest.handle(batch)
            except Exception:
                batch.requeue()
            else:
                batch.finish()
'''

MODES = {"ready": "ingest:IngestReady", "defaults": "ingest:Ingest", "go-nsq": "", "consumer": ""}


class Postgres:
    """The bench's own cluster: initdb'd into ``root``, run as ``postgres`` on a free port."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin, self.data, self.port = bin_dir, root / "pgdata", free_port()
        self.sockets = root / "pgsock"
        self.log = root / "postgres.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        for folder in (self.data.parent, self.sockets):
            folder.mkdir(exist_ok=True)
            shutil.chown(folder, "postgres", "postgres")
        self.log.touch()
        shutil.chown(self.log, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.sockets}'\n")

    def start(self, wait: bool = True) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w" if wait else "-W",
                  "start")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


async def accepting(dsn: str) -> bool:
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=0.5)
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
        return False
    await conn.close()
    return True


class Publisher:
    def __init__(self, address: str, topic: str, rate: int) -> None:
        self.address, self.topic, self.rate = address, topic, rate
        self.published = 0
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        per_tick, tick = max(1, self.rate // 100), 0.01
        pad = "x" * 110
        async with Producer([self.address]) as producer:
            started = time.monotonic()
            while not self.stopped.is_set():
                bodies = [json.dumps({"id": self.published + i, "ts": time.time(), "payload": pad}).encode()
                          for i in range(per_tick)]
                await producer.mpublish(self.topic, bodies)
                self.published += per_tick
                # Paced from the start: a slow pass is made up, so the rate holds over any second.
                delay = started + self.published / self.rate - time.monotonic()
                await asyncio.sleep(max(0.0, delay if delay < 1 else tick))


async def channel(session: aiohttp.ClientSession, http: str, topic: str, name: str) -> dict[str, Any]:
    async with session.get(f"http://{http}/stats", params={"format": "json", "topic": topic}) as resp:
        stats = await resp.json()
    for entry in stats.get("topics") or []:
        for ch in entry.get("channels", []):
            if ch["channel_name"] == name:
                return dict(ch)
    return {}


async def status(session: aiohttp.ClientSession, port: int, path: str) -> tuple[int, str]:
    try:
        async with session.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=1)) as resp:
            return resp.status, await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return 0, ""


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def one_run(args: argparse.Namespace, mode: str, outage: float, work: Path, pg: Postgres) -> dict[str, Any]:
    import asyncpg

    topic = f"events_{mode}_{int(outage)}_{int(time.time())}"
    conn = await asyncpg.connect(pg.dsn)
    await conn.execute("DROP TABLE IF EXISTS events; "
                       "CREATE TABLE events (id bigint PRIMARY KEY, ts double precision, payload text)")
    await conn.close()
    nsqd = RealNSQDServer(Path(args.real))
    await nsqd.start()
    metrics_port = free_port()
    env = {**os.environ, "INGEST_DSN": pg.dsn,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log_path = work / f"worker-{topic}.log"
    log = log_path.open("wb")
    go = mode in ("go-nsq", "consumer")  # no worker: no /metrics, /readyz
    if mode == "consumer":
        command = [sys.executable, "-c", "import asyncio, sys, ingest; asyncio.run(ingest.consume(*sys.argv[1:]))",
                   topic, nsqd.tcp_address]
    elif go:
        command = [str(args.go_binary), "--nsqd-tcp-address", nsqd.tcp_address, "--topic", topic, "--channel",
                   "ingest", "--pg-address", f"127.0.0.1:{pg.port}", "--max-in-flight", "4000", "--batch", "400",
                   "--max-wait", "250ms", "--writers", "2"]
    else:
        command = [sys.executable, "-m", "fastnsq", "worker", MODES[mode], "--topic", topic, "--channel", "ingest",
                   "--nsqd-tcp-address", nsqd.tcp_address, "--processes", "2", "--batch", "400,0.25",
                   "--max-in-flight", "4000", "--metrics-port", str(metrics_port)]
    worker = await asyncio.create_subprocess_exec(*command, cwd=work, env=env, stdout=log, stderr=log)
    log.close()
    publisher = Publisher(nsqd.tcp_address, topic, args.rate)
    samples: list[tuple[float, int]] = []
    readyz: list[tuple[float, int]] = []
    marks: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession() as session:
            while not (await channel(session, nsqd.http_address, topic, "ingest")).get("clients") if go else \
                    (await status(session, metrics_port, "/healthz"))[0] != 200:
                await asyncio.sleep(0.1)
            feeding = asyncio.create_task(publisher.run())
            stop_watch = asyncio.Event()

            async def watch() -> None:
                while not stop_watch.is_set():
                    now = time.monotonic()
                    ch = await channel(session, nsqd.http_address, topic, "ingest")
                    # nsqd counts FINs per client (the worker's connections live through the outage).
                    samples.append((now, sum(int(c.get("finish_count", 0)) for c in ch.get("clients") or [])))
                    if not go:
                        readyz.append((now, (await status(session, metrics_port, "/readyz"))[0]))
                    await asyncio.sleep(0.05)

            watching = asyncio.create_task(watch())
            await asyncio.sleep(args.warmup)
            marks["stop"] = time.monotonic()
            await asyncio.to_thread(pg.stop)
            marks["stopped"] = time.monotonic()
            await asyncio.sleep(max(0.0, outage - (marks["stopped"] - marks["stop"])))
            marks["start"] = time.monotonic()
            await asyncio.to_thread(pg.start, False)
            while not await accepting(pg.dsn):
                await asyncio.sleep(0.02)
            marks["accepting"] = time.monotonic()
            await asyncio.sleep(args.after)
            publisher.stopped.set()
            await feeding
            # Let the backlog drain (what is deferred in nsqd waits out its delay: counted, not waited for).
            drain_until = time.monotonic() + args.drain
            while time.monotonic() < drain_until:
                ch = await channel(session, nsqd.http_address, topic, "ingest")
                if ch.get("depth", 1) == 0 and ch.get("in_flight_count", 1) == 0:
                    break
                await asyncio.sleep(0.2)
            stop_watch.set()
            await watching
            ch = await channel(session, nsqd.http_address, topic, "ingest")
            _, text = (0, "") if go else await status(session, metrics_port, "/metrics")
    finally:  # a failed run leaves no consumer or nsqd behind
        if worker.returncode is None:
            worker.terminate()
        await worker.wait()
        await nsqd.close()
    conn = await asyncpg.connect(pg.dsn)
    rows = await conn.fetchval("SELECT count(*) FROM events")
    await conn.close()
    held = int(ch.get("depth", 0)) + int(ch.get("in_flight_count", 0)) + int(ch.get("deferred_count", 0))
    accept = marks["accepting"]
    return {
        "mode": mode, "outage_s": outage, "published": publisher.published, "rows": rows,
        # go-nsq logs each message past MaxAttempts ("giving up") and finishes it.
        "given_up": log_path.read_text().count("giving up") + log_path.read_text().count("gave up") if go else metric(
            text, "nsq_consumer_messages_given_up_total"),
        "dead_lettered": metric(text, "nsq_consumer_messages_dead_lettered_total"),
        "still_in_nsqd": held, "deferred": int(ch.get("deferred_count", 0)),
        "requeued": int(ch.get("requeue_count", 0)),
        "missing_rows": publisher.published - rows,
        # At most: a batch committed whose answer was lost is both in the table and deferred in nsqd.
        "lost": max(0, publisher.published - rows - held),
        "fins_per_s_after": [round((c2 - c1) / (t2 - t1)) for (t1, c1), (t2, c2) in itertools.pairwise(samples)
                             if accept - 1 <= t1 <= accept + 3][::4],
        "down_s": round(accept - marks["stop"], 2),
        "first_rows_after_s": first_rows(samples, accept),
        "full_flow_after_s": full_flow(samples, accept, 0.9 * args.rate),
        "readyz_200_after_s": first_after(readyz, accept, 200),
        "readyz_503_during": any(code == 503 for t, code in readyz if marks["stopped"] < t < accept),
    }


def full_flow(samples: list[tuple[float, int]], since: float, rate: float, window: float = 0.5) -> float | None:
    """Seconds from ``since`` to the first sample from which FINs run at ``rate`` over ``window``."""
    for i, (t, count) in enumerate(samples):
        if t < since:
            continue
        for t2, count2 in samples[i + 1:]:
            if t2 - t >= window:
                if (count2 - count) / (t2 - t) >= rate:
                    return round(t - since, 2)
                break
    return None


def first_rows(samples: list[tuple[float, int]], since: float) -> float | None:
    """Seconds from ``since`` to the first sample that counts more FINs than the one before it."""
    for (_, before), (t, count) in itertools.pairwise(samples):
        if t >= since and count > before:
            return round(t - since, 2)
    return None


def first_after(readyz: list[tuple[float, int]], since: float, code: int) -> float | None:
    for t, got in readyz:
        if t >= since and got == code:
            return round(t - since, 2)
    return None


def markdown(result: dict[str, Any]) -> str:
    head = (f"nsqd {result['nsqd']} (default flags), PostgreSQL {result['postgres']}, {result['rate']:,} msg/s, "
            "`fastnsq worker ingest:CLASS --processes 2 --batch 400,0.25 --max-in-flight 4000`, "
            f"{result['date']}")
    columns = ("| mode | PostgreSQL down (s) | first rows after it accepts (s) | full flow after (s) | "
               "/readyz 200 after (s) | "
               "/readyz 503 while down | published | rows | given up | requeued | still in nsqd (deferred) | lost |")
    lines = [head, "", columns, "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["runs"]:
        lines.append(f"| {r['mode']} | {r['down_s']} | {r.get('first_rows_after_s')} | {r['full_flow_after_s']} | "
                     f"{r['readyz_200_after_s']} | "
                     f"{'yes' if r['readyz_503_during'] else 'no'} | {r['published']:,} | {r['rows']:,} | "
                     f"{r['given_up']:.0f} | {r['requeued']:,} | {r['still_in_nsqd']:,} ({r['deferred']:,}) | "
                     f"{r['lost']:,} |")
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fastnsq-outage-"))
    os.chmod(work, 0o755)
    (work / "ingest.py").write_text(HANDLER)
    pg = Postgres(Path(args.pg_bin), work)
    pg.init()
    pg.start()
    runs = []
    try:
        for outage in [float(o) for o in args.outages.split(",")]:
            for mode in args.modes.split(","):
                print(f"== {mode}, PostgreSQL down {outage:g} s", flush=True)
                result = await one_run(args, mode, outage, work, pg)
                print(json.dumps(result), flush=True)
                runs.append(result)
    finally:
        pg.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    version = (await asyncio.to_thread(subprocess.run, [str(Path(args.pg_bin) / "postgres"), "--version"],
                                       capture_output=True, text=True, check=True)).stdout.strip()
    return {"nsqd": version_of(Path(args.real) / "nsqd")[0], "postgres": version, "rate": args.rate,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", required=True, help="the folder of the real nsqd")
    parser.add_argument("--pg-bin", default="/usr/lib/postgresql/15/bin")
    parser.add_argument("--outages", default="5,40", help="seconds PostgreSQL is down, comma-separated")
    parser.add_argument("--modes", default="ready,defaults,go-nsq", help="ready, defaults, go-nsq")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=15.0, help="seconds of publishing after the return")
    parser.add_argument("--drain", type=float, default=30.0, help="at most this long for the backlog after")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    if "go-nsq" in args.modes.split(","):
        sys.path.insert(0, str(ROOT / "bench"))
        from go_build import build

        args.go_binary = build(Path(args.real), program="gonsq_outage")
    result = asyncio.run(main_async(args))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())  # two runs in one minute keep both
    (out / f"dependency_outage-{stamp}.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    (out / f"dependency_outage-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
