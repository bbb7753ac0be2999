"""The package metadata says what is tested: every Python dev.py tests is a classifier, and no other;
the licence pyproject.toml names is in the sdist and the wheel, with the metadata PEP 639 asks for."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from .helpers import build_environment

ROOT = Path(__file__).resolve().parents[1]

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dev():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    return dev


def test_classifiers_name_exactly_the_tested_pythons() -> None:
    dev = _dev()
    classified = {
        m.group(1) for c in _project()["classifiers"] if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))
    }
    assert classified == set(dev.SUPPORTED_PYTHONS)
    lowest = min(dev.SUPPORTED_PYTHONS, key=lambda v: tuple(map(int, v.split("."))))
    assert _project()["requires-python"] == f">={lowest}"


@pytest.mark.timeout(600)
def test_the_sdist_and_the_wheel_carry_the_licence_with_its_pep_639_metadata(tmp_path: Path) -> None:
    """pyproject.toml said MIT and the repository had no LICENSE: no distribution carried one.
    The sdist (as tests/test_install.py builds it) and a wheel built from it (the twins only: the
    metadata is the same with the extensions, whose build `dev.py dist` checks the same way, on
    every wheel it builds): LICENSE, License-Expression: MIT, License-File: LICENSE."""
    dev = _dev()
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert _project()["license"] == dev.LICENSE_EXPRESSION and _project()["license-files"] == [dev.LICENSE_FILE]
    env = build_environment()
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True, env=env)
    (sdist,) = tmp_path.glob("fastnsq_client-*.tar.gz")
    assert dev.license_problems(*dev.sdist_licence(sdist), dev.LICENSE_FILE) == []
    safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.10.12+
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "src", **safe)
    (source,) = (tmp_path / "src").iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "--wheel-dir", str(tmp_path / "wheel"), str(source)], cwd=tmp_path, check=True,
                   capture_output=True, env={**env, "FASTNSQ_NO_EXTENSIONS": "1"})
    (wheel,) = (tmp_path / "wheel").glob("fastnsq_client-*.whl")
    assert dev.license_problems(*dev.wheel_licence(wheel), f"licenses/{dev.LICENSE_FILE}") == []
