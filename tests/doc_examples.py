"""Run the examples of a Markdown page as a reader would (README.md and every page of docs/).

One job: find a page's examples and run each in a fresh interpreter or shell, the same way
for the README (tests/test_readme.py) and the documentation site (tests/test_docs_examples.py).

* A ```python block runs as a script; a block whose first line names a test file
  (``# test_...py``) is a pytest module and runs under pytest with the project's plugin.
* A ```sh block that runs the ``fastnsq`` command runs under bash with ``set -e``; a line
  ending in ``&`` starts a server in the background, and the next line waits until
  nsqd's port answers. Other shell blocks (installing, dev.py, benchmarks against real
  binaries) are commands to copy, not examples, and are not run.
* An example that needs Java and pyspark (the Spark page) skips, saying so, where they
  are missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_PYTHON = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_SHELL = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.DOTALL | re.MULTILINE)

#: What a shell example's output must show, by a command it runs.
SHELL_EXPECTATIONS = {
    "fastnsq --version": lambda out: out.startswith("fastnsq ") and "\ncodec: " in out and "\nevent loop: " in out,
    "tail events -n 3 --format json": lambda out: out.count('"body"') == 3,
    "fastnsq stats": lambda out: "events" in out,
    "fastnsq bench": lambda out: "WORKLOAD" in out,
    "fastnsq to-file -topic=events": lambda out: "\none\nthree\ntwo\n" in out,
    "fastnsq to-file -topic=orders": lambda out: "country=DE\ncountry=FR\n" in out and "2 orders from FR" in out,
    "fastnsq to-nsq -topic=events": lambda out: {"one", "two", "three"} <= set(out.split()),
    "fastnsq to-http -topic=events": lambda out: "body=one\nbody=three\nbody=two\n" in out,
    "fastnsq worker tasks:handle": lambda out: sorted(line for line in out.splitlines() if line.startswith("handled"))
    == ["handled one", "handled three", "handled two"],
}
#: What a Python example's output must show, by a text in its code.
PYTHON_EXPECTATIONS = {
    "messages in parquet": lambda out: "1000 messages in parquet" in out,  # the stream read every message
    "distinct (partition, offset)": lambda out: "1000 distinct (partition, offset) in parquet" in out,
}


@dataclass(frozen=True)
class Example:
    page: Path
    index: int  # the n-th example of its kind on the page
    kind: str  # "python" or "sh"
    code: str

    @property
    def id(self) -> str:
        name = self.page.relative_to(ROOT).as_posix()
        return f"{name}:{self.kind}{self.index}"


def examples(page: Path) -> list[Example]:
    """The runnable examples of one Markdown page, in order."""
    text = page.read_text()
    found = [Example(page, i, "python", code) for i, code in enumerate(_PYTHON.findall(text))]
    shell = [code for code in _SHELL.findall(text) if re.search(r"(^|[|;&]\s*)fastnsq ", code, re.MULTILINE)]
    found += [Example(page, i, "sh", code) for i, code in enumerate(shell)]
    return found


def params(found: list[Example]) -> list[Any]:
    """``found`` as pytest parameters: a Spark example is marked ``spark`` (it runs in the serial
    part of the suite, on the C codec only); a shell example runs the ``fastnsq`` command on
    nsqd's default ports, so all of them share one xdist worker (``--dist loadgroup``)."""
    marked = []
    for example in found:
        marks = []
        if "pyspark" in example.code:
            marks.append(pytest.mark.spark)
        if example.kind == "sh":
            # nsqd's default ports, and background processes: alone, in the serial pass (in the
            # parallel passes an example on 4150 once met another test's processes: a fresh-clone
            # run saw to-file write each line twice and to-http get none)
            marks += [pytest.mark.xdist_group("default-ports"), pytest.mark.slow]
        marked.append(pytest.param(example, marks=marks, id=example.id))
    return marked


def doc_pages() -> list[Path]:
    """Every Markdown page of the documentation site (not the build output)."""
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def run(example: Example, tmp_path: Path) -> None:
    """Run one example; fail with its code and output, or skip with the reason."""
    if example.kind == "python":
        _run_python(example, tmp_path)
    else:
        _run_shell(example, tmp_path)


#: Below pytest-timeout's 300 s, so that a hung example shows where it hung instead of being cut.
EXAMPLE_TIMEOUT = 240


def _run_or_dump(cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run an example; if it hangs, SIGABRT it so faulthandler prints every thread's stack."""
    env = {**_env(), "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            out, err = process.communicate(timeout=EXAMPLE_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            out, err = process.communicate(timeout=30)
            pytest.fail(f"hung for {EXAMPLE_TIMEOUT} s; its stacks:\n--- stdout\n{out}\n--- stderr\n{err}")
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


def _run_python(example: Example, tmp_path: Path) -> None:
    code = example.code
    if "pyspark" in code:
        if shutil.which("java") is None:
            pytest.skip("the Spark example needs Java (no `java` on PATH)")
        pytest.importorskip("pyspark", reason="the Spark example needs pyspark (pip install 'fastnsq-client[spark]')")
    match = re.match(r"#\s*(test_\w+\.py)", code.splitlines()[0])
    if match:
        path = tmp_path / match.group(1)
        path.write_text(code)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "fastnsq.testing.pytest_plugin",
               "-o", "asyncio_mode=auto", "-p", "no:cacheprovider", str(path)]
    else:
        path = tmp_path / f"example_{example.index}.py"
        path.write_text(code)
        cmd = [sys.executable, str(path)]
    result = _run_or_dump(cmd, tmp_path)
    assert result.returncode == 0, (
        f"{example.id} failed:\n{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    for marker, check in PYTHON_EXPECTATIONS.items():
        if marker in code:
            assert check(result.stdout), f"{example.id}: unexpected output\n{result.stdout}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _run_shell(example: Example, tmp_path: Path) -> None:
    if not all(_port_free(p) for p in (4150, 4151, 4160, 4161)):
        pytest.skip(f"{example.id} uses nsqd's default ports, which are taken here")
    wait_for_nsqd = tmp_path / "wait_for_nsqd.py"
    wait_for_nsqd.write_text(
        "import socket, time\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', 4150), 0.1).close()\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    wait = f'"{sys.executable}" "{wait_for_nsqd}"'
    # What the console script does once installed: a real executable (so `kill %1` stops it).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fastnsq").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fastnsq "$@"\n')
    (bin_dir / "fastnsq").chmod(0o755)
    # And `python3` is the Python fastnsq is installed in, as in the reader's environment.
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    # If anything fails, take the background server down with the script.
    lines = ["set -e", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT", f'export PATH="{bin_dir}:$PATH"']
    for line in example.code.splitlines():
        lines.append(line)
        if line.split("#")[0].rstrip().endswith("&"):
            lines.append(wait)
    script = tmp_path / "example.sh"
    script.write_text("\n".join(lines) + "\nwait\n")
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                            timeout=180, check=False)
    assert result.returncode == 0, f"{example.id}:\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    for command, check in SHELL_EXPECTATIONS.items():
        if command in example.code:
            assert check(result.stdout), f"{example.id}: unexpected output of `{command}`\n{result.stdout}"
