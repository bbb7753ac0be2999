"""``python3 dev.py COMMAND --help`` answers at once and sets nothing up (issue 62).

It used to create .venv, pip install and build the extensions (about 3 minutes) before
``bench --help`` printed anything; killed halfway (``| head``) it left a half-built .venv.
Each help runs from a copy of dev.py and bench/ in a folder with no .venv, and must leave none.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dev.py and bench/'s top-level scripts, as a checkout without .venv has them."""
    home = tmp_path_factory.mktemp("devpy")
    shutil.copy2(ROOT / "dev.py", home / "dev.py")
    (home / "bench").mkdir()
    for script in (ROOT / "bench").glob("*.py"):
        shutil.copy2(script, home / "bench" / script.name)
    return home


@pytest.mark.parametrize("args", [
    ["bench", "--help"], ["bench", "--real", "/nowhere", "-h"], ["test", "--help"], ["test", "-h"],
    ["docs", "--help"], ["demo", "--help"], ["captures", "--help"], ["dist", "--help"],
    ["smoke-installed", "--help"], ["--help"],
])
def test_help_sets_nothing_up(clone: Path, args: list[str]) -> None:
    began = time.perf_counter()
    # The interpreter a user runs dev.py with: any python3, not .venv's (this test's may be one).
    done = subprocess.run([sys.executable, "-I", "dev.py", *args], cwd=clone, capture_output=True, text=True,
                          timeout=60, check=False)
    took = time.perf_counter() - began
    assert done.returncode == 0, done.stderr
    assert "usage" in done.stdout.lower() or "python3 dev.py" in done.stdout
    assert not any(clone.glob(".venv*")), "help created a virtualenv"
    assert not any(line.startswith("+ ") for line in done.stdout.splitlines())  # run()'s "+ command" lines
    # Under 2 s on an idle machine (0.25-0.7 s measured); the bound leaves room for a loaded one.
    assert took < 15, f"{args}: {took:.1f} s"


def test_bench_help_shows_run_alls_options(clone: Path) -> None:
    done = subprocess.run([sys.executable, "-I", "dev.py", "bench", "--help"], cwd=clone, capture_output=True,
                          text=True, timeout=60, check=False)
    assert "--real BIN" in done.stdout and "--write-readme" in done.stdout


def test_arguments_after_a_double_dash_are_not_dev_pys() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    assert dev.wants_help(["-k", "x", "--help"])
    assert not dev.wants_help(["--", "--help"])
    assert not dev.wants_help(["tests/test_codec.py", "-x"])
    assert set(dev.COMMAND_HELP) == set(dev.COMMANDS) | set(dev.STANDALONE_COMMANDS)


def test_busy_runs_cpu_bound_processes_beside_the_tests_and_ends_them() -> None:
    """``dev.py test --busy N``: N spinning processes for the run's length, killed after it."""
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    assert dev.busy_count(None) == 0 and dev.busy_count("2") == 2
    with pytest.raises(SystemExit, match="--busy two"):
        dev.busy_count("two")
    with dev.busy_loops(2):
        spinning = [p for p in _children() if "while True: pass" in p[1]]
        assert len(spinning) == 2, spinning
        states = {pid: _state(pid) for pid, _ in spinning}
    assert all(_state(pid) in (None, "Z") for pid in states), states  # gone (or reaped) after the run


def _children() -> list[tuple[int, str]]:
    """This process's children: (pid, command line), read from /proc."""
    me, found = str(Path("/proc/self").resolve().name), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[1] == me:
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append((int(stat.parent.name), command))
        except (OSError, IndexError):
            continue
    return found


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
