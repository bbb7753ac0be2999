"""The ``fastnsq`` command's entry point: the parser of every command, and running one."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
from collections.abc import Sequence

from .. import codec
from .._version import __version__
from ..loop import loop_name
from ._common import (
    Parser,
    UsageError,
    client_options,
    common_options,
    configure_logging,
    describe_error,
    logger,
    subparser_of,
)
from .bench import _build_bench
from .nsqd import _build_nsqd
from .pub import _build_pub
from .stats import _build_stats
from .tail import _build_tail
from .to_file import _build_to_file
from .to_http import _build_to_http
from .to_nsq import _build_to_nsq
from .to_postgres import _build_to_postgres
from .worker import _build_worker


def version_text() -> str:
    """``fastnsq --version``: the version, the codec in use (and why the Python one) and the event loop."""
    implementation = "C" if codec.IMPLEMENTATION == "c" else "Python"
    why = f" ({codec.WHY_PYTHON})" if codec.WHY_PYTHON else ""
    return (f"fastnsq {__version__}\ncodec: {implementation}{why}\nevent loop: {loop_name()}\n"
            f"Python {platform.python_version()} ({platform.python_implementation()}, {sys.platform})")


class VersionAction(argparse.Action):
    """``--version``, told when asked (the loop's import is not paid by every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``fastnsq`` argument parser (every subcommand)."""
    parser = Parser(
        prog="fastnsq",
        description="fastnsq's command line: an embedded nsqd, publish, tail, stats, benchmarks, a worker service, "
        "nsq's apps (to-file, to-nsq, to-http) and to-postgres.",
        epilog="Run `fastnsq <command> --help` for a command's options. Errors exit with status 1, "
        "bad usage with 2.",
    )
    parser.add_argument("--version", action=VersionAction, help="show the version, the codec in use and the event "
                        "loop, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    common, client, app_client = common_options(), client_options(), client_options(servers_required=True)
    _build_nsqd(commands, common)
    _build_pub(commands, common, client)
    _build_tail(commands, common, client)
    _build_stats(commands, common)
    _build_bench(commands, common)
    _build_worker(commands, common, client)
    _build_to_file(commands, common, app_client)
    _build_to_nsq(commands, common, app_client)
    _build_to_http(commands, common, app_client)
    _build_to_postgres(commands, common, app_client)
    return parser


#: The commands that take nsq's apps' command lines, Go's one-dash flags included.
GO_STYLE_COMMANDS = ("to-file", "to-nsq", "to-http")


def go_style(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``-topic=events`` as ``--topic=events`` for an app's command (nsq's scripts keep working)."""
    from ..apps.goflags import long_options, normalize

    if not argv or argv[0] not in GO_STYLE_COMMANDS:
        return list(argv)
    return [argv[0], *normalize(argv[1:], long_options(subparser_of(parser, argv[0])))]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script's entry point)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(go_style(parser, sys.argv[1:] if argv is None else argv))
    if unknown:  # argparse would say "fastnsq: error": name the command the flag was given to
        subparser_of(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    prog = f"fastnsq {args.command}"
    configure_logging(args)
    try:
        return int(args.run(parser, args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`fastnsq tail ... | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush does not complain.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as exc:
        print(f"{prog}: error: {exc} (see {prog} --help)", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - every failure is one line; --debug shows where it came from
        if getattr(args, "debug", False):
            logger.exception("%s failed", prog)
        print(f"{prog}: error: {describe_error(exc)}", file=sys.stderr)
        return 1
