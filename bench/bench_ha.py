"""HA throughput: publish, partitioned consume, ordered consume per partition; fastnsq and youzan's Go tools.

    python bench/bench_ha.py                                        # the embedded HA cluster
    python bench/bench_ha.py --real-bin ~/nsq-real/ha/bin [--base-port 14200] [--go-bin ~/nsq-real/ha/bin]

The cluster is 3 HA nsqd and an HA lookupd: the embedded ones (``NSQCluster(ha=True)``,
one child process) or, with ``--real-bin``, real youzan ones started by
:class:`fastnsq.testing.real.RealHACluster` (etcd from PATH; the flags of
fastnsq.testing.real's HA cluster flags). Topics have ``--partitions`` partitions
with ``--replicas`` replicas each (the embedded cluster does not replicate), their
channels created before anything is published. Bodies are 100 bytes. Each round runs
every workload once; rounds alternate which client goes first; the tables show the
median of the rounds.

* publish: fastnsq ``Producer.publish()`` through lookupd from 1,000 tasks (round robin
  over the partitions' leaders, coalesced per partition), ``--count`` messages;
* publish, one at a time: the same with a single task awaiting each publish, and
  youzan's ``to_nsq`` (go-nsq's TopicProducerMgr.Publish per stdin line, which waits
  for each answer), ``--seq-count`` messages each;
* partitioned consume: what the publish row put in, read by fastnsq ``Consumer``
  (one connection per partition, max_in_flight 2500, a sync handler) from one channel
  and by youzan's ``nsq_tail -n N -max-in-flight 2500`` (output to /dev/null) from another;
* ordered consume: ``--ordered-count`` messages spread over the partitions, read with
  SUB_ORDERED by fastnsq ``Consumer(ordered=True)`` and ``nsq_tail -ordered``: nsqd hands
  out one message at a time per partition.

The Go tools are looked for in ``--go-bin`` (default: ``--real-bin``); a tool that is
missing is left out with the reason. Prints the tables and writes
bench/results/ha-<server>-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastnsq
from fastnsq.testing import ExternalCluster, ExternalLookupd, ExternalNSQD
from fastnsq.testing.real import RealHACluster

BODY = b"h" * 100
CALLERS = 1000
MAX_IN_FLIGHT = 2500

EMBEDDED_SERVER = r"""
import asyncio, json, sys
from fastnsq.testing import NSQCluster

async def main(nodes, specs):
    async with NSQCluster(nodes=nodes, ha=True) as cluster:
        for spec in specs:
            await cluster.create_topic(spec["topic"], partitions=spec["partitions"], channels=spec["channels"])
        print(json.dumps({"lookupd": cluster.lookupd_http_addresses[0],
                          "leaders": {s["topic"]: cluster.partition_leaders(s["topic"]) for s in specs}}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

import fastnsq
fastnsq.run(main(int(sys.argv[1]), json.loads(sys.argv[2])))
"""


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Topics:
    """The topics of one round: what each workload publishes to or reads from."""

    publish: str  # the concurrent publish's messages; consumed from "fast" and "go"
    seq_fast: str
    seq_go: str
    ordered: str  # prefilled; consumed in order from "fast" and "go"

    @classmethod
    def of_round(cls, index: int) -> Topics:
        tag = f"{os.getpid()}_{index}"
        return cls(f"bha_pub_{tag}", f"bha_seqf_{tag}", f"bha_seqg_{tag}", f"bha_ord_{tag}")

    def specs(self, partitions: int) -> list[dict[str, Any]]:
        both = ["fast", "go"]
        return [
            {"topic": self.publish, "partitions": partitions, "channels": both},
            {"topic": self.seq_fast, "partitions": partitions, "channels": ["sink"]},
            {"topic": self.seq_go, "partitions": partitions, "channels": ["sink"]},
            {"topic": self.ordered, "partitions": partitions, "channels": both},
        ]


@dataclass
class Cluster:
    """Where the benchmark runs: the lookupd's address and how to say what the servers are."""

    lookupd: str
    description: str
    leaders: dict[str, dict[int, Any]] = field(default_factory=dict)
    stop: Any = None


def embedded_cluster(nodes: int, specs: list[dict[str, Any]]) -> Cluster:
    """Start the embedded cluster in a child process (the client gets this process to itself)."""
    server = subprocess.Popen(
        [sys.executable, "-c", EMBEDDED_SERVER, str(nodes), json.dumps(specs)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True,
    )
    info = json.loads(server.stdout.readline())  # type: ignore[union-attr]

    def stop() -> None:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(30)

    return Cluster(info["lookupd"], f"embedded NSQCluster(nodes={nodes}, ha=True) in one child process, "
                   f"codec {fastnsq.CODEC_IMPLEMENTATION}", info["leaders"], stop)


async def real_cluster(real: RealHACluster, specs: list[dict[str, Any]], replicas: int) -> Cluster:
    nodes = [ExternalNSQD(t, h) for t, h in zip(real.tcp_addresses, real.http_addresses)]
    harness = ExternalCluster(nodes, ExternalLookupd(real.lookupd_http_address, real.lookupd_tcp_address))
    placed = await asyncio.gather(*(
        harness.create_topic(s["topic"], s["partitions"], replicas=replicas, channels=s["channels"]) for s in specs
    ))
    leaders = {s["topic"]: p for s, p in zip(specs, placed)}
    return Cluster(real.lookupd_http_address, f"{real.describe()}; topics with {replicas} replicas", leaders)


# ---- fastnsq workloads ----------------------------------------------------------------


def row(workload: str, client: str, messages: int, seconds: float, cpu_s: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"workload": workload, "client": client, "messages": messages, "seconds": seconds,
                             "msgs_per_s": messages / seconds}
    if cpu_s is not None:
        entry["client_cpu_s_per_million"] = cpu_s / messages * 1e6
    return entry


async def fastnsq_publish(lookupd: str, topic: str, count: int, callers: int) -> dict[str, Any]:
    async with fastnsq.Producer(lookupd_http_addresses=[lookupd]) as producer:
        await producer.publish(topic, BODY)  # learn the partitions (and count it)
        left = count - 1

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await producer.publish(topic, BODY)

        c0, t0 = cpu(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        seconds, cpu_s = time.perf_counter() - t0, cpu() - c0
    name = "publish" if callers > 1 else "publish, one at a time"
    return row(name, f"fastnsq ({callers} task{'s' if callers > 1 else ''})", count - 1, seconds, cpu_s)


async def fastnsq_consume(lookupd: str, topic: str, channel: str, count: int, *, ordered: bool) -> dict[str, Any]:
    done = asyncio.Event()
    seen = 0

    def handle(message: Any) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    consumer = fastnsq.Consumer(topic, channel, lookupd_http_addresses=[lookupd], handler=handle,
                                max_in_flight=MAX_IN_FLIGHT, ordered=ordered)
    c0, t0 = cpu(), time.perf_counter()
    await consumer.start()
    await asyncio.wait_for(done.wait(), 900)
    seconds, cpu_s = time.perf_counter() - t0, cpu() - c0
    await consumer.stop()
    return row("ordered consume" if ordered else "partitioned consume", "fastnsq Consumer", count, seconds, cpu_s)


async def prefill_ordered(lookupd: str, topic: str, count: int, partitions: int) -> None:
    async with fastnsq.Producer(lookupd_http_addresses=[lookupd]) as producer:
        for start in range(0, count, 500):
            await producer.mpublish(topic, [BODY] * min(500, count - start), partition=(start // 500) % partitions)


# ---- youzan's Go tools ----------------------------------------------------------------


async def timed(argv: list[str], *, stdin: Path | None = None, timeout: float = 900) -> float:
    """Run a tool to its end; its wall time (process start included)."""
    loop = asyncio.get_running_loop()

    def run() -> float:
        t0 = time.perf_counter()
        with open(stdin or os.devnull, "rb") as source:
            done = subprocess.run(argv, stdin=source, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")
        return time.perf_counter() - t0

    return await loop.run_in_executor(None, run)


async def to_nsq(tool: Path, lookupd: str, topic: str, lines: Path, count: int) -> dict[str, Any]:
    seconds = await timed([str(tool), "-lookupd-http-address", lookupd, "-topic", topic], stdin=lines)
    return row("publish, one at a time", "youzan to_nsq (go-nsq)", count, seconds)


async def nsq_tail(tool: Path, lookupd: str, topic: str, channel: str, count: int, *, ordered: bool) -> dict[str, Any]:
    argv = [str(tool), "-lookupd-http-address", lookupd, "-topic", topic, "-channel", channel,
            "-n", str(count), "-max-in-flight", str(MAX_IN_FLIGHT)]
    if ordered:
        argv.append("-ordered")
    seconds = await timed(argv)
    return row("ordered consume" if ordered else "partitioned consume", "youzan nsq_tail (go-nsq)", count, seconds)


# ---- one round --------------------------------------------------------------------------


async def one_round(index: int, cluster: Cluster, topics: Topics, args: argparse.Namespace,
                    tools: dict[str, Path], lines: Path) -> list[dict[str, Any]]:
    lookupd = cluster.lookupd
    go_first = index % 2 == 1  # alternate who goes first: the machine's load drifts
    rows = [await fastnsq_publish(lookupd, topics.publish, args.count, CALLERS)]
    published = args.count

    async def pair(fast: Any, go: Any) -> list[dict[str, Any]]:
        if go is None:
            return [await fast()]
        return [await go(), await fast()] if go_first else [await fast(), await go()]

    rows += await pair(
        lambda: fastnsq_publish(lookupd, topics.seq_fast, args.seq_count + 1, 1),
        (lambda: to_nsq(tools["to_nsq"], lookupd, topics.seq_go, lines, args.seq_count)) if "to_nsq" in tools else None,
    )
    rows += await pair(
        lambda: fastnsq_consume(lookupd, topics.publish, "fast", published, ordered=False),
        (lambda: nsq_tail(tools["nsq_tail"], lookupd, topics.publish, "go", published, ordered=False))
        if "nsq_tail" in tools else None,
    )
    await prefill_ordered(lookupd, topics.ordered, args.ordered_count, args.partitions)
    rows += await pair(
        lambda: fastnsq_consume(lookupd, topics.ordered, "fast", args.ordered_count, ordered=True),
        (lambda: nsq_tail(tools["nsq_tail"], lookupd, topics.ordered, "go", args.ordered_count, ordered=True))
        if "nsq_tail" in tools else None,
    )
    load = [round(x, 2) for x in os.getloadavg()]  # other work on the machine moves every number
    for entry in rows:
        entry["round"] = index
        entry["load_average_after"] = load
        if entry["workload"] == "ordered consume":
            entry["msgs_per_s_per_partition"] = entry["msgs_per_s"] / args.partitions
    return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, client): the median msgs/s over the rounds, and each round's."""
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in rows:
        keyed.setdefault((entry["workload"], entry["client"]), []).append(entry)
    out = []
    for (workload, client), entries in keyed.items():
        rates = [e["msgs_per_s"] for e in entries]
        summary: dict[str, Any] = {"workload": workload, "client": client, "messages": entries[0]["messages"],
                                   "rounds": len(entries), "msgs_per_s_median": statistics.median(rates),
                                   "msgs_per_s_rounds": [round(r) for r in rates]}
        cpus = [e["client_cpu_s_per_million"] for e in entries if "client_cpu_s_per_million" in e]
        if cpus:
            summary["client_cpu_s_per_million_median"] = statistics.median(cpus)
        if workload == "ordered consume":
            summary["msgs_per_s_per_partition_median"] = statistics.median(
                e["msgs_per_s_per_partition"] for e in entries)
        out.append(summary)
    return out


def find_tools(go_bin: Path | None) -> tuple[dict[str, Path], dict[str, str]]:
    tools: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for name in ("to_nsq", "nsq_tail"):
        path = go_bin / name if go_bin is not None else None
        if path is not None and path.is_file() and os.access(path, os.X_OK):
            tools[name] = path
        else:
            missing[name] = f"not in {go_bin}" if go_bin is not None else "no --go-bin (or --real-bin) given"
    return tools, missing


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rounds = [Topics.of_round(i) for i in range(args.rounds)]
    specs = [spec for topics in rounds for spec in topics.specs(args.partitions)]
    go_bin = args.go_bin or args.real_bin
    tools, missing = find_tools(go_bin.expanduser() if go_bin else None)
    with tempfile.TemporaryDirectory() as folder:
        lines = Path(folder) / "lines"
        lines.write_bytes((BODY + b"\n") * args.seq_count)  # to_nsq publishes each line without its newline
        real = None
        if args.real_bin:
            real = RealHACluster(args.real_bin.expanduser().resolve(), base_port=args.base_port, standalone=False)
            await asyncio.get_running_loop().run_in_executor(None, real.start)
        try:
            cluster = (await real_cluster(real, specs, args.replicas) if real is not None
                       else embedded_cluster(args.nodes, specs))
            try:
                rows = []
                for index, topics in enumerate(rounds):
                    rows += await one_round(index, cluster, topics, args, tools, lines)
                    print(f"round {index + 1}/{args.rounds} done", flush=True)
            finally:
                if cluster.stop is not None:
                    cluster.stop()
        finally:
            if real is not None:
                real.stop()
    return {"server": cluster.description, "tools": {k: str(v) for k, v in tools.items()},
            "tools_left_out": missing, "rows": rows, "medians": medians(rows),
            "leaders": {t: {str(k): v for k, v in p.items()} for t, p in cluster.leaders.items()}}


def table(result: dict[str, Any]) -> str:
    lines = [f"{'WORKLOAD':24s} {'CLIENT':26s} {'MESSAGES':>9s} {'MSG/S (median)':>15s} {'CPU S/1M':>9s}  ROUNDS"]
    for entry in result["medians"]:
        cpu_s = entry.get("client_cpu_s_per_million_median")
        extra = (f"  ({entry['msgs_per_s_per_partition_median']:,.0f}/partition)"
                 if "msgs_per_s_per_partition_median" in entry else "")
        lines.append(f"{entry['workload']:24s} {entry['client']:26s} {entry['messages']:9,d} "
                     f"{entry['msgs_per_s_median']:15,.0f} {'' if cpu_s is None else f'{cpu_s:9.2f}':>9s}  "
                     f"{entry['msgs_per_s_rounds']}{extra}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real-bin", type=Path, help="youzan's nsqd/nsqlookupd: run on a real cluster (etcd on PATH)")
    parser.add_argument("--base-port", type=int, default=0, help="real cluster's ports from here (default: any)")
    parser.add_argument("--go-bin", type=Path, help="where to_nsq and nsq_tail are (default: --real-bin)")
    parser.add_argument("--nodes", type=int, default=3, help="embedded cluster nodes (a real one has 3)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2, help="real cluster: replicas per partition")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000, help="publish / partitioned consume messages")
    parser.add_argument("--seq-count", type=int, default=20_000, help="one-at-a-time publish messages")
    parser.add_argument("--ordered-count", type=int, default=20_000)
    args = parser.parse_args()
    result = fastnsq.run(main(args))
    server = "real" if args.real_bin else "embedded"
    print(f"\nHA cluster: {result['server']}; {args.partitions} partitions; client on uvloop, codec "
          f"{fastnsq.CODEC_IMPLEMENTATION}; median of {args.rounds} alternated rounds, 100-byte bodies\n")
    print(table(result))
    for tool, why in result["tools_left_out"].items():
        print(f"left out: {tool} ({why})")
    out = ROOT / "bench" / "results" / f"ha-{server}-{datetime.now():%Y%m%d-%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores", "python": platform.python_version(),
        "command": " ".join(sys.argv), "args": {k: str(v) for k, v in vars(args).items()}, **result,
    }, indent=1))
    print(f"\nwritten to {out}")
