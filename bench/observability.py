"""What watching costs: throughput with Prometheus metrics on and with OpenTelemetry installed but off.

One job: run fastnsq's consume (sync handler) and coalesced-publish workloads plain, with
``fastnsq.metrics`` tracking the client (scraped every second) and with ``fastnsq.otel``
imported but not instrumented, alternating round by round on one nsqd (run_all.py's server
and checks), and report each variant's median and the median of its same-round ratio to
the plain run.

    .venv/bin/python bench/observability.py --real ~/nsq-real/bin --rounds 5

Writes ``bench/results/observability-<date>-<commit>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys

import run_all
from ab import commit_of
from run_all import RESULTS, ROOT, Row, Server, run_once

WORKLOADS = [
    ("consume, sync handler", ["--workload", "consume", "--mode", "handler", "--max-in-flight", "2500"]),
    ("PUB, 1,000 callers, coalesced", ["--workload", "pub", "--concurrency", "1000"]),
]
VARIANTS = ("none", "metrics", "otel-off")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", metavar="BIN", help="a folder with a real nsqd (else the embedded one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=300_000)
    args = parser.parse_args(argv)
    args.max_seconds = 60.0
    python = str(ROOT / ".venv" / "bin" / "python")
    server = Server(None, None, None, real_bin=args.real)
    server.start()
    rates = {name: {variant: [] for variant in VARIANTS} for name, _ in WORKLOADS}
    try:
        for round_ in range(args.rounds):
            for name, arguments in WORKLOADS:
                order = VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    row = Row(arguments[1], "fastnsq", name,
                              [python, "-m", "fastnsq.benchmark", *arguments, "--observe", variant],
                              {"PYTHONPATH": str(ROOT)})
                    result = run_once(row, server, args.count, args, f"obs_{round_}_{variant.replace('-', '_')}")
                    if "error" in result:
                        raise SystemExit(f"{name} {variant}: {result['error']}")
                    rates[name][variant].append(float(result["msgs_per_s"]))
                    print(f"round {round_ + 1} {name} {variant}: {result['msgs_per_s']:,.0f} msg/s", flush=True)
    finally:
        server.stop()
    rows = []
    print(f"\n{args.rounds} alternated rounds, {args.count:,} messages, server: {server.info.get('description')}"
          f" ({server.info.get('command', '')})")
    for name, by_variant in rates.items():
        for variant in VARIANTS:
            ratios = [v / p for v, p in zip(by_variant[variant], by_variant["none"])]
            row = {"workload": name, "observe": variant, "median": statistics.median(by_variant[variant]),
                   "ratio_to_plain": statistics.median(ratios), "ratios": ratios, "rates": by_variant[variant]}
            rows.append(row)
            print(f"{name:32} {variant:9} {row['median']:12,.0f} msg/s  x{row['ratio_to_plain']:.3f}  "
                  + " ".join(f"{r:.2f}" for r in ratios))
    out = RESULTS / f"observability-{dt.date.today()}-{commit_of(ROOT)}.json"
    out.write_text(json.dumps({"commit": commit_of(ROOT), "rounds": args.rounds, "count": args.count,
                               "server": server.info, "machine": run_all.machine_info(), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
