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

    python -m fastnsq.testing.real ~/nsq-real/ha/bin --ha -- python -m pytest tests/test_ha.py

starts youzan's HA cluster instead (:class:`RealHACluster`): etcd from PATH, a youzan
nsqlookupd and three youzan nsqd with the cluster coordinator (etcd's v2 API, loopback
broadcast), plus one youzan nsqd without a
coordinator, the single nsqd of ``FASTNSQ_TEST_NSQD`` (a cluster node refuses the
``INTERNAL_CREATE_TOPIC`` that single-node tests create topics with).
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
from typing import TYPE_CHECKING, ClassVar

from .process import NSQDProcess, NSQLookupdProcess, ServerProcess, ServerProcessError, free_port, go_duration

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "RealHACluster",
    "RealLookupdServer",
    "RealNSQ",
    "RealNSQDServer",
    "RealServerError",
    "nsqd_flags",
    "real_bin_dir",
    "version_of",
]

#: The variable that names a folder of real binaries for ``dev.py`` and CI.
ENV_REAL_BIN = "FASTNSQ_REAL_BIN"
#: The same for youzan's HA binaries (``--ha``); tests that start a cluster of their own read it.
ENV_REAL_HA_BIN = "FASTNSQ_REAL_HA_BIN"
#: With ``--base-port``: the first port after the cluster's, for such a test's own cluster.
ENV_REAL_HA_NEXT_PORT = "FASTNSQ_REAL_HA_NEXT_PORT"
ENV_EMULATES = "FASTNSQ_TEST_NSQD_EMULATES"
#: Set by the runner for the command it runs: the folder of the real binaries the run is
#: judged against, from which tests start the servers they configure themselves.
ENV_TEST_REAL_BIN = "FASTNSQ_TEST_REAL_BIN"
_HOST = "127.0.0.1"
_START_TIMEOUT = 15.0


class RealServerError(RuntimeError):
    """A real server could not be found or started (the message says which and why)."""


def binary(bin_dir: Path, name: str) -> Path:
    path = bin_dir / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RealServerError(f"no executable {name} in {bin_dir} (how to get real servers: fastnsq's docs/testing.md, 'Getting the binaries')")
    return path


def version_of(nsqd: Path) -> tuple[str, str]:
    """(what ``nsqd --version`` prints, ``"master"`` or ``"v1.3.0"``: the shape it answers in)."""
    printed = subprocess.run([nsqd, "--version"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    # --help prints the flags and exits 0 (Go's flag package may exit 2 on older builds).
    helped = subprocess.run([nsqd, "--help"], capture_output=True, text=True, timeout=10, check=False)
    emulates = "master" if "topology-zone" in helped.stdout + helped.stderr else "v1.3.0"
    return printed, emulates


def _get(url: str, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=1.0) as response:  # loopback only
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

    Each is a :class:`~fastnsq.testing.process.NSQDProcess` /
    :class:`~fastnsq.testing.process.NSQLookupdProcess` (``processes``), so a caller
    can stop, kill or restart one on its ports.

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
    processes: list[ServerProcess] = field(default_factory=list)
    _own_data_dir: bool = False

    def start(self) -> None:
        nsqd = binary(self.bin_dir, "nsqd")
        lookupd = binary(self.bin_dir, "nsqlookupd")
        self.version, self.emulates = version_of(nsqd)
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="fastnsq-real-"))
            self._own_data_dir = True
        try:
            lookupd_process = self._launch(NSQLookupdProcess(lookupd, data_dir=self.data_dir / "nsqlookupd"))
            self.lookupd_tcp_address = lookupd_process.tcp_address
            self.lookupd_http_address = lookupd_process.http_address
            for index in range(self.nsqds):
                process = self._launch(NSQDProcess(*self.nsqd_args, binary=nsqd, data_dir=self.data_dir / f"nsqd{index}",
                                                   lookupd_tcp_addresses=[self.lookupd_tcp_address]))
                self.tcp_addresses.append(process.tcp_address)
                self.http_addresses.append(process.http_address)
            self._wait_registered()
        except BaseException:
            self.stop()
            raise

    def _launch(self, process: ServerProcess) -> ServerProcess:
        self.processes.append(process)
        try:
            process.start(_START_TIMEOUT)
        except ServerProcessError as exc:
            raise RealServerError(str(exc)) from None
        return process

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
        for process in reversed(self.processes):
            process.close()
        self.processes.clear()
        if self._own_data_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """The ``FASTNSQ_TEST_*`` variables naming these servers, and the binaries' folder.

        ``FASTNSQ_TEST_REAL_BIN`` lets a test that needs a server of its own (TLS, AUTH,
        small limits, restarts) start one from the same binaries (:func:`real_bin_dir`).
        """
        return {
            "FASTNSQ_TEST_NSQD": self.tcp_addresses[0],
            "FASTNSQ_TEST_NSQD_HTTP": self.http_addresses[0],
            "FASTNSQ_TEST_LOOKUPD_HTTP": self.lookupd_http_address,
            "FASTNSQ_TEST_LOOKUPD_TCP": self.lookupd_tcp_address,
            "FASTNSQ_TEST_CLUSTER_NSQD": ",".join(self.tcp_addresses),
            "FASTNSQ_TEST_CLUSTER_NSQD_HTTP": ",".join(self.http_addresses),
            ENV_EMULATES: self.emulates,
            ENV_TEST_REAL_BIN: str(self.bin_dir),
        }

    def describe(self) -> str:
        flags = " ".join(self.nsqd_args) or "default flags"
        return (f"real nsqd {self.version} ({self.emulates}, {self.bin_dir}) x{len(self.tcp_addresses)}, "
                f"{flags}; nsqlookupd {self.lookupd_http_address}")


# -- servers a test starts itself, configured as it needs ------------------------------------


def real_bin_dir() -> Path | None:
    """The folder of real binaries this test run is judged against, or None (embedded servers).

    Set by the runner (``FASTNSQ_TEST_REAL_BIN``): a test that needs a server of its own
    (TLS, AUTH, small limits, restarts) starts it from there with :class:`RealNSQDServer`.
    """
    folder = os.environ.get(ENV_TEST_REAL_BIN, "").strip()
    return Path(folder).expanduser() if folder else None


#: The embedded NSQD's options (seconds for durations) and the real nsqd's flags for them.
_NSQD_FLAGS: dict[str, tuple[str, str]] = {
    "msg_timeout": ("--msg-timeout", "duration"),
    "max_msg_timeout": ("--max-msg-timeout", "duration"),
    "max_req_timeout": ("--max-req-timeout", "duration"),
    "max_heartbeat_interval": ("--max-heartbeat-interval", "duration"),
    "max_output_buffer_timeout": ("--max-output-buffer-timeout", "duration"),
    "max_rdy_count": ("--max-rdy-count", "int"),
    "max_msg_size": ("--max-msg-size", "int"),
    "max_body_size": ("--max-body-size", "int"),
    "max_output_buffer_size": ("--max-output-buffer-size", "int"),
    "max_deflate_level": ("--max-deflate-level", "int"),
    "max_channel_consumers": ("--max-channel-consumers", "int"),
    "mem_queue_size": ("--mem-queue-size", "int"),
    "snappy": ("--snappy", "bool"),
    "deflate": ("--deflate", "bool"),
    "tls_required": ("--tls-required", "bool"),
    "tls_cert": ("--tls-cert", "str"),
    "tls_key": ("--tls-key", "str"),
    "tls_client_auth_policy": ("--tls-client-auth-policy", "str"),
    "tls_root_ca_file": ("--tls-root-ca-file", "str"),
    "auth_http_addresses": ("--auth-http-address", "list"),
    "lookupd_tcp_addresses": ("--lookupd-tcp-address", "list"),
}


def nsqd_flags(**options: object) -> list[str]:
    """The real nsqd's flags for the embedded :class:`~fastnsq.testing.NSQD`'s options.

    An option nsqd has no flag for (``client_timeout``: fixed at 60 s in nsqd 1.3;
    ``lookupd_ping_interval``: 15 s) raises ValueError naming it.
    """
    flags: list[str] = []
    for name, value in options.items():
        if name not in _NSQD_FLAGS:
            raise ValueError(f"the real nsqd has no flag for the option {name}={value!r}")
        flag, kind = _NSQD_FLAGS[name]
        if value is None:
            continue
        if kind == "duration":
            flags.append(f"{flag}={go_duration(float(value))}")  # type: ignore[arg-type]
        elif kind == "bool":
            flags.append(f"{flag}={'true' if value else 'false'}")
        elif kind == "list":
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise TypeError(f"{name} is a sequence of 'host:port', got {value!r}")
            flags += [f"{flag}={item}" for item in value]
        else:
            flags.append(f"{flag}={value}")
    return flags


class _AsyncProcess:
    """An async face over a :class:`ServerProcess` (the waits run in a thread, off the loop)."""

    external: ClassVar[bool] = False  # started by the test: it may stop and reconfigure it
    process: ServerProcess

    @property
    def tcp_address(self) -> str:
        return self.process.tcp_address

    @property
    def http_address(self) -> str:
        return self.process.http_address

    @property
    def tcp_port(self) -> int:
        return self.process.tcp_port

    @property
    def http_port(self) -> int:
        return self.process.http_port

    @property
    def host(self) -> str:
        return _HOST

    async def start(self) -> None:
        import asyncio

        try:
            await asyncio.to_thread(self.process.start, _START_TIMEOUT)
        except ServerProcessError as exc:
            raise RealServerError(str(exc)) from None

    async def kill(self) -> None:
        """SIGKILL: a crash (nothing flushed)."""
        import asyncio

        await asyncio.to_thread(self.process.kill)

    async def close(self) -> None:
        import asyncio

        await asyncio.to_thread(self.process.close)

    async def pause(self) -> None:
        """SIGSTOP: frozen with its connections open (a hung server); :meth:`resume` or a stop ends it."""
        self.process.pause()

    async def resume(self) -> None:
        self.process.resume()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class RealNSQDServer(_AsyncProcess):
    """A real nsqd from ``bin_dir`` that a test starts with the options it needs.

    Takes the embedded :class:`~fastnsq.testing.NSQD`'s option names (:func:`nsqd_flags`)
    and has its ``start``/``stop(keep_messages=...)`` and address attributes, so a test
    written for an embedded nsqd it configures runs on a real one too::

        async with RealNSQDServer(real_bin_dir(), tls_required=True, tls_cert=..., tls_key=...) as nsqd:
            ...
    """

    def __init__(self, bin_dir: Path, *extra_flags: str, **options: object) -> None:
        self.flags = [*nsqd_flags(**options), *extra_flags]
        self.process = NSQDProcess(*self.flags, binary=binary(bin_dir, "nsqd"))

    async def stop(self, *, keep_messages: bool = True) -> None:
        """SIGTERM (nsqd writes what it holds to its data path), or SIGKILL with ``keep_messages=False``
        (what was only in memory is lost; topics and channels survive in nsqd's metadata file)."""
        import asyncio

        await asyncio.to_thread(self.process.stop if keep_messages else self.process.kill)


class RealLookupdServer(_AsyncProcess):
    """A real nsqlookupd from ``bin_dir`` a test starts itself (durations in seconds)."""

    def __init__(self, bin_dir: Path, *, inactive_producer_timeout: float | None = None,
                 tombstone_lifetime: float | None = None) -> None:
        flags = []
        if inactive_producer_timeout is not None:
            flags.append(f"--inactive-producer-timeout={go_duration(inactive_producer_timeout)}")
        if tombstone_lifetime is not None:
            flags.append(f"--tombstone-lifetime={go_duration(tombstone_lifetime)}")
        self.process = NSQLookupdProcess(binary(bin_dir, "nsqlookupd"), *flags)

    async def stop(self) -> None:
        import asyncio

        await asyncio.to_thread(self.process.stop)


@dataclass
class _Node:
    """A server of the HA cluster, restartable: its name, command line and health URL."""

    name: str
    argv: list[str]
    health_url: str
    process: _Process | None = None


@dataclass
class RealHACluster:
    """etcd + youzan nsqlookupd + ``nsqds`` youzan nsqd in cluster mode, on loopback.

    The flags (etcd's v2 API, which etcd 3.4 turns off by default;
    ``--broadcast-interface=lo``, as the default interface is eth0; lookupd ``--allow-write-with-nochannels=true``, nsqd
    ``--lookup-ping-interval=5s``). ``standalone`` adds one youzan nsqd without the
    coordinator (no ``--rpc-port``, no etcd): what a single-node HA test talks to.
    Ports are the kernel's choice, or ``base_port`` and the ones after it (29 for
    three nodes). :meth:`kill_nsqd` and :meth:`start_nsqd` crash and restart a node.

    >>> with RealHACluster(Path("~/nsq-real/ha/bin").expanduser()) as ha:  # doctest: +SKIP
    ...     run_tests(env=ha.environment())
    """

    bin_dir: Path
    nsqds: int = 3
    data_dir: Path | None = None
    base_port: int = 0
    etcd_binary: Path | None = None
    cluster_id: str = "fastnsq-ha"
    nsqd_args: Sequence[str] = ()
    standalone: bool = True
    version: str = ""
    etcd_address: str = ""
    lookupd_tcp_address: str = ""
    lookupd_http_address: str = ""
    tcp_addresses: list[str] = field(default_factory=list)
    http_addresses: list[str] = field(default_factory=list)
    standalone_tcp_address: str = ""
    standalone_http_address: str = ""
    _nodes: dict[str, _Node] = field(default_factory=dict)
    _next_port: int = 0
    _own_data_dir: bool = False

    #: How long a youzan server may take to answer /ping (nsqd opens its disk queues first).
    START_TIMEOUT: ClassVar[float] = 60.0

    def start(self) -> None:
        nsqd = binary(self.bin_dir, "nsqd")
        lookupd = binary(self.bin_dir, "nsqlookupd")
        etcd = self.etcd_binary or shutil.which("etcd")
        if etcd is None:
            raise RealServerError("no etcd on PATH (apt-get install etcd-server, or give etcd_binary)")
        self.version = subprocess.run(
            [nsqd, "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        if "HA" not in self.version:
            raise RealServerError(f"{nsqd} is not youzan's HA nsqd: it says {self.version!r}")
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="fastnsq-real-ha-"))
            self._own_data_dir = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._next_port = self.base_port
        try:
            self._start_etcd(Path(etcd))
            self._start_lookupd(lookupd)
            for index in range(self.nsqds):
                self._add_nsqd(nsqd, index, cluster=True)
            if self.standalone:
                self._add_nsqd(nsqd, self.nsqds, cluster=False)
            for name in self._nodes:
                if name.startswith("nsqd"):
                    self._launch(name)
            self._wait_cluster_ready()
        except BaseException:
            self.stop()
            raise

    # -- ports, processes ----------------------------------------------------------------

    def _port(self) -> int:
        if not self.base_port:
            return free_port()
        port = self._next_port
        self._next_port += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As Go's listeners do: a port that only has connections in TIME_WAIT is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((_HOST, port))
            except OSError:
                raise RealServerError(f"port {_HOST}:{port} (from base port {self.base_port}) is in use") from None
        return port

    def _launch(self, name: str) -> None:
        """Start (or restart) a node and wait for its health URL."""
        assert self.data_dir is not None
        node = self._nodes[name]
        log = self.data_dir / f"{name}.log"
        with open(log, "ab") as out:
            # Its own process group: a Ctrl-C of the test run reaches the runner, which stops it in order.
            popen = subprocess.Popen(node.argv, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        node.process = _Process(name, popen, log)
        deadline = time.monotonic() + self.START_TIMEOUT
        while time.monotonic() < deadline:
            node.process.check_alive()
            with contextlib.suppress(OSError):
                _get(node.health_url)
                return
            time.sleep(0.1)
        raise RealServerError(f"{name} did not answer {node.health_url} in {self.START_TIMEOUT} s (log: {log})")

    def _start_etcd(self, etcd: Path) -> None:
        assert self.data_dir is not None
        client, peer, metrics = self._port(), self._port(), self._port()
        self.etcd_address = f"http://{_HOST}:{client}"
        argv = [str(etcd), "--name", "fastnsq-etcd", "--data-dir", str(self.data_dir / "etcd"),
                "--listen-client-urls", self.etcd_address, "--advertise-client-urls", self.etcd_address,
                "--listen-peer-urls", f"http://{_HOST}:{peer}",
                "--initial-advertise-peer-urls", f"http://{_HOST}:{peer}",
                "--initial-cluster", f"fastnsq-etcd=http://{_HOST}:{peer}", "--initial-cluster-state", "new",
                "--listen-metrics-urls", f"http://{_HOST}:{metrics}",
                # youzan/nsq speaks etcd's v2 API, which etcd 3.4 turns off by default.
                "--enable-v2=true"]
        self._nodes["etcd"] = _Node("etcd", argv, f"{self.etcd_address}/health")
        self._launch("etcd")

    def _cluster_flags(self) -> list[str]:
        # --broadcast-interface=lo: the default eth0 would win over --broadcast-address.
        return [f"--cluster-id={self.cluster_id}", f"--cluster-leadership-addresses={self.etcd_address}",
                "--broadcast-interface=lo", f"--broadcast-address={_HOST}"]

    def _start_lookupd(self, lookupd: Path) -> None:
        assert self.data_dir is not None
        tcp, http, metrics, rpc = self._port(), self._port(), self._port(), self._port()
        self.lookupd_tcp_address, self.lookupd_http_address = f"{_HOST}:{tcp}", f"{_HOST}:{http}"
        logs = self.data_dir / "nsqlookupd"
        logs.mkdir(parents=True, exist_ok=True)
        argv = [str(lookupd), *self._cluster_flags(),
                f"--tcp-address={self.lookupd_tcp_address}", f"--http-address={self.lookupd_http_address}",
                f"--metric-address={_HOST}:{metrics}", f"--rpc-port={rpc}",
                "--inactive-producer-timeout=100s", "--nsqd-ping-timeout=15s", "--tombstone-lifetime=45s",
                "--allow-write-with-nochannels=true", "--log-level=2", f"--log-dir={logs}"]
        self._nodes["nsqlookupd"] = _Node("nsqlookupd", argv, f"http://{self.lookupd_http_address}/ping")
        self._launch("nsqlookupd")

    def _add_nsqd(self, nsqd: Path, index: int, *, cluster: bool) -> None:
        assert self.data_dir is not None
        tcp, http, https, metrics = self._port(), self._port(), self._port(), self._port()
        name = f"nsqd{index}" if cluster else "nsqd-standalone"
        folder = self.data_dir / name
        (folder / "data").mkdir(parents=True, exist_ok=True)
        argv = [str(nsqd), f"--tcp-address={_HOST}:{tcp}", f"--http-address={_HOST}:{http}",
                f"--https-address={_HOST}:{https}", f"--metric-address={_HOST}:{metrics}",
                f"--worker-id={index + 1}", f"--data-path={folder / 'data'}",
                "--log-level=2", f"--log-dir={folder}", *self.nsqd_args]
        if cluster:
            # --rpc-port is what turns the coordinator (and etcd) on.
            argv += [*self._cluster_flags(), f"--rpc-port={self._port()}", "--lookup-ping-interval=5s"]
            self.tcp_addresses.append(f"{_HOST}:{tcp}")
            self.http_addresses.append(f"{_HOST}:{http}")
        else:
            argv += ["--broadcast-interface=lo", f"--broadcast-address={_HOST}"]
            self.standalone_tcp_address, self.standalone_http_address = f"{_HOST}:{tcp}", f"{_HOST}:{http}"
        self._nodes[name] = _Node(name, argv, f"http://{_HOST}:{http}/ping")

    def _wait_cluster_ready(self) -> None:
        """Until the lookupd leads (etcd elected it) and lists every cluster nsqd."""
        import json

        wanted = {int(a.rpartition(":")[2]) for a in self.tcp_addresses}
        accept = {"Accept": "application/vnd.nsq; version=1.0"}
        deadline = time.monotonic() + self.START_TIMEOUT
        seen: set[int] = set()
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                leader = json.loads(_get(f"http://{self.lookupd_http_address}/listlookup", accept) or b"{}")
                nodes = json.loads(_get(f"http://{self.lookupd_http_address}/nodes", accept))["producers"]
                seen = {node["tcp_port"] for node in nodes or ()}
                if leader.get("lookupdleader") and wanted <= seen:
                    return
            time.sleep(0.2)
        raise RealServerError(f"the HA lookupd {self.lookupd_http_address} lists nsqd ports {sorted(seen)}, "
                              f"not all of {sorted(wanted)}, after {self.START_TIMEOUT} s")

    # -- crash and restart ------------------------------------------------------------------

    def nsqd_pid(self, index: int) -> int | None:
        node = self._nodes[f"nsqd{index}"]
        return node.process.popen.pid if node.process and node.process.popen.poll() is None else None

    def kill_nsqd(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Crash cluster node ``index`` (SIGKILL by default: no goodbye to etcd or lookupd)."""
        process = self._nodes[f"nsqd{index}"].process
        if process is not None and process.popen.poll() is None:
            process.popen.send_signal(sig)
            process.popen.wait(30)

    def start_nsqd(self, index: int) -> None:
        """Start cluster node ``index`` again, on its old ports and data (it rejoins as it can)."""
        if self.nsqd_pid(index) is not None:
            raise RealServerError(f"nsqd{index} is running")
        self._launch(f"nsqd{index}")

    def stop(self) -> None:
        """nsqds first, then the lookupd, then etcd (each may still need the next); SIGKILL after 20 s."""
        for group in ("nsqd", "nsqlookupd", "etcd"):
            running = [n.process for name, n in self._nodes.items()
                       if n.process is not None and name.startswith(group) and n.process.popen.poll() is None]
            for process in running:
                process.popen.send_signal(signal.SIGTERM)
            for process in running:
                try:
                    process.popen.wait(20)
                except subprocess.TimeoutExpired:
                    process.popen.kill()
                    process.popen.wait()
        for node in self._nodes.values():
            node.process = None
        if self._own_data_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RealHACluster:  # noqa: PYI034 - a dataclass, not subclassed
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """The ``FASTNSQ_TEST_*`` variables naming these servers, and the binaries' folder."""
        env = {
            "FASTNSQ_TEST_LOOKUPD_HTTP": self.lookupd_http_address,
            "FASTNSQ_TEST_LOOKUPD_TCP": self.lookupd_tcp_address,
            "FASTNSQ_TEST_CLUSTER_NSQD": ",".join(self.tcp_addresses),
            "FASTNSQ_TEST_CLUSTER_NSQD_HTTP": ",".join(self.http_addresses),
            ENV_REAL_HA_BIN: str(self.bin_dir),
        }
        if self.standalone:
            env["FASTNSQ_TEST_NSQD"] = self.standalone_tcp_address
            env["FASTNSQ_TEST_NSQD_HTTP"] = self.standalone_http_address
        if self.base_port:
            env[ENV_REAL_HA_NEXT_PORT] = str(self._next_port)
        return env

    def describe(self) -> str:
        flags = " ".join(self.nsqd_args) or "the flags of run-youzan-cluster.sh"
        single = f" + 1 standalone {self.standalone_tcp_address}" if self.standalone else ""
        return (f"real youzan {self.version} ({self.bin_dir}) x{len(self.tcp_addresses)} in cluster mode"
                f"{single}, {flags}; nsqlookupd {self.lookupd_http_address}; etcd {self.etcd_address}")


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
    parser.add_argument("--ha", action="store_true",
                        help="BIN_DIR holds youzan's HA nsqd/nsqlookupd: start etcd + the HA cluster")
    parser.add_argument("--base-port", type=int, default=0,
                        help="--ha: use this port and the ones after it (default: ports the kernel picks)")
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
    if args.ha:
        return _run_ha(args, command)
    try:
        with running(args.bin_dir.expanduser(), nsqds=args.nsqds, data_dir=args.data_dir,
                     nsqd_args=args.nsqd_arg) as servers:
            print(f"fastnsq.testing.real: {servers.describe()}", flush=True)
            return subprocess.call(command, env={**os.environ, **servers.environment()})
    except RealServerError as exc:
        print(f"fastnsq.testing.real: {exc}", file=sys.stderr)
        return 2


def _run_ha(args: argparse.Namespace, command: list[str]) -> int:
    cluster = RealHACluster(args.bin_dir.expanduser().resolve(), nsqds=args.nsqds, data_dir=args.data_dir,
                            base_port=args.base_port, nsqd_args=args.nsqd_arg)

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    # The servers run in their own sessions (a Ctrl-C reaches only this process and the
    # command); a SIGTERM must unwind through the with-block too, or they outlive us.
    signal.signal(signal.SIGTERM, terminated)
    try:
        with cluster:
            print(f"fastnsq.testing.real: {cluster.describe()}", flush=True)
            child = subprocess.Popen(command, env={**os.environ, **cluster.environment()})
            try:
                return child.wait()
            finally:
                if child.poll() is None:
                    child.terminate()
                    child.wait()
    except RealServerError as exc:
        print(f"fastnsq.testing.real: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
