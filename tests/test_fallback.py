"""Without its C extensions fastnsq still installs and runs, and says why, once, with what it costs.

The build side runs setup.py's ``build_ext`` into a scratch folder with the compiler made
unusable (no virtualenv, nothing compiled: seconds); the import side runs a fresh interpreter
whose import of the extensions fails. The whole chain, an sdist installed into fresh
virtualenvs with and without a compiler, is tests/test_install.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastnsq import _fallback

from .helpers import build_environment as environment

ROOT = Path(__file__).resolve().parents[1]
CODEC_RESULTS = ROOT / "bench" / "results" / "codec.json"
def build_ext(tmp_path: Path, *setup_prefix: str, **env: str) -> subprocess.CompletedProcess[str]:
    """setup.py build_ext into ``tmp_path`` (the checkout's in-place build untouched)."""
    command = [sys.executable, *(setup_prefix or ["setup.py"]), "--quiet", "build_ext", "--force",
               "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "temp")]
    return subprocess.run(command, cwd=ROOT, env=environment(**env), capture_output=True, text=True, timeout=300,
                          check=False)


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("WARNING: fastnsq:")]


def test_the_speed_figures_are_the_benchmarks() -> None:
    """The ratio the warning quotes is bench/results/codec.json's, C against the twin, rounded."""
    medians = {bench["name"]: bench["stats"]["median"] for bench in json.loads(CODEC_RESULTS.read_text())["benchmarks"]}
    ratios = {name[: -len("[c]")]: medians[name.replace("[c]", "[python]")] / median
              for name, median in medians.items() if name.endswith("[c]")}
    assert round(ratios["test_decode_messages"]) == _fallback.DECODE_SPEEDUP
    assert (round(min(ratios.values())), round(max(ratios.values()))) == _fallback.SPEEDUP_RANGE


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_install_pages_quote_the_same_figures(page: str) -> None:
    low, high = _fallback.SPEEDUP_RANGE
    text = " ".join((ROOT / page).read_text().split())
    assert f"decodes messages {_fallback.DECODE_SPEEDUP}x as fast ({low}x to {high}x" in text


def test_the_message_names_the_cause_the_switches_and_the_cost() -> None:
    text = _fallback.explain("no C compiler: 'cc' is not on PATH")
    assert "(no C compiler: 'cc' is not on PATH)" in text
    assert "FASTNSQ_NO_EXTENSIONS=1" in text and "FASTNSQ_REQUIRE_EXTENSIONS=1" in text
    assert f"decodes messages {_fallback.DECODE_SPEEDUP}x as fast" in text


def test_a_failing_compiler_leaves_no_extension_and_one_warning(tmp_path: Path) -> None:
    done = build_ext(tmp_path, CC="/bin/false")
    assert done.returncode == 0, done.stderr
    (warning,) = warnings_in(done.stderr)
    assert "the C compiler '/bin/false' failed on fastnsq._frame (exit status 1)" in warning
    assert not list((tmp_path / "lib").rglob("*.so"))
    note = tmp_path / "lib" / "fastnsq" / _fallback.NOTE_FILE
    assert note.read_text().startswith("the C compiler '/bin/false' failed")


def test_a_missing_compiler_is_named(tmp_path: Path) -> None:
    done = build_ext(tmp_path, CC="fastnsq-no-such-cc")
    (warning,) = warnings_in(done.stderr)
    assert "no C compiler: 'fastnsq-no-such-cc' is not on PATH" in warning


def test_missing_python_headers_are_named(tmp_path: Path) -> None:
    """As on a machine without python3-dev: the include folder has no Python.h (and so the compile fails)."""
    no_headers = (
        "import runpy, sys, sysconfig; paths = sysconfig.get_paths; "
        f"sysconfig.get_paths = lambda *a, **k: {{**paths(*a, **k), 'include': {str(tmp_path)!r}}}; "
        "sys.argv[0] = 'setup.py'; runpy.run_path('setup.py', run_name='__main__')"
    )
    done = build_ext(tmp_path, "-c", no_headers, CC="/bin/false")
    (warning,) = warnings_in(done.stderr)
    assert f"the Python headers are missing: no Python.h in {tmp_path}" in warning


def test_require_extensions_makes_a_failed_build_an_error(tmp_path: Path) -> None:
    done = build_ext(tmp_path, CC="/bin/false", FASTNSQ_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0
    assert "FASTNSQ_REQUIRE_EXTENSIONS=1 requires them" in done.stderr
    assert "the C compiler '/bin/false' failed" in done.stderr
    assert not warnings_in(done.stderr)


def test_both_switches_at_once_are_refused(tmp_path: Path) -> None:
    done = build_ext(tmp_path, FASTNSQ_NO_EXTENSIONS="1", FASTNSQ_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0
    assert "FASTNSQ_NO_EXTENSIONS=1 chooses the pure-Python codec and FASTNSQ_REQUIRE_EXTENSIONS=1" in done.stderr


#: A fresh interpreter in which the C extensions cannot be imported (as after a build that fell back).
WITHOUT_EXTENSIONS = (
    "import sys\n"
    "for name in ('_frame', '_coalesce', '_delivery', '_blocking'):\n"
    "    sys.modules['fastnsq.' + name] = None\n"
)


def run_without_extensions(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_EXTENSIONS + code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=environment(**env), check=False)


def test_without_the_extensions_the_import_falls_back_and_warns_once() -> None:
    done = run_without_extensions("import fastnsq, fastnsq.codec as c, fastnsq.sync; print(c.IMPLEMENTATION, c.WHY_PYTHON)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("python not built: ")
    assert done.stderr.count("RuntimeWarning: fastnsq: the C extensions are not available") == 1
    assert "FASTNSQ_NO_EXTENSIONS=1" in done.stderr


def test_require_extensions_makes_the_fallback_an_import_error() -> None:
    done = run_without_extensions("import fastnsq", FASTNSQ_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0
    assert "ImportError: fastnsq: the C extensions are not available" in done.stderr
    assert "FASTNSQ_REQUIRE_EXTENSIONS=1 requires them" in done.stderr


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_choosing_the_twins_is_silent(value: str) -> None:
    done = run_without_extensions("import fastnsq.codec as c; print(c.IMPLEMENTATION, c.WHY_PYTHON)",
                                  FASTNSQ_NO_EXTENSIONS=value)
    assert done.stdout.strip() == "python chosen by FASTNSQ_NO_EXTENSIONS=1"
    assert "Warning" not in done.stderr


def test_both_switches_at_import_are_refused() -> None:
    done = run_without_extensions("import fastnsq", FASTNSQ_NO_EXTENSIONS="1", FASTNSQ_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0
    assert "set one of them" in done.stderr
