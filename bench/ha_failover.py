"""A partition leader killed mid-stream on a real youzan HA cluster: what was lost, what came twice.

    python bench/ha_failover.py ~/nsq-real/ha/bin [--base-port 14100] [--messages 6000] [--rate 100]

Starts its own cluster with :class:`fastnsq.testing.real.RealHACluster` (etcd from PATH,
a youzan nsqlookupd, three youzan nsqd in cluster mode; the flags of
fastnsq.testing.real's HA cluster flags) and a topic of ``--partitions`` partitions
with ``--replicas`` replicas each (3: every node), its channels ``plain`` and ``ordered``
created first. Then:

* a ``Producer`` (through the lookupd, default options) publishes numbered 100-byte
  bodies at ``--rate`` messages/s from ``--callers`` tasks, each publish awaited: a
  publish that returns was acknowledged by nsqd, one that raises was not;
* a ``Consumer`` reads ``plain`` and an ordered ``Consumer`` (SUB_ORDERED) ``ordered``;
* after ``--kill-after`` s the nsqd leading partition 0 is killed (SIGKILL) and
  started again ``--restart-after`` s later (it rejoins as a replica);
* publishing ends after ``--messages`` messages and the consumers get
  ``--drain-timeout`` s to read everything.

It counts, per channel: published (attempted), acknowledged, failed (raised),
consumed (distinct), duplicated (deliveries beyond the first), lost (acknowledged,
never consumed), and delivered though the publish raised. Prints them and writes
bench/results/ha-failover-<date>.json. ``tests/test_ha_failover.py`` runs it smaller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastnsq
from fastnsq.testing import ExternalCluster, ExternalLookupd, ExternalNSQD
from fastnsq.testing.real import RealHACluster

CHANNELS = ("plain", "ordered")


def external(cluster: RealHACluster) -> ExternalCluster:
    """The harness's view of the real cluster (topic creation through its lookupd)."""
    nodes = [ExternalNSQD(t, h) for t, h in zip(cluster.tcp_addresses, cluster.http_addresses)]
    return ExternalCluster(nodes, ExternalLookupd(cluster.lookupd_http_address, cluster.lookupd_tcp_address))


async def failover(
    cluster: RealHACluster,
    *,
    messages: int = 6000,
    rate: float = 100.0,
    callers: int = 4,
    partitions: int = 2,
    replicas: int = 3,
    kill_after: float = 5.0,
    restart_after: float = 30.0,
    drain_timeout: float = 120.0,
    producer_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the scenario on a started ``cluster``; the counts and the timeline."""
    loop = asyncio.get_running_loop()
    harness = external(cluster)
    topic = f"failover_{os.getpid()}_{int(time.time())}"
    leaders = await harness.create_topic(topic, partitions, replicas=replicas, channels=list(CHANNELS))
    victim_address = leaders[0]
    victim = cluster.tcp_addresses.index(victim_address)
    lookupd = [cluster.lookupd_http_address]
    started = loop.time()
    timeline: list[tuple[float, str]] = []

    def mark(what: str) -> None:
        timeline.append((round(loop.time() - started, 2), what))

    deliveries = {name: Counter[bytes]() for name in CHANNELS}

    def recorder(name: str) -> Any:
        seen = deliveries[name]

        def handle(message: Any) -> None:
            seen[message.body] += 1

        return handle

    consumers = {
        name: fastnsq.Consumer(
            topic,
            name,
            lookupd_http_addresses=lookupd,
            handler=recorder(name),
            max_in_flight=200,
            lookupd_poll_interval=1.0,
            ordered=name == "ordered",
        )
        for name in CHANNELS
    }
    for consumer in consumers.values():
        await consumer.start()
    acknowledged: set[bytes] = set()
    failed: dict[bytes, tuple[float, str]] = {}  # body -> (when, what it raised)
    next_seq = 0
    restarted = False

    async with fastnsq.Producer(lookupd_http_addresses=lookupd, **(producer_options or {})) as producer:

        async def caller() -> None:
            nonlocal next_seq
            while next_seq < messages:
                seq = next_seq
                next_seq += 1
                due = started + seq / rate
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                body = b"%08d" % seq + b"." * 92  # 100 bytes, numbered
                try:
                    await producer.publish(topic, body)
                except Exception as exc:  # noqa: BLE001 - every way a publish can fail is counted
                    failed[body] = (round(loop.time() - started, 2), type(exc).__name__)
                else:
                    acknowledged.add(body)

        async def chaos() -> None:
            nonlocal restarted
            await asyncio.sleep(kill_after)
            mark(f"kill nsqd{victim} ({victim_address}), leader of partition 0")
            await loop.run_in_executor(None, cluster.kill_nsqd, victim)
            moved = asyncio.create_task(new_leader())
            await asyncio.sleep(restart_after)
            mark(f"restart nsqd{victim}")
            await loop.run_in_executor(None, cluster.start_nsqd, victim)
            mark(f"nsqd{victim} answers /ping")
            restarted = True
            await moved

        async def new_leader() -> None:
            """Log what the write lookup names for partition 0 until it names a running node again."""
            named: str | None = victim_address
            deadline = loop.time() + 120
            while loop.time() < deadline:
                now = (await harness.partition_leaders(topic)).get(0)
                if now != named:
                    mark(f"lookupd names {now or 'no node'} for writes to partition 0")
                    named = now
                running = now is not None and cluster.nsqd_pid(cluster.tcp_addresses.index(now)) is not None
                if running and (now != victim_address or restarted):
                    return
                await asyncio.sleep(0.2)
            mark("partition 0 has no running leader after 120 s")

        chaos_task = asyncio.create_task(chaos())
        await asyncio.gather(*(caller() for _ in range(callers)))
        mark(f"publishing done: {len(acknowledged)} acknowledged, {len(failed)} raised")
        await chaos_task
        producer_stats = producer.snapshot().as_dict()

    deadline = loop.time() + drain_timeout
    while loop.time() < deadline and not all(acknowledged <= set(seen) for seen in deliveries.values()):
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.0)  # late duplicates count too
    mark("drained" if all(acknowledged <= set(seen) for seen in deliveries.values()) else "drain timed out")
    stranded = await where_the_channels_stand(cluster, topic) if any(
        not acknowledged <= set(seen) for seen in deliveries.values()) else None
    channel_stats = {}
    for name, consumer in consumers.items():
        await consumer.stop()
        seen = deliveries[name]
        channel_stats[name] = {
            "consumed": len(seen),
            "duplicated": sum(seen.values()) - len(seen),
            "lost": len(acknowledged - set(seen)),
            "lost_sample": sorted(body[:8].decode() for body in acknowledged - set(seen))[:20],
            "delivered_though_publish_raised": len(set(failed) & set(seen)),
            "ordering_errors": len(consumer.ordering_errors),
            "duplicates_dropped_by_client": consumer.duplicates_dropped,
        }
    return {
        "topic": topic,
        "partitions": partitions,
        "replicas": replicas,
        "published": messages,
        "acknowledged": len(acknowledged),
        "failed": len(failed),
        "failures": {
            kind: {"count": len(times), "first_at_s": min(times), "last_at_s": max(times)}
            for kind, times in _by_kind(failed.values()).items()
        },
        "producer": producer_stats,
        "channels": channel_stats,
        "timeline": timeline,
        "channels_on_the_nodes": stranded,
    }


async def where_the_channels_stand(cluster: RealHACluster, topic: str) -> list[dict[str, Any]]:
    """What each running nsqd's /stats says of the topic's channels (when something was not delivered)."""
    import aiohttp

    found = []
    async with aiohttp.ClientSession(headers={"Accept": "application/vnd.nsq; version=1.0"}) as http:
        for index, address in enumerate(cluster.http_addresses):
            if cluster.nsqd_pid(index) is None:
                continue
            async with http.get(f"http://{address}/stats", params={"format": "json", "topic": topic}) as r:
                stats = json.loads(await r.read())
            for part in stats.get("topics") or ():
                found.append({
                    "nsqd": address, "partition": part.get("topic_partition"), "is_leader": part.get("is_leader"),
                    "channels": {c["channel_name"]: {k: c.get(k) for k in ("depth", "in_flight_count", "client_count")}
                                 for c in part.get("channels") or ()},
                })
    return found


def _by_kind(failures: Any) -> dict[str, list[float]]:
    kinds: dict[str, list[float]] = {}
    for when, kind in failures:
        kinds.setdefault(kind, []).append(when)
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("bin_dir", type=Path, help="youzan's nsqd and nsqlookupd (build-youzan.sh)")
    parser.add_argument("--base-port", type=int, default=0, help="ports from here on (default: the kernel's)")
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--rate", type=float, default=100.0, help="publishes per second")
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=3, help="per partition, the leader included")
    parser.add_argument("--kill-after", type=float, default=5.0)
    parser.add_argument("--restart-after", type=float, default=30.0)
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--data-dir", type=Path, help="keep the servers' data and logs here")
    parser.add_argument("--max-retries", type=int, help="Producer max_retries (default: the Producer's, 3)")
    parser.add_argument("--retry-delay", type=float, help="Producer retry_delay (default: the Producer's, 0.05 s)")
    args = parser.parse_args()
    cluster = RealHACluster(
        args.bin_dir.expanduser().resolve(),
        base_port=args.base_port,
        standalone=False,
        data_dir=args.data_dir,
    )
    with cluster:
        print(cluster.describe(), flush=True)
        result = fastnsq.run(
            failover(
                cluster,
                messages=args.messages,
                rate=args.rate,
                callers=args.callers,
                partitions=args.partitions,
                replicas=args.replicas,
                kill_after=args.kill_after,
                restart_after=args.restart_after,
                drain_timeout=args.drain_timeout,
            producer_options={k: v for k, v in (("max_retries", args.max_retries), ("retry_delay", args.retry_delay))
                              if v is not None},
            )
        )
    for at, what in result["timeline"]:
        print(f"{at:8.2f} s  {what}")
    print(
        f"\npublished {result['published']}, acknowledged {result['acknowledged']}, raised {result['failed']} "
        f"{result['failures'] or ''}"
    )
    for name, row in result["channels"].items():
        print(
            f"{name:8s} consumed {row['consumed']}, duplicated {row['duplicated']}, lost {row['lost']}, "
            f"delivered though the publish raised {row['delivered_though_publish_raised']}, "
            f"ordering errors {row['ordering_errors']}, repeated heads dropped {row['duplicates_dropped_by_client']}"
        )
    out = ROOT / "bench" / "results" / f"ha-failover-{datetime.now():%Y%m%d-%H%M}.json"
    out.write_text(
        json.dumps(
            {
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()} {os.cpu_count()} cores",
                "python": platform.python_version(),
                "server": cluster.describe(),
                "args": {k: str(v) for k, v in vars(args).items()},
                **result,
            },
            indent=1,
        )
    )
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
