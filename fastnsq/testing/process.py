"""NSQ servers in child processes on free loopback ports: the one place that starts them.

One job: start an nsqd (fastnsq's embedded one, ``python -m fastnsq nsqd``, or a real
binary with the flags given) or a real nsqlookupd as a child process, wait until it
answers ``/ping``, and stop (SIGTERM), kill (SIGKILL), pause (SIGSTOP) or restart it on
the same ports and data. The demo, ``fastnsq bench``, the benchmarks and the real-server
harness (:mod:`fastnsq.testing.real`) all start their servers here. Standard library
only: ``fastnsq bench`` imports it, and it runs before anything is installed.

    with NSQDProcess() as nsqd:                                   # the embedded nsqd
        ...  # nsqd.tcp_address, nsqd.http_address
    real = NSQDProcess("--mem-queue-size=0", binary="~/nsq-real/bin/nsqd")
    real.start(); real.kill(); real.start()                       # same ports, same data
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._ports import PortKeeper

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["NSQDProcess", "NSQLookupdProcess", "ServerProcess", "ServerProcessError", "free_port", "go_duration"]

HOST = "127.0.0.1"
_PORT_ATTEMPTS = 3  # fresh ports when a port called free was taken before the server bound it
_ROOT = Path(__file__).resolve().parents[2]  # the checkout: found without `pip install` too


class ServerProcessError(RuntimeError):
    """A server process could not be started (the message says which, why, and its log's tail)."""


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice; the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _ping(http_address: str) -> bool:
    """Whether the server answers HTTP: ``/ping`` says OK, or refuses plain HTTP (an nsqd with
    ``--tls-required=true`` answers 403 TLS_REQUIRED: it is up all the same)."""
    try:
        with urllib.request.urlopen(f"http://{http_address}/ping", timeout=1.0) as response:  # loopback only
            return bytes(response.read()).strip() == b"OK"
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


class ServerProcess:
    """A server with a TCP and an HTTP port in a child process; subclasses give its command line.

    The ports are chosen at the first :meth:`start` and kept by every later one, so that
    clients reconnect to a restarted server where they left it. Output goes to a log
    file (``log``), whose tail any start-up failure quotes.
    """

    name = "server"

    def __init__(self, *extra_args: str, data_dir: str | os.PathLike[str] | None = None) -> None:
        self.extra_args = tuple(extra_args)
        self._own_data_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix=f"fastnsq-{self.name}-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.data_dir / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.tcp_address = ""
        self.http_address = ""
        self._ports = PortKeeper()  # the ports, kept bound between a stop and the next start

    # -- what subclasses say ---------------------------------------------------------------

    def argv(self, tcp_address: str, http_address: str) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        return None

    # -- state -------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def tcp_port(self) -> int:
        return int(self.tcp_address.rpartition(":")[2])

    @property
    def http_port(self) -> int:
        return int(self.http_address.rpartition(":")[2])

    # -- start, stop ---------------------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and wait until it answers ``/ping``; raises ServerProcessError otherwise."""
        if self.running:
            raise ServerProcessError(f"{self.name} is running already (pid {self.pid})")
        keep_ports = bool(self.tcp_address)
        for attempt in range(1 if keep_ports else _PORT_ATTEMPTS):
            if not keep_ports:
                self.tcp_address, self.http_address = f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"
            try:
                self._spawn_and_wait(timeout)
                return
            except ServerProcessError as exc:
                self._release_ports()
                if keep_ports or "address already in use" not in str(exc) or attempt + 1 == _PORT_ATTEMPTS:
                    raise
                self.tcp_address = self.http_address = ""

    def _spawn_and_wait(self, timeout: float) -> None:
        argv = self.argv(self.tcp_address, self.http_address)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.environment())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerProcessError(f"{self.name} exited with {self.process.returncode}; log tail:\n{self._tail()}")
            if _ping(self.http_address):
                self._release_ports()  # the server listens beside the holds (SO_REUSEADDR on both)
                return
            time.sleep(0.05)
        self.kill()
        raise ServerProcessError(f"{self.name} did not answer /ping on {self.http_address} in {timeout} s; "
                                 f"log tail:\n{self._tail()}")

    def _hold_ports(self) -> None:
        for address in (self.tcp_address, self.http_address):
            if address:
                host, _, port = address.rpartition(":")
                self._ports.hold(host, int(port))

    def _release_ports(self) -> None:
        self._ports.release_all()

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else "(no log)"

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (a clean shutdown: a real nsqd writes what it holds to disk), then SIGKILL
        after ``timeout`` s; returns the exit status (None when it was not running)."""
        if self.process is None or self.process.poll() is not None:
            return None
        self.process.send_signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        self.process.terminate()
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        self._hold_ports()
        return status

    def kill(self) -> int | None:
        """SIGKILL: a crash; nothing is flushed."""
        if self.process is None or self.process.poll() is not None:
            return None
        self.process.kill()
        status = self.process.wait()
        self._hold_ports()
        return status

    def pause(self) -> None:
        """SIGSTOP: the process freezes, its sockets stay open and nobody answers (a hung server)."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)
            _wait_stopped(self.process.pid)

    def resume(self) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)

    def restart(self, *, kill: bool = False, timeout: float = 20.0) -> None:
        """Stop (SIGTERM, or SIGKILL with ``kill``) and start again on the same ports and data."""
        self.kill() if kill else self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Stop, and remove the data folder if it was a temporary one."""
        self.stop()
        self._release_ports()
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NSQDProcess(ServerProcess):
    """An nsqd in a child process: a real one from ``binary``, else fastnsq's embedded one.

    ``extra_args`` are flags of that nsqd (``"--msg-timeout", "600"`` for the embedded
    one, ``"--mem-queue-size=0"`` for a real one). A real nsqd keeps its data in
    ``data_dir`` (a temporary folder by default), so a restart finds what it wrote.
    The embedded one keeps messages in memory only: a restarted process starts empty.
    A process of its own gives the server its own core: on a 2-core machine the client
    is about twice as fast as with the server in its process (measured with the demo).
    """

    name = "nsqd"

    def __init__(self, *extra_args: str, binary: str | os.PathLike[str] | None = None,
                 data_dir: str | os.PathLike[str] | None = None, lookupd_tcp_addresses: Sequence[str] = ()) -> None:
        if isinstance(lookupd_tcp_addresses, str):
            raise TypeError("lookupd_tcp_addresses is a sequence of 'host:port', not one string")
        self.binary = _executable(binary) if binary is not None else None
        self.lookupd_tcp_addresses = tuple(lookupd_tcp_addresses)
        super().__init__(*extra_args, data_dir=data_dir)

    @property
    def real(self) -> bool:
        return self.binary is not None

    def argv(self, tcp_address: str, http_address: str) -> list[str]:
        lookupds = [f"--lookupd-tcp-address={address}" for address in self.lookupd_tcp_addresses]
        if self.binary is None:
            return [sys.executable, "-m", "fastnsq", "nsqd", "--tcp-address", tcp_address,
                    "--http-address", http_address, *lookupds, *self.extra_args]
        return [str(self.binary), f"--data-path={self.data_dir}", f"--tcp-address={tcp_address}",
                f"--http-address={http_address}", "--https-address=", f"--broadcast-address={HOST}",
                *lookupds, *self.extra_args]

    def environment(self) -> dict[str, str] | None:
        if self.binary is not None:
            return None
        path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
        # The embedded nsqd ends with this process: a test run killed by a signal left its servers
        # running for as long as nobody looked (fastnsq nsqd watches its parent's pid).
        return dict(os.environ, PYTHONPATH=path, FASTNSQ_STOP_WITH_PARENT=str(os.getpid()))

    def describe(self) -> str:
        what = f"nsqd {self.binary}" if self.binary else "fastnsq's embedded nsqd (fastnsq nsqd)"
        return f"{what} {' '.join(self.extra_args)}".rstrip()


class NSQLookupdProcess(ServerProcess):
    """A real nsqlookupd from ``binary`` in a child process (``extra_args``: its flags)."""

    name = "nsqlookupd"

    def __init__(self, binary: str | os.PathLike[str], *extra_args: str,
                 data_dir: str | os.PathLike[str] | None = None) -> None:
        self.binary = _executable(binary)
        super().__init__(*extra_args, data_dir=data_dir)

    def argv(self, tcp_address: str, http_address: str) -> list[str]:
        return [str(self.binary), f"--tcp-address={tcp_address}", f"--http-address={http_address}",
                f"--broadcast-address={HOST}", *self.extra_args]


def _executable(path: str | os.PathLike[str]) -> Path:
    found = Path(path).expanduser()
    if not (found.is_file() and os.access(found, os.X_OK)):
        raise ServerProcessError(f"no executable {found} (how to get real servers: fastnsq's docs/testing.md, 'Getting the binaries')")
    return found


def go_duration(seconds: float) -> str:
    """A Go duration flag value: ``2.0`` -> ``"2000ms"``."""
    return f"{round(seconds * 1000)}ms"


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of ``pid`` is stopped (Linux: /proc): SIGSTOP lands asynchronously, and on
    a busy machine a real nsqd answered a publish sent after pause() returned."""
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return  # no /proc, or the process is gone
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)

