"""The API as type checkers and editors see it: mypy --strict, and pyright where it can be had.

* ``tests/typing/accepted_*.py`` and every Python example of the README and the docs pages
  (tests/doc_examples.py finds them) must type-check with no finding.
* ``tests/typing/rejected_*.py``: every line with a ``rejected:`` comment must be reported (a wrong
  option type, an unknown option, a wrong handler signature...), and no other line.

Each checker runs once over all the files (a module-scoped fixture). pyright comes from PyPI's
``pyright`` package (the ``test`` extra), which fetches the checker from the npm registry on its
first run and needs node; where it cannot, its tests skip, saying why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from . import doc_examples

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "tests" / "typing"
_MARK = re.compile(r"#\s*rejected:")

pytestmark = pytest.mark.skipif(
    __import__("os").environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0"),
    reason="checked once, in the pass with the C codec",
)


def example_files(folder: Path) -> dict[Path, str]:
    """Every Python example of the README and the docs, written to ``folder``: file -> its example's id."""
    found = {}
    for page in [ROOT / "README.md", *doc_examples.doc_pages()]:
        for example in doc_examples.examples(page):
            if example.kind != "python":
                continue
            name = re.sub(r"\W", "_", example.id) + ".py"
            path = folder / name
            path.write_text(example.code)
            found[path] = example.id
    return found


def findings(output: str, pattern: re.Pattern[str]) -> dict[str, set[int]]:
    """The lines each file has a finding on, from a checker's output."""
    lines: dict[str, set[int]] = defaultdict(set)
    for match in pattern.finditer(output):
        lines[Path(match.group("path")).name].add(int(match.group("line")))
    return lines


def rejected_lines(path: Path) -> set[int]:
    return {number for number, line in enumerate(path.read_text().splitlines(), 1) if _MARK.search(line)}


class Checked:
    """One checker's run over the accepted files, the examples and the rejected files."""

    def __init__(self, name: str, output: str, pattern: re.Pattern[str], examples: dict[Path, str]) -> None:
        self.name = name
        self.output = output
        self.lines = findings(output, pattern)
        self.examples = examples

    def about(self, file_name: str) -> str:
        return "\n".join(line for line in self.output.splitlines() if file_name in line)


def _files(tmp: Path) -> tuple[list[Path], dict[Path, str]]:
    examples = example_files(tmp)
    return [*sorted(TYPING.glob("*.py")), *examples], examples


_MYPY_LINE = re.compile(r"^(?P<path>[^\s:]+\.py):(?P<line>\d+): error:", re.MULTILINE)
_PYRIGHT_LINE = re.compile(r"^\s*(?P<path>/\S+\.py):(?P<line>\d+):\d+ - error:", re.MULTILINE)


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    tmp = tmp_path_factory.mktemp("mypy")
    files, examples = _files(tmp)
    done = subprocess.run(
        # fastnsq's own findings are its own suite's (tests/test_sourcecode.py), as for a user's installed copy
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         "--cache-dir", str(tmp / ".cache"), "--show-absolute-path", *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert "error: " in done.stdout or done.returncode == 0, done.stdout + done.stderr  # it ran, and said so
    return Checked("mypy", done.stdout, _MYPY_LINE, examples)


def _pyright_command() -> list[str]:
    """pyright's command, or a skip saying why it cannot run here."""
    if shutil.which("node") is None and shutil.which("nodejs") is None:
        pytest.skip("pyright needs node, which is not on PATH")
    command = [sys.executable, "-m", "pyright"]
    try:
        probe = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("pyright could not be fetched within 300 s (npm registry)")
    if probe.returncode != 0 or "pyright" not in probe.stdout:
        if "No module named pyright" in probe.stderr:
            pytest.skip("the pyright package is not installed (pip install 'fastnsq-client[test]')")
        pytest.skip(f"pyright cannot run here: {(probe.stdout + probe.stderr).strip()[-500:]}")
    return command


@pytest.fixture(scope="module")
def pyright(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    command = _pyright_command()
    tmp = tmp_path_factory.mktemp("pyright")
    files, examples = _files(tmp)
    config = tmp / "pyrightconfig.json"
    # strict, but for the "unknown" reports that third-party libraries without types set off
    config.write_text(json.dumps({
        "typeCheckingMode": "strict", "pythonVersion": f"3.{sys.version_info.minor}", "extraPaths": [str(ROOT)],
        **{rule: False for rule in ("reportMissingTypeStubs", "reportUnknownMemberType", "reportUnknownVariableType",
                                    "reportUnknownArgumentType", "reportUnknownParameterType", "reportPrivateUsage")},
    }))
    done = subprocess.run([*command, "--project", str(config), "--pythonpath", sys.executable, *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert "error" in done.stdout or done.returncode == 0, done.stdout + done.stderr
    return Checked("pyright", done.stdout, _PYRIGHT_LINE, examples)


def _accepted(checked: Checked) -> None:
    problems = [checked.about(path.name) for path in TYPING.glob("accepted_*.py") if checked.lines.get(path.name)]
    problems += [f"{example_id}:\n{checked.about(path.name)}" for path, example_id in checked.examples.items()
                 if checked.lines.get(path.name)]
    assert not problems, f"{checked.name} rejects code it must accept:\n" + "\n".join(problems)


def _rejected(checked: Checked) -> None:
    files = sorted(TYPING.glob("rejected_*.py"))
    assert files
    for path in files:
        marked = rejected_lines(path)
        assert len(marked) >= 10, path
        found = checked.lines.get(path.name, set())
        assert found == marked, (
            f"{checked.name} on {path.name}: lines marked but accepted {sorted(marked - found)}, "
            f"lines rejected but not marked {sorted(found - marked)}\n{checked.about(path.name)}"
        )


def test_mypy_strict_accepts_the_api_and_every_example(mypy: Checked) -> None:
    assert len(mypy.examples) >= 20  # the README's and the docs' examples were found
    _accepted(mypy)


def test_mypy_strict_rejects_each_marked_line(mypy: Checked) -> None:
    _rejected(mypy)


def test_pyright_accepts_the_api_and_every_example(pyright: Checked) -> None:
    _accepted(pyright)


def test_pyright_rejects_each_marked_line(pyright: Checked) -> None:
    _rejected(pyright)


def test_marks_are_read() -> None:
    """The rejected files' marks are found, and a line without one is not taken for marked."""
    sample = TYPING / "rejected_clients.py"
    lines = sample.read_text().splitlines()
    marked = rejected_lines(sample)
    assert all("# rejected:" in lines[number - 1] for number in marked)
    assert 1 not in marked
