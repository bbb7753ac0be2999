"""The habits that keep the code as docs/architecture.md describes it: ruff and mypy, clean.

As asyncpg's tests/test__sourcecode.py runs flake8 and mypy: a finding fails the suite. The
versions are pinned in the ``test`` extra, so a new release's new rules do not fail a build
that did not change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    os.environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0"),
    reason="checked once, in the pass with the C codec",
)


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)


def test_ruff_finds_nothing() -> None:
    done = run("ruff", "check", "--no-cache", "fastnsq", "tests", "bench", "dev.py", "setup.py", "docs/conf.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing() -> None:
    done = run("mypy", "--no-incremental", "fastnsq")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
