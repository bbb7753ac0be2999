"""Start-up cost: ``import fastnsq`` and the ``fastnsq`` command load no HTTP machinery.

aiohttp alone takes about a quarter of a second to import (its connector builds an
SSL context), which every ``fastnsq pub`` in a shell loop and every Spark worker
would pay. These tests check, in a fresh interpreter, which modules get loaded:
the time itself is measured by the benchmark notes (``python -X importtime``), not
asserted here, because a shared machine makes wall times flaky.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

#: Loaded only when a lookupd, the HTTP API or snappy/deflate is used.
LAZY = ("aiohttp", "yarl", "fastnsq.lookupd", "fastnsq.testing", "fastnsq.compression", "cramjam")


def loaded_after(code: str) -> set[str]:
    """The modules of LAZY that are in sys.modules after running ``code`` in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {LAZY!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_import_fastnsq_loads_no_http_or_lookupd_machinery() -> None:
    assert loaded_after("import fastnsq") == set()


def test_consumer_and_producer_for_direct_nsqd_load_no_lookupd() -> None:
    code = (
        "import fastnsq\n"
        "fastnsq.Consumer('t', 'c', nsqd_tcp_addresses=['127.0.0.1:4150'], handler=print)\n"
        "fastnsq.Producer(['127.0.0.1:4150'])"
    )
    assert loaded_after(code) == set()


def test_the_command_line_parser_loads_no_http_machinery() -> None:
    # Building the parser (every command does) must not import the embedded servers or aiohttp.
    assert loaded_after("from fastnsq import cli\ncli.build_parser()") == set()


def test_lookupd_is_still_importable_and_brings_aiohttp_when_used() -> None:
    code = "from fastnsq.lookupd import LookupdClient\nLookupdClient()"
    assert {"aiohttp", "fastnsq.lookupd"} <= loaded_after(code)


@pytest.mark.parametrize("name", ["Endpoint"])
def test_lookupd_reexports_what_moved_to_config(name: str) -> None:
    from fastnsq import config, lookupd

    assert getattr(lookupd, name) is getattr(config, name)
