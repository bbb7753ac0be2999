"""Where the slowest messages of fastnsq's publisher waited: one open-loop point, every message traced.

Runs ``bench/latency_driver.py`` as publisher (a task per message by default: pattern (a) of
``latency.py --patterns``) and as consumer against a real nsqd, each dumping every message:
the publisher when its task started (``sent``) and when nsqd's answer came back (``acked``),
the consumer when its handler got it, all from the message's due time. The messages later
than ``--threshold`` in the measuring window come in runs (one stall delays every message
due during it); each run is put down to where its first message waited:

* ``publisher (before the send)``: its task started late: the publishing process was not
  running (descheduled, or busy);
* ``publisher or nsqd (send to answer)``: the task started on time, the answer came late,
  and so did the message: between the task and nsqd taking it (the process stalled before its
  write, or nsqd did);
* ``nsqd or consumer (after the answer)``: nsqd answered on time, the consumer got it late.

It also prints the publisher's Python garbage collections (count, longest pause) and the
time its threads waited for a core (``runqueue_wait_s``), and first the machine's own floor:
how late a process that does nothing but sleep until the next 100 us mark wakes up (no nsqd,
no client: what the scheduler and the virtual machine give any process at that moment).

    .venv/bin/python bench/latency_tail.py --real ~/nsq-real/bin --rate 10000 --rounds 3
    .venv/bin/python bench/latency_tail.py --real ~/nsq-real/bin --publisher "--callers 0 --period-us 1000"  # bunched by 1 ms
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import run_all
from run_all import ROOT, Server

from fastnsq.benchmark import process_cpu_seconds

DRIVER = ROOT / "bench" / "latency_driver.py"
CLASSES = ("publisher (before the send)", "publisher or nsqd (send to answer)", "nsqd or consumer (after the answer)")


def wake_floor(seconds: float = 3.0, period_ns: int = 100_000) -> dict[str, float]:
    """How late this process wakes from sleeping until each next ``period_ns`` mark (ms)."""
    mark = time.monotonic_ns() + period_ns
    end = mark + int(seconds * 1e9)
    lateness = []
    while mark < end:
        wait = mark - time.monotonic_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        lateness.append(time.monotonic_ns() - mark)
        mark += period_ns
    lateness.sort()

    def rank(q: float) -> float:
        return lateness[min(len(lateness) - 1, int(q * len(lateness)))] / 1e6

    return {"p50": rank(0.5), "p99": rank(0.99), "p999": rank(0.999), "max": lateness[-1] / 1e6,
            "over_1ms": sum(1 for x in lateness if x > 1_000_000), "over_2ms": sum(1 for x in lateness if x > 2_000_000)}


def run_traced(server: Server, rate: int, publisher: list[str], folder: Path, number: int) -> dict[str, Any]:
    topic = f"tail_{number}_{os.getpid()}"
    server.create_channel(topic)
    start_ns = time.monotonic_ns() + 1_000_000_000
    schedule = ["--nsqd-tcp-address", str(server.tcp), "--topic", topic, "--rate", str(rate),
                "--start-ns", str(start_ns)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pub_dump, sub_dump = folder / f"{number}.pub", folder / f"{number}.sub"
    sub = subprocess.Popen([sys.executable, str(DRIVER), "--mode", "sub", *schedule, "--channel", run_all.CHANNEL, "--drain", "3",
                            "--options", json.dumps({"max_in_flight": 2500, "output_buffer_size": -1})],
                           stdout=subprocess.PIPE, text=True, env={**env, "FASTNSQ_LATENCY_DUMP": str(sub_dump)})
    pub = subprocess.Popen([sys.executable, str(DRIVER), "--mode", "pub", *publisher, *schedule],
                           stdout=subprocess.PIPE, text=True, env={**env, "FASTNSQ_LATENCY_DUMP": str(pub_dump)})
    window_start = start_ns + 1_000_000_000  # the drivers' 1 s warm-up
    time.sleep(max(0.0, (window_start - time.monotonic_ns()) / 1e9))
    nsqd0 = (process_cpu_seconds(server.pid) if server.pid else None) or 0.0
    time.sleep(max(0.0, (window_start + 3_000_000_000 - time.monotonic_ns()) / 1e9))
    nsqd1 = (process_cpu_seconds(server.pid) if server.pid else None) or 0.0
    results: dict[str, Any] = {"nsqd_cpu_us_per_msg": (nsqd1 - nsqd0) / (3 * rate) * 1e6}
    for side, process in (("pub", pub), ("sub", sub)):
        out, _ = process.communicate(timeout=60)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        results[side] = json.loads(lines[-1][len("RESULT "):]) if lines else {}
    server.delete_topic(topic)
    return {**results, "runs": runs_of_late(pub_dump, sub_dump, 1000.0, 4000.0)}


def runs_of_late(pub_dump: Path, sub_dump: Path, low_ms: float, high_ms: float,
                 threshold_ms: float = 1.0) -> list[dict[str, Any]]:
    """The runs of messages later than ``threshold_ms`` (due within [low, high) ms of the start)."""
    sent = {}
    for line in pub_dump.read_text().splitlines():
        key, went_text, answered_text = line.split()
        sent[key] = (float(went_text), float(answered_text))
    late = []
    for line in sub_dump.read_text().splitlines():
        key, latency_text = line.split()
        if low_ms <= float(key) < high_ms and float(latency_text) > threshold_ms:
            late.append((float(key), key, float(latency_text)))
    late.sort()
    runs: list[dict[str, Any]] = []
    for at, key, latency in late:
        if runs and at - runs[-1]["last_due_ms"] <= 1.0:
            run = runs[-1]
            run["last_due_ms"], run["messages"] = at, run["messages"] + 1
            run["longest_ms"] = max(run["longest_ms"], latency)
            continue
        went, answered = sent.get(key, (float("nan"), float("nan")))
        where = CLASSES[0] if went > threshold_ms / 2 else CLASSES[1] if answered > threshold_ms / 2 else CLASSES[2]
        runs.append({"first_due_ms": at, "last_due_ms": at, "messages": 1, "longest_ms": latency,
                     "first_sent_ms": went, "first_acked_ms": answered, "where": where})
    return runs


def report(point: dict[str, Any], threshold: float) -> str:
    pub, sub, runs = point["pub"], point["sub"], point["runs"]
    e2e = sub.get("latency_ms", {})
    per_message = " / ".join(f"{side.get('cpu_s', 0) / max(1, side.get('count', 1)) * 1e6:.1f}" for side in (pub, sub))
    lines = [(f"end-to-end p50 / p99 / p99.9 / max: {e2e.get('p50', 0):.2f} / {e2e.get('p99', 0):.2f} / "
             f"{e2e.get('p999', 0):.2f} / {e2e.get('max', 0):.2f} ms; CPU per message publisher / consumer / nsqd "
             f"{per_message} / {point['nsqd_cpu_us_per_msg']:.1f} us; the publisher waited for a core "
             f"{pub.get('runqueue_wait_s', 0):.2f} s; gc {pub.get('gc')}")]
    by_class: Counter[str] = Counter()
    for run in runs:
        by_class[run["where"]] += run["messages"]
    total = sum(by_class.values())
    lines.append(f"messages later than {threshold:g} ms: {total} in {len(runs)} runs; by where the run's first waited: "
                 + ", ".join(f"{name} {by_class[name]}" for name in CLASSES))
    for run in sorted(runs, key=lambda r: -r["longest_ms"])[:8]:
        lines.append(f"  due {run['first_due_ms']:8.1f} ms: {run['messages']:3} messages, up to {run['longest_ms']:.2f} ms; "
                     f"first sent +{run['first_sent_ms']:.2f}, answered +{run['first_acked_ms']:.2f}: {run['where']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", metavar="BIN", required=True, help="the folder of a real nsqd")
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--publisher", default="--callers 0",
                        help="latency_driver.py's publisher flags (default: a task per message)")
    parser.add_argument("--threshold", type=float, default=1.0, help="ms: a message later than this is late")
    parser.add_argument("--port-base", type=int, default=run_all.REAL_PORT_BASE)
    args = parser.parse_args(argv)
    floor = wake_floor()
    print(f"the machine's floor (load {os.getloadavg()[0]:.2f}): a process waking every 100 us for 3 s wakes late by "
          f"p50 {floor['p50']:.3f} / p99 {floor['p99']:.3f} / p99.9 {floor['p999']:.3f} / max {floor['max']:.3f} ms "
          f"({floor['over_1ms']:.0f} wakes over 1 ms, {floor['over_2ms']:.0f} over 2 ms)", flush=True)
    server = Server(None, None, None, real_bin=args.real, port_base=args.port_base, mem_queue_size=10_000)
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="fastnsq-tail-") as folder:
            for number in range(args.rounds):
                point = run_traced(server, args.rate, args.publisher.split(), Path(folder), number)
                print(f"round {number + 1}, {args.rate:,} msg/s, load {os.getloadavg()[0]:.2f}: " + report(point, args.threshold),
                      flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
