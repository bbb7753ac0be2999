"""Run a fuzz target for a number of inputs and record it.

    python tests/fuzz/run_fuzz.py --runs 10000000                     # the codec differential (fuzz_codec.py)
    python tests/fuzz/run_fuzz.py --target hostile --runs 1000000     # a hostile nsqd (fuzz_hostile.py)

Starts atheris (libFuzzer) on the target with a per-input time limit (a hang is a
failure), a memory limit (unbounded growth is a failure) and the regression corpus
tests/corpus/server_bytes as seeds, then writes what libFuzzer reported (inputs run,
seconds, coverage, crash/hang/oom artifacts: any is a failure) to
bench/results/fuzz-<target>-<date>.json and prints it. Exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"codec": Path(__file__).with_name("fuzz_codec.py"), "hostile": Path(__file__).with_name("fuzz_hostile.py")}
SEEDS = ROOT / "tests" / "corpus" / "server_bytes"


def run(target: Path, runs: int, per_input_timeout: int, rss_limit_mb: int, corpus: Path, artifacts: Path) -> dict:
    command = [sys.executable, str(target), f"-atheris_runs={runs}", f"-timeout={per_input_timeout}",
               f"-rss_limit_mb={rss_limit_mb}", f"-artifact_prefix={artifacts}/", "-print_final_stats=1",
               str(corpus), str(SEEDS)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.monotonic() - started
    log = done.stderr + done.stdout
    finished = re.search(r"Done (\d+) in (\d+) second", log)
    coverage = re.findall(r"cov: (\d+) ft: (\d+)", log)
    found = sorted(p.name for p in artifacts.iterdir())
    return {
        "runs_requested": runs,
        "runs_done": int(finished.group(1)) if finished else None,
        "seconds": round(seconds, 1),
        "exit_status": done.returncode,
        "coverage_edges": int(coverage[-1][0]) if coverage else None,
        "coverage_features": int(coverage[-1][1]) if coverage else None,
        "artifacts": found,  # crash-*, timeout-*, oom-*: each a failure, kept for the corpus
        "differences_or_crashes": sum(name.startswith("crash-") for name in found),
        "hangs": sum(name.startswith("timeout-") for name in found),
        "out_of_memory": sum(name.startswith("oom-") for name in found),
        "log_tail": log[-3000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=sorted(TARGETS), default="codec", help="what to fuzz (default codec)")
    parser.add_argument("--runs", type=int, default=10_000_000, help="inputs to run (default 10,000,000)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take (a hang past it fails)")
    parser.add_argument("--rss-limit-mb", type=int, default=2048, help="memory limit (a leak past it fails)")
    parser.add_argument("--corpus", type=Path, help="keep the grown corpus here (default: a temporary folder)")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix="fastnsq-fuzz-corpus-"))
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts = Path(tempfile.mkdtemp(prefix="fastnsq-fuzz-artifacts-"))
    result = run(TARGETS[args.target], args.runs, args.timeout, args.rss_limit_mb, corpus, artifacts)
    import fastnsq

    result.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), python=platform.python_version(),
                  machine=f"{platform.machine()} {os.cpu_count()} cores", target=args.target,
                  fastnsq=fastnsq.__version__, command=" ".join(sys.argv))
    summary = {k: v for k, v in result.items() if k != "log_tail"}
    print(json.dumps(summary, indent=1))
    if not args.no_save:
        out = ROOT / "bench" / "results" / f"fuzz-{args.target}-{datetime.now():%Y%m%d-%H%M}.json"
        out.write_text(json.dumps(result, indent=1))
        print(f"written to {out}")
    failed = result["runs_done"] != args.runs or result["artifacts"] or result["exit_status"] != 0
    if result["artifacts"]:
        keep = ROOT / "tests" / "fuzz" / "artifacts"
        keep.mkdir(exist_ok=True)
        for name in result["artifacts"]:
            shutil.copy(artifacts / name, keep / name)
        print(f"failing inputs copied to {keep}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
