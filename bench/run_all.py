"""Run every benchmark workload with fastnsq and each Python peer; write the JSON and the report.

One job: orchestrate. The server runs in its own process (the embedded nsqd,
``python -m fastnsq.testing``, unless ``--nsqd-tcp-address/--nsqd-http-address``
name a real one); each client runs each workload in its own process (fastnsq:
``python -m fastnsq.benchmark``; a peer: ``bench/peers/<peer>_driver.py`` in its
own virtualenv under ``bench/.peers/<peer>``), so the CPU each reports is its own.
The peers are installed from PyPI on first use; one that cannot be installed or
does not work gets its reason recorded instead of a number.

    python3 dev.py bench                              # the full run (3 rounds; 140-290 s on 2 shared cores)
    python3 dev.py bench --repeat 5 --readme          # what the README shows (its summary table updated)
    .venv/bin/python bench/run_all.py --quick         # CI-sized
    .venv/bin/python bench/run_all.py --count 100000 --clients fastnsq,ansq --workloads consume

Writes ``bench/results/<date>-<host>.json`` and renders ``bench/results/report.md``
and ``bench/results/chart.png`` from it (``bench/report.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PEERS_DIR = BENCH / "peers"
VENVS = BENCH / ".peers"
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))  # fastnsq itself, for pre-filling topics

import report

WORKLOADS = ("pub", "mpub", "consume")
#: Measured messages per workload in the full run (--quick divides by 10); warm-up is 10 % more.
DEFAULT_COUNTS = {"pub": 200_000, "mpub": 2_000_000, "consume": 300_000}
PUB_CONCURRENCY = 1000
MPUB_BATCH = 200
MPUB_CONCURRENCY = 16
MAX_IN_FLIGHT = 2500
CHANNEL = "bench"


@dataclass
class Peer:
    """A Python peer: what to install, which Python it needs, its driver."""

    name: str
    requirements: list[str]
    min_python: tuple[int, int] = (3, 8)
    max_python: tuple[int, int] | None = None
    driver: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        self.driver = self.driver or f"{self.name}_driver.py"


PEERS = [
    # Pinned to the versions this harness was written against; their dependencies float.
    Peer("pynsq", ["pynsq==0.9.1", "tornado>=6,<7", "uvloop"], notes="Tornado IOLoop on the asyncio loop"),
    Peer("gnsq", ["gnsq==1.0.2", "gevent"], notes="gevent greenlets"),
    Peer("ansq", ["ansq==0.3.0", "uvloop"], notes="asyncio streams"),
    Peer("asyncnsq", ["asyncnsq==2.0.1", "uvloop"], min_python=(3, 12), notes="asyncio streams; needs Python >= 3.12"),
]


@dataclass
class Row:
    """One (workload, client, variant) to run, and how."""

    workload: str
    client: str
    label: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


# ---- the machine ------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    return {
        "host": socket.gethostname(),
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
    }


def fastnsq_info() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c",
         ("import json, fastnsq, uvloop; print(json.dumps({'version': fastnsq.__version__, "
         "'codec': fastnsq.CODEC_IMPLEMENTATION, 'uvloop': uvloop.__version__}))")],
        capture_output=True, text=True, env=_fastnsq_env(), check=True,
    )
    return json.loads(out.stdout)


def source_state() -> dict[str, Any]:
    """The git commit measured, and library files that differ from it (the run uses the working tree)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], check=False, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else ""

    # Porcelain lines are "XY path": the two status columns may start with a space.
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "fastnsq").splitlines() if line.strip()]
    return {"commit": git("rev-parse", "HEAD").strip() or None, "uncommitted_library_files": dirty}


def _fastnsq_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


# ---- the server -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(address: str, method: str, path: str, **params: str) -> Any:
    url = f"http://{address}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return json.loads(text) if text.startswith(("{", "[")) else text


class Server:
    """The nsqd under test: the embedded one in a child process, or a real one by address."""

    def __init__(self, tcp: str | None, http: str | None, pid: int | None) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.tcp, self.http, self.pid = tcp, http, pid
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        if self.tcp is None:
            tcp_port, http_port = _free_port(), _free_port()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fastnsq.testing", "--tcp-port", str(tcp_port), "--http-port", str(http_port)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_fastnsq_env(),
            )
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith("running"):
                    break
            else:
                raise RuntimeError("the embedded nsqd did not start")
            self.tcp, self.http, self.pid = f"127.0.0.1:{tcp_port}", f"127.0.0.1:{http_port}", self.process.pid
        assert self.http is not None
        answer = _http(self.http, "GET", "/info")
        version = answer.get("data", answer).get("version")  # nsqd < 1.0 wrapped answers in "data"
        if self.process is not None:
            self.info = {
                "kind": "embedded",
                "description": "fastnsq's embedded nsqd (fastnsq.testing, pure Python on uvloop) in its own process",
                "version": f"nsqd {version} protocol, fastnsq {fastnsq_info()['version']}",
            }
        else:
            self.info = {"kind": "external", "description": "a real nsqd", "version": f"nsqd {version}"}
        self.info.update(tcp=self.tcp, http=self.http, pid_measured=self.pid is not None)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def create_channel(self, topic: str) -> None:
        assert self.http is not None
        _http(self.http, "POST", "/topic/create", topic=topic)
        _http(self.http, "POST", "/channel/create", topic=topic, channel=CHANNEL)

    def delete_topic(self, topic: str) -> None:
        assert self.http is not None
        try:
            _http(self.http, "POST", "/topic/delete", topic=topic)
        except OSError:
            pass

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        assert self.http is not None
        stats = _http(self.http, "GET", "/stats", format="json", topic=topic, include_clients="false")
        stats = stats.get("data", stats)
        for entry in stats.get("topics") or []:
            if entry["topic_name"] == topic:
                return entry
        return None

    def prefill(self, topic: str, count: int) -> None:
        """Pre-fill with fastnsq's MPUB (not measured), into the bench channel."""
        import fastnsq
        from fastnsq.benchmark import prefill

        fastnsq.run(prefill(str(self.tcp), topic, count, nsqd_http_address=self.http, channel=CHANNEL))


# ---- peers: Pythons, virtualenvs, drivers -----------------------------------------------------


def _python_version(executable: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [executable, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            check=False, capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode:
        return None  # e.g. a pyenv shim for a version that is not selected
    major, minor = out.stdout.strip().split(".")
    return int(major), int(minor)


def find_python(min_version: tuple[int, int]) -> tuple[str | None, list[str]]:
    """An interpreter >= min_version: this one, pythonX.Y on PATH, uv's, or pyenv's; plus where we looked."""
    looked: list[str] = []
    candidates = [sys.executable]
    for minor in range(min_version[1], 20):
        name = f"python{min_version[0]}.{minor}"
        if shutil.which(name):
            candidates.append(shutil.which(name))  # type: ignore[arg-type]
    looked.append("PATH (python3.N)")
    if shutil.which("uv"):
        out = subprocess.run(["uv", "python", "find", f">={min_version[0]}.{min_version[1]}"],
                             check=False, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(out.stdout.strip())
        looked.append("uv python find")
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], check=False, capture_output=True, text=True)
        roots.insert(0, out.stdout.strip())
    for root in filter(None, dict.fromkeys(roots)):
        candidates += sorted(glob.glob(f"{root}/versions/*/bin/python3.[0-9]*"))
        looked.append(f"{root}/versions")
    for candidate in candidates:
        if candidate.endswith("-config"):
            continue
        version = _python_version(candidate)
        if version is not None and version >= min_version:
            return candidate, looked
    return None, looked


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_peer(peer: Peer, *, reinstall: bool, log: Any) -> dict[str, Any]:
    """Install ``peer`` into bench/.peers/<name> (once); return its record (python, versions, or error)."""
    record: dict[str, Any] = {"name": peer.name, "requirements": peer.requirements, "notes": peer.notes}
    python, looked = find_python(peer.min_python)
    if python is None:
        record["error"] = (f"needs Python >= {peer.min_python[0]}.{peer.min_python[1]}, not available here "
                           f"(looked in: {', '.join(looked)})")
        return record
    venv = VENVS / peer.name
    stamp = venv / ".bench-requirements"
    wanted = json.dumps({"python": python, "requirements": peer.requirements})
    if reinstall and venv.exists():
        shutil.rmtree(venv)
    if not (stamp.exists() and stamp.read_text() == wanted and venv_python(peer.name).exists()):
        log(f"installing {peer.name} ({' '.join(peer.requirements)}) with {python} ...")
        if venv.exists():
            shutil.rmtree(venv)
        steps = [
            [python, "-m", "venv", str(venv)],
            [str(venv_python(peer.name)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             *peer.requirements],
        ]
        for step in steps:
            done = subprocess.run(step, check=False, capture_output=True, text=True, timeout=900)
            if done.returncode:
                record["error"] = f"install failed: {' '.join(step[:4])} ...: {_tail(done.stderr or done.stdout)}"
                return record
        stamp.write_text(wanted)
    info = run_driver([str(venv_python(peer.name)), str(PEERS_DIR / peer.driver), "--workload", "info"], {}, 120)
    if "error" in info:
        record["error"] = f"does not import/run: {info['error']}"
        return record
    record.update(python=info.get("python"), version=info.get("client_version"), executable=python)
    return record


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def run_driver(command: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one driver process; its last ``RESULT {json}`` (or bare JSON) line, or {"error": ...}."""
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        line = line.strip()
        line = line.removeprefix("RESULT ")
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            if done.returncode:
                result["error"] = f"exit {done.returncode}: {_tail(done.stderr)}"
            return result
    return {"error": f"exit {done.returncode}, no result: {_tail(done.stderr or done.stdout)}"}


# ---- the rows ---------------------------------------------------------------------------------


def fastnsq_rows(counts: dict[str, int]) -> list[Row]:
    base = [sys.executable, "-m", "fastnsq.benchmark"]
    env = {"PYTHONPATH": _fastnsq_env()["PYTHONPATH"]}

    def row(workload: str, label: str, *extra: str) -> Row:
        return Row(workload, "fastnsq", label, [*base, "--workload", workload, *extra], env)

    return [
        row("pub", "coalesce on", "--concurrency", str(PUB_CONCURRENCY)),
        row("pub", "coalesce off", "--concurrency", str(PUB_CONCURRENCY), "--no-coalesce"),
        row("mpub", "", "--concurrency", str(MPUB_CONCURRENCY), "--batch", str(MPUB_BATCH)),
        row("consume", "sync handler", "--mode", "handler", "--max-in-flight", str(MAX_IN_FLIGHT)),
        row("consume", "async handler", "--mode", "async", "--max-in-flight", str(MAX_IN_FLIGHT)),
        row("consume", "batches()", "--mode", "batches", "--max-in-flight", str(MAX_IN_FLIGHT)),
    ]


def peer_rows(peer: Peer, peer_loop: str) -> list[Row]:
    base = [str(venv_python(peer.name)), str(PEERS_DIR / peer.driver), "--loop", peer_loop]
    return [
        Row("pub", peer.name, "", [*base, "--workload", "pub", "--concurrency", str(PUB_CONCURRENCY)]),
        Row("mpub", peer.name, "", [*base, "--workload", "mpub", "--concurrency", str(MPUB_CONCURRENCY),
                                    "--batch", str(MPUB_BATCH)]),
        Row("consume", peer.name, "", [*base, "--workload", "consume", "--max-in-flight", str(MAX_IN_FLIGHT)]),
    ]


def go_rows(info: dict[str, Any]) -> list[Row]:
    base = [sys.executable, str(PEERS_DIR / "gonsq_driver.py")]
    return [Row(w, "go-nsq", "", [*base, "--workload", w, "--batch", str(MPUB_BATCH),
                                  "--max-in-flight", str(MAX_IN_FLIGHT)]) for w in info.get("workloads", [])]


def run_once(row: Row, server: Server, count: int, args: argparse.Namespace, topic: str) -> dict[str, Any]:
    """One run of ``row`` on a fresh ``topic`` (pre-filled for a consumer, deleted afterwards)."""
    warmup = count // 10
    try:
        server.create_channel(topic)
        if row.workload == "consume":
            server.prefill(topic, count + warmup)
        command = [*row.command, "--nsqd-tcp-address", str(server.tcp), "--nsqd-http-address", str(server.http),
                   "--topic", topic, "--channel", CHANNEL, "--count", str(count), "--warmup", str(warmup),
                   "--max-seconds", str(args.max_seconds)]
        if server.pid:
            command += ["--server-pid", str(server.pid)]
        load_before = _loadavg()
        result = run_driver(command, row.env, args.max_seconds + 180)
        result["loadavg_1m"] = [load_before, _loadavg()]  # others' jobs on the machine skew wall time
        if "error" not in result:
            result["check"] = verify(server, topic, row.workload, result)
        return result
    finally:
        server.delete_topic(topic)


def summarize(row: Row, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by msgs/s (an actual run, so its CPU figures belong to it), with every run's rates."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"workload": row.workload, "client": row.client, "label": row.label, "error": runs[-1]["error"]}
    chosen = sorted(good, key=lambda r: r["msgs_per_s"])[(len(good) - 1) // 2]
    return {
        **chosen,
        "label": row.label,
        "runs_msgs_per_s": [r["msgs_per_s"] for r in good],
        "runs_cpu_per_million": [r["cpu_per_million"] for r in good],
        "runs_loadavg_1m": [r["loadavg_1m"] for r in good],
    }


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def verify(server: Server, topic: str, workload: str, result: dict[str, Any]) -> str:
    """What nsqd says about the topic after the run (a publish run must have all its messages)."""
    stats = server.topic_stats(topic)
    if stats is None:
        return "topic missing in /stats"
    if workload in ("pub", "mpub"):
        return f"nsqd topic message_count {stats['message_count']:,}"
    channel = next((c for c in stats.get("channels") or [] if c["channel_name"] == CHANNEL), None)
    if channel is None:
        return "channel missing in /stats"
    return f"nsqd channel depth {channel['depth']}, in flight {channel['in_flight_count']}, " \
           f"requeued {channel['requeue_count']}, timed out {channel['timeout_count']}"


# ---- main -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages, one round (CI)")
    parser.add_argument("--count", type=int, default=None, help="measured messages of every workload")
    parser.add_argument("--repeat", type=int, default=None,
                        help="rounds over all rows, the median run of each row is kept (default 3, --quick 1)")
    parser.add_argument("--max-seconds", type=float, default=5.0, help="cap on one run's measured window")
    parser.add_argument("--clients", default=None, help="comma-separated subset: fastnsq,pynsq,gnsq,ansq,asyncnsq,go-nsq")
    parser.add_argument("--workloads", default=None, help="comma-separated subset: pub,mpub,consume")
    parser.add_argument("--peer-loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="event loop of the asyncio-based peers (default uvloop, their best case)")
    parser.add_argument("--nsqd-tcp-address", default=None, help="a real nsqd instead of the embedded one")
    parser.add_argument("--nsqd-http-address", default=None)
    parser.add_argument("--nsqd-pid", type=int, default=None, help="the real nsqd's pid, to measure its CPU")
    parser.add_argument("--reinstall", action="store_true", help="recreate the peers' virtualenvs")
    parser.add_argument("--output", default=None, help="JSON path (default bench/results/<date>-<host>.json)")
    parser.add_argument("--no-report", action="store_true", help="write the JSON only")
    parser.add_argument("--readme", action="store_true",
                        help="also put the summary table in README.md (for a full run on a quiet machine)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.nsqd_tcp_address is None) != (args.nsqd_http_address is None):
        raise SystemExit("give both --nsqd-tcp-address and --nsqd-http-address, or neither")
    args.repeat = args.repeat or (1 if args.quick else 3)
    counts = {w: (args.count or (c // 10 if args.quick else c)) for w, c in DEFAULT_COUNTS.items()}
    clients = set((args.clients or "fastnsq,pynsq,gnsq,ansq,asyncnsq,go-nsq").split(","))
    workloads = [w for w in WORKLOADS if w in (args.workloads or ",".join(WORKLOADS)).split(",")]
    started = time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {text}", flush=True)

    command = "python bench/run_all.py " + " ".join(sys.argv[1:] if argv is None else argv)
    data: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command.strip(),
        "machine": machine_info(),
        "python": platform.python_version(),
        "fastnsq": {**fastnsq_info(), **source_state()},
        "settings": {
            "body_size": 100, "counts": counts, "warmup": "10 % of the count, before the clock starts",
            "repeat": args.repeat, "max_seconds": args.max_seconds, "pub_concurrency": PUB_CONCURRENCY,
            "mpub_batch": MPUB_BATCH, "mpub_concurrency": MPUB_CONCURRENCY, "max_in_flight": MAX_IN_FLIGHT,
            "fastnsq_loop": "uvloop (fastnsq.run)", "peer_loop": args.peer_loop,
        },
        "peers": {},
        "rows": [],
    }

    rows: list[Row] = fastnsq_rows(counts) if "fastnsq" in clients else []
    for peer in PEERS:
        if peer.name not in clients:
            continue
        record = ensure_peer(peer, reinstall=args.reinstall, log=log)
        data["peers"][peer.name] = record
        if "error" in record:
            log(f"{peer.name}: {record['error']}")
            continue
        log(f"{peer.name} {record['version']} on Python {record['python']}")
        rows += peer_rows(peer, args.peer_loop)
    if "go-nsq" in clients:
        go = run_driver([sys.executable, str(PEERS_DIR / "gonsq_driver.py"), "--workload", "info"], {}, 60)
        data["peers"]["go-nsq"] = {"name": "go-nsq", **go}
        if go.get("reason"):
            data["peers"]["go-nsq"]["error"] = go["reason"]
            log(f"go-nsq: {go['reason']}")
        rows += go_rows(go)
    rows = [r for r in rows if r.workload in workloads]

    server = Server(args.nsqd_tcp_address, args.nsqd_http_address, args.nsqd_pid)
    server.start()
    data["server"] = server.info
    log(f"server: {server.info['version']} at {server.tcp}")
    runs: list[list[dict[str, Any]]] = [[] for _ in rows]
    try:
        # Round robin: every row once, then every row again. A change in the machine's load
        # (other jobs) then touches every client alike instead of the rows that ran during it.
        for attempt in range(args.repeat):
            for index, row in enumerate(rows):
                if runs[index] and "error" in runs[index][-1]:
                    continue  # it failed once: it will again
                topic = f"bench_{index}_{row.workload}_{row.client.replace('-', '_')}_{attempt}"
                result = run_once(row, server, counts[row.workload], args, topic)
                runs[index].append(result)
                name = f"{row.client} {row.workload} {row.label}".strip()
                step = f"[{attempt + 1}/{args.repeat} {index + 1}/{len(rows)}]"
                if "error" in result:
                    log(f"{step} {name}: ERROR {result['error']}")
                else:
                    log(f"{step} {name}: {result['msgs_per_s']:,.0f} msg/s, client {result['cpu_per_million']:.2f} "
                        f"CPU s/M, {result['messages']:,} msgs{' (capped)' if result.get('capped') else ''}, "
                        f"load {result['loadavg_1m'][0]}")
    finally:
        server.stop()
    data["rows"] = [summarize(row, row_runs) for row, row_runs in zip(rows, runs)]
    data["duration_s"] = round(time.perf_counter() - started, 1)

    RESULTS.mkdir(parents=True, exist_ok=True)
    output = Path(args.output) if args.output else RESULTS / (
        f"{dt.date.today().isoformat()}-{socket.gethostname().split('.')[0]}.json")
    output.write_text(json.dumps(data, indent=2) + "\n")
    log(f"wrote {output}")
    if not args.no_report:
        md, png = report.render(output, readme=ROOT / "README.md" if args.readme else None)
        log(f"wrote {md} and {png}" + (" and README.md's summary" if args.readme else ""))
        print()
        print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
