"""Go baseline: nsq's own ``bench_writer`` / ``bench_reader`` (built on go-nsq's protocol code), when on PATH.

They are the reference Go load generators from nsq's ``bench/`` directory
(build them with ``go build`` there and put them on PATH). Neither has a
"1,000 concurrent single publishes" mode, so only two workloads map:

* mpub: ``bench_writer --batch-size 200`` (MPUB batches from GOMAXPROCS writers);
* consume: ``bench_reader --rdy 2500`` (raw SUB + RDY, FIN per message).

They run for a fixed time (``--runfor``) and log ``... <N>ops/s ...`` on stderr,
which is what this driver reports; their CPU comes from the child's rusage.
``--workload info`` says whether they (and ``go``) are available. Untested on
machines without Go: the parsing follows the tools' published log format.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

CLIENT = "go-nsq"
TOOLS = {"mpub": "bench_writer", "consume": "bench_reader"}
_OPS = re.compile(r"([0-9.]+)ops/s")


def availability() -> dict[str, object]:
    found = {name: shutil.which(name) for name in ("go", *TOOLS.values())}
    usable = {workload: found[tool] for workload, tool in TOOLS.items() if found[tool]}
    if usable:
        reason = ""
    elif found["go"]:
        reason = "go is installed but bench_writer/bench_reader (nsq's bench/ tools) are not on PATH"
    else:
        reason = "not available: no Go toolchain (go) and no bench_writer/bench_reader on PATH"
    return {"found": found, "workloads": sorted(usable), "reason": reason}


def run_tool(args) -> dict[str, object]:
    tool = shutil.which(TOOLS[args.workload])
    if tool is None:
        raise SystemExit(f"{TOOLS[args.workload]} is not on PATH")
    seconds = args.max_seconds or 10.0
    command = [tool, f"--runfor={seconds}s", f"--nsqd-tcp-address={args.nsqd_tcp_address}",
               f"--size={args.size}", f"--topic={args.topic}"]
    if args.workload == "mpub":
        command.append(f"--batch-size={args.batch}")
    else:
        command += [f"--channel={args.channel}", f"--rdy={args.max_in_flight}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = _common.process_cpu_seconds(args.server_pid)
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_after = _common.process_cpu_seconds(args.server_pid)
    rates = _OPS.findall(done.stderr)
    if done.returncode or not rates:
        raise SystemExit(f"{command[0]} failed (exit {done.returncode}): {done.stderr[-500:]}")
    rate = float(rates[-1])
    messages = int(rate * seconds)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    server = None if server_before is None or server_after is None else server_after - server_before
    return {
        "workload": args.workload, "variant": Path(tool).name, "client": CLIENT, "client_version": "nsq bench tools",
        "python": None, "loop": "goroutines", "messages": messages, "seconds": seconds, "msgs_per_s": rate,
        "cpu_user": after.ru_utime - before.ru_utime, "cpu_system": after.ru_stime - before.ru_stime,
        "cpu_s": cpu, "cpu_per_million": cpu / messages * 1e6 if messages else None,
        "server_cpu": server, "server_cpu_per_million": server / messages * 1e6 if server and messages else None,
        "capped": False, "end": f"--runfor {seconds}s (the tool's own clock)", "settings": {"command": command},
        "notes": "fixed-duration run: includes process start and connection setup; no warm-up",
    }


def main() -> None:
    args = _common.build_parser(CLIENT).parse_args()
    if args.workload == "info":
        info = availability()
        _common.emit({"client": CLIENT, "client_version": "nsq bench tools", "python": None, "loop": "goroutines",
                      **info})
        return
    if args.workload not in TOOLS:
        raise SystemExit(f"no Go tool for the {args.workload} workload")
    _common.emit(run_tool(args))


if __name__ == "__main__":
    main()
