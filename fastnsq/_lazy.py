"""Public names imported on first use (PEP 562): one loader for every package that defers its imports.

``fastnsq`` and ``fastnsq.runner`` re-export names whose modules cost most of a command's
start-up (the consumer, the producer, their codecs; the supervisor). A package gives its
``__name__`` and where each name lives; it gets the module ``__getattr__`` that imports the
name's module the first time the name is read and keeps the value in the package, so later
reads find it directly. Imports nothing of fastnsq.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def attribute_loader(package: str, homes: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``homes[name]`` is (its submodule, its name there)."""

    def load(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        submodule, attribute = home
        value = getattr(importlib.import_module(f".{submodule}", package), attribute)
        setattr(sys.modules[package], name, value)  # once: later reads find it directly
        return value

    return load
