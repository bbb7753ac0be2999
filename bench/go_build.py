"""Build the go-nsq sides of the benchmarks (bench/go/src/<program>) in GOPATH mode.

go-nsq v1.1.0 and golang.org/x/sys come from a GOPATH holding their sources
(``~/nsq-real/gopath`` beside the binaries' folder); this checkout's
``bench/go`` is added to GOPATH for the programs' own sources. Nothing is fetched. The
binaries go next to the real servers (never into the checkout):

    .venv/bin/python bench/go_build.py ~/nsq-real/bin                  # -> ~/nsq-real/bin/latency_bench
    .venv/bin/python bench/go_build.py ~/nsq-real/bin gonsq_recovery   # -> ~/nsq-real/bin/recovery_bench
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Each program's source folder under bench/go/src, and the binary's name in the bin folder.
PROGRAMS = {"gonsq_latency": "latency_bench", "gonsq_recovery": "recovery_bench"}


def build(bin_dir: Path, gopath: Path | None = None, program: str = "gonsq_latency") -> Path:
    """Build (again when the source is newer) ``program`` into ``bin_dir``; returns the binary's path."""
    source = HERE / "go" / "src" / program / "main.go"
    target = bin_dir / PROGRAMS[program]
    if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    go = shutil.which("go")
    if go is None:
        raise SystemExit("no Go toolchain (go) on PATH: apt-get install golang-go")
    deps = gopath or bin_dir.parent / "gopath"
    if not (deps / "src" / "github.com" / "nsqio" / "go-nsq").is_dir():
        raise SystemExit(f"{deps}: no go-nsq source (put go-nsq v1.1.0 and its dependencies in that GOPATH first)")
    env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": "", "GOPROXY": "off",
           "GOPATH": f"{deps}{os.pathsep}{HERE / 'go'}", "GOCACHE": str(bin_dir.parent / "gocache")}
    subprocess.run([go, "build", "-o", str(target), program], check=True, env=env, cwd=HERE)
    return target


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in PROGRAMS):
        raise SystemExit(__doc__)
    print(build(Path(sys.argv[1]).expanduser(), program=sys.argv[2] if len(sys.argv) == 3 else "gonsq_latency"))
