"""Start-up cost: ``import fastnsq`` and one ``fastnsq pub`` to a local nsqd, median of N runs.

One job: time a fresh interpreter. ``import fastnsq`` is measured twice, as the
cumulative time ``python -X importtime`` reports for the ``fastnsq`` package and as the
wall time of ``python -c "import fastnsq"`` (interpreter start included); ``fastnsq pub``
as the wall time of the command publishing one message (start, connect, PUB, OK, exit).
Bytecode is compiled once first and kept, as an installed package has it
(``PYTHONDONTWRITEBYTECODE`` is unset for the children; whether the caller had it set is
recorded).

    .venv/bin/python bench/startup.py --real ~/nsq-real/bin          # starts that nsqd, like run_all.py
    .venv/bin/python bench/startup.py --nsqd-tcp-address 127.0.0.1:4150

Writes ``bench/results/startup-<date>-<host>.json`` and prints it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import run_all

_IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| fastnsq$", re.MULTILINE)


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=run_all._fastnsq_env()["PYTHONPATH"])
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def wall(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def importtime(env: dict[str, str]) -> float:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fastnsq"], env=env, check=True,
                          capture_output=True, text=True)
    match = _IMPORT_LINE.search(done.stderr)
    if match is None:
        raise SystemExit(f"no 'fastnsq' line in -X importtime's output: {done.stderr[-300:]}")
    return int(match.group(1)) / 1e6


def measure(tcp: str, runs: int) -> dict[str, Any]:
    env = child_env()
    pub = [sys.executable, "-m", "fastnsq", "pub", "--nsqd-tcp-address", tcp, "-q", "startup_bench", "hello"]
    # Compile and cache the bytecode of everything these commands import (an installed package's state).
    subprocess.run([sys.executable, "-c", "import fastnsq, fastnsq.cli"], env=env, check=True)
    subprocess.run(pub, env=env, check=True)
    samples: dict[str, list[float]] = {"import_importtime_s": [], "import_wall_s": [], "pub_wall_s": []}
    for _ in range(runs):  # interleaved, so a change in the machine's load touches all three
        samples["import_importtime_s"].append(importtime(env))
        samples["import_wall_s"].append(wall([sys.executable, "-c", "import fastnsq"], env))
        samples["pub_wall_s"].append(wall(pub, env))
    return {name: {"median": statistics.median(values), "runs": values} for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default=None, metavar="BIN", help="start the nsqd of this folder (as run_all.py)")
    parser.add_argument("--nsqd-tcp-address", default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if (args.real is None) == (args.nsqd_tcp_address is None):
        raise SystemExit("give --real BIN or --nsqd-tcp-address")
    server = run_all.Server(args.nsqd_tcp_address, None, None, real_bin=args.real) if args.real else None
    tcp = args.nsqd_tcp_address
    if server is not None:
        server.start()
        tcp = server.tcp
    try:
        results = measure(str(tcp), args.runs)
    finally:
        if server is not None:
            server.stop()
    data = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/startup.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": run_all.machine_info(),
        "python": platform.python_version(),
        "fastnsq": run_all.source_state(),
        "server": server.info if server is not None else {"tcp": tcp},
        "caller_had_PYTHONDONTWRITEBYTECODE": "PYTHONDONTWRITEBYTECODE" in os.environ,
        "loadavg_1m": os.getloadavg()[0],
        "targets": {"import_s": 0.15, "pub_wall_s": 0.3},
        **results,
    }
    output = Path(args.output) if args.output else run_all.RESULTS / (
        f"startup-{dt.date.today().isoformat()}-{socket.gethostname().split('.')[0]}.json")
    output.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps({k: v["median"] for k, v in results.items()}, indent=2))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
