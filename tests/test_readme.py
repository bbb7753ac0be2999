"""Every example in README.md runs, as written (a fresh interpreter or shell each).

```python blocks run as scripts; a block whose first line names a test file
(``# test_...py``) is a pytest module and runs under pytest with the project's plugin.
```sh blocks run under bash with ``set -e``; a line ending in ``&`` starts a server in
the background, and the next line waits until nsqd's port answers.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
SHELL_BLOCKS = [b for b in re.findall(r"```sh\n(.*?)```", README, re.DOTALL) if "fastnsq " in b]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_the_readme_has_examples():
    assert len(PYTHON_BLOCKS) >= 5 and SHELL_BLOCKS


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_example_runs(index, tmp_path):
    code = PYTHON_BLOCKS[index]
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
        path = tmp_path / f"example_{index}.py"
        path.write_text(code)
        cmd = [sys.executable, str(path)]
    result = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"README example {index} failed:\n{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    if "messages in parquet" in code:
        assert "1000 messages in parquet" in result.stdout  # the stream read every message


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("index", range(len(SHELL_BLOCKS)))
def test_readme_shell_example_runs(index, tmp_path):
    if not all(_port_free(p) for p in (4150, 4151, 4160, 4161)):
        pytest.skip("the README's shell example uses nsqd's default ports, which are taken here")
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
    # If anything fails, take the background server down with the script.
    lines = ["set -e", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT", f'export PATH="{bin_dir}:$PATH"']
    for line in SHELL_BLOCKS[index].splitlines():
        lines.append(line)
        if line.split("#")[0].rstrip().endswith("&"):
            lines.append(wait)
    script = tmp_path / "example.sh"
    script.write_text("\n".join(lines) + "\nwait\n")
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    out = result.stdout
    assert out.count('"body"') == 3  # tail -n 3 --format json
    assert "events" in out and "WORKLOAD" in out  # stats and bench tables
