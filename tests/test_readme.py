"""Every Python example in README.md runs, as written (a fresh interpreter each).

Blocks fenced as ```python run as scripts; a block whose first line names a test file
(``# test_...py``) is a pytest module and runs under pytest with the project's plugin.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    code = BLOCKS[index]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    first = code.splitlines()[0]
    match = re.match(r"#\s*(test_\w+\.py)", first)
    if match:
        path = tmp_path / match.group(1)
        path.write_text(code)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "fastnsq.testing.pytest_plugin",
               "-o", "asyncio_mode=auto", "-p", "no:cacheprovider", str(path)]
    else:
        path = tmp_path / f"example_{index}.py"
        path.write_text(code)
        cmd = [sys.executable, str(path)]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"README example {index} failed:\n{code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
