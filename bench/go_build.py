"""Build bench/go/src/gonsq_latency (go-nsq's side of bench/latency.py) in GOPATH mode.

go-nsq v1.1.0 and golang.org/x/sys come from a GOPATH holding their sources
(``~/nsq-real/gopath`` beside the binaries' folder); this checkout's
``bench/go`` is added to GOPATH for the program's own source. Nothing is fetched. The
binary goes next to the real servers (never into the checkout):

    .venv/bin/python bench/go_build.py ~/nsq-real/bin     # -> ~/nsq-real/bin/latency_bench
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "go" / "src" / "gonsq_latency" / "main.go"
BINARY_NAME = "latency_bench"


def build(bin_dir: Path, gopath: Path | None = None) -> Path:
    """Build (again when the source is newer) ``bin_dir/latency_bench``; returns its path."""
    target = bin_dir / BINARY_NAME
    if target.exists() and target.stat().st_mtime >= SOURCE.stat().st_mtime:
        return target
    go = shutil.which("go")
    if go is None:
        raise SystemExit("no Go toolchain (go) on PATH: apt-get install golang-go")
    deps = gopath or bin_dir.parent / "gopath"
    if not (deps / "src" / "github.com" / "nsqio" / "go-nsq").is_dir():
        raise SystemExit(f"{deps}: no go-nsq source (put go-nsq v1.1.0 and its dependencies in that GOPATH first)")
    env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": "", "GOPROXY": "off",
           "GOPATH": f"{deps}{os.pathsep}{HERE / 'go'}", "GOCACHE": str(bin_dir.parent / "gocache")}
    subprocess.run([go, "build", "-o", str(target), "gonsq_latency"], check=True, env=env, cwd=HERE)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(build(Path(sys.argv[1]).expanduser()))
