"""What every ``fastnsq`` command shares: its errors, argument types, option groups and helpers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Callable
from typing import Any

from .. import codec
from .._version import __version__
from ..config import ConnectionOptions, parse_address
from ..errors import InvalidValueError, NSQError

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


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``fastnsq pub: error: <what> (see --help)``."""

    def error(self, message: str) -> Any:  # argparse's signature; never returns
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def nsqd_address_arg(text: str) -> str:
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


def listen_address_arg(text: str) -> str:
    """``host:port`` to listen on; port 0 means any free port."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port (port 0-65535; 0 for any free port)")
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def http_address_arg(text: str) -> str:
    from ..lookupd import normalize_lookupd_address

    try:
        normalize_lookupd_address(text)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def topic_arg(text: str) -> str:
    if not codec.valid_topic_name(text):
        raise argparse.ArgumentTypeError(f"invalid topic name {text!r}: {_TOPIC_RULE}")
    return text


def channel_arg(text: str) -> str:
    if not codec.valid_channel_name(text):
        raise argparse.ArgumentTypeError(f"invalid channel name {text!r}: {_TOPIC_RULE}")
    return text


def int_at_least(low: int) -> Callable[[str], int]:
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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def delimiter_arg(text: str) -> bytes:
    data = text.encode().decode("unicode_escape").encode("latin-1") if "\\" in text else text.encode()
    if len(data) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a single byte")
    return data


def common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="store_true", help="log connections and retries to stderr")
    group.add_argument("--debug", action="store_true", help="debug logging, and a traceback on errors")
    return common


def client_options(*, servers_required: bool = False) -> argparse.ArgumentParser:
    """--nsqd-tcp-address / --lookupd-http-address, TLS, AUTH and compression (go-nsq's names).
    ``servers_required``: the command refuses to start without one (nsq's apps, as nsq's own do)."""
    client = argparse.ArgumentParser(add_help=False)
    where = client.add_argument_group("servers (at least one address is required)" if servers_required
                                      else "servers (default: --nsqd-tcp-address 127.0.0.1:4150)")
    where.add_argument(
        "--nsqd-tcp-address", action="append", type=nsqd_address_arg, default=[], metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times)",
    )
    where.add_argument(
        "--lookupd-http-address", action="append", type=http_address_arg, default=[], metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times)",
    )
    add_tls_options(client)
    add_auth_option(client)
    add_compression_options(client)
    return client


def add_compression_options(parser: argparse.ArgumentParser) -> None:
    compression = parser.add_argument_group("compression (negotiated with nsqd)")
    compression.add_argument("--snappy", action="store_true", help="snappy-compress the connection")
    compression.add_argument("--deflate", action="store_true", help="deflate-compress the connection")
    compression.add_argument(
        "--deflate-level", type=int_at_least(1), default=6, metavar="1-9", help="deflate level (default 6)"
    )


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    tls = parser.add_argument_group("TLS")
    tls.add_argument("--tls", action="store_true", help="upgrade connections to TLS (nsqd's tls_v1)")
    tls.add_argument(
        "--tls-root-ca-file", type=existing_file, metavar="PEM",
        help="CA bundle that signs the server certificate (implies --tls)",
    )
    tls.add_argument("--tls-cert", type=existing_file, metavar="PEM", help="client certificate (implies --tls)")
    tls.add_argument("--tls-key", type=existing_file, metavar="PEM", help="client private key, with --tls-cert")
    tls.add_argument(
        "--tls-insecure-skip-verify", action="store_true",
        help="do not verify the server certificate (implies --tls; for tests only)",
    )


def add_auth_option(parser: argparse.ArgumentParser) -> None:
    auth = parser.add_argument_group("AUTH")
    auth.add_argument(
        "--auth-secret", metavar="SECRET",
        help=f"secret for nsqd's AUTH (and lookupd's bearer token); prefer the {AUTH_SECRET_ENV} "
        "environment variable, which keeps it out of `ps`",
    )


def configure_logging(args: argparse.Namespace) -> None:
    # Quiet by default: a one-line error is the contract, and warnings (a reconnect)
    # would add lines. -v shows them, --debug everything.
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.ERROR
    logging.basicConfig(level=level, format=f"fastnsq {args.command}: %(levelname)s %(name)s: %(message)s")
    if not args.debug:
        logging.getLogger("aiohttp").setLevel(max(level, logging.WARNING))
        # asyncio's "exception was never retrieved" reports, written when a future is
        # collected, would add a traceback after the one-line error.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def run_async(coro: Any) -> Any:
    from ..loop import run

    return run(coro)


def resolve_topic(parser: argparse.ArgumentParser, args: argparse.Namespace, *, takes_body: bool) -> None:
    """TOPIC may be positional or ``--topic`` (the go tools' flag); a second word is then the BODY."""
    sub = subparser_of(parser, args.command)
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
            args.topic = topic_arg(positional)
        except argparse.ArgumentTypeError as exc:
            sub.error(f"argument TOPIC: {exc}")


def subparser_of(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse offers no public lookup of a subparser
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


def client_settings(args: argparse.Namespace) -> dict[str, Any]:
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


def passthrough_options(values: list[str], *, for_: str, flag: str) -> dict[str, Any]:
    """``--consumer-opt`` / ``--producer-opt`` values (go's tools' passthrough): typed options."""
    from ..options import parse_options

    try:
        return parse_options(values, for_=for_)  # type: ignore[arg-type]
    except InvalidValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def servers_of(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    nsqd, lookupd = list(args.nsqd_tcp_address), list(args.lookupd_http_address)
    if not nsqd and not lookupd:
        nsqd = [DEFAULT_NSQD_TCP]
    return nsqd, lookupd


async def check_nsqd(address: str, settings: dict[str, Any]) -> None:
    """Open and close one connection, so a wrong address, TLS or AUTH fails at once and clearly."""
    from ..config import connection_options
    from ..conn import Connection

    conn = Connection(address, connection_options(settings))  # the connection's own options only
    try:
        await conn.connect()
    except (OSError, asyncio.TimeoutError, NSQError) as exc:
        raise CommandError(f"cannot connect to nsqd {address}: {describe_error(exc)}") from exc
    try:
        require_tls(conn, settings)
    finally:
        await conn.close()


def require_tls(conn: Any, settings: dict[str, Any]) -> None:
    """nsqd without TLS answers IDENTIFY with tls_v1 false and the client goes on in clear text;
    a user who asked for TLS gets an error instead."""
    if settings.get("tls_v1") and not conn.identify_response.get("tls_v1"):
        raise CommandError(f"nsqd {conn.address} does not offer TLS (asked for by --tls and the --tls-* options)")


async def check_lookupd(address: str, topic: str | None, secret: str | None) -> None:
    """Ask the lookupd once (``/lookup`` for a topic, else ``/nodes``) so an unreachable one fails now."""
    from ..lookupd import LookupdClient

    async with LookupdClient(timeout=5.0, auth_secret=secret) as client:
        if topic is None:
            await client.nodes(address)
        else:
            await client.lookup(address, topic)


def install_stop_signals(callback: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not on the main thread
            loop.add_signal_handler(sig, callback)


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
