"""fastnsq next to youzan/go-nsq's own Consumer and TopicProducerMgr, on a real youzan HA cluster.

    python bench/bench_ha_vs_yz.py --real-bin ~/nsq-real/ha/bin [--base-port 16300] [--rounds 3]

The cluster: etcd + a youzan nsqlookupd + 3 youzan nsqd (0.3.7-HA.1.13.0) started by
:class:`fastnsq.testing.real.RealHACluster` with the flags of
fastnsq.testing.real's HA cluster (the JSON records every argv). youzan/go-nsq
v1.7.2-HA runs in bench/go/src/yz_driver (bench/yz_driver.py builds it). Topics have
``--partitions`` partitions with 2 replicas, their channels made before anything is
published; bodies are 100 bytes. Each round runs every workload once for each client,
alternating which client goes first; the table shows medians and every round's figure.
The measure is the upstream side-by-side's: the clock runs to the count-th message, the
client's CPU from getrusage, the server's from /proc of the three nsqd, both per message.

* partitioned consume: ``--count`` messages pre-filled over the partitions (MPUB), read by
  fastnsq ``Consumer`` (sync handler, max_in_flight 2500) from one channel and by go-nsq's
  ``Consumer`` (one handler, MaxInFlight 2500) from another; the clock starts before connecting;
* ordered consume: ``--ordered-count`` messages, read with SUB_ORDERED (fastnsq
  ``ordered=True``, go-nsq ``EnableOrdered``). nsqd hands out one message at a time per
  partition, so the bound is partitions / (round trip per message): measured with one bare
  connection (fastnsq's codec, RDY 1, FIN written in the same pass as the message arrives) on
  one partition, as the median time between consecutive messages;
* publish from 1,000 callers: 1,000 asyncio tasks on one fastnsq ``Producer`` (coalesced)
  and 1,000 goroutines on one go-nsq ``TopicProducerMgr`` (``Publish``, go-nsq's defaults:
  pool size 2, PubStrategy dynamic load); ``--count`` messages;
* sharded publish: the same with a sharding key per caller (fastnsq ``sharding_key``,
  go-nsq ``PublishOrdered``; both murmur3).

Prints the table and writes bench/results/ha-vs-yz-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import yz_driver
from bench_ha import cpu

import fastnsq
from fastnsq.benchmark import process_cpu_seconds
from fastnsq.conn import Connection
from fastnsq.testing import ExternalCluster, ExternalLookupd, ExternalNSQD
from fastnsq.testing.real import RealHACluster

BODY = b"h" * 100
CALLERS = 1000
MAX_IN_FLIGHT = 2500  # both clients, unless --max-in-flight says otherwise


def server_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the nsqd processes have used so far."""
    return sum(process_cpu_seconds(pid) or 0.0 for pid in pids)


def entry(workload: str, client: str, messages: int, seconds: float, client_cpu: float,
          nsqd_cpu: float) -> dict[str, Any]:
    return {"workload": workload, "client": client, "messages": messages, "seconds": seconds,
            "msgs_per_s": messages / seconds, "client_cpu_us_per_msg": client_cpu / messages * 1e6,
            "server_cpu_us_per_msg": nsqd_cpu / messages * 1e6}


class Bench:
    def __init__(self, args: argparse.Namespace, real: RealHACluster, driver: Path) -> None:
        self.args = args
        self.real = real
        self.driver = driver
        self.lookupd = real.lookupd_http_address
        self.pids = [pid for i in range(real.nsqds) if (pid := real.nsqd_pid(i)) is not None]
        nodes = [ExternalNSQD(t, h) for t, h in zip(real.tcp_addresses, real.http_addresses)]
        self.harness = ExternalCluster(nodes, ExternalLookupd(real.lookupd_http_address, real.lookupd_tcp_address))

    async def topic(self, name: str, channels: list[str]) -> dict[int, str]:
        return await self.harness.create_topic(name, self.args.partitions, replicas=self.args.replicas,
                                               channels=channels)

    async def prefill(self, topic: str, count: int) -> None:
        async with fastnsq.Producer(lookupd_http_addresses=[self.lookupd]) as producer:
            for start in range(0, count, 1000):
                await producer.mpublish(topic, [BODY] * min(1000, count - start),
                                        partition=(start // 1000) % self.args.partitions)

    # ---- consuming ---------------------------------------------------------------------

    async def fastnsq_consume(self, topic: str, channel: str, count: int, *, ordered: bool) -> dict[str, Any]:
        done = asyncio.Event()
        seen = 0

        def handle(message: Any) -> None:
            nonlocal seen
            seen += 1
            if seen == count:
                done.set()

        consumer = fastnsq.Consumer(topic, channel, lookupd_http_addresses=[self.lookupd], handler=handle,
                                    max_in_flight=self.args.max_in_flight, ordered=ordered)
        s0, c0, t0 = server_cpu(self.pids), cpu(), time.perf_counter()
        await consumer.start()
        try:
            await asyncio.wait_for(done.wait(), self.args.timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(f"fastnsq read {seen} of {count} from {topic}/{channel}: {consumer.snapshot()}") from None
        seconds, client_cpu, nsqd_cpu = time.perf_counter() - t0, cpu() - c0, server_cpu(self.pids) - s0
        await consumer.stop()
        name = "ordered consume" if ordered else "partitioned consume"
        return entry(name, "fastnsq Consumer", count, seconds, client_cpu, nsqd_cpu)

    async def go(self, workload: str, client: str, *flags: str) -> dict[str, Any]:
        s0 = server_cpu(self.pids)
        process = await asyncio.create_subprocess_exec(
            str(self.driver), *flags, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 900)
        nsqd_cpu = server_cpu(self.pids) - s0  # includes the driver's start: a few ms
        if process.returncode != 0:
            raise RuntimeError(f"yz_driver {flags} exited {process.returncode}: {err.decode()[-1500:]}")
        result = json.loads(out.splitlines()[-1])
        if result.get("errors"):
            raise RuntimeError(f"yz_driver {flags}: {result['errors']} publishes failed")
        return entry(workload, client, result["msgs"], result["secs"], result["cpu_user_s"] + result["cpu_sys_s"],
                     nsqd_cpu)

    async def go_consume(self, topic: str, channel: str, count: int, *, ordered: bool) -> dict[str, Any]:
        flags = ["-mode=bench-consume", f"-lookupd={self.lookupd}", f"-topic={topic}", f"-channel={channel}",
                 f"-count={count}", f"-max-in-flight={self.args.max_in_flight}"]
        if ordered:
            flags.append("-ordered")
        name = "ordered consume" if ordered else "partitioned consume"
        return await self.go(name, "youzan/go-nsq Consumer", *flags)

    async def bare_ordered(self, topic: str, channel: str, leaders: dict[int, str], partitions: list[int],
                           count: int) -> list[list[float]]:
        """Bare connections (the codec, RDY 1, FIN in the same pass as the message arrives) reading
        ``count`` messages of each of ``partitions`` with SUB_ORDERED at once: each one's arrival times."""
        arrivals: list[list[float]] = [[] for _ in partitions]
        finished = asyncio.Event()
        conns = []
        for index, partition in enumerate(partitions):
            def on_message(message: Any, seen: list[float] = arrivals[index], at: int = index) -> None:
                seen.append(time.perf_counter())
                conns[at].fin(message)
                if all(len(a) >= count for a in arrivals):
                    finished.set()

            conn = Connection(leaders[partition], fastnsq.ConnectionOptions(), on_message=on_message)
            conns.append(conn)
            await conn.connect()
            await conn.subscribe(topic, channel, partition=partition, ordered=True)
        for conn in conns:
            conn.rdy(1)
        await asyncio.wait_for(finished.wait(), 600)
        await asyncio.gather(*(conn.close() for conn in conns))
        return arrivals

    async def round_trip(self, topic: str, leaders: dict[int, str], count: int) -> dict[str, Any]:
        """The bound of ordered consumption: one message in flight per partition, FIN at once.

        The round trip per message is measured on one partition alone (the median time between
        consecutive messages); the bound is partitions / round trip. The same bare client on every
        partition at once shows what nsqd gives when all partitions run together."""
        one = (await self.bare_ordered(topic, "rtt", leaders, [0], count))[0]
        gaps = sorted(b - a for a, b in itertools.pairwise(one[1:]))  # the first includes the SUB
        median = statistics.median(gaps)
        together = await self.bare_ordered(topic, "rtt_all", leaders, list(range(self.args.partitions)), count)
        t0 = min(a[1] for a in together)
        t1 = max(a[count - 1] for a in together)
        return {"workload": "ordered round trip", "messages": len(gaps), "round_trip_ms_median": median * 1e3,
                "round_trip_ms_p90": gaps[int(len(gaps) * 0.9)] * 1e3,
                "bound_msgs_per_s": self.args.partitions / median,
                "bare_all_partitions_msgs_per_s": self.args.partitions * (count - 2) / (t1 - t0)}

    # ---- publishing --------------------------------------------------------------------

    async def fastnsq_publish(self, topic: str, count: int, *, sharded: bool) -> dict[str, Any]:
        async with fastnsq.Producer(lookupd_http_addresses=[self.lookupd]) as producer:
            for _ in range(50):  # as go-nsq's warm-up: routes and connections before the clock
                await producer.publish(topic, BODY)
            left = count

            async def caller(index: int) -> None:
                nonlocal left
                key = f"key-{index}" if sharded else None
                while left > 0:
                    left -= 1
                    await producer.publish(topic, BODY, sharding_key=key)

            s0, c0, t0 = server_cpu(self.pids), cpu(), time.perf_counter()
            await asyncio.gather(*(caller(i) for i in range(CALLERS)))
            seconds, client_cpu, nsqd_cpu = time.perf_counter() - t0, cpu() - c0, server_cpu(self.pids) - s0
        name = "sharded publish, 1,000 callers" if sharded else "publish, 1,000 callers"
        return entry(name, "fastnsq Producer", count, seconds, client_cpu, nsqd_cpu)

    async def go_publish(self, topic: str, count: int, *, sharded: bool) -> dict[str, Any]:
        flags = ["-mode=bench-pub", f"-lookupd={self.lookupd}", f"-topic={topic}", f"-count={count}",
                 f"-concurrency={CALLERS}", "-size=100"]
        if sharded:
            flags.append("-sharded")
        name = "sharded publish, 1,000 callers" if sharded else "publish, 1,000 callers"
        return await self.go(name, "youzan/go-nsq TopicProducerMgr", *flags)

    async def profiled(self, label: str, workload: Any) -> dict[str, Any]:
        """Run ``workload()``; with ``--pprof DIR`` every nsqd's CPU profile (youzan's
        ``/debug/pprof/profile``) is taken meanwhile, for ``--pprof-seconds``, into
        ``DIR/<label>-nsqd<i>.pprof`` (read with ``go tool pprof -top <nsqd binary> <files>``)."""
        if not self.args.pprof:
            return await workload()
        import aiohttp

        folder = Path(self.args.pprof)
        folder.mkdir(parents=True, exist_ok=True)

        async def capture(session: aiohttp.ClientSession, index: int, address: str) -> None:
            url = f"http://{address}/debug/pprof/profile?seconds={self.args.pprof_seconds}"
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=120)) as response:
                (folder / f"{label}-nsqd{index}.pprof").write_bytes(await response.read())

        async with aiohttp.ClientSession() as session:
            captures = [asyncio.create_task(capture(session, i, a)) for i, a in enumerate(self.real.http_addresses)]
            await asyncio.sleep(0.1)  # the profiles start on request
            result = await workload()
            await asyncio.gather(*captures)
        result["pprof"] = label
        return result

    # ---- a round -----------------------------------------------------------------------

    async def one_round(self, index: int) -> list[dict[str, Any]]:
        args = self.args
        tag = f"{os.getpid()}_{index}"
        go_first = index % 2 == 1

        async def pair(fast: Any, go: Any) -> list[dict[str, Any]]:
            return [await go(), await fast()] if go_first else [await fast(), await go()]

        rows: list[dict[str, Any]] = []
        only = set(args.only.split(","))
        if "consume" in only:
            consume = f"yzc_{tag}"
            await self.topic(consume, ["fast", "go"])
            await self.prefill(consume, args.count)
            rows += await pair(
                lambda: self.profiled(f"consume-fastnsq-{index}", lambda: self.fastnsq_consume(
                    consume, "fast", args.count, ordered=False)),
                lambda: self.profiled(f"consume-go-nsq-{index}", lambda: self.go_consume(
                    consume, "go", args.count, ordered=False)))
        if "ordered" in only:
            ordered = f"yzo_{tag}"
            leaders = await self.topic(ordered, ["fast", "go", "rtt", "rtt_all"])
            await self.prefill(ordered, args.ordered_count)
            rows += await pair(
                lambda: self.profiled(f"ordered-fastnsq-{index}", lambda: self.fastnsq_consume(
                    ordered, "fast", args.ordered_count, ordered=True)),
                lambda: self.profiled(f"ordered-go-nsq-{index}", lambda: self.go_consume(
                    ordered, "go", args.ordered_count, ordered=True)))
            rows.append(await self.round_trip(ordered, leaders, min(2000, args.ordered_count // args.partitions)))
        for sharded in [s for s in (False, True) if ("sharded" if s else "publish") in only]:
            fast_topic, go_topic = f"yzpf_{int(sharded)}_{tag}", f"yzpg_{int(sharded)}_{tag}"
            await self.topic(fast_topic, ["sink"])
            await self.topic(go_topic, ["sink"])
            rows += await pair(lambda s=sharded, t=fast_topic: self.fastnsq_publish(t, args.count, sharded=s),
                               lambda s=sharded, t=go_topic: self.go_publish(t, args.count, sharded=s))
        load = [round(x, 2) for x in os.getloadavg()]
        for row in rows:
            row["round"] = index
            row["load_average_after"] = load
        return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keyed: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        keyed.setdefault((row["workload"], row.get("client", "")), []).append(row)
    out = []
    for (workload, client), entries in keyed.items():
        if workload == "ordered round trip":
            rtts = [e["round_trip_ms_median"] for e in entries]
            bare = [e["bare_all_partitions_msgs_per_s"] for e in entries]
            out.append({"workload": workload, "client": "bare connection", "rounds": len(entries),
                        "round_trip_ms_median": statistics.median(rtts), "round_trip_ms_rounds": rtts,
                        "bound_msgs_per_s_median": statistics.median(e["bound_msgs_per_s"] for e in entries),
                        "bare_all_partitions_msgs_per_s_median": statistics.median(bare),
                        "bare_all_partitions_msgs_per_s_rounds": [round(b) for b in bare]})
            continue
        rates = [e["msgs_per_s"] for e in entries]
        out.append({"workload": workload, "client": client, "messages": entries[0]["messages"], "rounds": len(entries),
                    "msgs_per_s_median": statistics.median(rates), "msgs_per_s_rounds": [round(r) for r in rates],
                    "client_cpu_us_per_msg_median": statistics.median(e["client_cpu_us_per_msg"] for e in entries),
                    "server_cpu_us_per_msg_median": statistics.median(e["server_cpu_us_per_msg"] for e in entries)})
    return out


def table(summary: list[dict[str, Any]]) -> str:
    lines = [(f"{'WORKLOAD':32s} {'CLIENT':32s} {'MSG/S median':>13s} {'vs go':>6s} {'CLIENT us/msg':>13s} "
              f"{'NSQD us/msg':>11s}  ROUNDS")]
    go_rate = {e["workload"]: e["msgs_per_s_median"] for e in summary if "go-nsq" in e["client"]}
    bound = next((e for e in summary if e["workload"] == "ordered round trip"), None)
    for e in summary:
        if e["workload"] == "ordered round trip":
            continue
        ratio = e["msgs_per_s_median"] / go_rate[e["workload"]] if e["workload"] in go_rate else float("nan")
        extra = ""
        if bound is not None and e["workload"] == "ordered consume":
            extra = (f"  ({e['msgs_per_s_median'] / bound['bound_msgs_per_s_median']:.0%} of the bound, "
                     f"{e['msgs_per_s_median'] / bound['bare_all_partitions_msgs_per_s_median']:.0%} of bare)")
        lines.append(f"{e['workload']:32s} {e['client']:32s} {e['msgs_per_s_median']:13,.0f} {ratio:6.2f} "
                     f"{e['client_cpu_us_per_msg_median']:13.1f} {e['server_cpu_us_per_msg_median']:11.1f}  "
                     f"{e['msgs_per_s_rounds']}{extra}")
    if bound is not None:
        lines.append(f"ordered round trip (one partition, one in flight): {bound['round_trip_ms_median']:.3f} ms "
                     f"median {[round(r, 3) for r in bound['round_trip_ms_rounds']]}; bound = partitions / round "
                     f"trip = {bound['bound_msgs_per_s_median']:,.0f} msg/s; bare connections on every partition "
                     f"at once: {bound['bare_all_partitions_msgs_per_s_median']:,.0f} msg/s "
                     f"{bound['bare_all_partitions_msgs_per_s_rounds']}")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    driver = yz_driver.build()
    real = RealHACluster(args.real_bin.expanduser().resolve(), base_port=args.base_port, standalone=False)
    await asyncio.get_running_loop().run_in_executor(None, real.start)
    try:
        bench = Bench(args, real, driver)
        rows = []
        for index in range(args.rounds):
            rows += await bench.one_round(index)
            print(f"round {index + 1}/{args.rounds} done", flush=True)
        argv = {name: node.argv for name, node in real._nodes.items()}
        return {"server": real.describe(), "argv": argv, "rows": rows, "medians": medians(rows)}
    finally:
        real.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real-bin", type=Path, required=True, help="youzan's nsqd and nsqlookupd (etcd on PATH)")
    parser.add_argument("--base-port", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2, help="replicas per partition (1: no replication)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--ordered-count", type=int, default=20_000)
    parser.add_argument("--timeout", type=float, default=900, help="seconds a workload may take")
    parser.add_argument("--only", default="consume,ordered,publish,sharded", help="the workloads to run")
    parser.add_argument("--max-in-flight", type=int, default=MAX_IN_FLIGHT,
                        help="consume: both clients' max in flight (fastnsq max_in_flight, go-nsq MaxInFlight)")
    parser.add_argument("--pprof", default="", metavar="DIR",
                        help="consume and ordered consume: take every nsqd's CPU profile meanwhile, into DIR")
    parser.add_argument("--pprof-seconds", type=int, default=3)
    args = parser.parse_args()
    result = fastnsq.run(main(args))
    print(f"\n{result['server']}; {args.partitions} partitions x {args.replicas} replicas; 100-byte bodies; fastnsq on uvloop, "
          f"codec {fastnsq.CODEC_IMPLEMENTATION}; youzan/go-nsq v1.7.2-HA; medians of {args.rounds} alternated rounds\n")
    print(table(result["medians"]))
    out = HERE / "results" / f"ha-vs-yz-{datetime.now():%Y%m%d-%H%M}.json"
    out.write_text(json.dumps({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores", "python": platform.python_version(),
        "command": " ".join(sys.argv), "args": {k: str(v) for k, v in vars(args).items()}, **result,
    }, indent=1))
    print(f"\nwritten to {out}")
