"""``fastnsq to-postgres`` through faults under a steady publish (issue 59, acceptance 2).

A real nsqd (``--bin``: nsqd v1.3.0, default flags but its addresses and data path) and our own
PostgreSQL 15 (tests/pgserver.py, its defaults). ``fastnsq to-postgres --processes 2
--batch-size 400`` (defaults otherwise) while events are published at ``--rate`` (5,000/s),
one id each, and every 50th id published a second time (a duplicate). On a timeline:

1. PostgreSQL stopped (fast shutdown) for ``--pg-down`` seconds (10), then started again;
2. nsqd stopped (SIGTERM: it writes its queues to disk) and started again on the same ports;
3. one of the app's worker processes SIGKILLed (the supervisor starts another);
4. SIGTERM to the app while the publish goes on: it must drain and exit 0 with nothing in flight;
5. the publish stops, the app runs again until the channel is empty.

Then: rows = distinct ids published (none lost, none twice), the duplicates the app counted
(its log's closing lines; a SIGKILLed process says nothing, so its share is not in that sum),
and nsqd's channel with nothing queued or in flight. The seconds from PostgreSQL's return to
the first rows written again are timed from the table's count, polled every 0.1 s.

    python bench/sink_postgres_faults.py --bin ~/nsq-real/bin
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from sink_postgres import TABLE, event


class Publisher:
    """Events at a steady rate, retried until nsqd takes them (through its restart)."""

    def __init__(self, address: str, topic: str, rate: int) -> None:
        self.address, self.topic, self.rate = address, topic, rate
        self.published: set[int] = set()
        self.duplicates_sent = 0
        self.stopped = asyncio.Event()
        self.next_id = 0

    async def run(self) -> None:
        from fastnsq import Producer

        tick = 0.05
        async with Producer([self.address]) as producer:
            started = time.monotonic()
            while not self.stopped.is_set():
                due = int((time.monotonic() - started) * self.rate)
                ids = list(range(self.next_id, due))
                if ids:
                    repeats = [i for i in ids if i % 50 == 0]
                    bodies = [event(i) for i in ids + repeats]
                    while not self.stopped.is_set():
                        try:
                            await producer.mpublish(self.topic, bodies)
                            break
                        except Exception:  # noqa: BLE001 - nsqd restarting: the same bodies again
                            await asyncio.sleep(0.1)
                    else:
                        return
                    self.published.update(ids)
                    self.duplicates_sent += len(repeats)
                    self.next_id = due
                await asyncio.sleep(tick)


async def start_app(args: argparse.Namespace, topic: str, nsqd: Any, postgres: Any, log: Path) -> Any:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fastnsq", "to-postgres", "--topic", topic, "--channel", "sink",
            "--nsqd-tcp-address", nsqd.tcp_address, "--dsn", postgres.dsn, "--table", "events", "--key", "id",
            "--processes", "2", "--batch-size", "400", stdout=out, stderr=out, env=env, start_new_session=True)


async def rows(postgres: Any) -> int:
    return int(await asyncio.to_thread(postgres.psql, "SELECT count(*) FROM events"))


async def scenario(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from fastnsq.benchmark import process_tree
    from fastnsq.testing import drain
    from fastnsq.testing.process import NSQDProcess
    from tests.pgserver import PostgresServer

    postgres = PostgresServer()
    postgres.start()
    postgres.psql(TABLE)
    nsqd = NSQDProcess(binary=Path(args.bin).expanduser() / "nsqd")
    nsqd.start()
    topic, log = f"faults_{os.getpid()}", Path(tempfile.mkdtemp(prefix="fastnsq-faults-")) / "app.log"
    report: dict[str, Any] = {"nsqd_argv": nsqd.argv(nsqd.tcp_address, nsqd.http_address), "log": str(log)}
    publisher = Publisher(nsqd.tcp_address, topic, args.rate)
    publishing = asyncio.create_task(publisher.run())
    try:
        app = await start_app(args, topic, nsqd, postgres, log)
        await asyncio.sleep(10)
        postgres.stop()
        await asyncio.sleep(args.pg_down)
        await asyncio.to_thread(postgres.start)
        back, before = time.monotonic(), await rows(postgres)
        while await rows(postgres) <= before:
            await asyncio.sleep(0.1)
        report["seconds_to_first_rows_after_postgres_returned"] = round(time.monotonic() - back, 2)
        await asyncio.sleep(10)
        nsqd.stop()
        await asyncio.sleep(2)
        nsqd.start()
        await asyncio.sleep(10)
        children = process_tree(app.pid)[1:]
        os.kill(children[0], signal.SIGKILL)
        await asyncio.sleep(10)
        app.send_signal(signal.SIGTERM)
        report["sigterm_exit_status"] = await asyncio.wait_for(app.wait(), 120)
        async with aiohttp.ClientSession() as session, session.get(
                f"http://{nsqd.http_address}/stats", params={"format": "json", "topic": topic}) as resp:
            stats = await resp.json(content_type=None)
        channel = next(c for t in stats["topics"] for c in t["channels"] if c["channel_name"] == "sink")
        report["in_flight_after_sigterm"] = channel["in_flight_count"]
        publisher.stopped.set()
        await publishing
        total = len(publisher.published) + publisher.duplicates_sent
        app = await start_app(args, topic, nsqd, postgres, log)
        # published=0: nsqd's counts restarted with it; what matters is nothing left in the channel.
        while not await drain.channel_drained([nsqd.http_address], topic, "sink", published=0):
            await asyncio.sleep(0.5)
        app.send_signal(signal.SIGTERM)
        report["last_exit_status"] = await asyncio.wait_for(app.wait(), 120)
        count, distinct = map(int, postgres.psql("SELECT count(*), count(DISTINCT id) FROM events").split("|"))
        text = log.read_text(errors="replace")
        counted = sum(int(n) for n in re.findall(r"(\d+) duplicates absorbed", text))
        report.update({
            "published_distinct": len(publisher.published), "published_messages": total,
            "duplicates_published": publisher.duplicates_sent, "rows": count, "distinct_rows": distinct,
            "lost": len(publisher.published) - distinct, "duplicates_counted_by_the_surviving_processes": counted,
            "dead_lettered": sum(int(n) for n in re.findall(r"(\d+) dead-lettered", text)),
        })
    finally:
        publisher.stopped.set()
        nsqd.stop()
        postgres.remove()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="folder with the real nsqd")
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--pg-down", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(scenario(args)), indent=1))


if __name__ == "__main__":
    main()
