"""The public names of ``fastnsq`` and ``fastnsq.runner`` are imported on first use (fastnsq/_lazy.py).

What the commands' start-up relies on: ``import fastnsq`` does not import the client, and the
entry point's early child start does not import asyncio. What users rely on: every public name is
there, the same object as in its home module, and a misspelt one is an AttributeError naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fastnsq
import fastnsq.runner

#: The codec switches make ``import fastnsq`` import the codec at once (they are judged there, as
#: documented), and the twins import asyncio: the start-up path these tests pin is the default one.
_SWITCHES = ("FASTNSQ_NO_EXTENSIONS", "FASTNSQ_REQUIRE_EXTENSIONS")


def _fresh(code: str) -> str:
    """``code`` run in a new interpreter (the modules already imported here would hide an eager import),
    without the codec switches."""
    env = {name: value for name, value in os.environ.items() if name not in _SWITCHES}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env=env)
    return done.stdout.strip()


def test_import_fastnsq_does_not_import_the_client() -> None:
    code = ("import sys, fastnsq; heavy = ['fastnsq.consumer', 'fastnsq.producer', 'fastnsq.conn', 'asyncio'];"
            "print(sorted(m for m in heavy if m in sys.modules)); fastnsq.Consumer;"
            "print('fastnsq.consumer' in sys.modules)")
    before, after = _fresh(code).splitlines()
    assert before == "[]"
    assert after == "True"


def test_the_early_child_start_does_not_import_asyncio() -> None:
    assert _fresh("import sys, fastnsq.__main__, fastnsq.runner.spawning; print('asyncio' in sys.modules)") == "False"


@pytest.mark.parametrize("package", [fastnsq, fastnsq.runner], ids=lambda p: p.__name__)
def test_every_public_name_is_its_home_modules_object(package: object) -> None:
    import importlib

    for name in package.__all__:  # type: ignore[attr-defined]
        value = getattr(package, name)
        home = package._HOMES.get(name)  # type: ignore[attr-defined]
        if home is not None:
            assert value is getattr(importlib.import_module(f"{package.__name__}.{home[0]}"), home[1])  # type: ignore[attr-defined]
        assert name in dir(package)


def test_a_misspelt_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'fastnsq' has no attribute 'Consumr'"):
        fastnsq.Consumr  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match="'fastnsq.runner' has no attribute 'Supervisr'"):
        fastnsq.runner.Supervisr  # type: ignore[attr-defined]  # noqa: B018
