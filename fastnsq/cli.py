"""The ``fastnsq`` command: run an embedded nsqd, publish, tail, show stats, benchmark.

One job: turn a command line into calls on fastnsq's public API and print the
outcome. The flags follow nsq's own tools (``nsq_tail``, ``to_nsq``, ``nsq_stat``):
``--nsqd-tcp-address`` / ``--lookupd-http-address`` (each may be repeated),
``--topic``, ``--channel``, ``-n``. Examples::

    fastnsq nsqd                                   # embedded nsqd on 127.0.0.1:4150/4151
    fastnsq pub events 'hello'                     # one message
    seq 1000 | fastnsq pub events - --rate 200     # stdin lines, 200 msg/s
    fastnsq tail events -n 10 --format json        # ephemeral channel, 10 messages, then exit
    fastnsq stats --lookupd-http-address 127.0.0.1:4161
    fastnsq bench

Errors are one line on stderr, ``fastnsq <command>: error: <what>``, with exit
status 1 (2 for bad usage, as argparse does); ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import codec
from ._version import __version__
from .config import ConnectionOptions, parse_address
from .errors import InvalidValueError, NSQError

__all__ = ["CommandError", "ProgressLine", "build_parser", "format_table", "main"]

logger = logging.getLogger(__name__)

#: Where the go tools and ``fastnsq nsqd`` listen by default.
DEFAULT_NSQD_TCP = "127.0.0.1:4150"
DEFAULT_NSQD_HTTP = "127.0.0.1:4151"
#: Environment variable read for ``--auth-secret`` so the secret stays out of ``ps``.
AUTH_SECRET_ENV = "NSQ_AUTH_SECRET"

_TOPIC_RULE = "1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral"


class CommandError(Exception):
    """A failure the command reports as one line (no traceback) with exit status 1."""


class UsageError(CommandError):
    """Options that cannot go together: reported like argparse's errors, exit status 2."""


# ---- argument types: each rejects a bad value with one line naming it -----------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``fastnsq pub: error: <what> (see --help)``."""

    def error(self, message: str) -> Any:  # argparse's signature; never returns
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _nsqd_address(text: str) -> str:
    """``host:port`` (``[v6]:port``) with the port required, as the go tools want it."""
    stripped = text.strip()
    has_port = "]:" in stripped if stripped.startswith("[") else stripped.count(":") == 1
    if not has_port:
        raise argparse.ArgumentTypeError(f"{text!r} has no port: give host:port")
    try:
        host, port = parse_address(stripped)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen_address(text: str) -> str:
    """``host:port`` to listen on; port 0 means any free port."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port (port 0-65535; 0 for any free port)")
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def _http_address(text: str) -> str:
    from .lookupd import normalize_lookupd_address

    try:
        normalize_lookupd_address(text)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _topic(text: str) -> str:
    if not codec.valid_topic_name(text):
        raise argparse.ArgumentTypeError(f"invalid topic name {text!r}: {_TOPIC_RULE}")
    return text


def _channel(text: str) -> str:
    if not codec.valid_channel_name(text):
        raise argparse.ArgumentTypeError(f"invalid channel name {text!r}: {_TOPIC_RULE}")
    return text


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def _existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def _delimiter(text: str) -> bytes:
    data = text.encode().decode("unicode_escape").encode("latin-1") if "\\" in text else text.encode()
    if len(data) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a single byte")
    return data


# ---- the parser -------------------------------------------------------------------------------


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="store_true", help="log connections and retries to stderr")
    group.add_argument("--debug", action="store_true", help="debug logging, and a traceback on errors")
    return common


def _client_options() -> argparse.ArgumentParser:
    """--nsqd-tcp-address / --lookupd-http-address, TLS, AUTH and compression (go-nsq's names)."""
    client = argparse.ArgumentParser(add_help=False)
    where = client.add_argument_group("servers (default: --nsqd-tcp-address 127.0.0.1:4150)")
    where.add_argument(
        "--nsqd-tcp-address", action="append", type=_nsqd_address, default=[], metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times)",
    )
    where.add_argument(
        "--lookupd-http-address", action="append", type=_http_address, default=[], metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times)",
    )
    _add_tls_options(client)
    _add_auth_option(client)
    _add_compression_options(client)
    return client


def _add_compression_options(parser: argparse.ArgumentParser) -> None:
    compression = parser.add_argument_group("compression (negotiated with nsqd)")
    compression.add_argument("--snappy", action="store_true", help="snappy-compress the connection")
    compression.add_argument("--deflate", action="store_true", help="deflate-compress the connection")
    compression.add_argument(
        "--deflate-level", type=_int_at_least(1), default=6, metavar="1-9", help="deflate level (default 6)"
    )


def _add_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS")
    tls.add_argument("--tls", action="store_true", help="upgrade connections to TLS (nsqd's tls_v1)")
    tls.add_argument(
        "--tls-root-ca-file", type=_existing_file, metavar="PEM",
        help="CA bundle that signs the server certificate (implies --tls)",
    )
    tls.add_argument("--tls-cert", type=_existing_file, metavar="PEM", help="client certificate (implies --tls)")
    tls.add_argument("--tls-key", type=_existing_file, metavar="PEM", help="client private key, with --tls-cert")
    tls.add_argument(
        "--tls-insecure-skip-verify", action="store_true",
        help="do not verify the server certificate (implies --tls; for tests only)",
    )


def _add_auth_option(parser: argparse.ArgumentParser) -> None:
    auth = parser.add_argument_group("AUTH")
    auth.add_argument(
        "--auth-secret", metavar="SECRET",
        help=f"secret for nsqd's AUTH (and lookupd's bearer token); prefer the {AUTH_SECRET_ENV} "
        "environment variable, which keeps it out of `ps`",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``fastnsq`` argument parser (every subcommand)."""
    parser = _Parser(
        prog="fastnsq",
        description="fastnsq's command line: an embedded nsqd, publish, tail, stats and benchmarks.",
        epilog="Run `fastnsq <command> --help` for a command's options. Errors exit with status 1, "
        "bad usage with 2.",
    )
    parser.add_argument("--version", action="version", version=f"fastnsq {__version__} (codec: {codec.IMPLEMENTATION})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    common, client = _common_options(), _client_options()
    _build_nsqd(commands, common)
    _build_pub(commands, common, client)
    _build_tail(commands, common, client)
    _build_stats(commands, common)
    _build_bench(commands, common)
    return parser


def _build_nsqd(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "nsqd", parents=[common], help="run the embedded nsqd (and nsqlookupd) until Ctrl-C",
        description="Run fastnsq's embedded nsqd, in memory, until Ctrl-C or SIGTERM; prints its addresses. "
        "Messages live in memory only and are gone when it stops.",
        epilog="Example: fastnsq nsqd --lookupd   (nsqd on 4150/4151, nsqlookupd on 4160/4161)",
    )
    sub.add_argument("--tcp-address", type=_listen_address, default=DEFAULT_NSQD_TCP, metavar="HOST:PORT",
                     help="TCP address to listen on, port 0 for any free port (default %(default)s)")
    sub.add_argument("--http-address", type=_listen_address, default=DEFAULT_NSQD_HTTP, metavar="HOST:PORT",
                     help="HTTP address to listen on, same host as --tcp-address (default %(default)s)")
    sub.add_argument("--broadcast-address", metavar="HOST",
                     help="address registered with nsqlookupd (default: the listening host)")
    sub.add_argument("--lookupd-tcp-address", action="append", type=_nsqd_address, default=[],
                     metavar="HOST:PORT", help="register with this nsqlookupd (may be given multiple times)")
    sub.add_argument("--lookupd", action="store_true",
                     help="also run an embedded nsqlookupd and register with it")
    sub.add_argument("--lookupd-tcp-port", type=_int_at_least(0), default=4160, metavar="PORT",
                     help="embedded nsqlookupd TCP port, 0 for any (default %(default)s)")
    sub.add_argument("--lookupd-http-port", type=_int_at_least(0), default=4161, metavar="PORT",
                     help="embedded nsqlookupd HTTP port, 0 for any (default %(default)s)")
    # Not asking fastnsq.testing whether HA is available here: building the parser runs for
    # every command, and importing the embedded servers (aiohttp) would slow `fastnsq pub`.
    sub.add_argument("--ha", action="store_true", help="speak the HA (youzan) dialect")
    sub.add_argument("--emulate", choices=("v1.3.0", "master"), default="v1.3.0",
                     help="answer like the released nsqd v1.3.0 (default) or nsq master 3103474b (topology fields)")
    limits = sub.add_argument_group("limits (nsqd's flags, durations in seconds)")
    limits.add_argument("--msg-timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                        help="default time before an unanswered message is requeued (default 60)")
    limits.add_argument("--max-rdy-count", type=_int_at_least(1), default=codec.DEFAULT_MAX_RDY_COUNT,
                        metavar="N", help="maximum RDY count of a client (default %(default)s)")
    limits.add_argument("--max-msg-size", type=_int_at_least(1), default=codec.DEFAULT_MAX_MSG_SIZE,
                        metavar="BYTES", help="maximum message size (default %(default)s)")
    limits.add_argument("--max-body-size", type=_int_at_least(1), default=codec.DEFAULT_MAX_BODY_SIZE,
                        metavar="BYTES", help="maximum command body size (default %(default)s)")
    tls = sub.add_argument_group("TLS and AUTH (nsqd's flags)")
    tls.add_argument("--tls-cert", type=_existing_file, metavar="PEM", help="server certificate: enables TLS")
    tls.add_argument("--tls-key", type=_existing_file, metavar="PEM", help="server private key")
    tls.add_argument("--tls-root-ca-file", type=_existing_file, metavar="PEM", help="CA that signs client certificates")
    tls.add_argument("--tls-client-auth-policy", choices=("require", "require-verify"),
                     help="ask clients for a certificate (and verify it)")
    tls.add_argument("--tls-required", action="store_true", help="refuse clients that do not upgrade to TLS")
    tls.add_argument("--auth-http-address", action="append", type=_nsqd_address, default=[], metavar="HOST:PORT",
                     help="auth server to ask for AUTH (may be given multiple times)")
    sub.set_defaults(run=_run_nsqd)


def _build_pub(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "pub", parents=[common, client], help="publish a message, or stdin lines (like to_nsq)",
        usage="fastnsq pub [options] TOPIC [BODY | -]",
        description="Publish BODY to TOPIC, or one message per line of stdin when BODY is '-' or missing "
        "(empty lines are skipped, as to_nsq does). Lines are sent in MPUB batches.",
        epilog="Examples: fastnsq pub events hello;  seq 1000 | fastnsq pub events --rate 100",
    )
    sub.add_argument("topic", nargs="?", metavar="TOPIC", help="topic to publish to")
    sub.add_argument("body", nargs="?", metavar="BODY", help="message body; '-' or absent: read stdin lines")
    sub.add_argument("--topic", dest="topic_option", type=_topic, metavar="TOPIC", help="the topic, as to_nsq takes it")
    sub.add_argument("--count", type=_int_at_least(1), metavar="N",
                     help="publish BODY N times, or at most N stdin lines")
    sub.add_argument("--rate", type=_positive_float, metavar="MSG/S", help="publish at most this many messages per second")
    sub.add_argument("--delimiter", type=_delimiter, default=b"\n", metavar="CHAR",
                     help="byte that separates stdin messages (default newline)")
    sub.add_argument("-q", "--quiet", action="store_true", help="do not print the summary")
    sub.set_defaults(run=_run_pub)


def _build_tail(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "tail", parents=[common, client], help="print a topic's messages (like nsq_tail)",
        usage="fastnsq tail [options] TOPIC",
        description="Subscribe to TOPIC on an ephemeral channel (tail<random>#ephemeral) and print each "
        "message: the body and a newline (raw), or one JSON object per line.",
        epilog="JSON lines carry id, attempts, timestamp (ns since the epoch) and body (text) or "
        "body_base64 (when the body is not UTF-8).",
    )
    sub.add_argument("topic", nargs="?", metavar="TOPIC", help="topic to read")
    sub.add_argument("--topic", dest="topic_option", type=_topic, metavar="TOPIC", help="the topic, as nsq_tail takes it")
    sub.add_argument("--channel", type=_channel, metavar="CHANNEL",
                     help="channel to read (default: a new tail<random>#ephemeral)")
    sub.add_argument("-n", type=_int_at_least(0), default=0, metavar="N", dest="total",
                     help="exit after N messages (0: run until Ctrl-C; waits if the topic is quiet)")
    sub.add_argument("--format", choices=("raw", "json"), default="raw", help="output format (default raw)")
    sub.add_argument("--max-in-flight", type=_int_at_least(1), default=200, metavar="N",
                     help="messages nsqd may send before they are answered (default %(default)s)")
    sub.set_defaults(run=_run_tail)


def _build_stats(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "stats", parents=[common], help="topics and channels of an nsqd or a lookupd's cluster",
        description="Show the topics and channels of nsqd (its /stats over HTTP) or of every nsqd a "
        "nsqlookupd knows (its /nodes): depth, in flight, deferred, requeued, timed out, messages, "
        "clients. Like nsq_stat, it talks to the HTTP ports.",
        epilog="Default: --nsqd-http-address 127.0.0.1:4151. Addresses may be http(s)://host:port.",
    )
    where = sub.add_argument_group("servers")
    where.add_argument("--nsqd-http-address", action="append", type=_http_address, default=[], metavar="HOST:PORT",
                       help="nsqd HTTP address (may be given multiple times)")
    where.add_argument("--lookupd-http-address", action="append", type=_http_address, default=[],
                       metavar="HOST:PORT", help="nsqlookupd HTTP address: every nsqd it lists (may be repeated)")
    sub.add_argument("--topic", type=_topic, help="only this topic")
    sub.add_argument("--channel", type=_channel, help="only this channel")
    sub.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    sub.add_argument("--timeout", type=_positive_float, default=5.0, metavar="SECONDS",
                     help="HTTP request timeout (default 5)")
    _add_tls_options(sub)
    _add_auth_option(sub)
    sub.set_defaults(run=_run_stats)


def _build_bench(commands: Any, common: argparse.ArgumentParser) -> None:
    from .benchmark import SCENARIOS

    sub = commands.add_parser(
        "bench", parents=[common], help="fastnsq's benchmark workloads, with a progress bar and a table",
        description="Run fastnsq's benchmark scenarios (fastnsq.benchmark, the harness of bench/) against "
        "the embedded nsqd started in a child process, or against --nsqd-tcp-address: a progress line "
        "while each runs, a table at the end (client CPU seconds per million messages; the server's too "
        "when it is the embedded one).",
        epilog="Example: fastnsq bench --workload pub --workload consume-batches --count 100000",
    )
    where = sub.add_argument_group("servers (default: an embedded nsqd in a child process)")
    where.add_argument("--nsqd-tcp-address", type=_nsqd_address, metavar="HOST:PORT",
                       help="benchmark this nsqd instead")
    where.add_argument("--nsqd-http-address", type=_nsqd_address, metavar="HOST:PORT",
                       help="its HTTP address: consumers end when /stats shows the channel drained, "
                       "and each workload's topic is deleted afterwards")
    sub.add_argument("--workload", action="append", choices=list(SCENARIOS), metavar="NAME",
                     help="run only this workload (may be given multiple times; --list shows them)")
    sub.add_argument("--list", action="store_true", help="list the workloads and exit")
    sub.add_argument("--count", type=_int_at_least(1), metavar="N",
                     help="measured messages per workload (default: each workload's own; a tenth more warm up)")
    sub.add_argument("--size", type=_int_at_least(1), metavar="BYTES", help="message body size (default 100)")
    sub.add_argument("--max-seconds", type=_positive_float, metavar="SECONDS", help="cap each workload's run")
    sub.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    _add_tls_options(sub)
    _add_auth_option(sub)
    _add_compression_options(sub)
    sub.set_defaults(run=_run_bench)


# ---- main -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script's entry point)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"fastnsq {args.command}"
    _configure_logging(args)
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
    except Exception as exc:  # every failure is one line; --debug shows where it came from
        if getattr(args, "debug", False):
            logger.exception("%s failed", prog)
        print(f"{prog}: error: {describe_error(exc)}", file=sys.stderr)
        return 1


def describe_error(exc: BaseException) -> str:
    """One line for an exception: its text, or its type when it has none (timeouts)."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not str(exc):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (CommandError, NSQError)):
        return text
    http = _describe_http_error(exc)
    if http is not None:
        return http
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}" if not str(exc).startswith("[Errno") else text
    return text


def _describe_http_error(exc: BaseException) -> str | None:
    """aiohttp's errors in one line (they quote whole status lines otherwise)."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        return describe_error(exc.os_error)
    if isinstance(exc, (aiohttp.ClientResponseError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return "not an HTTP answer: is this an HTTP port?"
    if isinstance(exc, aiohttp.ClientError):
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def _configure_logging(args: argparse.Namespace) -> None:
    # Quiet by default: a one-line error is the contract, and warnings (a reconnect)
    # would add lines. -v shows them, --debug everything.
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.ERROR
    logging.basicConfig(level=level, format=f"fastnsq {args.command}: %(levelname)s %(name)s: %(message)s")
    if not args.debug:
        logging.getLogger("aiohttp").setLevel(max(level, logging.WARNING))
        # asyncio's "exception was never retrieved" reports, written when a future is
        # collected, would add a traceback after the one-line error.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def _run(coro: Any) -> Any:
    from .loop import run

    return run(coro)


def _resolve_topic(parser: argparse.ArgumentParser, args: argparse.Namespace, *, takes_body: bool) -> None:
    """TOPIC may be positional or ``--topic`` (the go tools' flag); a second word is then the BODY."""
    sub = _subparser(parser, args.command)
    positional, option = args.topic, args.topic_option
    if option is not None:
        if positional is not None and takes_body and args.body is None:
            args.body = positional  # `pub --topic events hello`
        elif positional is not None:
            sub.error(f"the topic is given twice ({positional!r} and --topic {option!r})")
        args.topic = option
    elif positional is None:
        sub.error("a TOPIC is required")
    else:
        try:
            args.topic = _topic(positional)
        except argparse.ArgumentTypeError as exc:
            sub.error(f"argument TOPIC: {exc}")


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse offers no public lookup of a subparser
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


def _client_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Connection options (TLS, AUTH, compression) for Producer/Consumer, validated."""
    secret = args.auth_secret if args.auth_secret is not None else os.environ.get(AUTH_SECRET_ENV) or None
    settings: dict[str, Any] = {
        "tls_v1": bool(args.tls or args.tls_root_ca_file or args.tls_cert or args.tls_insecure_skip_verify),
        "tls_root_ca_file": args.tls_root_ca_file,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_insecure_skip_verify": args.tls_insecure_skip_verify,
        "auth_secret": secret,
        "user_agent": f"fastnsq-cli/{__version__}",
    }
    if args.snappy and args.deflate:
        raise UsageError("--snappy and --deflate cannot go together (nsqd refuses both)")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.snappy:
        settings["snappy"] = True
    if args.deflate:
        settings.update(deflate=True, deflate_level=args.deflate_level)
    try:
        ConnectionOptions(**settings)  # a bad combination fails here, before any connection
    except InvalidValueError as exc:
        raise UsageError(str(exc)) from None
    return settings


def _servers(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    nsqd, lookupd = list(args.nsqd_tcp_address), list(args.lookupd_http_address)
    if not nsqd and not lookupd:
        nsqd = [DEFAULT_NSQD_TCP]
    return nsqd, lookupd


async def _check_nsqd(address: str, settings: dict[str, Any]) -> None:
    """Open and close one connection, so a wrong address, TLS or AUTH fails at once and clearly."""
    from .conn import Connection

    conn = Connection(address, ConnectionOptions(**settings))
    try:
        await conn.connect()
    except (OSError, asyncio.TimeoutError, NSQError) as exc:
        raise CommandError(f"cannot connect to nsqd {address}: {describe_error(exc)}") from exc
    try:
        _require_tls(conn, settings)
    finally:
        await conn.close()


def _require_tls(conn: Any, settings: dict[str, Any]) -> None:
    """nsqd without TLS answers IDENTIFY with tls_v1 false and the client goes on in clear text;
    a user who asked for TLS gets an error instead."""
    if settings.get("tls_v1") and not conn.identify_response.get("tls_v1"):
        raise CommandError(f"nsqd {conn.address} does not offer TLS (asked for by --tls and the --tls-* options)")


async def _check_lookupd(address: str, topic: str | None, secret: str | None) -> None:
    """Ask the lookupd once (``/lookup`` for a topic, else ``/nodes``) so an unreachable one fails now."""
    from .lookupd import LookupdClient

    async with LookupdClient(timeout=5.0, auth_secret=secret) as client:
        if topic is None:
            await client.nodes(address)
        else:
            await client.lookup(address, topic)


def _install_stop_signals(callback: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not on the main thread
            loop.add_signal_handler(sig, callback)


# ---- nsqd ---------------------------------------------------------------------------------


def _run_nsqd(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .testing import EMBEDDED_HA_AVAILABLE

    if args.ha and not EMBEDDED_HA_AVAILABLE:
        _subparser(parser, "nsqd").error("--ha: the embedded nsqd does not speak the HA dialect yet")
    tcp_host, tcp_port = _split_listen(args.tcp_address)
    http_host, http_port = _split_listen(args.http_address)
    if tcp_host != http_host:
        _subparser(parser, "nsqd").error(
            f"--tcp-address and --http-address must use the same host ({tcp_host} vs {http_host})"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        _subparser(parser, "nsqd").error("--tls-cert and --tls-key go together")
    _run(_serve_nsqd(args, tcp_host, tcp_port, http_port))
    return 0


async def _serve_nsqd(args: argparse.Namespace, host: str, tcp_port: int, http_port: int) -> None:
    from .testing import NSQLookupd
    from .testing.nsqd import NSQD

    stop = asyncio.Event()
    _install_stop_signals(stop.set)
    broadcast = args.broadcast_address or (host if host not in ("0.0.0.0", "::") else None)
    async with contextlib.AsyncExitStack() as stack:
        registrations = list(args.lookupd_tcp_address)
        lines = []
        if args.lookupd:
            lookupd = NSQLookupd(host=host, tcp_port=args.lookupd_tcp_port, http_port=args.lookupd_http_port, ha=args.ha,
                                 **({} if args.ha else {"emulate": args.emulate}))
            await stack.enter_async_context(lookupd)
            registrations.insert(0, lookupd.tcp_address)
            lines.append(f"nsqlookupd  tcp {lookupd.tcp_address}  http {lookupd.http_address}")
        nsqd = NSQD(
            host=host, tcp_port=tcp_port, http_port=http_port,
            broadcast_address=broadcast or _hostname(), lookupd_tcp_addresses=registrations, ha=args.ha,
            msg_timeout=args.msg_timeout, max_msg_timeout=max(900.0, args.msg_timeout),
            max_rdy_count=args.max_rdy_count, max_msg_size=args.max_msg_size, max_body_size=args.max_body_size,
            tls_cert=args.tls_cert, tls_key=args.tls_key, tls_root_ca_file=args.tls_root_ca_file,
            tls_client_auth_policy=args.tls_client_auth_policy, tls_required=args.tls_required,
            auth_http_addresses=args.auth_http_address, emulate=args.emulate,
        )
        await stack.enter_async_context(nsqd)
        lines.insert(0, f"nsqd        tcp {nsqd.tcp_address}  http {nsqd.http_address}")
        for line in lines:
            print(line)
        dialect = "HA (youzan)" if args.ha else f"nsqd 1.3, answering like nsqd {args.emulate}"
        print(f"running ({dialect} protocol, messages in memory only); Ctrl-C to stop", flush=True)
        await stop.wait()
    print("stopped", flush=True)


def _split_listen(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _hostname() -> str:
    import socket

    return socket.gethostname()


# ---- pub --------------------------------------------------------------------------------------


def _run_pub(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _resolve_topic(parser, args, takes_body=True)
    if args.body is not None and args.body != "-" and not args.body:
        _subparser(parser, "pub").error("BODY is empty: nsqd rejects empty messages")
    settings = _client_settings(args)
    started = time.perf_counter()
    published = _run(_publish(args, settings))
    elapsed = time.perf_counter() - started
    if not args.quiet:
        noun = "message" if published == 1 else "messages"
        rate = f" ({published / elapsed:,.0f} msg/s)" if published >= 100 and elapsed > 0 else ""
        print(f"published {published:,} {noun} to {args.topic} in {elapsed:.2f} s{rate}")
    return 0


async def _publish(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from .producer import Producer

    nsqd, lookupd = _servers(args)
    for address in lookupd:
        await _check_lookupd(address, None, settings["auth_secret"])
    producer = Producer(nsqd, lookupd_http_addresses=lookupd, **settings)
    await producer.start()
    try:
        if not producer.connections:
            raise CommandError("no nsqd to publish to: the lookupd lists none (publish to --nsqd-tcp-address first)")
        for conn in producer.connections:
            _require_tls(conn, settings)
        pacer = _Pacer(args.rate)
        if args.body is not None and args.body != "-":
            chunks = _repeat(args.body.encode(), args.count or 1)
        else:
            chunks = _stdin_chunks(args.delimiter, args.count)
        return await _send_chunks(producer, args.topic, chunks, pacer)
    finally:
        await producer.close()


_BATCH = 1000  # messages per MPUB: large enough to amortise, small enough to pace smoothly


async def _repeat(body: bytes, count: int) -> AsyncIterator[list[bytes]]:
    while count > 0:
        take = min(count, _BATCH)
        yield [body] * take
        count -= take


async def _stdin_chunks(delimiter: bytes, limit: int | None) -> AsyncIterator[list[bytes]]:
    """stdin split on ``delimiter`` (empty messages skipped), read by a daemon thread.

    A daemon thread, not the loop's executor: a read blocked on a terminal must not
    keep the process alive after Ctrl-C.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)  # bounded: a fast file waits for nsqd
    stream: Any = sys.stdin.buffer  # a BufferedReader: read1 returns what is there, without waiting for more

    def read() -> None:
        try:
            while True:
                data = stream.read1(65536)
                asyncio.run_coroutine_threadsafe(queue.put(data or None), loop).result()
                if not data:
                    return
        except (RuntimeError, OSError, ValueError):  # the loop is gone or stdin closed: stop reading
            return

    threading.Thread(target=read, name="fastnsq-stdin", daemon=True).start()
    rest = b""
    sent = 0
    while limit is None or sent < limit:
        data = await queue.get()
        if data is None:
            parts, rest = [rest], b""
        else:
            parts = (rest + data).split(delimiter)
            rest = parts.pop()
        lines = [line for line in parts if line]
        if limit is not None:
            lines = lines[: limit - sent]
        for start in range(0, len(lines), _BATCH):
            yield lines[start : start + _BATCH]
        sent += len(lines)
        if data is None:
            return


class _Pacer:
    """How many messages may go now to keep at most ``rate`` per second (None: no limit)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.sent = 0
        self.start = time.monotonic()

    async def allowance(self, wanted: int) -> int:
        if self.rate is None:
            return wanted
        while True:
            due = int((time.monotonic() - self.start) * self.rate) + 1 - self.sent
            if due > 0:
                return min(due, wanted)
            await asyncio.sleep((self.sent + 1 - (time.monotonic() - self.start) * self.rate) / self.rate)


async def _send_chunks(producer: Any, topic: str, chunks: AsyncIterator[list[bytes]], pacer: _Pacer) -> int:
    """Publish every chunk (MPUB, or PUB for one message), a few commands in flight at once."""
    in_flight: set[asyncio.Task[Any]] = set()
    published = 0

    async def settle(limit: int) -> None:
        nonlocal in_flight
        while len(in_flight) > limit:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raises the publish's error

    async for chunk in chunks:
        offset = 0
        while offset < len(chunk):
            take = await pacer.allowance(len(chunk) - offset)
            part = chunk[offset : offset + take]
            offset += take
            pacer.sent += take
            send = producer.publish(topic, part[0]) if take == 1 else producer.mpublish(topic, part)
            in_flight.add(asyncio.ensure_future(send))
            published += take
            await settle(4)
    await settle(0)
    return published


# ---- tail -------------------------------------------------------------------------------------


def _run_tail(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _resolve_topic(parser, args, takes_body=False)
    settings = _client_settings(args)
    channel = args.channel or f"tail{random.randrange(1_000_000):06d}#ephemeral"
    _run(_tail(args, channel, settings))
    return 0


async def _tail(args: argparse.Namespace, channel: str, settings: dict[str, Any]) -> None:
    from .consumer import Consumer

    nsqd, lookupd = _servers(args)
    for address in nsqd:
        await _check_nsqd(address, settings)
    for address in lookupd:
        await _check_lookupd(address, args.topic, settings["auth_secret"])
    max_in_flight = min(args.max_in_flight, args.total) if args.total else args.max_in_flight
    consumer = Consumer(
        args.topic, channel, nsqd_tcp_addresses=nsqd, lookupd_http_addresses=lookupd,
        max_in_flight=max_in_flight, lookupd_poll_interval=15.0, **settings,
    )
    write = _json_writer(sys.stdout) if args.format == "json" else _raw_writer(sys.stdout)
    await consumer.start()
    stopping: list[asyncio.Future[Any]] = []  # Ctrl-C / SIGTERM: stop (drain) once, then exit 0

    def on_signal() -> None:
        if not stopping:
            stopping.append(asyncio.ensure_future(consumer.stop(timeout=2.0)))

    _install_stop_signals(on_signal)
    shown = 0
    try:
        async for batch in consumer.batches(max_size=max_in_flight, max_wait=0.05):
            wanted = len(batch) if not args.total else min(len(batch), args.total - shown)
            for message in batch.messages[:wanted]:
                write(message)
                message.finish()
            for message in batch.messages[wanted:]:
                message.requeue(0, backoff=False)  # past -n: leave it for the next reader
            sys.stdout.flush()
            shown += wanted
            if args.total and shown >= args.total:
                break
    finally:
        await (stopping[0] if stopping else consumer.stop(timeout=2.0))


def _raw_writer(stream: TextIO) -> Callable[[Any], None]:
    out = stream.buffer

    def write(message: Any) -> None:
        out.write(message.body)
        out.write(b"\n")

    return write


def _json_writer(stream: TextIO) -> Callable[[Any], None]:
    def write(message: Any) -> None:
        stream.write(json.dumps(message_record(message), ensure_ascii=False) + "\n")

    return write


def message_record(message: Any) -> dict[str, Any]:
    """A message as JSON-ready values: id, attempts, timestamp and the body as text or base64.

    >>> from fastnsq.codec import Message
    >>> message_record(Message(1700000000000000000, 1, b"0123456789abcdef", b"hi"))
    {'id': '0123456789abcdef', 'attempts': 1, 'timestamp': 1700000000000000000, 'body': 'hi'}
    """
    raw_id = bytes(message.id)
    try:
        text_id = raw_id.decode("ascii")
        if not text_id.isalnum():
            raise ValueError
    except ValueError:
        text_id = raw_id.hex()  # HA: a binary id
    record: dict[str, Any] = {"id": text_id, "attempts": message.attempts, "timestamp": message.timestamp}
    body = bytes(message.body)
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    return record


# ---- stats ------------------------------------------------------------------------------------


_STATS_COLUMNS = ("DEPTH", "IN-FLIGHT", "DEFERRED", "REQUEUED", "TIMED-OUT", "MESSAGES", "CLIENTS")


def _run_stats(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    nodes = _run(_collect_stats(args))
    if args.format == "json":
        print(json.dumps(nodes, indent=2))
        return 0
    rows = stats_rows(nodes, show_node=len(nodes) > 1)
    if not rows:
        what = f"topic {args.topic!r}" if args.topic else "topics"
        print(f"no {what} on {', '.join(nodes) or 'any nsqd'}")
        return 0
    headers = (["NSQD"] if len(nodes) > 1 else []) + ["TOPIC", "CHANNEL", *_STATS_COLUMNS]
    print(format_table(headers, rows))
    return 0


async def _collect_stats(args: argparse.Namespace) -> dict[str, Any]:
    """``{nsqd http address: its /stats JSON}`` for the nsqd given or listed by the lookupds."""
    import aiohttp

    from .lookupd import LookupdClient, normalize_lookupd_address

    secret = args.auth_secret if args.auth_secret is not None else os.environ.get(AUTH_SECRET_ENV) or None
    scheme = "https" if args.tls or args.tls_root_ca_file or args.tls_insecure_skip_verify else "http"
    context = _http_ssl_context(args) if scheme == "https" or any(
        a.startswith("https://") for a in args.nsqd_http_address + args.lookupd_http_address
    ) else None
    connector = aiohttp.TCPConnector(ssl=context if context is not None else True)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        addresses = list(args.nsqd_http_address)
        if args.lookupd_http_address:
            client = LookupdClient(session, timeout=args.timeout, auth_secret=secret)
            for lookupd in args.lookupd_http_address:
                for node in await client.nodes(_with_scheme(lookupd, scheme)):
                    if node.http_address not in addresses:
                        addresses.append(node.http_address)
        elif not addresses:
            addresses = [DEFAULT_NSQD_HTTP]
        urls = {a: normalize_lookupd_address(_with_scheme(a, scheme)) for a in addresses}
        answers = await asyncio.gather(*(_nsqd_stats(session, url, args) for url in urls.values()))
        return dict(zip(urls, answers))


def _with_scheme(address: str, scheme: str) -> str:
    return address if "://" in address else f"{scheme}://{address}"


def _http_ssl_context(args: argparse.Namespace) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=args.tls_root_ca_file)
    if args.tls_cert:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    if args.tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def _nsqd_stats(session: Any, base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    query = {"format": "json"}
    if args.topic:
        query["topic"] = args.topic
    if args.channel:
        query["channel"] = args.channel
    url = f"{base_url}/stats"
    try:
        async with session.get(url, params=query) as response:
            body = await response.read()
            status = response.status
    except asyncio.TimeoutError:
        raise CommandError(f"nsqd {base_url} did not answer within {args.timeout} s") from None
    except aiohttp.ClientError as exc:
        raise CommandError(f"cannot reach nsqd {base_url}: {describe_error(exc)}") from None
    if status != 200:
        raise CommandError(f"nsqd {url} answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
    try:
        data = json.loads(body)
    except ValueError:
        raise CommandError(f"{url} did not answer JSON: is it an nsqd HTTP address?") from None
    if isinstance(data, dict) and "data" in data and "status_code" in data:
        data = data["data"]  # nsqd before 1.0 wraps its answers
    if not isinstance(data, dict) or "topics" not in data:
        raise CommandError(f"{url} did not answer nsqd stats: is it an nsqd HTTP address?")
    return data


def stats_rows(nodes: dict[str, Any], *, show_node: bool) -> list[list[Any]]:
    """Table rows from ``{address: /stats JSON}``: a row per topic, then one per channel.

    >>> stats = {"topics": [{"topic_name": "t", "depth": 2, "message_count": 5,
    ...          "channels": [{"channel_name": "c", "depth": 1, "in_flight_count": 3, "client_count": 1}]}]}
    >>> stats_rows({"n:4151": stats}, show_node=False)
    [['t', '-', 2, '', '', '', '', 5, ''], ['', 'c', 1, 3, 0, 0, 0, 0, 1]]
    """
    rows: list[list[Any]] = []
    for address, data in nodes.items():
        for topic in data.get("topics") or []:
            paused = " (paused)" if topic.get("paused") else ""
            node = [address] if show_node else []
            rows.append([*node, topic.get("topic_name", "?") + paused, "-", topic.get("depth", 0),
                         "", "", "", "", topic.get("message_count", 0), ""])
            for channel in topic.get("channels") or []:
                rows.append([
                    *([""] if show_node else []),
                    "",
                    channel.get("channel_name", "?") + (" (paused)" if channel.get("paused") else ""),
                    channel.get("depth", 0),
                    channel.get("in_flight_count", 0),
                    channel.get("deferred_count", 0),
                    channel.get("requeue_count", 0),
                    channel.get("timeout_count", 0),
                    channel.get("message_count", 0),
                    channel.get("client_count", 0),
                ])
    return rows


# ---- bench ------------------------------------------------------------------------------------


def _run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .benchmark import SCENARIOS
    from .testing.process import NSQDProcess  # one home for nsqd child processes; imported on use

    if args.list:
        rows = [[name, scenario.description] for name, scenario in SCENARIOS.items()]
        print(format_table(["WORKLOAD", "WHAT IT MEASURES"], rows))
        return 0
    if args.nsqd_http_address and not args.nsqd_tcp_address:
        raise UsageError("--nsqd-http-address goes with --nsqd-tcp-address")
    settings = _client_settings(args)
    names = args.workload or list(SCENARIOS)
    server: NSQDProcess | None = None
    try:
        if args.nsqd_tcp_address is None:
            if settings["tls_v1"] or settings["auth_secret"]:
                raise UsageError("TLS and AUTH options need --nsqd-tcp-address (the embedded nsqd runs without them)")
            server = NSQDProcess()
            server.start()
            print(f"embedded nsqd in a child process (pid {server.pid}): tcp {server.tcp_address}  "
                  f"http {server.http_address}", file=sys.stderr, flush=True)
            tcp, http, pid = server.tcp_address, server.http_address, server.pid
        else:
            tcp, http, pid = args.nsqd_tcp_address, args.nsqd_http_address, None
        results = _run(_bench(names, args, settings, tcp, http, pid))
    finally:
        if server is not None:
            server.stop()
    print(format_table(*bench_table(results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.as_dict() for r in results], f, indent=2)
        print(f"results written to {args.json}", file=sys.stderr)
    return 0


async def _bench(
    names: list[str], args: argparse.Namespace, settings: dict[str, Any], tcp: str, http: str | None,
    pid: int | None,
) -> list[Any]:
    from . import benchmark

    await _check_nsqd(tcp, settings)
    progress = ProgressLine()
    results = []
    for name in names:

        def report(done: int, total: int, elapsed: float, name: str = name) -> None:
            rate = f"{done / elapsed:,.0f} msg/s" if elapsed > 0 else ""
            progress.update(name, done, total, f"{rate}  {elapsed:.0f} s")

        if benchmark.SCENARIOS[name].workload == "consume":
            progress.update(name, 0, None, "publishing the messages to consume", force=True)
        result = await benchmark.run_scenario(
            name, tcp, nsqd_http_address=http, count=args.count, size=args.size or benchmark.BODY_SIZE,
            progress=report, server_pid=pid, max_seconds=args.max_seconds, options=settings,
        )
        results.append(result)
        progress.done(f"{name}: {result.messages:,} messages in {result.seconds:.2f} s, "
                      f"{result.msgs_per_s:,.0f} msg/s")
    return results


def bench_table(results: Sequence[Any]) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows of the ``fastnsq bench`` table from :class:`fastnsq.benchmark.BenchResult` records."""
    headers = ["WORKLOAD", "VARIANT", "MESSAGES", "SECONDS", "MSG/S", "CPU S/1M", "NSQD CPU S/1M"]
    rows = []
    for r in results:
        server = r.server_cpu_per_million
        rows.append([
            r.workload + (" (capped)" if r.capped else ""), r.variant, r.messages, f"{r.seconds:.2f}",
            r.msgs_per_s, f"{r.cpu_per_million:.2f}", "" if server is None else f"{server:.2f}",
        ])
    return headers, rows


def __getattr__(name: str) -> Any:
    # cli.NSQDProcess lives in fastnsq.testing.process (imported on use: `fastnsq pub` stays light).
    if name == "NSQDProcess":
        from .testing.process import NSQDProcess

        return NSQDProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- console rendering --------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Iterable[Iterable[Any]]) -> str:
    """A plain-text table: numbers right-aligned with thousands separators, text left-aligned.

    >>> print(format_table(["NAME", "MSG/S"], [["pub", 12345.6], ["sub", 7]]))
    NAME     MSG/S
    pub     12,346
    sub          7
    """
    values = [list(row) for row in rows]
    cells = [[_cell(value) for value in row] for row in values]
    numeric = _numeric_columns(headers, values)
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in cells)])


def _numeric_columns(headers: Sequence[str], rows: list[list[Any]]) -> list[bool]:
    """Columns whose every filled cell is a number (or a number already formatted as text)."""
    result = []
    for index in range(len(headers)):
        values = [row[index] for row in rows if row[index] not in ("", "-", None)]
        result.append(bool(values) and all(_is_number(v) for v in values))
    return result


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value).replace(",", ""))
    except ValueError:
        return False
    return True


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


class ProgressLine:
    """A progress bar: one self-rewriting line on a terminal, a plain line every few seconds otherwise.

    >>> import io
    >>> progress = ProgressLine(io.StringIO(), interval=0)
    >>> progress.update("mpub", 50, 100, "1,234 msg/s")
    >>> progress.stream.getvalue()
    'mpub  [##########          ]  50%  50/100  1,234 msg/s\\n'
    """

    def __init__(self, stream: TextIO | None = None, *, interval: float | None = None, width: int = 20) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.1 if self.tty else 2.0)
        self.width = width
        self._last = float("-inf")
        self._open = False

    def update(self, label: str, done: float, total: float | None, detail: str = "", *, force: bool = False) -> None:
        """Show progress (throttled to ``interval`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        text = render_progress(label, done, total, detail, self.width)
        if self.tty:
            columns = shutil.get_terminal_size((100, 24)).columns
            self.stream.write("\r\x1b[K" + text[: max(columns - 1, 10)])
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self, line: str | None = None) -> None:
        """End the bar; on a terminal the line is replaced by ``line`` (or kept)."""
        if self.tty and self._open:
            self.stream.write("\r\x1b[K" + line + "\n" if line is not None else "\n")
        elif line is not None:
            self.stream.write(line + "\n")
        self._open = False
        self._last = float("-inf")
        self.stream.flush()


def render_progress(label: str, done: float, total: float | None, detail: str = "", width: int = 20) -> str:
    """``label  [#####     ]  50%  50/100  detail`` (no bar when the total is unknown)."""
    if total:
        fraction = min(max(done / total, 0.0), 1.0)
        filled = int(fraction * width)
        bar = f"[{'#' * filled}{' ' * (width - filled)}] {fraction * 100:3.0f}%  {_cell(done)}/{_cell(total)}"
    else:
        bar = _cell(done) if done else ""
    return "  ".join(part for part in (label, bar, detail) if part)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
