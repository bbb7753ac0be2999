"""``fastnsq to-nsq`` from an upstream nsqd into a partitioned topic of a real youzan cluster.

    python bench/apps_ha.py ~/nsq-real/bin ~/nsq-real/ha/bin [--base-port 22300] [--count 300000] [--rounds 3]

Starts a real upstream nsqd (the first folder; ``--mem-queue-size`` above the count, so the
topic is in memory as bench/apps.py has it) and a youzan cluster of its own (the second
folder: etcd from PATH, a youzan nsqlookupd, 3 youzan nsqd, :class:`RealHACluster`). Per round
and case, a new source topic pre-filled with ``--count`` JSON bodies (~90 B, 10,000 distinct
``user`` keys) and a new destination topic of ``--partitions`` partitions (2 replicas); then
to-nsq with ``--max-in-flight 2500`` runs from its start until the source channel is drained
(every message FINed, so acknowledged by the destination). Cases alternate within a round:
``plain`` (partitions in turn) and ``keyed`` (``--sharding-key-json-field user``). The
destination's message count is checked against the count after each run. Prints each run,
the medians and the app's CPU per message, and writes bench/results/apps-ha-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp

from fastnsq import Producer
from fastnsq.benchmark import process_tree
from fastnsq.testing import ExternalCluster, ExternalLookupd, ExternalNSQD, drain
from fastnsq.testing.real import RealHACluster, RealNSQDServer

CASES = {"plain": [], "keyed": ["-sharding-key-json-field=user"]}


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


async def channel(http: aiohttp.ClientSession, address: str, topic: str) -> dict[str, Any]:
    async with http.get(f"http://{address}/stats", params={"format": "json", "topic": topic}) as response:
        stats = json.loads(await response.read())
    for found in stats.get("topics", []):
        for entry in found["channels"]:
            if entry["channel_name"] == "nsq_to_nsq":
                return dict(entry)
    return {}


async def held(http: aiohttp.ClientSession, cluster: RealHACluster, topic: str) -> int:
    """Messages the destination topic's partition leaders hold."""
    total = 0
    for address in cluster.http_addresses:
        async with http.get(f"http://{address}/stats", params={"format": "json", "topic": topic}) as response:
            stats = json.loads(await response.read())
        stats = stats.get("data", stats)
        total += sum(t["message_count"] for t in stats.get("topics", []) if t.get("is_leader"))
    return total


async def run_once(source: Any, cluster: RealHACluster, case: str, name: str, count: int) -> dict[str, Any]:
    lookupd = f"-destination-lookupd-http-address={cluster.lookupd_http_address}"
    command = [sys.executable, "-m", "fastnsq", "to-nsq", f"-topic={name}", f"-nsqd-tcp-address={source.tcp_address}",
               f"-destination-topic={name}", "-max-in-flight=2500", "-status-every=0", lookupd, *CASES[case]]
    async with aiohttp.ClientSession() as http:
        began = time.monotonic()
        app = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.DEVNULL)
        cpu = 0.0
        while True:
            cpu = max(cpu, cpu_seconds(process_tree(app.pid)))  # before the workers exit
            if await drain.channel_drained(source.http_address, name, "nsq_to_nsq", published=count):
                break
            await asyncio.sleep(0.02)
        took = time.monotonic() - began
        cpu = max(cpu, cpu_seconds(process_tree(app.pid)))
        stats = await channel(http, source.http_address, name)
        app.terminate()
        await app.wait()
        arrived = await held(http, cluster, name)
    return {"case": case, "seconds": round(took, 3), "rate": round(count / took), "requeues": stats["requeue_count"],
            "app_cpu_us_per_message": round(cpu / count * 1e6, 2), "destination_holds": arrived}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    bodies = [json.dumps({"user": f"u{i % 10000:05d}", "seq": i, "pad": "x" * 50}).encode() for i in range(args.count)]
    runs: list[dict[str, Any]] = []
    with RealHACluster(Path(args.ha_bin).expanduser(), standalone=False, base_port=args.base_port) as ha:
        view = ExternalCluster([ExternalNSQD(t, h) for t, h in zip(ha.tcp_addresses, ha.http_addresses)],
                               ExternalLookupd(ha.lookupd_http_address, ha.lookupd_tcp_address))
        source = RealNSQDServer(Path(args.nsqd_bin).expanduser(), f"--mem-queue-size={args.count * 2}")
        await source.start()
        try:
            for round_ in range(args.rounds):
                for case in (CASES if round_ % 2 == 0 else reversed(CASES)):
                    name = f"apps_ha_{case}_{round_}_{os.getpid()}"
                    await view.create_topic(name, partitions=args.partitions, replicas=2)
                    async with Producer([source.tcp_address]) as producer:
                        for at in range(0, len(bodies), 10_000):
                            await producer.mpublish(name, bodies[at:at + 10_000])
                    run = {"round": round_, **await run_once(source, ha, case, name, args.count),
                           "load": os.getloadavg()[0]}
                    print(json.dumps(run), flush=True)
                    runs.append(run)
        finally:
            await source.close()
        server = ha.version
    medians = {case: {"rate": statistics.median(r["rate"] for r in runs if r["case"] == case),
                      "app_cpu_us_per_message": statistics.median(r["app_cpu_us_per_message"]
                                                                  for r in runs if r["case"] == case)}
               for case in CASES}
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "server": server, "count": args.count, "partitions": args.partitions,
            "replicas": 2, "max_in_flight": 2500, "body_bytes": len(bodies[0]), "runs": runs, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nsqd_bin", help="folder of a real upstream nsqd (1.3.0)")
    parser.add_argument("ha_bin", help="folder of youzan's nsqd and nsqlookupd")
    parser.add_argument("--base-port", type=int, default=0)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    print(json.dumps(result["medians"], indent=1))
    out = args.out or ROOT / "bench" / "results" / f"apps-ha-{datetime.now(timezone.utc):%Y-%m-%d}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
