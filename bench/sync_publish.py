"""The blocking facade's publish from threads: msg/s and per-call latency, beside go-nsq.

Closed loop: ``--count`` messages of ``--size`` bytes split over 1 / 8 / 64 threads that
share one ``fastnsq.sync.Producer``; each thread calls ``publish()`` and times every call.
``publish_async`` (fire and forget: the threads only enqueue, then wait for every future)
is measured the same way. With ``--gonsq PATH`` each fastnsq round alternates with
``gonsq_bench -mode=pub -shared`` (go-nsq's ``Producer.Publish`` from as many goroutines
sharing one producer) at the same concurrency; each run's topic is deleted after it
(an nsqd this script starts); with ``--before DIR`` (a checkout of older
code, e.g. ``git worktree add DIR COMMIT``, built) the same runs of that code too. Each
measurement runs in a process of its own; medians over ``--rounds``.

    .venv/bin/python bench/sync_publish.py                              # an embedded nsqd (its own process)
    .venv/bin/python bench/sync_publish.py --nsqd-bin ~/nsq-real/bin/nsqd --gonsq ~/nsq-real/bin/gonsq_bench \\
        --rounds 5 --out bench/results/sync-publish-DATE.json           # a real nsqd 1.3.0, beside go-nsq
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CODE = os.environ.get("SYNC_BENCH_CODE") or str(ROOT)  # --before: a checkout of the code to compare
if CODE not in sys.path:
    sys.path.insert(0, CODE)

from fastnsq.benchmark import process_cpu_seconds
from fastnsq.testing.process import NSQDProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
import go_build  # bench/go_build.py

REAL_NSQD_FLAGS = ("--mem-queue-size=10000000",)


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


# ---- one measurement, in a process of its own ------------------------------------------------


def measure(address: str, mode: str, threads: int, count: int, size: int) -> dict[str, Any]:
    """Publish ``count`` bodies from ``threads`` threads through one blocking producer."""
    from fastnsq.sync import Producer

    topic = f"syncbench{uuid.uuid4().hex[:10]}"
    body = b"x" * size
    per_thread = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
    latencies: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    with Producer([address]) as producer:
        producer.publish(topic, body)  # the topic exists and the connection is open before the clock
        start_line = threading.Barrier(threads + 1)

        def work(index: int) -> None:
            own = latencies[index]
            clock = time.perf_counter_ns
            futures = []
            start_line.wait()
            try:
                for _ in range(per_thread[index]):
                    began = clock()
                    if mode == "publish":
                        producer.publish(topic, body)
                    elif mode == "publish_timeout":
                        producer.publish(topic, body, timeout=2.0)
                    else:
                        futures.append(producer.publish_async(topic, body))
                    own.append(clock() - began)
                for future in futures:
                    future.result(60)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        cpu0 = time.process_time()
        start_line.wait()
        t0 = time.perf_counter()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    if errors:
        raise RuntimeError(f"{len(errors)} thread(s) failed, the first: {errors[0]!r}")
    every = sorted(v for own in latencies for v in own)
    return {
        "client": f"fastnsq {mode}", "threads": threads, "count": count, "size": size, "topic": topic,
        "seconds": elapsed, "msg_per_s": count / elapsed, "cpu_us_per_msg": cpu / count * 1e6,
        "p50_ms": percentile(every, 0.5) / 1e6, "p99_ms": percentile(every, 0.99) / 1e6,
    }


def run_child(address: str, mode: str, threads: int, count: int, size: int, code: str | None = None,
              pin: str | None = None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", address, "--mode", mode, "--threads", str(threads),
               "--count", str(count), "--size", str(size)] + (["--pin", pin] if pin else [])
    env = dict(os.environ, SYNC_BENCH_CODE=code) if code else None
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600, env=env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if code:
        result["client"] += f" (before: {code})"
    return result


def gonsq_binary(given: str) -> str:
    """``--gonsq``: a folder or a path ending in ``gonsq_bench`` is (re)built there from
    bench/go/src/gonsq_bench when missing or older than its source (bench/go_build.py); any other
    path is run as it is."""
    path = Path(given).expanduser()
    if path.is_dir():
        path = path / "gonsq_bench"
    if path.name != go_build.PROGRAMS["gonsq_bench"]:
        return str(path)
    return str(go_build.build(path.parent, program="gonsq_bench"))


def run_gonsq(binary: str, address: str, threads: int, count: int, size: int) -> dict[str, Any]:
    topic = f"gonsq{uuid.uuid4().hex[:10]}"
    command = [binary, "-mode=pub", f"-nsqd-tcp-address={address}", f"-topic={topic}", f"-count={count}",
               f"-size={size}", f"-concurrency={threads}", "-shared"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    return {"client": "go-nsq Producer.Publish (shared)", "threads": threads, "count": count, "size": size,
            "topic": topic, "raw": raw, "msg_per_s": _gonsq_rate(raw, count)}


def _gonsq_rate(raw: dict[str, Any], count: int) -> float:
    for key in ("msgs_per_s", "msg_per_s"):
        if key in raw:
            return float(raw[key])
    for key in ("secs", "seconds"):
        if key in raw:
            return count / float(raw[key])
    raise KeyError(f"no rate in gonsq_bench's output: {raw}")


# ---- the rounds --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="publish", choices=["publish", "publish_timeout", "publish_async"])
    parser.add_argument("--threads", default="1,8,64")
    parser.add_argument("--modes", default="publish,publish_async", help="also: publish_timeout (timeout=2)")
    parser.add_argument("--count", type=int, default=80_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nsqd", metavar="HOST:PORT", help="a running nsqd (else one is started)")
    parser.add_argument("--nsqd-bin", metavar="PATH", help="start this real nsqd (else the embedded one)")
    parser.add_argument("--gonsq", metavar="PATH", help="gonsq_bench (or the folder for it): alternate its rounds "
                        "with fastnsq's; built there by bench/go_build.py when missing or older than its source")
    parser.add_argument("--before", metavar="DIR", help="also measure the facade of the code in DIR")
    parser.add_argument("--pin", metavar="CPUS", help="a diagnosis: fastnsq's process on these CPUs only "
                        "(e.g. 1; os.sched_setaffinity), nsqd and go-nsq left free")
    parser.add_argument("--out", metavar="JSON", help="write every round and the medians here")
    args = parser.parse_args()
    if args.child:
        if args.pin:
            os.sched_setaffinity(0, {int(cpu) for cpu in args.pin.split(",")})
        print(json.dumps(measure(args.child, args.mode, int(args.threads), args.count, args.size)))
        return
    if args.gonsq:
        args.gonsq = gonsq_binary(args.gonsq)
    server = None
    if args.nsqd:
        address = args.nsqd
    else:
        extra = REAL_NSQD_FLAGS if args.nsqd_bin else ()
        server = NSQDProcess(*extra, binary=args.nsqd_bin)
        server.start()
        address = server.tcp_address
    try:
        report = rounds(args, address, server)
    finally:
        if server is not None:
            server.close()
    print(json.dumps({"medians": report["medians"], "ratios": report["ratios"]}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def rounds(args: argparse.Namespace, address: str, server: NSQDProcess | None) -> dict[str, Any]:
    threads = [int(t) for t in args.threads.split(",")]
    modes = args.modes.split(",")
    runs: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for n in threads:
            kinds = [("fastnsq", mode) for mode in modes] + ([("gonsq", "pub")] if args.gonsq else [])
            kinds += [("before", mode) for mode in modes] if args.before else []
            if round_no % 2:
                kinds.reverse()  # alternate who goes first
            for kind, mode in kinds:
                cpu0 = process_cpu_seconds(server.pid) if server is not None and server.pid else None
                if kind == "gonsq":
                    result = run_gonsq(args.gonsq, address, n, args.count, args.size)
                else:
                    code = args.before if kind == "before" else None
                    result = run_child(address, mode, n, args.count, args.size, code, args.pin)
                    result["pinned_to"] = args.pin
                if cpu0 is not None and server is not None and server.pid:
                    result["nsqd_cpu_s"] = (process_cpu_seconds(server.pid) or 0.0) - cpu0
                result["round"] = round_no
                result["load1"] = os.getloadavg()[0]
                if server is not None:
                    delete_topic(server.http_address, result["topic"])
                runs.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    medians = []
    for client in dict.fromkeys(r["client"] for r in runs):
        for n in threads:
            mine = [r for r in runs if r["client"] == client and r["threads"] == n]
            row = {"client": client, "threads": n, "rounds": len(mine),
                   "msg_per_s": statistics.median(r["msg_per_s"] for r in mine)}
            for key in ("p50_ms", "p99_ms", "cpu_us_per_msg"):
                if key in mine[0]:
                    row[key] = statistics.median(r[key] for r in mine)
            medians.append(row)
    return {
        "ratios": ratios(runs, threads),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server": server.argv(server.tcp_address, server.http_address) if server is not None else address,
        "python": sys.version.split()[0], "cpus": os.cpu_count(), "count": args.count, "size": args.size,
        "commit": _commit(), "before": args.before, "pin": args.pin,
        "runs": runs, "medians": medians,
    }


def delete_topic(http_address: str, topic: str) -> None:
    """Each run on an nsqd in the same state: with --mem-queue-size 10,000,000 every topic holds
    an 80 MB channel of pointers that Go's collector scans for as long as the topic lives, so
    the runs of the last rounds would pay for the topics of the first ones."""
    request = urllib.request.Request(f"http://{http_address}/topic/delete?topic={topic}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def ratios(runs: list[dict[str, Any]], threads: list[int]) -> list[dict[str, Any]]:
    """Per thread count: the median of same-round ratios (noise of a shared machine cancels out)."""
    by = {(r["client"], r["threads"], r["round"]): r["msg_per_s"] for r in runs}
    clients = list(dict.fromkeys(r["client"] for r in runs))
    go = next((c for c in clients if c.startswith("go-nsq")), None)
    mine = [c for c in clients if c.startswith("fastnsq ") and "(before: " not in c]
    befores = {r["client"].rpartition("(before: ")[2][:-1] for r in runs if "(before: " in r["client"]}
    pairs: list[tuple[str, str | None]] = [(c, go) for c in mine]
    pairs += [(c, f"{c} (before: {b})") for c in mine for b in befores]
    out = []
    for client, other in pairs:
        if other is None or other not in clients:
            continue
        for n in threads:
            each = [by[(client, n, k)] / by[(other, n, k)] for (c, t, k) in by if c == client and t == n
                    if (other, n, k) in by]
            if each:
                out.append({"client": client, "versus": other, "threads": n, "median_ratio": statistics.median(each),
                            "ratios": [round(x, 3) for x in each]})
    return out


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip()


if __name__ == "__main__":
    main()
