"""Go baselines: the go-nsq library (``gonsq_bench``) and nsq's raw ``bench_reader`` / ``bench_writer``.

Two clients, one driver (standard library only, like the other drivers):

* ``--tool library``: ``gonsq_bench`` (bench/go/src/gonsq_bench, on go-nsq v1.1.0's
  ``Consumer`` and ``Producer``: what a go-nsq user runs). Modes consume, pub
  (synchronous ``Publish`` from ``--concurrency`` goroutines, ``--shared`` for one
  Producer, else one each) and mpub. It counts: the clock runs from connect (consume)
  or from the first publish (pub/mpub, connections made before) to the ``--count``-th
  message handled or acknowledged, and its CPU comes from its own getrusage over that
  window (one JSON line).
* ``--tool raw``: nsq's ``bench_reader`` (SUB, RDY, a FIN per message on raw
  go-nsq protocol helpers, one connection per GOMAXPROCS) and ``bench_writer`` (MPUB
  batches). They run for a fixed time (``--runfor``) and log ``<N>ops/s``; the clock
  starts after connect and SUB (at the first RDY) and stops at ``--runfor``. A reader
  only measures the protocol's ceiling if it never runs out of messages: the harness
  pre-fills more than it can read in that time and this driver checks, through nsqd's
  ``/stats``, that messages were left (``ran_dry`` in the result otherwise). Their CPU
  is the child's rusage (process start included: a few ms).

``--bin DIR`` is where the binaries are (e.g. ``~/nsq-real/bin``: docs/testing.md, "Getting the
binaries"; bench/go_build.py builds gonsq_bench there); without it, PATH. The server's CPU is read from ``/proc`` before
and after the child. ``--workload info`` says what is available.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

LIBRARY = "go-nsq"
RAW = "nsq raw tools"
RAW_TOOLS = {"mpub": "bench_writer", "consume": "bench_reader"}
_OPS = re.compile(r"([0-9.]+)ops/s")
_DURATION = re.compile(r"duration: ([0-9.]+)(ms|s)")


def find(tool: str, bin_dir: str | None) -> str | None:
    if bin_dir:
        path = Path(bin_dir).expanduser() / tool
        return str(path) if path.is_file() else None
    return shutil.which(tool)


def go_nsq_version(binary: str) -> str:
    """go-nsq's version: ``gonsq_bench -version`` says it; an older build does not, then a VERSIONS.txt
    next to bin/ (``github.com/nsqio/go-nsq <dir> <version>`` lines) may, else a generic name."""
    try:
        said = subprocess.run([binary, "-version"], check=False, capture_output=True, text=True, timeout=10)
        if said.returncode == 0 and said.stdout.startswith("go-nsq "):
            return said.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    versions = Path(binary).resolve().parent.parent / "VERSIONS.txt"
    try:
        for line in versions.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "github.com/nsqio/go-nsq":
                return f"go-nsq {parts[2]}"
    except OSError:
        pass
    return "go-nsq"


def availability(bin_dir: str | None) -> dict[str, Any]:
    found = {name: find(name, bin_dir) for name in ("gonsq_bench", *RAW_TOOLS.values())}
    library = ["consume", "pub", "mpub"] if found["gonsq_bench"] else []
    raw = [w for w, tool in RAW_TOOLS.items() if found[tool]]
    reason = "" if library or raw else (
        f"no gonsq_bench, bench_reader or bench_writer in {bin_dir or 'PATH'} "
        "(docs/testing.md, 'Getting the binaries')")
    version = go_nsq_version(found["gonsq_bench"]) if found["gonsq_bench"] else "go-nsq"
    return {"found": found, "library_workloads": library, "raw_workloads": raw, "reason": reason,
            "client_version": version}


def _run(command: list[str], server_pid: int | None, timeout: float) -> tuple[subprocess.CompletedProcess[str],
                                                                              float, float, float | None]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = _common.process_cpu_seconds(server_pid)
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_after = _common.process_cpu_seconds(server_pid)
    server = None if server_before is None or server_after is None else server_after - server_before
    return done, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, server


def _record(args: Any, *, client: str, version: str, variant: str, messages: int, seconds: float, cpu_user: float,
            cpu_system: float, server: float | None, end: str, command: list[str], notes: str) -> dict[str, Any]:
    cpu = cpu_user + cpu_system
    return {
        "workload": args.workload, "variant": variant, "client": client, "client_version": version,
        "python": None, "loop": "goroutines", "messages": messages, "seconds": seconds,
        "msgs_per_s": messages / seconds if seconds > 0 else 0.0,
        "cpu_user": cpu_user, "cpu_system": cpu_system, "cpu_s": cpu,
        "cpu_per_million": cpu / messages * 1e6 if messages else None,
        "server_cpu": server, "server_cpu_per_million": server / messages * 1e6 if server and messages else None,
        "capped": False, "end": end, "settings": {"command": command}, "notes": notes,
    }


def run_library(args: Any) -> dict[str, Any]:
    binary = find("gonsq_bench", args.bin)
    if binary is None:
        raise SystemExit(f"gonsq_bench is not in {args.bin or 'PATH'}")
    command = [binary, f"-mode={args.workload}", f"-nsqd-tcp-address={args.nsqd_tcp_address}",
               f"-topic={args.topic}", f"-count={args.count}", f"-size={args.size}"]
    if args.workload == "consume":
        command += [f"-channel={args.channel}", f"-max-in-flight={args.max_in_flight}"]
        variant = f"Consumer, max_in_flight {args.max_in_flight}"
    else:
        command += [f"-concurrency={args.concurrency}", f"-batch={args.batch}"]
        if args.shared:
            command.append("-shared")
        producers = "one shared Producer" if args.shared or args.concurrency == 1 else f"{args.concurrency} Producers"
        goroutines = "one goroutine" if args.concurrency == 1 else f"{args.concurrency} goroutines"
        variant = (f"{goroutines}, {producers}" if args.workload == "pub"
                   else f"batches of {args.batch}, {goroutines}, {producers}")
        if args.size != _common.BODY_SIZE:
            variant += f", {args.size}-byte bodies"
    seconds_cap = (args.max_seconds or 60.0) * 4 + 60
    done, _, _, server = _run(command, args.server_pid, seconds_cap)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"gonsq_bench failed (exit {done.returncode}): {done.stderr[-500:]}")
    out = json.loads(lines[-1])
    end = ("the handler saw the count-th message (clock from ConnectToNSQD)" if args.workload == "consume"
           else "the last publish returned (connections made before the clock)")
    return _record(args, client=LIBRARY, version=go_nsq_version(binary), variant=variant, messages=out["msgs"],
                   seconds=out["secs"], cpu_user=out["cpu_user_s"], cpu_system=out["cpu_sys_s"], server=server,
                   end=end, command=command,
                   notes="gonsq_bench: go-nsq's Consumer/Producer; CPU is its own getrusage over the window; "
                         "server CPU from /proc around the whole process")


def run_raw(args: Any) -> dict[str, Any]:
    tool = RAW_TOOLS.get(args.workload)
    binary = find(tool, args.bin) if tool else None
    if binary is None:
        raise SystemExit(f"no raw tool for {args.workload} in {args.bin or 'PATH'}")
    seconds = args.runfor
    command = [binary, f"--runfor={seconds}s", f"--nsqd-tcp-address={args.nsqd_tcp_address}",
               f"--size={args.size}", f"--topic={args.topic}"]
    if args.workload == "mpub":
        command.append(f"--batch-size={args.batch}")
        variant = f"bench_writer, batches of {args.batch}"
    else:
        command += [f"--channel={args.channel}", f"--rdy={args.max_in_flight}"]
        variant = f"bench_reader, RDY {args.max_in_flight} per connection"
    done, user, system, server = _run(command, args.server_pid, seconds + 120)
    rates = _OPS.findall(done.stderr)
    durations = _DURATION.findall(done.stderr)
    if done.returncode or not rates or not durations:
        raise SystemExit(f"{tool} failed (exit {done.returncode}): {done.stderr[-500:]}")
    value, unit = durations[-1]
    measured = float(value) / (1000.0 if unit == "ms" else 1.0)
    rate = float(rates[-1])
    messages = round(rate * measured)
    result = _record(args, client=RAW, version="nsq v1.3.0 bench tools", variant=variant, messages=messages,
                     seconds=measured, cpu_user=user, cpu_system=system, server=server,
                     end=f"--runfor {seconds}s (the tool's clock: from the first RDY / MPUB, after connect)",
                     command=command,
                     notes=f"{tool}: raw protocol on go-nsq's command helpers, one connection per GOMAXPROCS; "
                           "fixed duration; CPU from the child's rusage (process start included)")
    if args.workload == "consume" and args.nsqd_http_address:
        chan = _common.channel_counts(args.nsqd_http_address, args.topic, args.channel)
        left = None if chan is None else chan["depth"]
        result["backlog_left"] = left
        result["ran_dry"] = left == 0
    return result


def main() -> None:
    parser = _common.build_parser("go")
    parser.add_argument("--tool", choices=("library", "raw"), default="library")
    parser.add_argument("--bin", default=None, help="folder with gonsq_bench, bench_reader, bench_writer")
    parser.add_argument("--shared", action="store_true", help="library pub/mpub: one Producer for all goroutines")
    parser.add_argument("--runfor", type=float, default=3.0, help="raw tools: seconds to run")
    args = parser.parse_args()
    if args.workload == "info":
        info = availability(args.bin)
        _common.emit({"client": LIBRARY, "python": None, "loop": "goroutines", **info})
        return
    _common.emit(run_library(args) if args.tool == "library" else run_raw(args))


if __name__ == "__main__":
    main()
