"""Run every benchmark workload with fastnsq and each Python peer; write the JSON and the report.

One job: orchestrate. The server runs in its own process (the embedded nsqd,
``python -m fastnsq.testing``, unless ``--nsqd-tcp-address/--nsqd-http-address``
name a real one); each client runs each workload in its own process (fastnsq:
``python -m fastnsq.benchmark``; a peer: ``bench/peers/<peer>_driver.py`` in its
own virtualenv under ``bench/.peers/<peer>``), so the CPU each reports is its own.
The peers are installed from PyPI on first use; one that cannot be installed or
does not work gets its reason recorded instead of a number.

    python3 dev.py bench                              # the full run (3 rounds; 140-290 s on 2 shared cores)
    python3 dev.py bench --real ~/nsq-real/bin --clients fastnsq,go-nsq --repeat 5   # the README's headline: a real nsqd
    python3 dev.py bench --real ~/nsq-real/bin --clients fastnsq,go-nsq --repeat 5 --write-readme   # ... into README.md
    python3 dev.py bench --repeat 5                   # the embedded nsqd (bench/README.md's numbers)
    .venv/bin/python bench/run_all.py --quick         # CI-sized
    .venv/bin/python bench/run_all.py --count 100000 --clients fastnsq,ansq --workloads consume

``--real BIN`` starts the real nsqd of ``BIN`` (docs/testing.md, "Getting the binaries")
on loopback with ``--mem-queue-size`` big enough for every pre-filled topic, and a second one with
every flag at its default for the ``consume_default`` rows; it adds one caller publishing in a
loop (``pub1``: 100 B, ``pub1_1k``: 1 KiB) and 16 callers (``pub16``), and the
Go side: the go-nsq library (``gonsq_bench`` in ``BIN``, built there from bench/go/src/gonsq_bench
by bench/go_build.py when missing or older than its source) and nsq's raw ``bench_reader`` /
``bench_writer``. A real run measures every client the same way: no warm-up, the clock
from connect (a consumer) or the first publish (connections made before) to the
count-th message handled or acknowledged, on a topic pre-filled with more than any
client reads (see bench/README.md, Method).

Writes ``bench/results/<date>-<host>.json`` and renders ``bench/results/report.md``,
``bench/results/chart.png`` and ``bench/results/readme-summary.md`` (the README's summary table)
from it (``bench/report.py``; ``bench/results/embedded/`` for the embedded nsqd). Only
``--write-readme`` touches a README: it replaces the summary table in README.md (``--real``) or
bench/README.md (the embedded nsqd).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
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

import go_build
import report

WORKLOADS = ("pub", "pub16", "pub1", "pub1_1k", "mpub", "consume", "consume_default")
#: Workloads that read a pre-filled topic (the others publish).
CONSUMERS = ("consume", "consume_default")
#: Measured messages per workload in the full run (--quick divides by 10); warm-up is 10 % more.
DEFAULT_COUNTS = {"pub": 200_000, "mpub": 2_000_000, "consume": 300_000}
#: Against a real nsqd (--real): no warm-up, and the consumers read a million of a larger backlog.
#: One caller publishes 20-30 thousand messages a second: 100,000 keep it busy 3-5 s.
REAL_COUNTS = {"pub": 200_000, "pub16": 100_000, "pub1": 100_000, "pub1_1k": 100_000, "mpub": 2_000_000,
               "consume": 1_000_000, "consume_default": 1_000_000}
#: Body size of each workload's messages (the others: BODY_SIZE).
BODY_SIZE = 100
BODY_SIZES = {"pub1_1k": 1024}
PUB_CONCURRENCY = 1000
FEW_CALLERS = 16  # the "pub16" workload: 16 callers (go-nsq: 16 Producers)
MPUB_BATCH = 200
MPUB_CONCURRENCY = 16
REAL_MPUB_CONCURRENCY = 4  # MPUBs in flight against a real nsqd, for every client
MAX_IN_FLIGHT = 2500
CHANNEL = "bench"
#: A consumer's backlog beyond its count: it never runs dry before the count-th message.
CONSUME_MARGIN = 0.1
#: nsq's bench_reader runs for a fixed time: it gets this long, and a backlog it cannot finish.
RAW_RUNFOR = 2.0
RAW_PREFILL = 2_500_000
#: nsqd's --mem-queue-size in a real run: every pre-filled topic stays in memory (not its disk queue).
REAL_MEM_QUEUE_SIZE = 10_000_000
#: The rows of these workloads run against a second nsqd with every flag at its default
#: (--mem-queue-size 10000: all but 10,000 of a pre-filled backlog wait in the disk queue).
DEFAULT_FLAGS_WORKLOADS = ("consume_default",)
REAL_PORT_BASE = 5160


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
    #: consume: messages to pre-fill (None: the count, plus the warm-up or the margin)
    prefill: int | None = None
    #: in a real run, a consumer ends at its count-th message and gets no HTTP address (it would
    #: wait for a drain that never comes); a tool that reads /stats itself still needs it
    needs_http: bool = False

    @property
    def size(self) -> int:
        return body_size(self.workload)

    @property
    def nsqd(self) -> str:
        """Which nsqd the row runs against: "main" (--mem-queue-size in a real run) or "default" (no flags)."""
        return "default" if self.workload in DEFAULT_FLAGS_WORKLOADS else "main"


def body_size(workload: str) -> int:
    return BODY_SIZES.get(workload, BODY_SIZE)


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


def _free_pair(base: int) -> tuple[int, int]:
    """Two consecutive free loopback ports from ``base`` on (nsqd's TCP and HTTP)."""
    for port in range(base, base + 400, 2):
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port, port + 1
        except OSError:
            continue
    raise SystemExit(f"no two free ports in {base}..{base + 400}")


class Server:
    """The nsqd under test: the embedded one in a child process, a real one started from a
    folder of binaries (``real_bin``), or a running one by address."""

    def __init__(self, tcp: str | None, http: str | None, pid: int | None, *, real_bin: str | None = None,
                 port_base: int = REAL_PORT_BASE, mem_queue_size: int | None = REAL_MEM_QUEUE_SIZE) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.mem_queue_size = mem_queue_size
        self.tcp, self.http, self.pid = tcp, http, pid
        self.real_bin = real_bin
        self.port_base = port_base
        self.data_dir: str | None = None
        self.info: dict[str, Any] = {}

    def _start_real(self) -> list[str]:
        assert self.real_bin is not None
        binary = Path(self.real_bin).expanduser() / "nsqd"
        if not binary.is_file():
            raise SystemExit(f"--real: no nsqd in {self.real_bin}")
        tcp_port, http_port = _free_pair(self.port_base)
        self.data_dir = tempfile.mkdtemp(prefix="fastnsq-bench-nsqd-")
        flags = [f"--data-path={self.data_dir}", f"--tcp-address=127.0.0.1:{tcp_port}",
                 f"--http-address=127.0.0.1:{http_port}", "--https-address=", "--broadcast-address=127.0.0.1"]
        if self.mem_queue_size is not None:  # None: nsqd's default (10000)
            flags.append(f"--mem-queue-size={self.mem_queue_size}")
        self.process = subprocess.Popen([str(binary), *flags], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, text=True)
        self.tcp, self.http, self.pid = f"127.0.0.1:{tcp_port}", f"127.0.0.1:{http_port}", self.process.pid
        deadline = time.monotonic() + 10
        while True:
            try:
                _http(self.http, "GET", "/ping")
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"nsqd from {binary} did not start") from None
                time.sleep(0.05)
        return [str(binary), *flags]

    def start(self) -> None:
        command = None
        if self.real_bin is not None:
            command = self._start_real()
        elif self.tcp is None:
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
        if command is not None:
            self.info = {
                "kind": "real",
                "description": f"nsqd {version}, the released binary, started by the harness on loopback",
                "version": f"nsqd {version}",
                "command": " ".join(command),
                "flags": ({"mem_queue_size": self.mem_queue_size,
                           "note": "every other flag at nsqd's default (max-rdy-count 2500, msg-timeout 60s, ...)"}
                          if self.mem_queue_size is not None else
                          {"mem_queue_size": None,
                           "note": "every flag at nsqd's default (mem-queue-size 10000: a backlog beyond 10,000 "
                                   "messages waits in the disk queue; max-rdy-count 2500, msg-timeout 60s, ...)"}),
            }
        elif self.process is not None:
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
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

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

    def prefill(self, topic: str, count: int, size: int = BODY_SIZE) -> None:
        """Pre-fill with fastnsq's MPUB (not measured), into the bench channel."""
        import fastnsq
        from fastnsq.benchmark import prefill

        fastnsq.run(prefill(str(self.tcp), topic, count, nsqd_http_address=self.http, channel=CHANNEL, size=size))


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


def fastnsq_rows(mpub_concurrency: int, *, real: bool) -> list[Row]:
    base = [sys.executable, "-m", "fastnsq.benchmark"]
    env = {"PYTHONPATH": _fastnsq_env()["PYTHONPATH"]}

    def row(group: str, label: str, workload: str, *extra: str) -> Row:
        return Row(group, "fastnsq", label, [*base, "--workload", workload, *extra], env)

    mif = ("--max-in-flight", str(MAX_IN_FLIGHT))
    rows = [
        row("pub", "coalesce on", "pub", "--concurrency", str(PUB_CONCURRENCY)),
        row("pub", "coalesce off", "pub", "--concurrency", str(PUB_CONCURRENCY), "--no-coalesce"),
        row("mpub", "", "mpub", "--concurrency", str(mpub_concurrency), "--batch", str(MPUB_BATCH)),
        row("consume", "sync handler", "consume", "--mode", "handler", *mif),
        row("consume", "async handler", "consume", "--mode", "async", *mif),
        row("consume", "batches()", "consume", "--mode", "batches", *mif),
        row("consume", "async for", "consume", "--mode", "iter", *mif),
    ]
    if real:
        rows.insert(2, row("pub16", "coalesce off", "pub", "--concurrency", str(FEW_CALLERS), "--no-coalesce"))
        # One caller publishing in a loop, awaiting each answer (scripts, backfills), with the defaults.
        rows[3:3] = [row("pub1", "one task", "pub", "--concurrency", "1"),
                     row("pub1_1k", "one task", "pub", "--concurrency", "1")]
        # What a reader gets from nsqd as installed: the backlog beyond 10,000 in its disk queue.
        rows.append(row("consume_default", "sync handler", "consume", "--mode", "handler", *mif))
        # bench_reader's shape: a connection per GOMAXPROCS (2 here), RDY 2500 on each.
        rows.insert(rows.index(next(r for r in rows if r.label == "async handler")),
                    row("consume", "sync handler, 2 connections", "consume", "--mode", "handler",
                        "--max-in-flight", str(2 * MAX_IN_FLIGHT), "--connections", "2"))
    return rows


def peer_rows(peer: Peer, peer_loop: str, mpub_concurrency: int) -> list[Row]:
    base = [str(venv_python(peer.name)), str(PEERS_DIR / peer.driver), "--loop", peer_loop]
    return [
        Row("pub", peer.name, "", [*base, "--workload", "pub", "--concurrency", str(PUB_CONCURRENCY)]),
        Row("mpub", peer.name, "", [*base, "--workload", "mpub", "--concurrency", str(mpub_concurrency),
                                    "--batch", str(MPUB_BATCH)]),
        Row("consume", peer.name, "", [*base, "--workload", "consume", "--max-in-flight", str(MAX_IN_FLIGHT)]),
    ]


def build_gonsq_bench(bin_dir: Path, log: Any) -> None:
    """gonsq_bench into ``bin_dir`` from bench/go/src/gonsq_bench, when missing or older than its source."""
    try:
        log(f"go-nsq: {go_build.build(bin_dir, program='gonsq_bench')}")
    except (SystemExit, OSError, subprocess.CalledProcessError) as exc:
        # No Go, no GOPATH with go-nsq, or a failed build: the go-nsq rows use what bin_dir holds, if anything.
        log(f"go-nsq: gonsq_bench not built ({exc}); bench/go_build.py, docs/testing.md 'Getting the binaries'")


def go_rows(info: dict[str, Any], bin_dir: str | None, mpub_concurrency: int) -> list[Row]:
    """go-nsq's library (gonsq_bench) and nsq's raw tools, where the driver found them."""
    base = [sys.executable, str(PEERS_DIR / "gonsq_driver.py"), *(["--bin", bin_dir] if bin_dir else [])]
    library = [*base, "--tool", "library"]
    raw = [*base, "--tool", "raw"]
    rows = []
    if "consume" in info.get("library_workloads", []):
        rows += [
            Row("pub", "go-nsq", "shared Producer", [*library, "--workload", "pub", "--concurrency",
                                                     str(PUB_CONCURRENCY), "--shared"]),
            Row("pub16", "go-nsq", f"{FEW_CALLERS} Producers", [*library, "--workload", "pub", "--concurrency",
                                                                str(FEW_CALLERS)]),
            Row("pub1", "go-nsq", "one goroutine", [*library, "--workload", "pub", "--concurrency", "1"]),
            Row("pub1_1k", "go-nsq", "one goroutine", [*library, "--workload", "pub", "--concurrency", "1"]),
            Row("mpub", "go-nsq", "shared Producer", [*library, "--workload", "mpub", "--concurrency",
                                                      str(mpub_concurrency), "--shared", "--batch", str(MPUB_BATCH)]),
            Row("consume", "go-nsq", "Consumer", [*library, "--workload", "consume", "--max-in-flight",
                                                  str(MAX_IN_FLIGHT)]),
            Row("consume_default", "go-nsq", "Consumer", [*library, "--workload", "consume", "--max-in-flight",
                                                          str(MAX_IN_FLIGHT)]),
        ]
    if "mpub" in info.get("raw_workloads", []):
        rows.append(Row("mpub", "nsq raw tools", "bench_writer", [*raw, "--workload", "mpub", "--batch",
                                                                   str(MPUB_BATCH), "--runfor", str(RAW_RUNFOR)]))
    if "consume" in info.get("raw_workloads", []):
        rows.append(Row("consume", "nsq raw tools", "bench_reader", [*raw, "--workload", "consume",
                                                                      "--max-in-flight", str(MAX_IN_FLIGHT),
                                                                      "--runfor", str(RAW_RUNFOR)],
                        prefill=RAW_PREFILL, needs_http=True))
    return rows


def run_once(row: Row, server: Server, count: int, args: argparse.Namespace, topic: str) -> dict[str, Any]:
    """One run of ``row`` on a fresh ``topic`` (pre-filled for a consumer, deleted afterwards)."""
    real = args.real is not None
    warmup = 0 if real else count // 10
    try:
        server.create_channel(topic)
        if row.workload in CONSUMERS:
            backlog = count + warmup if not real else count + int(count * CONSUME_MARGIN) + MAX_IN_FLIGHT
            server.prefill(topic, row.prefill or backlog, row.size)
        http = [] if real and row.workload in CONSUMERS and not row.needs_http else [
            "--nsqd-http-address", str(server.http)]
        command = [*row.command, "--nsqd-tcp-address", str(server.tcp), *http,
                   "--topic", topic, "--channel", CHANNEL, "--count", str(count), "--warmup", str(warmup),
                   "--max-seconds", str(args.max_seconds), "--size", str(row.size)]
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
        return {"workload": row.workload, "client": row.client, "label": row.label, "body_size": row.size,
                "nsqd": row.nsqd, "error": runs[-1]["error"]}
    chosen = sorted(good, key=lambda r: r["msgs_per_s"])[(len(good) - 1) // 2]
    return {
        **chosen,
        "workload": row.workload,  # the row's group (e.g. pub16 runs the pub workload with 16 callers)
        "label": row.label,
        "body_size": row.size,
        "nsqd": row.nsqd,  # which of data["servers"] it ran against
        "runs_msgs_per_s": [r["msgs_per_s"] for r in good],
        "runs_rounds": [r.get("round") for r in good],
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
    if workload not in CONSUMERS:
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
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="cap on one run's measured window (default 5 s, 10 s with --real)")
    parser.add_argument("--clients", default=None,
                        help="comma-separated subset: fastnsq,pynsq,gnsq,ansq,asyncnsq,go-nsq (go-nsq includes nsq's "
                        "raw bench tools)")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated subset: pub,mpub,consume (and with --real pub16, pub1 and "
                        "pub1_1k: one caller at 100 B and 1 KiB, consume_default: on an nsqd with default flags)")
    parser.add_argument("--real", default=None, metavar="BIN",
                        help="start the real nsqd of this folder (nsqd, nsqlookupd and nsq's bench tools) and add "
                        "the go-nsq library and nsq's raw bench tools from it")
    parser.add_argument("--real-port", type=int, default=REAL_PORT_BASE,
                        help="with --real: first port to try for nsqd's TCP (HTTP on the next one)")
    parser.add_argument("--peer-loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="event loop of the asyncio-based peers (default uvloop, their best case)")
    parser.add_argument("--nsqd-tcp-address", default=None, help="a real nsqd instead of the embedded one")
    parser.add_argument("--nsqd-http-address", default=None)
    parser.add_argument("--nsqd-pid", type=int, default=None, help="the real nsqd's pid, to measure its CPU")
    parser.add_argument("--reinstall", action="store_true", help="recreate the peers' virtualenvs")
    parser.add_argument("--output", default=None,
                        help="JSON path (default bench/results/<date>-<host>.json, <date>-<host>-nsqd.json with --real)")
    parser.add_argument("--no-report", action="store_true", help="write the JSON only")
    parser.add_argument("--write-readme", action="store_true",
                        help="also replace the summary table in README.md (--real) or bench/README.md (the embedded "
                        "server); for a full run. Without it the table goes to readme-summary.md beside report.md")
    parser.add_argument("--readme", action="store_true", help=argparse.SUPPRESS)  # the old name: refused
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.readme:
        parser.error(report.README_RENAMED)
    if args.write_readme and args.no_report:
        parser.error("--write-readme needs the report: drop --no-report")
    if (args.nsqd_tcp_address is None) != (args.nsqd_http_address is None):
        raise SystemExit("give both --nsqd-tcp-address and --nsqd-http-address, or neither")
    if args.real is not None and args.nsqd_tcp_address is not None:
        raise SystemExit("--real starts its own nsqd: do not also give --nsqd-tcp-address")
    real = args.real is not None
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.max_seconds = args.max_seconds or (10.0 if real else 5.0)
    base_counts = REAL_COUNTS if real else DEFAULT_COUNTS
    counts = {w: (args.count or (c // 10 if args.quick else c)) for w, c in base_counts.items()}
    mpub_concurrency = REAL_MPUB_CONCURRENCY if real else MPUB_CONCURRENCY
    clients = set((args.clients or "fastnsq,pynsq,gnsq,ansq,asyncnsq,go-nsq").split(","))
    available = [w for w in WORKLOADS if w in counts]
    workloads = [w for w in available if w in (args.workloads or ",".join(available)).split(",")]
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
            "body_size": BODY_SIZE, "body_sizes": {w: body_size(w) for w in workloads}, "counts": counts,
            "warmup": ("none: the clock runs from connect (consumers) or the first publish (connections made "
                       "before) to the count-th message handled or acknowledged" if real
                       else "10 % of the count, before the clock starts"),
            "repeat": args.repeat, "max_seconds": args.max_seconds, "pub_concurrency": PUB_CONCURRENCY,
            "few_callers": FEW_CALLERS, "mpub_batch": MPUB_BATCH, "mpub_concurrency": mpub_concurrency,
            "max_in_flight": MAX_IN_FLIGHT, "fastnsq_loop": "uvloop (fastnsq.run)", "peer_loop": args.peer_loop,
            **({"consume_backlog": f"count + {CONSUME_MARGIN:.0%} + {MAX_IN_FLIGHT} messages",
                "raw_reader": f"bench_reader --runfor {RAW_RUNFOR}s on {RAW_PREFILL:,} pre-filled messages"}
               if real else {}),
        },
        "peers": {},
        "rows": [],
    }

    rows: list[Row] = fastnsq_rows(mpub_concurrency, real=real) if "fastnsq" in clients else []
    for peer in PEERS:
        if peer.name not in clients:
            continue
        record = ensure_peer(peer, reinstall=args.reinstall, log=log)
        data["peers"][peer.name] = record
        if "error" in record:
            log(f"{peer.name}: {record['error']}")
            continue
        log(f"{peer.name} {record['version']} on Python {record['python']}")
        rows += peer_rows(peer, args.peer_loop, mpub_concurrency)
    if "go-nsq" in clients:
        if real:
            build_gonsq_bench(Path(args.real).expanduser(), log)
        bin_args = ["--bin", args.real] if real else []
        go = run_driver([sys.executable, str(PEERS_DIR / "gonsq_driver.py"), "--workload", "info", *bin_args],
                        {}, 60)
        data["peers"]["go-nsq"] = {"name": "go-nsq", "version": go.get("client_version"), **go}
        if go.get("reason"):
            data["peers"]["go-nsq"]["error"] = go["reason"]
            log(f"go-nsq: {go['reason']}")
        rows += go_rows(go, args.real, mpub_concurrency)
    rows = [r for r in rows if r.workload in workloads]
    # Rows of one workload run back to back (fastnsq, then go-nsq and the raw tools, then the Python
    # peers), so the runs a ratio pairs ran close together in time.
    rank = {"fastnsq": 0, "go-nsq": 1, "nsq raw tools": 2}
    rows.sort(key=lambda r: (WORKLOADS.index(r.workload), rank.get(r.client, 3)))

    server = Server(args.nsqd_tcp_address, args.nsqd_http_address, args.nsqd_pid, real_bin=args.real,
                    port_base=args.real_port)
    servers = {"main": server}
    if real and any(r.nsqd == "default" for r in rows):
        # A second nsqd, every flag at its default, for the rows of DEFAULT_FLAGS_WORKLOADS.
        servers["default"] = Server(None, None, None, real_bin=args.real, port_base=args.real_port + 2,
                                    mem_queue_size=None)
    started_servers: list[Server] = []
    try:
        for one in servers.values():
            one.start()
            started_servers.append(one)
    except BaseException:
        for one in started_servers:
            one.stop()
        raise
    data["server"] = server.info
    data["servers"] = {name: one.info for name, one in servers.items()}
    for name, one in servers.items():
        log(f"server ({name}): {one.info['version']} at {one.tcp}: {one.info.get('command', '')}")
    runs: list[list[dict[str, Any]]] = [[] for _ in rows]
    try:
        # Round robin: every row once, then every row again. A change in the machine's load
        # (other jobs) then touches every client alike instead of the rows that ran during it;
        # every other round runs backwards, so no row always runs right after the same one.
        for attempt in range(args.repeat):
            order = range(len(rows)) if attempt % 2 == 0 else range(len(rows) - 1, -1, -1)
            for index in order:
                row = rows[index]
                if runs[index] and "error" in runs[index][-1]:
                    continue  # it failed once: it will again
                topic = f"bench_{index}_{row.workload}_{re.sub(r'[^A-Za-z0-9_]', '_', row.client)}_{attempt}"
                result = run_once(row, servers[row.nsqd], counts[row.workload], args, topic)
                result["round"] = attempt  # rows of one round ran back to back: ratios pair them
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
        for one in servers.values():
            one.stop()
    data["rows"] = [summarize(row, row_runs) for row, row_runs in zip(rows, runs)]
    data["duration_s"] = round(time.perf_counter() - started, 1)

    RESULTS.mkdir(parents=True, exist_ok=True)
    output = Path(args.output) if args.output else RESULTS / (
        f"{dt.date.today().isoformat()}-{socket.gethostname().split('.')[0]}{'-nsqd' if real else ''}.json")
    output.write_text(json.dumps(data, indent=2) + "\n")
    log(f"wrote {output}")
    if not args.no_report:
        # The real nsqd is the README's headline; the embedded server's numbers are bench/README.md's.
        readme = (ROOT / "README.md" if real else BENCH / "README.md") if args.write_readme else None
        md, png = report.render(output, out_dir=RESULTS if real else RESULTS / "embedded", readme=readme)
        summary = md.parent / report.SUMMARY_NAME
        log(f"wrote {md}, {png} and {summary}" + (f" and {readme.relative_to(ROOT)}'s summary table" if readme else
                                                  f" ({'README.md' if real else 'bench/README.md'} untouched: "
                                                  "--write-readme puts the table there)"))
        print()
        print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
