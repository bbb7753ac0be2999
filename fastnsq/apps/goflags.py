"""Go's flag spelling on our command line: ``-topic=events`` and ``-gzip`` as nsq's apps take them.

Go's ``flag`` package takes one dash or two, ``-name=value`` or ``-name value``, and a bool
as ``-name`` or ``-name=true|false``. Scripts and unit files written for ``nsq_to_file`` use
the one-dash form; :func:`normalize` rewrites it to argparse's two dashes for the long options
a parser knows, so that a user swaps the binary and keeps the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

#: The values Go's strconv.ParseBool takes.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    """The parser's ``--name`` options."""
    return {option for action in parser._actions for option in action.option_strings if option.startswith("--")}


def normalize(argv: Sequence[str], known: set[str]) -> list[str]:
    """``argv`` with each ``-name`` / ``-name=value`` of a known long option given two dashes.

    A token after ``--``, a negative number, or a one-dash name we do not know is left alone
    (argparse then reports it, naming it)."""
    result: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            result.append(token)
            result.extend(tokens)
            break
        if token.startswith("-") and not token.startswith("--") and len(token) > 2:
            name = token[1:].partition("=")[0]
            if f"--{name}" in known:
                token = "-" + token
        result.append(token)
    return result


def go_bool(text: str) -> bool:
    """A bool flag's ``=value`` as Go parses it (``-gzip=false``)."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a bool (Go's flags take true, false, 1, 0, t, f)")


def add_bool(group: argparse._ActionsContainer, name: str, help: str) -> None:
    """A Go bool flag: ``--name`` alone is true, ``--name=false`` false (``-name=false`` too)."""
    group.add_argument(name, nargs="?", const=True, default=None, type=go_bool, metavar="BOOL", help=help)
