"""Every exception a public call can raise is in the API reference, where users import it from,
with its parents (issue 60: a publish while nsqd was down raised ``fastnsq.producer.pool.NsqdDown``,
a ``NoConnectionError`` the documentation did not name).

Every exception class the package defines is found by importing each of its modules; those of
fastnsq's own errors (``NSQError``'s family) must import from ``fastnsq.errors`` and have a row
in ``docs/api/errors.md`` naming their parents (``ServerError``'s subclasses, one per ``E_*`` code,
are shown by autodoc from ``fastnsq.errors.__all__``); the others, a row with the dotted name
users import them by.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import fastnsq
import fastnsq.errors

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api" / "errors.md"

#: Packages whose errors no public call raises: the command line's programs turn theirs into
#: a message and an exit status.
COMMANDS = ("fastnsq.cli", "fastnsq.apps", "fastnsq.__main__")
#: Errors that stay inside the package, and why.
INTERNAL = {
    "fastnsq.runner.loading.LoadError": "the worker's child reports it to the supervisor, which exits 2 saying it",
}


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every public exception class defined in fastnsq, by its dotted name (module.Class)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(fastnsq.__path__, "fastnsq."):
        if info.name.startswith(COMMANDS) or any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == info.name
                    and not name.startswith("_")):
                found[f"{info.name}.{name}"] = value
    return found


def _rows() -> dict[str, list[str]]:
    """The page's table: each exception's name (as users import it) and its parents."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        if match := re.match(r"\| `([\w.]+)`[^|]* \| ([^|]+) \|", line):
            rows[match.group(1)] = re.findall(r"`([\w.]+)`", match.group(2))
    return rows


def test_every_exception_a_public_call_raises_is_documented_with_its_parents() -> None:
    rows = _rows()
    missing = []
    for dotted, cls in sorted(_exception_classes().items()):
        if dotted in INTERNAL:
            continue
        if issubclass(cls, fastnsq.errors.NSQError):
            if getattr(fastnsq.errors, cls.__name__, None) is not cls or cls.__name__ not in fastnsq.errors.__all__:
                missing.append(f"{dotted}: not importable from fastnsq.errors")
                continue
            if issubclass(cls, fastnsq.errors.ServerError) and cls is not fastnsq.errors.ServerError:
                continue  # one per E_* code: autodoc shows each, with its parent
            name = cls.__name__
        else:  # the row's name is where users import it from: any path to the same class
            name = next((row for row in rows if "." in row and _imported(row) is cls), dotted)
        parents = [base.__name__ for base in cls.__bases__]
        if name not in rows:
            missing.append(f"{name}: no row in {PAGE.name}")
        elif rows[name] != parents:
            missing.append(f"{name}: {PAGE.name} says its parents are {rows[name]}, not {parents}")
    assert not missing, "\n".join(missing)


def _imported(name: str) -> object:
    """``fastnsq.errors.NAME`` for a bare name, else the dotted path's object (None if none)."""
    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module) if module else fastnsq.errors, attribute, None)


def test_the_page_names_no_exception_that_does_not_exist() -> None:
    for name in _rows():
        assert isinstance(_imported(name), type), f"{PAGE.name} names {name}, which does not import"


def test_a_publish_while_nsqd_is_down_raises_what_the_page_names() -> None:
    """The class users catch, from where they import it; the old path names the same class."""
    from fastnsq.producer.pool import NsqdDown

    assert NsqdDown is fastnsq.errors.NsqdDown
    assert NsqdDown.__module__ == "fastnsq.errors"
    assert NsqdDown.__bases__ == (fastnsq.NoConnectionError,)
