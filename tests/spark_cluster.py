"""A real Spark standalone cluster on loopback, from pyspark's own jars: a master and two workers.

One job: start ``org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker``
JVMs with pyspark's ``bin/spark-class`` (no Spark download: the pip package carries the
jars), wait until the master lists every worker ALIVE, find the executors a worker
started (to SIGKILL one), and stop everything at the end: each daemon runs in a process
group of its own, and the group is killed, so no executor JVM outlives the tests.

    with SparkStandalone(tmp_dir) as cluster:
        spark = SparkSession.builder.master(cluster.master_url)...getOrCreate()
        cluster.executor_pids()     # the CoarseGrainedExecutorBackend JVMs of the workers

The pytest fixture ``spark_standalone`` (session-scoped) gives one to a test module that
imports it; it skips, saying why, only when Java or PySpark is missing.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["EXECUTOR_CLASS", "SparkStandalone", "SparkStandaloneError", "executor_of", "spark_standalone"]

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def distinct_free_ports(count: int) -> list[int]:
    """``count`` TCP ports nothing listens on now, all different (held open together while
    the kernel picks them, so that two daemons are never given the same one)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SparkStandaloneError(RuntimeError):
    """The cluster did not come up (the message quotes the logs' tails)."""


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found[_parent(int(entry))].append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), parents first."""
    children = _children()
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def executor_of(pid: int) -> int | None:
    """The executor JVM ``pid`` runs under (a Python worker's ancestor), or None."""
    while pid > 1:
        if EXECUTOR_CLASS in _cmdline(pid):
            return pid
        pid = _parent(pid)
    return None


class SparkStandalone:
    """A standalone master and ``workers`` workers (``cores`` cores, ``memory`` each) on 127.0.0.1.

    Work and log folders live under ``root``. The master's web UI answers the JSON
    status (``/json``) that :meth:`wait_for_workers` reads.
    """

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                 daemon_memory: str = "256m") -> None:
        self.root = Path(root)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.spark_home = _spark_home()
        self.port = 0
        self.webui_port = 0
        self.processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://{HOST}:{self.webui_port}/json"

    def environment(self) -> dict[str, str]:
        """The daemons' environment: loopback only, an empty conf folder, this Python for
        the executors' workers, and this checkout importable there."""
        conf = self.root / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        paths = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP=HOST,
            SPARK_LOCAL_HOSTNAME=HOST,
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            PYSPARK_PYTHON=sys.executable,
            PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
        )
        return env

    def _spawn(self, name: str, *args: str) -> None:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            # A session (and so a process group) of its own: stop() kills the group, which
            # holds the executors a worker started, whatever state the JVMs are in.
            process = subprocess.Popen(
                [str(self.spark_home / "bin" / "spark-class"), *args], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True,
            )
        self.processes.append((name, process, log))

    def start(self, timeout: float = 90.0) -> None:
        """Start the master and the workers; wait until the master lists every worker ALIVE."""
        ports = distinct_free_ports(2 + 2 * self.workers)  # one free_port() at a time may repeat one
        self.port, self.webui_port = ports.pop(), ports.pop()
        self._spawn("master", _MASTER_CLASS, "--host", HOST, "--port", str(self.port),
                    "--webui-port", str(self.webui_port))
        for i in range(self.workers):
            work = self.root / f"worker-{i}"
            work.mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker-{i}", _WORKER_CLASS, self.master_url, "--host", HOST, "--port", str(ports.pop()),
                        "--webui-port", str(ports.pop()), "--cores", str(self.cores), "--memory", self.memory,
                        "--work-dir", str(work))
        try:
            self.wait_for_workers(timeout)
        except BaseException:
            self.stop()
            raise

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications), or {} while it does not answer it.
        Once in CI (a loaded machine) /json answered with an HTML page of Spark's UI while the
        cluster started, and the start failed on it: the master's UI before its pages were
        attached, or another daemon given the same port (now excluded, distinct_free_ports).
        A cluster that never answers JSON still fails, after ``timeout``, with the logs' tails."""
        try:
            with urllib.request.urlopen(self.status_url, timeout=2) as response:
                return dict(json.loads(response.read()))
        except (OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        return sum(1 for worker in self.status().get("workers", ()) if worker.get("state") == "ALIVE")

    def wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process, _ in self.processes:
                if process.poll() is not None:
                    raise SparkStandaloneError(f"spark {name} exited with {process.returncode}:\n{self.tails()}")
            if self.alive_workers() == self.workers:
                return
            time.sleep(0.25)
        raise SparkStandaloneError(f"{self.workers} workers not ALIVE at {self.status_url} in {timeout} s:\n"
                                   f"{self.tails()}")

    def tails(self, chars: int = 1500) -> str:
        return "\n".join(f"--- {name} ({log}):\n{log.read_text(errors='replace')[-chars:]}"
                         for name, _, log in self.processes if log.exists())

    def worker_pids(self) -> list[int]:
        return [process.pid for name, process, _ in self.processes if name.startswith("worker") and
                process.poll() is None]

    def executor_pids(self) -> list[int]:
        """The live executor JVMs the workers started (one per worker per application)."""
        return [pid for worker in self.worker_pids() for pid in descendants(worker) if EXECUTOR_CLASS in _cmdline(pid)]

    def wait_for_executors(self, count: int, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.executor_pids()
            if len(pids) >= count:
                return pids
            time.sleep(0.25)
        raise SparkStandaloneError(f"{count} executors did not start in {timeout} s:\n{self.tails()}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to each daemon's process group (a worker kills its executors), then SIGKILL."""
        for _, process, _ in reversed(self.processes):
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, process, _ in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, process, _ in self.processes:
            _signal_group(process.pid, signal.SIGKILL)  # whatever is left of the group: executors too
            if process.poll() is None:
                process.wait(10)
        self.processes.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _missing() -> str | None:
    if shutil.which("java") is None:
        return "no `java` on PATH: a Spark standalone cluster needs a JVM (Java 17)"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'fastnsq-client[spark]')"
    if not (_spark_home() / "bin" / "spark-class").exists():
        return "this pyspark has no bin/spark-class to start a standalone cluster with"
    return None


@pytest.fixture(scope="session")
def spark_standalone() -> Iterator[SparkStandalone]:
    """A standalone master and two 1-core workers on loopback for the whole test session."""
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="fastnsq-spark-standalone-"))
    cluster = SparkStandalone(root)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
