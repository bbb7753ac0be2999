"""Real nsqd and nsqlookupd processes from a folder of binaries, on free loopback ports.

One job: start the real servers a test run or a benchmark is judged against, tell it
where they are (the ``FASTNSQ_TEST_*`` variables of :mod:`fastnsq.testing.external`),
and stop them. Standard library only, so that it also runs before anything is
installed.

    python -m fastnsq.testing.real ~/nsq-real/bin -- python -m pytest tests/

starts an nsqlookupd and three nsqd registered with it (the first is also the single
nsqd of ``FASTNSQ_TEST_NSQD``), runs the command with the variables set, stops the
servers and exits with the command's status. Their data and logs go to a temporary
folder (``--data-dir`` to keep them). Which upstream version the binaries are is read
from ``nsqd --help``: nsq master has ``--topology-zone``, the released 1.3.0 does not
(both print 1.3.0 as their version); it goes to the tests as ``FASTNSQ_TEST_NSQD_EMULATES``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RealNSQ", "RealServerError", "version_of"]

#: The variable that names a folder of real binaries for ``dev.py`` and CI.
ENV_REAL_BIN = "FASTNSQ_REAL_BIN"
ENV_EMULATES = "FASTNSQ_TEST_NSQD_EMULATES"
_HOST = "127.0.0.1"
_START_TIMEOUT = 15.0


class RealServerError(RuntimeError):
    """A real server could not be found or started (the message says which and why)."""


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice; bound by the server right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def binary(bin_dir: Path, name: str) -> Path:
    path = bin_dir / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RealServerError(f"no executable {name} in {bin_dir} (build the real servers: ../shared/real-servers)")
    return path


def version_of(nsqd: Path) -> tuple[str, str]:
    """(what ``nsqd --version`` prints, ``"master"`` or ``"v1.3.0"``: the shape it answers in)."""
    printed = subprocess.run([nsqd, "--version"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    # --help prints the flags and exits 0 (Go's flag package may exit 2 on older builds).
    helped = subprocess.run([nsqd, "--help"], capture_output=True, text=True, timeout=10, check=False)
    emulates = "master" if "topology-zone" in helped.stdout + helped.stderr else "v1.3.0"
    return printed, emulates


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=1.0) as response:  # loopback only
        return bytes(response.read())


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RealServerError(f"{self.name} exited with {self.popen.returncode}; log tail:\n{tail}")


@dataclass
class RealNSQ:
    """An nsqlookupd and ``nsqds`` nsqd from ``bin_dir``, registered with it, on loopback.

    >>> servers = RealNSQ(Path("~/nsq-real/bin").expanduser())   # doctest: +SKIP
    >>> with servers:                                            # doctest: +SKIP
    ...     run_tests(env=servers.environment())
    """

    bin_dir: Path
    nsqds: int = 3
    data_dir: Path | None = None
    nsqd_args: Sequence[str] = ()
    tcp_addresses: list[str] = field(default_factory=list)
    http_addresses: list[str] = field(default_factory=list)
    lookupd_tcp_address: str = ""
    lookupd_http_address: str = ""
    version: str = ""
    emulates: str = ""
    _processes: list[_Process] = field(default_factory=list)
    _own_data_dir: bool = False

    def start(self) -> None:
        nsqd = binary(self.bin_dir, "nsqd")
        lookupd = binary(self.bin_dir, "nsqlookupd")
        self.version, self.emulates = version_of(nsqd)
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="fastnsq-real-"))
            self._own_data_dir = True
        try:
            self._start_lookupd(lookupd)
            for index in range(self.nsqds):
                self._start_nsqd(nsqd, index)
            self._wait_registered()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        assert self.data_dir is not None
        log = self.data_dir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        process = _Process(name, popen, log)
        self._processes.append(process)
        return process

    def _wait_ping(self, process: _Process, http_address: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            process.check_alive()
            with contextlib.suppress(OSError):
                if _get(f"http://{http_address}/ping") == b"OK":
                    return
            time.sleep(0.05)
        raise RealServerError(f"{process.name} did not answer /ping on {http_address} in {_START_TIMEOUT} s")

    def _start_lookupd(self, lookupd: Path) -> None:
        tcp, http = free_port(), free_port()
        self.lookupd_tcp_address, self.lookupd_http_address = f"{_HOST}:{tcp}", f"{_HOST}:{http}"
        argv = [str(lookupd), f"--tcp-address={self.lookupd_tcp_address}",
                f"--http-address={self.lookupd_http_address}", f"--broadcast-address={_HOST}"]
        self._wait_ping(self._spawn("nsqlookupd", argv), self.lookupd_http_address)

    def _start_nsqd(self, nsqd: Path, index: int) -> None:
        assert self.data_dir is not None
        tcp, http = f"{_HOST}:{free_port()}", f"{_HOST}:{free_port()}"
        data_path = self.data_dir / f"nsqd{index}"
        data_path.mkdir(parents=True, exist_ok=True)
        argv = [str(nsqd), f"--data-path={data_path}", f"--tcp-address={tcp}", f"--http-address={http}",
                "--https-address=", f"--broadcast-address={_HOST}",
                f"--lookupd-tcp-address={self.lookupd_tcp_address}", *self.nsqd_args]
        self._wait_ping(self._spawn(f"nsqd{index}", argv), http)
        self.tcp_addresses.append(tcp)
        self.http_addresses.append(http)

    def _wait_registered(self) -> None:
        import json

        wanted = {int(a.rpartition(":")[2]) for a in self.tcp_addresses}
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            nodes = json.loads(_get(f"http://{self.lookupd_http_address}/nodes")).get("producers", [])
            if wanted <= {node["tcp_port"] for node in nodes}:
                return
            time.sleep(0.05)
        raise RealServerError(f"the nsqds did not register with nsqlookupd {self.lookupd_http_address}")

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 10 s); remove a temporary data folder."""
        for process in reversed(self._processes):
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.popen.wait(10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        self._processes.clear()
        if self._own_data_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RealNSQ:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """The ``FASTNSQ_TEST_*`` variables naming these servers."""
        return {
            "FASTNSQ_TEST_NSQD": self.tcp_addresses[0],
            "FASTNSQ_TEST_NSQD_HTTP": self.http_addresses[0],
            "FASTNSQ_TEST_LOOKUPD_HTTP": self.lookupd_http_address,
            "FASTNSQ_TEST_LOOKUPD_TCP": self.lookupd_tcp_address,
            "FASTNSQ_TEST_CLUSTER_NSQD": ",".join(self.tcp_addresses),
            "FASTNSQ_TEST_CLUSTER_NSQD_HTTP": ",".join(self.http_addresses),
            ENV_EMULATES: self.emulates,
        }

    def describe(self) -> str:
        flags = " ".join(self.nsqd_args) or "default flags"
        return (f"real nsqd {self.version} ({self.emulates}, {self.bin_dir}) x{len(self.tcp_addresses)}, "
                f"{flags}; nsqlookupd {self.lookupd_http_address}")


@contextlib.contextmanager
def running(bin_dir: Path, **options: object) -> Iterator[RealNSQ]:
    servers = RealNSQ(bin_dir, **options)  # type: ignore[arg-type]
    with servers:
        yield servers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastnsq.testing.real",
        description="Run COMMAND against real nsqd/nsqlookupd binaries started on free loopback ports.",
    )
    parser.add_argument("bin_dir", type=Path, help="the folder with nsqd and nsqlookupd")
    parser.add_argument("--nsqds", type=int, default=3, help="how many nsqd (default 3)")
    parser.add_argument("--data-dir", type=Path, help="keep data and logs here (default: a temporary folder)")
    parser.add_argument("--nsqd-arg", action="append", default=[], help="an extra nsqd flag (repeatable)")
    parser.usage = "%(prog)s BIN_DIR [options] -- COMMAND [ARGS...]"
    words = list(sys.argv[1:] if argv is None else argv)
    if "--" not in words:
        parser.error("give the command to run after --")
    split = words.index("--")
    args = parser.parse_args(words[:split])
    command = words[split + 1 :]
    if not command:
        parser.error("give the command to run after --")
    if args.nsqds < 1:
        parser.error(f"--nsqds must be at least 1, got {args.nsqds}")
    try:
        with running(args.bin_dir.expanduser(), nsqds=args.nsqds, data_dir=args.data_dir,
                     nsqd_args=args.nsqd_arg) as servers:
            print(f"fastnsq.testing.real: {servers.describe()}", flush=True)
            return subprocess.call(command, env={**os.environ, **servers.environment()})
    except RealServerError as exc:
        print(f"fastnsq.testing.real: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
