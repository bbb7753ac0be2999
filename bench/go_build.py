"""Build the go-nsq sides of the benchmarks (bench/go/src/<program>) in GOPATH mode.

go-nsq v1.1.0 and golang.org/x/sys come from a GOPATH holding their sources
(``~/nsq-real/gopath`` beside the binaries' folder); this checkout's
``bench/go`` is added to GOPATH for the programs' own sources. Nothing is fetched. The
binaries go next to the real servers (never into the checkout):

    .venv/bin/python bench/go_build.py ~/nsq-real/bin                  # -> ~/nsq-real/bin/latency_bench
    .venv/bin/python bench/go_build.py ~/nsq-real/bin gonsq_recovery   # -> ~/nsq-real/bin/recovery_bench
    .venv/bin/python bench/go_build.py ~/nsq-real/bin gonsq_bench      # -> ~/nsq-real/bin/gonsq_bench
    .venv/bin/python bench/go_build.py --gopath ~/nsq-real/gopath /tmp/bin gonsq_bench   # another GOPATH

A binary is built again when it is missing or older than its main.go; ``--force`` builds it anyway.
bench/run_all.py --real and bench/sync_publish.py build ``gonsq_bench`` this way, bench/latency.py
``latency_bench`` and bench/recovery.py --go ``recovery_bench``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Each program's source folder under bench/go/src, and the binary's name in the bin folder.
PROGRAMS = {"gonsq_latency": "latency_bench", "gonsq_recovery": "recovery_bench", "gonsq_bench": "gonsq_bench",
            "gonsq_outage": "outage_bench"}


def build(bin_dir: Path, gopath: Path | None = None, program: str = "gonsq_latency", *, force: bool = False) -> Path:
    """Build (again when the source is newer) ``program`` into ``bin_dir``; returns the binary's path."""
    source = HERE / "go" / "src" / program / "main.go"
    target = bin_dir / PROGRAMS[program]
    if not force and target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    go = shutil.which("go")
    if go is None:
        raise SystemExit("no Go toolchain (go) on PATH: apt-get install golang-go")
    deps = gopath or bin_dir.parent / "gopath"
    if not (deps / "src" / "github.com" / "nsqio" / "go-nsq").is_dir():
        raise SystemExit(f"{deps}: no go-nsq source (put go-nsq v1.1.0 and its dependencies in that GOPATH first)")
    env = {**os.environ, "GO111MODULE": "off", "GOFLAGS": "", "GOPROXY": "off",
           "GOPATH": f"{deps}{os.pathsep}{HERE / 'go'}", "GOCACHE": str(deps.parent / "gocache")}
    bin_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "build", "-o", str(target), program], check=True, env=env, cwd=HERE)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bin_dir", type=Path, help="where the binary goes (the real servers' folder)")
    parser.add_argument("program", nargs="?", default="gonsq_latency", choices=sorted(PROGRAMS))
    parser.add_argument("--gopath", type=Path, default=None,
                        help="the GOPATH holding go-nsq v1.1.0 and golang.org/x/sys (default: BIN_DIR/../gopath)")
    parser.add_argument("--force", action="store_true", help="build even if the binary is newer than its source")
    args = parser.parse_args(argv)
    gopath = args.gopath.expanduser() if args.gopath else None
    print(build(args.bin_dir.expanduser(), gopath, args.program, force=args.force))


if __name__ == "__main__":
    main()
