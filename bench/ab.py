"""Two checkouts of fastnsq side by side on one nsqd: did a change cost throughput?

One job: run fastnsq's benchmark workloads (``python -m fastnsq.benchmark``) from this
checkout ("new") and from another one ("base", with its own built ``.venv``), alternating
round by round against the same server, and report each side's median and the median of
the same-round ratios new ÷ base. The server and the workloads are run_all.py's.

    python3 -c "import dev; dev.setup()"                 # in the other checkout first
    .venv/bin/python bench/ab.py --base /path/to/other/checkout --real ~/nsq-real/bin --rounds 5

Writes ``bench/results/ab-<date>-<base commit>-<new commit>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import run_all
from run_all import RESULTS, ROOT, Row, Server, run_once

#: (name, fastnsq.benchmark arguments): the README headline's fastnsq rows.
WORKLOADS = [
    ("consume, sync handler", ["--workload", "consume", "--mode", "handler", "--max-in-flight", "2500"]),
    ("consume, batches()", ["--workload", "consume", "--mode", "batches", "--max-in-flight", "2500"]),
    ("consume, async for", ["--workload", "consume", "--mode", "iter", "--max-in-flight", "2500"]),
    ("PUB, 1,000 callers, coalesced", ["--workload", "pub", "--concurrency", "1000"]),
    ("PUB, 1,000 callers, coalesce=False", ["--workload", "pub", "--concurrency", "1000", "--no-coalesce"]),
    ("MPUB x200, 4 in flight", ["--workload", "mpub", "--concurrency", "4", "--batch", "200"]),
]


def commit_of(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def row(checkout: Path, name: str, arguments: list[str]) -> Row:
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{checkout}: no .venv (run `python3 -c 'import dev; dev.setup()'` there first)")
    return Row(arguments[1], "fastnsq", name, [str(python), "-m", "fastnsq.benchmark", *arguments],
               {"PYTHONPATH": str(checkout)})


def one_run(checkout: Path, server: Server, name: str, arguments: list[str], settings: argparse.Namespace,
            topic: str) -> float:
    """run_all's run: a fresh topic, pre-filled for a consumer, the same clock and checks."""
    result = run_once(row(checkout, name, arguments), server, settings.count, settings, topic)
    if "error" in result:
        raise SystemExit(f"{checkout} {name}: {result['error']}")
    return float(result["msgs_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, type=Path, help="the other checkout (with its .venv built)")
    parser.add_argument("--real", metavar="BIN", help="a folder with a real nsqd (else the embedded one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--only", help="run only the workloads whose name contains this")
    args = parser.parse_args(argv)
    args.max_seconds = 60.0
    base, new = args.base.resolve(), ROOT
    workloads = [w for w in WORKLOADS if args.only is None or args.only in w[0]]
    server = Server(None, None, None, real_bin=args.real)
    server.start()
    rates: dict[str, dict[str, list[float]]] = {name: {"base": [], "new": []} for name, _ in workloads}
    try:
        for round_ in range(args.rounds):
            for name, arguments in workloads:
                # Alternate which side goes first, round by round: neither always meets a warmer server.
                order = [("base", base), ("new", new)] if round_ % 2 == 0 else [("new", new), ("base", base)]
                for side, checkout in order:
                    rate = one_run(checkout, server, name, arguments, args, f"ab_{round_}_{side}")
                    rates[name][side].append(rate)
                    print(f"round {round_ + 1} {name} {side}: {rate:,.0f} msg/s", flush=True)
    finally:
        server.stop()
    rows = []
    for name, by_side in rates.items():
        ratios = [n / b for n, b in zip(by_side["new"], by_side["base"])]
        rows.append({"workload": name, "base_median": statistics.median(by_side["base"]),
                     "new_median": statistics.median(by_side["new"]), "ratio_median": statistics.median(ratios),
                     "ratios": ratios, "base": by_side["base"], "new": by_side["new"]})
    print(f"\nnew {commit_of(new)} / base {commit_of(base)}, {args.rounds} alternated rounds, {args.count:,} messages, "
          f"server: {server.info.get('description')} ({server.info.get('command', '')})")
    print(f"{'workload':40} {'base':>12} {'new':>12} {'new/base':>9}  round ratios")
    for row in rows:
        spread = " ".join(f"{r:.2f}" for r in row["ratios"])
        print(f"{row['workload']:40} {row['base_median']:12,.0f} {row['new_median']:12,.0f} "
              f"{row['ratio_median']:9.3f}  {spread}")
    out = RESULTS / f"ab-{dt.date.today()}-{commit_of(base)}-{commit_of(new)}.json"
    document: dict[str, Any] = {
        "base": {"path": str(base), "commit": commit_of(base)}, "new": {"path": str(new), "commit": commit_of(new)},
        "rounds": args.rounds, "count": args.count, "server": server.info, "machine": run_all.machine_info(),
        "rows": rows,
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
