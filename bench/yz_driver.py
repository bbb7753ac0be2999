"""Build and run yz_driver: youzan/go-nsq's own Consumer and Producer, for interop tests and benchmarks.

The Go source is the project's (bench/go/src/yz_driver/main.go); youzan/go-nsq and its
dependencies come from a GOPATH holding youzan/go-nsq v1.7.2-HA's source
(``~/nsq-real/ha/gopath``, youzan/go-nsq v1.7.2-HA). The binary goes outside the checkout,
to ``~/nsq-real/ha/yz_driver`` (``YZ_DRIVER`` to choose another path), and is rebuilt when
the source is newer. Nothing of youzan's is copied into the project.

    python bench/yz_driver.py            # build, print the binary's path
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "go" / "src" / "yz_driver" / "main.go"
HA_HOME = Path(os.environ.get("FASTNSQ_YOUZAN_HOME", Path.home() / "nsq-real" / "ha"))
GOPATH = HA_HOME / "gopath"
BINARY = Path(os.environ.get("YZ_DRIVER", HA_HOME / "yz_driver"))


class DriverUnavailable(RuntimeError):
    """Go or youzan/go-nsq's sources are not on this machine (the reason says which)."""


def build() -> Path:
    """The driver binary, built first if it is missing or older than its source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    go = shutil.which("go")
    if go is None:
        raise DriverUnavailable("no go on PATH (apt-get install golang-go)")
    if not (GOPATH / "src" / "github.com" / "youzan" / "go-nsq").is_dir():
        raise DriverUnavailable(f"no youzan/go-nsq under {GOPATH} (put youzan/go-nsq v1.7.2-HA and its dependencies there)")
    env = dict(
        os.environ, GO111MODULE="off", GOFLAGS="", GOPROXY="off", GOENV="off",
        GOPATH=f"{GOPATH}:{HERE / 'go'}", GOCACHE=str(HA_HOME / "gocache"),
    )
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([go, "build", "-o", str(BINARY), "yz_driver"], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise DriverUnavailable(f"building yz_driver failed:\n{done.stderr}")
    return BINARY


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def publish(binary: Path, lookupd: str, topic: str, requests: Sequence[dict[str, Any]],
                  *flags: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """go-nsq's TopicProducerMgr publishes each request; its answers, in order."""
    lines = "".join(json.dumps(request) + "\n" for request in requests).encode()
    process = await asyncio.create_subprocess_exec(
        str(binary), "-mode=pub", f"-lookupd={lookupd}", f"-topic={topic}", *flags,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(lines), timeout)
    if process.returncode != 0:
        raise RuntimeError(f"yz_driver pub exited {process.returncode}: {err.decode()[-2000:]}")
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    if len(answers) != len(requests):
        raise RuntimeError(f"yz_driver answered {len(answers)} of {len(requests)} publishes: {err.decode()[-2000:]}")
    return answers


class Subscriber:
    """go-nsq's Consumer in a child process; :meth:`messages` when it has stopped."""

    def __init__(self, binary: Path, topic: str, *flags: str) -> None:
        self.argv = [str(binary), "-mode=sub", f"-topic={topic}", *flags]
        self.process: asyncio.subprocess.Process | None = None
        self._early: list[bytes] = []

    async def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it has connected (its first line)."""
        self.process = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        assert self.process.stdout is not None
        while True:  # messages may come before the line that says it connected: keep them
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
            if not line:
                err = await self.process.stderr.read() if self.process.stderr else b""
                raise RuntimeError(f"yz_driver sub did not start: {err.decode()[-2000:]}")
            if b'"ready"' in line:
                return
            self._early.append(line)

    async def messages(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Every message it consumed (body and ext decoded), once it stopped by itself."""
        assert self.process is not None
        out, err = await asyncio.wait_for(self.process.communicate(), timeout)
        if self.process.returncode != 0:
            raise RuntimeError(f"yz_driver sub exited {self.process.returncode}: {err.decode()[-2000:]}")
        found = []
        for line in [*self._early, *out.splitlines()]:
            record = json.loads(line)
            if "body" in record:
                record["body"] = base64.b64decode(record["body"])
                record["ext"] = base64.b64decode(record["ext"])
                found.append(record)
        return found

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


if __name__ == "__main__":
    try:
        print(build())
    except DriverUnavailable as exc:
        sys.exit(str(exc))
