"""``fastnsq worker`` scaling (issue 34): a CPU-bound handler, 1 process against 2, on a real nsqd.

Each run pre-fills a new topic with ``--count`` messages (100-byte bodies), starts
``fastnsq worker worker:Burn`` (this file is also the handler module: ``Burn`` spends about
``--handler-us`` microseconds of pure Python per message and remembers the bodies it
handled, written out by its ``teardown()``), and polls nsqd's ``/stats`` every 50 ms: the
clock runs from the first poll that sees a message handled to the one that sees none left
(queued, in flight or deferred), so the processes' start-up is not counted. Then SIGTERM,
and the bodies every process handled are checked: each message exactly once.

Two layouts, rounds alternating 1 and 2 processes, medians reported:

* ``single``: one nsqd, every process connected to it (the default);
* ``split``: three nsqd behind an nsqlookupd, ``--split-nsqd`` (each nsqd to one process,
  an nsqd moved from a busy process to an idle one while messages wait; every poll also
  checks that each nsqd holds at most one connection of the channel, and the run records
  how many nsqd moved).

    python bench/worker.py --bin ~/nsq-real/bin --rounds 3 [--port-base 24100]

Writes ``bench/results/worker-<date>.json`` and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class Burn:
    """The handler the worker runs (``worker:Burn``): pure-Python work, bodies kept for the check."""

    def setup(self) -> None:
        self.loops = int(os.environ["BENCH_BURN_LOOPS"])
        self.seen: list[bytes] = []

    def handle(self, message: Any) -> None:
        total = 0
        for i in range(self.loops):
            total += i * i
        self.seen.append(message.body[:8])

    def teardown(self) -> None:
        path = Path(os.environ["BENCH_OUT"]) / f"seen-{os.getpid()}"
        path.write_bytes(b"\n".join(self.seen))


def calibrate(target_us: float) -> int:
    """How many loop turns of Burn.handle take ``target_us`` microseconds here (best of 5)."""
    loops = 1000
    burn = Burn()
    burn.loops, burn.seen = loops, []

    class _Message:
        body = b"00000000"

    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(2000):
            burn.handle(_Message)
        best = min(best, (time.perf_counter() - started) / 2000)
    return max(1, round(loops * target_us * 1e-6 / best))


# ---- one run ---------------------------------------------------------------------------------


async def prefill(addresses: list[str], topic: str, count: int) -> None:
    from fastnsq import Producer

    bodies = [b"%08d-" % i + b"x" * 91 for i in range(count)]
    for index, address in enumerate(addresses):
        async with Producer([address]) as producer:
            mine = bodies[index :: len(addresses)]
            for start in range(0, len(mine), 1000):
                await producer.mpublish(topic, mine[start : start + 1000])


async def channel_figures(session: Any, http_addresses: list[str], topic: str) -> list[dict[str, Any]]:
    """Each nsqd's view of the bench channel, with ``left``: messages still queued in the topic
    (no channel yet, or not yet moved into it), queued in the channel, in flight or deferred."""
    found = []
    for address in http_addresses:
        async with session.get(f"http://{address}/stats", params={"format": "json", "topic": topic}) as resp:
            data = await resp.json(content_type=None)
        topics = [t for t in data.get("topics") or [] if t["topic_name"] == topic]
        channels = [c for t in topics for c in t["channels"] if c["channel_name"] == "bench"]
        figures = dict(channels[0]) if channels else {"depth": 0, "in_flight_count": 0, "deferred_count": 0,
                                                      "clients": []}
        figures["left"] = (sum(t["depth"] for t in topics) + figures["depth"] + figures["in_flight_count"]
                           + figures["deferred_count"])
        found.append(figures)
    return found


async def one_run(servers: dict[str, Any], processes: int, args: argparse.Namespace, loops: int) -> dict[str, Any]:
    from fastnsq.testing.process import free_port

    topic = f"worker_bench_{os.getpid()}_{time.monotonic_ns()}"
    nsqds = servers["nsqd"]
    await prefill([n.tcp_address for n in nsqds], topic, args.count)
    out = Path(tempfile.mkdtemp(prefix="fastnsq-worker-bench-"))
    port = args.port_base + 99 if args.port_base else free_port()
    command = [sys.executable, "-m", "fastnsq", "worker", "worker:Burn", "--topic", topic, "--channel", "bench",
               "--processes", str(processes), "--max-in-flight", str(args.max_in_flight),
               "--metrics-port", str(port), "--log-level", "WARNING"]
    if servers["lookupd"] is not None:
        command += ["--split-nsqd", "--lookupd-http-address", servers["lookupd"].http_address,
                    "--consumer-opt", "lookupd_poll_interval=1"]
    else:
        command += ["--nsqd-tcp-address", nsqds[0].tcp_address]
    command += args.worker_arg
    env = {**os.environ, "BENCH_BURN_LOOPS": str(loops), "BENCH_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    load = os.getloadavg()[0]
    worker = await asyncio.create_subprocess_exec(*command, cwd=HERE, env=env)
    try:
        return {"processes": processes, **await _measure(worker, nsqds, topic, port, out, args, load)}
    finally:
        if worker.returncode is None:
            worker.kill()


async def _measure(worker: Any, nsqds: list[Any], topic: str, port: int, out: Path, args: argparse.Namespace,
                   load: float) -> dict[str, Any]:
    """Poll nsqd until every message is handled; then SIGTERM the worker and check what it handled."""
    import aiohttp

    from fastnsq.benchmark import process_cpu_seconds
    from fastnsq.testing import drain

    http = [n.http_address for n in nsqds]
    most_connections: list[int] = [0] * len(nsqds)
    async with aiohttp.ClientSession() as session:
        t0 = handled0 = None
        cpu0: list[float] = []
        while True:
            figures = await channel_figures(session, http, topic)
            now = time.perf_counter()
            left = sum(f["left"] for f in figures)
            handled = args.count - left
            if t0 is None and handled > 0:
                t0, handled0 = now, handled
                cpu0 = [process_cpu_seconds(n.pid) or 0.0 for n in nsqds]
            if t0 is not None:
                most_connections = [max(m, len(f["clients"])) for m, f in zip(most_connections, figures)]
            # Done when the channel took every message and holds none, in two answers in a row
            # (fastnsq.testing.drain: one answer's counts can be read across nsqd's pump).
            if handled == args.count and await drain.channel_drained(http, topic, "bench", published=args.count):
                t1 = now
                break
            if worker.returncode is not None:
                raise SystemExit(f"the worker exited with {worker.returncode}")
            await asyncio.sleep(0.05)
        nsqd_cpu = sum((process_cpu_seconds(n.pid) or 0.0) - c for n, c in zip(nsqds, cpu0))
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            metrics = await resp.text()
    worker.send_signal(signal.SIGTERM)
    status = await asyncio.wait_for(worker.wait(), 60)
    assert t0 is not None and handled0 is not None
    seen = [line for path in out.glob("seen-*") for line in path.read_bytes().split(b"\n") if line]
    duration = t1 - t0
    return {
        "layout": "split" if len(nsqds) > 1 else "single",
        "rate": (args.count - handled0) / duration, "duration": duration, "exit_status": status,
        "handled": len(seen), "distinct": len(set(seen)), "exactly_once": len(seen) == len(set(seen)) == args.count,
        "nsqd_cpu_share": nsqd_cpu / duration, "worker_cpu_seconds": _metric(metrics, "process_cpu_seconds_total"),
        "connections_per_nsqd": most_connections, "load_average_1m": load,
        "nsqd_moves": _metric(metrics, "nsq_worker_nsqd_moves_total"),
    }


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


# ---- the layouts -------------------------------------------------------------------------------


def start_servers(layout: str, binary_dir: Path, port_base: int | None) -> dict[str, Any]:
    from fastnsq.testing.process import NSQDProcess, NSQLookupdProcess

    ports = iter(range(port_base, port_base + 100)) if port_base else None

    def start(server: Any) -> Any:
        if ports is not None:  # the ports asked for, else the kernel's free ones
            server.tcp_address, server.http_address = f"127.0.0.1:{next(ports)}", f"127.0.0.1:{next(ports)}"
        server.start()
        return server

    flags = ("--mem-queue-size=1000000",)
    if layout == "single":
        return {"nsqd": [start(NSQDProcess(*flags, binary=binary_dir / "nsqd"))], "lookupd": None}
    lookupd = start(NSQLookupdProcess(binary_dir / "nsqlookupd"))
    nsqds = [start(NSQDProcess(*flags, binary=binary_dir / "nsqd", lookupd_tcp_addresses=[lookupd.tcp_address]))
             for _ in range(3)]
    return {"nsqd": nsqds, "lookupd": lookupd}


def stop_servers(servers: dict[str, Any]) -> None:
    for server in [*servers["nsqd"], servers["lookupd"]]:
        if server is not None:
            server.stop()


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    loops = calibrate(args.handler_us)
    results: dict[str, Any] = {"runs": [], "loops": loops}
    for layout in args.layouts:
        servers = start_servers(layout, Path(args.bin).expanduser(), args.port_base)
        try:
            for round_index in range(args.rounds):
                for processes in (1, 2) if round_index % 2 == 0 else (2, 1):
                    run = await one_run(servers, processes, args, loops)
                    run["round"] = round_index
                    results["runs"].append(run)
                    print(json.dumps(run), flush=True)
        finally:
            stop_servers(servers)
    return results


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for layout in sorted({run["layout"] for run in results["runs"]}):
        runs = [run for run in results["runs"] if run["layout"] == layout]
        by = {p: [r for r in runs if r["processes"] == p] for p in (1, 2)}
        rates = {p: statistics.median(r["rate"] for r in by[p]) for p in (1, 2)}
        ratios = [two["rate"] / one["rate"] for one, two in zip(
            sorted(by[1], key=lambda r: r["round"]), sorted(by[2], key=lambda r: r["round"]))]
        summary[layout] = {
            "median_rate_1": rates[1], "median_rate_2": rates[2], "ratio_of_medians": rates[2] / rates[1],
            "median_of_round_ratios": statistics.median(ratios), "round_ratios": ratios,
            "nsqd_cpu_share_median": {p: statistics.median(r["nsqd_cpu_share"] for r in by[p]) for p in (1, 2)},
            "every_run_exactly_once": all(r["exactly_once"] for r in runs),
            "every_exit_0": all(r["exit_status"] == 0 for r in runs),
            "connections_per_nsqd": sorted({tuple(r["connections_per_nsqd"]) for r in runs}),
            "nsqd_moves": {p: [r.get("nsqd_moves", 0) for r in by[p]] for p in (1, 2)},
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="folder with the real nsqd and nsqlookupd")
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--handler-us", type=float, default=50.0)
    parser.add_argument("--max-in-flight", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="one more argument for fastnsq worker (repeat: --worker-arg=--consumer-opt "
                             "--worker-arg=express_lane=false)")
    parser.add_argument("--port-base", type=int, help="nsqd and nsqlookupd on ports from this one up "
                        "(default: free ones the kernel picks); the worker's metrics port too")
    parser.add_argument("--layouts", nargs="+", default=["single", "split"], choices=["single", "split"])
    parser.add_argument("--out", default=str(HERE / "results" / f"worker-{time.strftime('%Y-%m-%d-%H%M')}.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    results = asyncio.run(bench(args))
    results["summary"] = summarize(results)
    results["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "shared": True}
    results["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["summary"], indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
