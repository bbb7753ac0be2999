#!/usr/bin/env python3
"""Set everything up, then run the demo or the tests. Needs only Python 3 and a C compiler.

    python3 dev.py demo     # venv + install + embedded nsqd + a real publish/consume run
    python3 dev.py test     # venv + install + the test suite, with both codec implementations
    python3 dev.py bench    # venv + install + the benchmark report in bench/
    python3 dev.py bench --real ~/nsq-real/bin   # the same against a real nsqd, with go-nsq's tools

Idempotent: the virtualenv lives in .venv and is only reinstalled when the build inputs
change (pyproject.toml, setup.py, the Cython sources).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".fastnsq-install-stamp"
BUILD_INPUTS = [
    "pyproject.toml", "setup.py", "fastnsq/_frame.pyx", "fastnsq/_frame.pxd", "fastnsq/_coalesce.pyx",
    "fastnsq/_delivery.pyx",
]
EXTRAS = "test,testing,bench,spark"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def build_hash() -> str:
    digest = hashlib.sha256(EXTRAS.encode())
    for name in BUILD_INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def run(*cmd: object, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True, env=env)


def setup() -> Path:
    """Create .venv and install fastnsq (editable, C extension built in place) once."""
    python = venv_python()
    if not python.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = build_hash()
    built = [p for name in ("_frame", "_coalesce", "_delivery") for p in (ROOT / "fastnsq").glob(f"{name}.*.so")]
    built_all = len(built) == 3
    if STAMP.exists() and STAMP.read_text() == stamp and built_all:
        return python
    run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", "setuptools", "wheel", "Cython>=3.0")
    run(python, "-m", "pip", "install", "--quiet", "-e", f".[{EXTRAS}]")
    # The editable install compiles the extension; make sure it sits next to the sources.
    run(python, "setup.py", "--quiet", "build_ext", "--inplace")
    STAMP.write_text(stamp)
    return python


def demo(python: Path, args: list[str]) -> None:
    run(python, "-m", "fastnsq.demo", *args)


def test(python: Path, args: list[str]) -> None:
    """The suite with the C codec, then the integration tests again on the Python twin."""
    run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args)
    env = dict(os.environ, FASTNSQ_NO_EXTENSIONS="1")
    run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not spark and not slow", *args, env=env)


def bench(python: Path, args: list[str]) -> None:
    run(python, "bench/run_all.py", *args)


COMMANDS = {"demo": demo, "test": test, "bench": bench}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__)
        return 2
    python = setup()
    try:
        COMMANDS[sys.argv[1]](python, sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
