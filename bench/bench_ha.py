"""HA throughput against the embedded HA cluster: partitioned, and ordered per partition.

    python bench/bench_ha.py [--nodes 3] [--partitions 4] [--count 200000] [--ordered-count 20000]

The cluster (N HA nsqd + an HA nsqlookupd, topic partitions and leaders spread over the
nodes) runs in a child process; this process is the client. Workloads, 100-byte bodies:

* publish: 1,000 tasks awaiting ``Producer.publish()`` through lookupd (round robin
  over the partitions' leaders, coalesced per partition);
* partitioned consume: ``Consumer`` through lookupd, one connection per partition,
  max_in_flight 2500, a sync handler;
* ordered consume: ``Consumer(ordered=True)`` (SUB_ORDERED): nsqd hands out one message
  at a time per partition, so the rate is per partition one round trip per message.

Prints a table and writes bench/results/ha-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastnsq

SERVER = r"""
import asyncio, json, sys
from fastnsq.testing import NSQCluster

async def main(nodes, partitions, topics):
    async with NSQCluster(nodes=nodes, ha=True) as cluster:
        for topic in topics:
            await cluster.create_topic(topic, partitions=partitions, channels=["bench"])
        print(json.dumps({"lookupd": cluster.lookupd_http_addresses[0],
                          "leaders": {t: cluster.partition_leaders(t) for t in topics}}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

nodes, partitions = int(sys.argv[1]), int(sys.argv[2])
import fastnsq
fastnsq.run(main(nodes, partitions, sys.argv[3:]))
"""


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def publish(lookupd: str, topic: str, count: int, callers: int = 1000) -> dict:
    body = b"h" * 100
    async with fastnsq.Producer(lookupd_http_addresses=[lookupd]) as producer:
        await producer.publish(topic, body)  # learn the partitions
        left = count

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await producer.publish(topic, body)

        c0, t0 = cpu(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        seconds, cpu_s = time.perf_counter() - t0, cpu() - c0
    return {"workload": "publish (partitions round robin)", "messages": count, "seconds": seconds,
            "msgs_per_s": count / seconds, "client_cpu_s_per_million": cpu_s / count * 1e6}


async def consume(lookupd: str, topic: str, count: int, *, ordered: bool, partitions: int) -> dict:
    done = asyncio.Event()
    seen = 0

    def handle(message) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    consumer = fastnsq.Consumer(topic, "bench", lookupd_http_addresses=[lookupd], handler=handle,
                                max_in_flight=2500, ordered=ordered)
    c0, t0 = cpu(), time.perf_counter()
    await consumer.start()
    await asyncio.wait_for(done.wait(), 600)
    seconds, cpu_s = time.perf_counter() - t0, cpu() - c0
    await consumer.stop()
    name = "ordered consume (SUB_ORDERED)" if ordered else "partitioned consume (SUB per partition)"
    row = {"workload": name, "messages": count, "seconds": seconds, "msgs_per_s": count / seconds,
           "client_cpu_s_per_million": cpu_s / count * 1e6}
    if ordered:
        row["msgs_per_s_per_partition"] = count / seconds / partitions
    return row


async def main(args: argparse.Namespace) -> list[dict]:
    topics = ["bench_ha", "bench_ha_ordered"]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.nodes), str(args.partitions), *topics],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True,
    )
    try:
        info = json.loads(server.stdout.readline())  # type: ignore[union-attr]
        lookupd = info["lookupd"]
        rows = [await publish(lookupd, topics[0], args.count)]
        rows.append(await consume(lookupd, topics[0], args.count + 1, ordered=False, partitions=args.partitions))
        async with fastnsq.Producer(lookupd_http_addresses=[lookupd]) as producer:
            for start in range(0, args.ordered_count, 500):
                await producer.mpublish(topics[1], [b"o" * 100] * min(500, args.ordered_count - start),
                                        partition=(start // 500) % args.partitions)
        rows.append(await consume(lookupd, topics[1], args.ordered_count, ordered=True, partitions=args.partitions))
        for row in rows:
            row["leaders"] = info["leaders"]
        return rows
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(20)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--ordered-count", type=int, default=20_000)
    args = parser.parse_args()
    rows = fastnsq.run(main(args))
    print(f"\nHA cluster: {args.nodes} embedded HA nsqd + lookupd (one child process), topic of "
          f"{args.partitions} partitions; client on uvloop, codec {fastnsq.CODEC_IMPLEMENTATION}\n")
    print(f"{'WORKLOAD':42s} {'MESSAGES':>9s} {'MSG/S':>10s} {'CPU S/1M':>9s}")
    for row in rows:
        extra = f"  ({row['msgs_per_s_per_partition']:,.0f} msg/s per partition)" if "msgs_per_s_per_partition" in row else ""
        print(f"{row['workload']:42s} {row['messages']:9,d} {row['msgs_per_s']:10,.0f} "
              f"{row['client_cpu_s_per_million']:9.2f}{extra}")
    out = ROOT / "bench" / "results" / f"ha-{datetime.now():%Y%m%d-%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores", "python": platform.python_version(),
        "args": vars(args), "rows": rows,
    }, indent=1))
    print(f"\nwritten to {out}")
