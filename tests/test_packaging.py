"""The package metadata says what is tested: every Python dev.py tests is a classifier, and no other."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_classifiers_name_exactly_the_tested_pythons() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    classified = {
        m.group(1) for c in _project()["classifiers"] if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))
    }
    assert classified == set(dev.SUPPORTED_PYTHONS)
    lowest = min(dev.SUPPORTED_PYTHONS, key=lambda v: tuple(map(int, v.split("."))))
    assert _project()["requires-python"] == f">={lowest}"
