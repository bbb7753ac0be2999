"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os

import pytest

# The server fixtures (nsqd, nsqlookupd, nsq_cluster, ...); also registered by the
# pytest11 entry point when fastnsq is installed, and loading both is harmless.
pytest_plugins = ["fastnsq.testing.pytest_plugin"]

from fastnsq import _frame_py

try:
    from fastnsq import _frame as _frame_c
except ImportError:  # pragma: no cover - only in a build without the extension
    _frame_c = None

NO_EXTENSIONS = os.environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0")


def _codec_params() -> list:
    params = [pytest.param(_frame_py, id="py")]
    if _frame_c is not None:
        params.insert(0, pytest.param(_frame_c, id="c"))
    elif not NO_EXTENSIONS:
        params.insert(0, pytest.param(None, id="c", marks=pytest.mark.skip("C codec not built")))
    return params


@pytest.fixture(params=_codec_params())
def codec(request: pytest.FixtureRequest):
    """Each codec implementation in turn: the C extension and the pure-Python twin."""
    return request.param


@pytest.fixture(autouse=True)
def _reap_app_processes():
    """App processes (tests/apps_support.py) a test left running when it failed are killed."""
    yield
    from .apps_support import kill_leftovers

    kill_leftovers()
