"""A PostgreSQL instance of our own for the tests and bench/sink_postgres.py: initdb into a temporary
folder, ``postgres`` on a free port (and its own socket folder), stopped by its pid.

As root (CI, the dev machine) the server runs as the ``postgres`` user, which PostgreSQL
requires. The binaries come from Debian's ``postgresql`` package (``/usr/lib/postgresql/<v>/bin``)
or the PATH; :func:`missing_reason` says why there is none, naming the package.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from fastnsq.testing.process import free_port

#: Debian's package that brings initdb and postgres (.ci/run installs it where it is missing).
PACKAGE = "postgresql"


def bin_dir() -> Path | None:
    """The folder with initdb and postgres: the PATH's, else Debian's newest."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent  # Debian links them from its versioned folder
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda path: int(Path(path).parent.parent.name) if Path(path).parent.parent.name.isdigit()
                      else 0)
    return Path(versions[-1]).parent if versions else None


def missing_reason() -> str | None:
    """None when a server can be started here, else why not (naming the Debian package)."""
    if bin_dir() is None:
        return f"no PostgreSQL server binaries (initdb, postgres): install Debian's {PACKAGE} package"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return f"running as root without a postgres user (Debian's {PACKAGE} package creates it)"
    return None


class PostgresServer:
    """``start()``, ``dsn``, ``stop()``; ``restart()`` keeps the data and the port."""

    def __init__(self, *, settings: dict[str, str] | None = None, base: str | None = None) -> None:
        binaries = bin_dir()
        assert binaries is not None, missing_reason()
        self.bin = binaries
        self.settings = dict(settings or {})
        self.folder = Path(tempfile.mkdtemp(prefix="fastnsq-pg-", dir=base))
        self.data, self.sockets = self.folder / "data", self.folder / "sockets"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.user: str | None = "postgres" if os.geteuid() == 0 else None
        self.log = self.folder / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self) -> dict[str, Any]:
        return {"user": self.user, "group": self.user} if self.user else {}

    def init(self) -> None:
        self.sockets.mkdir(parents=True)
        if self.user:
            os.chmod(self.folder, 0o755)
            shutil.chown(self.folder, self.user, self.user)
            shutil.chown(self.sockets, self.user, self.user)
        subprocess.run([self.bin / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
                        "--locale=C", "--no-sync"], check=True, capture_output=True, **self._as_server_user())

    def start(self, timeout: float = 60.0) -> None:
        if not self.data.exists():
            self.init()
        options = []
        for name, value in {"listen_addresses": "127.0.0.1", "unix_socket_directories": str(self.sockets),
                            "port": str(self.port), **self.settings}.items():
            options += ["-c", f"{name}={value}"]
        log = self.log.open("ab")
        self.process = subprocess.Popen([self.bin / "postgres", "-D", self.data, *options], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        **self._as_server_user())
        log.close()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()  # never left running by a start that failed (the fixture would not stop it)
            raise

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while subprocess.run([self.bin / "pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                             check=False).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self, *, fast: bool = True, timeout: float = 60.0) -> None:
        """SIGINT (fast shutdown: sessions ended, what is committed kept), or SIGTERM (smart)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT if fast else signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGQUIT)
            self.process.wait(timeout)

    def restart(self) -> None:
        self.stop()
        self.start()

    def psql(self, sql: str) -> str:
        """One statement's unaligned result (rows as lines, fields |-separated)."""
        done = subprocess.run([self.bin / "psql", "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
                               "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", sql],
                              check=True, capture_output=True, text=True)
        return done.stdout.strip()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
