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
``ready_check=ready``, ``max_in_flight`` 4000. ``sync`` is the blocking facade
(``fastnsq.sync.Consumer``, one process): ``batches(400, 0.25)`` in the main thread, a sync
handler and a sync ``ready_check``, asyncpg on an event loop of its own per thread.
``handler`` is the plain ``Consumer`` with a message handler and the defaults (no
``ready_check``: a failed message is held and retried in-process, ``hold_failed``),
``max_in_flight`` 200, one ``INSERT ... ON CONFLICT DO NOTHING`` a message through an asyncpg
pool of 8; ``sync-handler`` the blocking facade the same way, 8 worker threads, each with its
own asyncpg connection on its own loop. A row a message is a commit a message: with
``--synchronous-commit off`` the sessions do not wait for each commit's WAL flush. The plain
``Consumer`` modes run on ``fastnsq.run`` (uvloop), as the docs' examples do.

``--ceiling S`` measures first, for the handler modes, what their handler writes a second with
no NSQ at all (the same pool and statement, as many writes at once, the events encoded and
decoded as bodies are), alone and beside the publisher at ``--rate`` into nsqd: no consumer
can drain a backlog faster, so "full flow" (90 % of the rate) is only measurable where it is
above the rate. A row a message through an asyncpg pool is two round trips (the INSERT and
the pool's reset of the connection on release) and ~180-210 us of the handler's CPU a row here.

The HTTP sink (modes ``http``, ``http-ready``, ``http-go-nsq``): the bench's own nginx
(``--nginx``, Debian's) with its own prefix and config on a free loopback port, stopped with
``nginx -s stop`` and started again; ``POST /events`` answers 204 and writes the batch's
``X-Ids`` header to its access log, which says what arrived (distinct ids) and how often
(duplicates). ``http`` is ``fastnsq worker ingest_http:Post`` (aiohttp, no ``ready()``: the
worker's defaults), ``http-ready`` the same with ``ready()`` (``GET /health``), ``http-go-nsq``
``outage_bench --http-url`` (go-nsq v1.1.0, the batches POSTed with net/http).

    python bench/dependency_outage.py --real ~/nsq-real/bin --outages 5,40 --modes sync,http,http-ready,http-go-nsq
    python bench/dependency_outage.py --real ~/nsq-real/bin --outages 5,40,300 --modes handler,sync-handler
    python bench/dependency_outage.py --real ~/nsq-real/bin --ceiling 20 --outages 40 --modes handler,sync-handler \
        --synchronous-commit off

Writes bench/results/dependency_outage-<date>.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


INSERT = "INSERT INTO events VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING"
ROW_SETTINGS = {"synchronous_commit": os.environ.get("INGEST_SYNC_COMMIT", "on")}


async def consume_handler(topic, address):
    """The plain Consumer with a message handler and the defaults (no ready_check): a row a message."""
    import asyncio
    import fastnsq

    # A commit a message: without waiting for its WAL flush (a clean stop flushes it), or the
    # sink's fsyncs, not the consumer, set the pace (1,000-2,600 commits/s here).
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=8, server_settings=ROW_SETTINGS)

    async def handle(message):
        event = json.loads(message.body)
        await pool.execute(INSERT, event["id"], event["ts"], event["payload"])

    async with fastnsq.Consumer(topic, "ingest", nsqd_tcp_addresses=[address], handler=handle, max_in_flight=200):
        await asyncio.Event().wait()


async def ceiling_handler(seconds):
    """consume_handler's writes with no NSQ: as many at once as its max_in_flight (200), through
    the same pool of 8, each event encoded and decoded as a message body is; rows/s on stdout."""
    import asyncio, itertools, time

    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=8, server_settings=ROW_SETTINGS)
    ids, pad, rows = itertools.count(10 ** 12), "x" * 110, 0
    started = time.monotonic()
    cpu = time.process_time()

    async def writer():
        nonlocal rows
        while time.monotonic() - started < seconds:
            event = json.loads(json.dumps({"id": next(ids), "ts": time.time(), "payload": pad}))
            await pool.execute(INSERT, event["id"], event["ts"], event["payload"])
            rows += 1

    await asyncio.gather(*(writer() for _ in range(200)))
    took = time.monotonic() - started
    print(json.dumps({"rows": rows, "seconds": took, "cpu_s": time.process_time() - cpu}))


def ceiling_sync_handler(seconds):
    """consume_sync_handler's writes with no NSQ: 8 threads, each its own connection; rows/s on stdout."""
    import itertools, threading, time

    ids, pad, counts = itertools.count(10 ** 12), "x" * 110, []
    started = time.monotonic()
    cpu = time.process_time()

    def writer():
        ingest, rows = SyncIngest(), 0
        while time.monotonic() - started < seconds:
            event = json.loads(json.dumps({"id": next(ids), "ts": time.time(), "payload": pad}))
            ingest._run(ingest._connection().execute(INSERT, event["id"], event["ts"], event["payload"]))
            rows += 1
        counts.append(rows)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    print(json.dumps({"rows": sum(counts), "seconds": took, "cpu_s": time.process_time() - cpu}))


def consume_sync_handler(topic, address):
    """The blocking facade with a handler and the defaults: 8 threads, a row a message each."""
    import threading
    import fastnsq.sync

    local = threading.local()

    def handle(message):
        ingest = getattr(local, "ingest", None) or SyncIngest()
        local.ingest = ingest
        event = json.loads(message.body)
        try:
            ingest._run(ingest._connection().execute(INSERT, event["id"], event["ts"], event["payload"]))
        except Exception:
            ingest._failed()
            raise

    fastnsq.sync.Consumer(topic, "ingest", nsqd_tcp_addresses=[address], handler=handle, workers=8,
                          max_in_flight=200).run()


class SyncIngest:
    """The blocking facade's handler: asyncpg on an event loop of its own, run from this thread
    (no blocking PostgreSQL driver is installed; psycopg would do the same job)."""

    def __init__(self):
        import asyncio
        self.loop = asyncio.new_event_loop()
        self.conn = None

    def _run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def _connection(self):
        if self.conn is None or self.conn.is_closed():
            self.conn = self._run(asyncpg.connect(DSN, timeout=2, server_settings=ROW_SETTINGS))
        return self.conn

    def _failed(self):
        if self.conn is not None:
            self.conn.terminate()
        self.conn = None

    def handle(self, batch):
        rows = [(e["id"], e["ts"], e["payload"]) for e in (json.loads(m.body) for m in batch)]

        async def write(conn):
            async with conn.transaction():
                await conn.execute(STAGING)
                await conn.copy_records_to_table("staging", records=rows)
                await conn.execute("INSERT INTO events SELECT * FROM staging ON CONFLICT (id) DO NOTHING")

        try:
            self._run(write(self._connection()))
        except Exception:
            self._failed()
            raise

    def ready(self):
        try:
            self._run(self._connection().fetchval("SELECT 1"))
        except Exception:
            self._failed()
            raise


def consume_sync(topic, address):
    """The blocking facade: fastnsq.sync.Consumer.batches(), a sync handler, a sync ready_check."""
    import fastnsq.sync

    ingest, check = SyncIngest(), SyncIngest()  # the check runs in another thread: its own loop
    consumer = fastnsq.sync.Consumer(topic, "ingest", nsqd_tcp_addresses=[address], max_in_flight=4000,
                                     ready_check=check.ready)
    for batch in consumer.batches(400, 0.25):
        try:
            ingest.handle(batch)
        except Exception:
            batch.requeue()
        else:
            batch.finish()
'''

HTTP_HANDLER = r'''
import json, os
import aiohttp

URL = os.environ["INGEST_URL"]


class Post:
    """POSTs each batch (the bodies, one a line; X-Ids: the ids, for the sink's access log)."""

    async def setup(self):
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def teardown(self):
        await self.session.close()

    async def handle(self, batch):
        ids = ",".join(str(json.loads(m.body)["id"]) for m in batch)
        body = b"\n".join(bytes(m.body) for m in batch)
        async with self.session.post(URL + "/events", data=body, headers={"X-Ids": ids}) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"HTTP {resp.status}")


class PostReady(Post):
    async def ready(self):
        async with self.session.get(URL + "/health") as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
'''

MODES = {"ready": "ingest:IngestReady", "defaults": "ingest:Ingest", "go-nsq": "", "consumer": "", "sync": "",
         "handler": "consume_handler", "sync-handler": "consume_sync_handler",
         "http": "ingest_http:Post", "http-ready": "ingest_http:PostReady", "http-go-nsq": ""}
#: The modes without a worker (no /metrics, /readyz: their given up are counted in their log), and
#: what runs in each, for the markdown table's head (the module docstring says more).
NOT_A_WORKER = {
    "go-nsq": "go-nsq v1.1.0 (outage_bench, MaxInFlight 4000)",
    "consumer": "Consumer.batches(400, 0.25), ready_check, max_in_flight 4000",
    "sync": "fastnsq.sync.Consumer.batches(400, 0.25), a sync ready_check",
    "handler": "Consumer with a message handler on fastnsq.run, its defaults, max_in_flight 200",
    "sync-handler": "fastnsq.sync.Consumer with a message handler, 8 threads",
    "http-go-nsq": "go-nsq v1.1.0 (outage_bench --http-url)",
}
NO_WORKER = set(NOT_A_WORKER)


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


    async def accepting(self) -> bool:
        import asyncpg

        try:
            conn = await asyncpg.connect(self.dsn, timeout=0.5)
        except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
            return False
        await conn.close()
        return True

    async def reset(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        await conn.execute("DROP TABLE IF EXISTS events; "
                           "CREATE TABLE events (id bigint PRIMARY KEY, ts double precision, payload text)")
        await conn.close()

    async def count(self) -> tuple[int, int]:
        """Distinct rows and rows written (ON CONFLICT DO NOTHING: the same number)."""
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        rows = int(await conn.fetchval("SELECT count(*) FROM events"))
        await conn.close()
        return rows, rows

    def version(self) -> str:
        return subprocess.run([str(self.bin / "postgres"), "--version"], capture_output=True, text=True,
                              check=True).stdout.strip()


NGINX_CONF = """daemon on;
user root root;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    log_format ids '$status $http_x_ids';
    large_client_header_buffers 4 32k;
    client_max_body_size 16m;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location = /events {{ access_log {root}/events.log ids; return 204; }}
        location = /health {{ return 200 "ok"; }}
    }}
}}
"""


class Nginx:
    """The HTTP sink: the bench's own nginx (Debian's) on a free loopback port, with its own
    prefix. POST /events answers 204 and logs the batch's X-Ids: what arrived is that log."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary, self.root, self.port = binary, root / "nginx", free_port()
        self.conf = self.root / "nginx.conf"
        self.url = f"http://127.0.0.1:{self.port}"

    def init(self) -> None:
        self.root.mkdir(exist_ok=True)
        self.conf.write_text(NGINX_CONF.format(root=self.root, port=self.port))

    def _run(self, *args: str) -> None:
        subprocess.run([self.binary, "-p", str(self.root), "-c", str(self.conf), *args], check=True,
                       capture_output=True, timeout=60)

    def start(self, wait: bool = True) -> None:
        self._run()  # the master daemonizes once it listens

    def stop(self) -> None:
        """Fast shutdown (connections closed at once), until the master is gone."""
        pid = int((self.root / "nginx.pid").read_text())
        self._run("-s", "stop")
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)

    async def accepting(self) -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(
                    self.url + "/health", timeout=aiohttp.ClientTimeout(total=0.5)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def reset(self) -> None:
        (self.root / "events.log").write_text("")
        self._run("-s", "reopen")

    async def count(self) -> tuple[int, int]:
        """Distinct ids answered 204, and ids answered 204 (duplicates included)."""
        seen: set[str] = set()
        total = 0
        for line in (self.root / "events.log").read_text().splitlines():
            status, _, ids = line.partition(" ")
            if status == "204" and ids not in ("", "-"):
                batch = ids.split(",")
                total += len(batch)
                seen.update(batch)
        return len(seen), total

    def version(self) -> str:
        return subprocess.run([self.binary, "-v"], check=False, capture_output=True, text=True).stderr.strip()


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


async def one_run(args: argparse.Namespace, mode: str, outage: float, work: Path,
                  sink: Postgres | Nginx) -> dict[str, Any]:
    topic = f"events_{mode}_{int(outage)}_{int(time.time())}"
    await sink.reset()
    nsqd = RealNSQDServer(Path(args.real))
    await nsqd.start()
    metrics_port = free_port()
    dsn = sink.dsn if isinstance(sink, Postgres) else ""
    env = {**os.environ, "INGEST_DSN": dsn, "INGEST_URL": sink.url if isinstance(sink, Nginx) else "",
           "INGEST_SYNC_COMMIT": args.synchronous_commit,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log_path = work / f"worker-{topic}.log"
    log = log_path.open("wb")
    go = mode in NO_WORKER  # no worker: no /metrics, /readyz
    if mode == "consumer":
        command = [sys.executable, "-c", "import sys, fastnsq, ingest; fastnsq.run(ingest.consume(*sys.argv[1:]))",
                   topic, nsqd.tcp_address]
    elif mode == "handler":
        command = [sys.executable, "-c", "import sys, fastnsq, ingest; fastnsq.run(ingest.consume_handler(*sys.argv[1:]))",
                   topic, nsqd.tcp_address]
    elif mode == "sync-handler":
        command = [sys.executable, "-c", "import sys, ingest; ingest.consume_sync_handler(*sys.argv[1:])",
                   topic, nsqd.tcp_address]
    elif mode == "sync":
        command = [sys.executable, "-c", "import sys, ingest; ingest.consume_sync(*sys.argv[1:])",
                   topic, nsqd.tcp_address]
    elif go:
        sink_flags = ["--http-url", sink.url + "/events"] if isinstance(sink, Nginx) else [
            "--pg-address", f"127.0.0.1:{sink.port}"]
        command = [str(args.go_binary), "--nsqd-tcp-address", nsqd.tcp_address, "--topic", topic, "--channel",
                   "ingest", *sink_flags, "--max-in-flight", "4000", "--batch", "400",
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
            await asyncio.to_thread(sink.stop)
            marks["stopped"] = time.monotonic()
            await asyncio.sleep(max(0.0, outage - (marks["stopped"] - marks["stop"])))
            marks["start"] = time.monotonic()
            await asyncio.to_thread(sink.start, False)
            while not await sink.accepting():
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
    rows, written = await sink.count()
    held = int(ch.get("depth", 0)) + int(ch.get("in_flight_count", 0)) + int(ch.get("deferred_count", 0))
    accept = marks["accepting"]
    return {
        "mode": mode, "sink": "nginx" if isinstance(sink, Nginx) else "postgres", "outage_s": outage,
        "published": publisher.published, "rows": rows, "duplicates": written - rows,
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


async def ceiling_run(args: argparse.Namespace, mode: str, work: Path, sink: Postgres, beside: bool) -> dict[str, Any]:
    """What ``mode``'s handler writes a second with no NSQ under it (``ceiling_handler``), alone
    or ``beside`` a publisher at ``--rate`` into the real nsqd (the drain after an outage runs
    beside it): no consumer can drain a backlog faster than its handler can write."""
    await sink.reset()
    nsqd = RealNSQDServer(Path(args.real))
    await nsqd.start()
    env = {**os.environ, "INGEST_DSN": sink.dsn, "INGEST_SYNC_COMMIT": args.synchronous_commit,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    runner = {"handler": "import sys, fastnsq, ingest; fastnsq.run(ingest.ceiling_handler(float(sys.argv[1])))",
              "sync-handler": "import sys, ingest; ingest.ceiling_sync_handler(float(sys.argv[1]))"}[mode]
    publisher = Publisher(nsqd.tcp_address, f"ceiling_{mode}_{int(time.time())}", args.rate)
    try:
        feeding = asyncio.create_task(publisher.run()) if beside else None
        await asyncio.sleep(1.0 if beside else 0.0)
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", runner, str(args.ceiling), cwd=work,
                                                     env=env, stdout=subprocess.PIPE)
        out, _ = await child.communicate()
        if feeding is not None:
            publisher.stopped.set()
            await feeding
    finally:
        await nsqd.close()
    measured = json.loads(out.decode().strip().splitlines()[-1])
    return {"mode": f"{mode} ceiling", "beside_publisher": beside, "rows_per_s": round(measured["rows"] / measured["seconds"]),
            "handler_cpu_us_per_row": round(measured["cpu_s"] / max(measured["rows"], 1) * 1e6, 1),
            "publish_rate": args.rate if beside else 0, "seconds": round(measured["seconds"], 1)}


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


def what_ran(mode: str) -> str:
    if mode in NOT_A_WORKER:
        return NOT_A_WORKER[mode]
    return f"`fastnsq worker {MODES.get(mode, '?')} --processes 2 --batch 400,0.25 --max-in-flight 4000`"


def markdown(result: dict[str, Any]) -> str:
    sinks = ", ".join(result.get("sinks", {}).values()) or f"PostgreSQL {result.get('postgres')}"
    modes = sorted({r["mode"].removesuffix(" ceiling") for r in result["runs"]})
    ran = "; ".join(f"{mode}: {what_ran(mode)}" for mode in modes)
    head = f"nsqd {result['nsqd']} (default flags), {sinks}, {result['rate']:,} msg/s, {result['date']}. {ran}"
    columns = ("| mode | sink | sink down (s) | first rows after it accepts (s) | full flow after (s) | "
               "/readyz 200 after (s) | /readyz 503 while down | published | arrived | duplicates | given up | "
               "requeued | still in nsqd (deferred) | lost |")
    lines = [head, "", columns, "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    ceilings = [r for r in result["runs"] if "rows_per_s" in r]
    for r in ceilings:
        lines.insert(1, f"\n{r['mode']}, no NSQ, {'beside the publisher' if r['beside_publisher'] else 'alone'}: "
                        f"{r['rows_per_s']:,} rows/s ({r['handler_cpu_us_per_row']} us of the handler's CPU a row)")
    for r in result["runs"]:
        if "rows_per_s" in r:
            continue
        lines.append(f"| {r['mode']} | {r.get('sink', 'postgres')} | {r['down_s']} | {r.get('first_rows_after_s')} | "
                     f"{r['full_flow_after_s']} | {r['readyz_200_after_s']} | "
                     f"{'yes' if r['readyz_503_during'] else 'no'} | {r['published']:,} | {r['rows']:,} | "
                     f"{r.get('duplicates', 0):,} | {r['given_up']:.0f} | {r['requeued']:,} | "
                     f"{r['still_in_nsqd']:,} ({r['deferred']:,}) | {r['lost']:,} |")
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fastnsq-outage-"))
    os.chmod(work, 0o755)
    (work / "ingest.py").write_text(HANDLER)
    (work / "ingest_http.py").write_text(HTTP_HANDLER)
    modes = args.modes.split(",")
    sinks: dict[str, Postgres | Nginx] = {}
    if any(not m.startswith("http") for m in modes):
        sinks["postgres"] = Postgres(Path(args.pg_bin), work)
    if any(m.startswith("http") for m in modes):
        sinks["nginx"] = Nginx(args.nginx, work)
    started: list[Postgres | Nginx] = []
    runs = []
    try:
        for sink in sinks.values():
            sink.init()
            sink.start()
            started.append(sink)
        for mode in [m for m in modes if m in ("handler", "sync-handler")] if args.ceiling else []:
            for beside in (False, True):
                print(f"== {mode} ceiling, {'beside the publisher' if beside else 'alone'}", flush=True)
                result = await ceiling_run(args, mode, work, sinks["postgres"], beside)
                print(json.dumps(result), flush=True)
                runs.append(result)
        for outage in [float(o) for o in args.outages.split(",") if o]:
            for mode in modes:
                sink = sinks["nginx" if mode.startswith("http") else "postgres"]
                print(f"== {mode}, {type(sink).__name__} down {outage:g} s", flush=True)
                result = await one_run(args, mode, outage, work, sink)
                print(json.dumps(result), flush=True)
                runs.append(result)
    finally:
        for sink in started:
            with contextlib.suppress(Exception):
                sink.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return {"nsqd": version_of(Path(args.real) / "nsqd")[0], "rate": args.rate,
            "sinks": {name: sink.version() for name, sink in sinks.items()},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", required=True, help="the folder of the real nsqd")
    parser.add_argument("--pg-bin", default="/usr/lib/postgresql/15/bin")
    parser.add_argument("--nginx", default="/usr/sbin/nginx", help="the nginx binary (Debian's) for the http modes")
    parser.add_argument("--outages", default="5,40", help="seconds PostgreSQL is down, comma-separated")
    parser.add_argument("--modes", default="ready,defaults,go-nsq", help="ready, defaults, go-nsq")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--synchronous-commit", default="on", choices=("on", "off"),
                        help="the handlers' PostgreSQL sessions (off: a commit does not wait for its WAL flush)")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=15.0, help="seconds of publishing after the return")
    parser.add_argument("--drain", type=float, default=30.0, help="at most this long for the backlog after")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument("--ceiling", type=float, default=0.0, metavar="S",
                        help="first, for the handler modes: their writes with no NSQ for S s, alone and "
                             "beside the publisher (rows/s: what any consumer's drain is bounded by)")
    args = parser.parse_args()
    if {"go-nsq", "http-go-nsq"} & set(args.modes.split(",")):
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
