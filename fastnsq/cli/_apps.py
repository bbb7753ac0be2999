"""The flags nsq's apps share (``nsq_to_file``, ``nsq_to_http``, ``nsq_to_nsq``), Go's names and defaults.

One job: the consuming and runtime flags of ``fastnsq to-file`` / ``to-nsq`` / ``to-http``,
and turning them into an :class:`~fastnsq.apps.hosting.AppRun`. Durations take Go's form
(``30s``, ``1m``) or seconds; Go's one-dash spelling is rewritten before parsing
(:mod:`fastnsq.apps.goflags`).
"""

from __future__ import annotations

import argparse
from typing import Any

from .._version import __version__
from ..options import parse_duration
from ._common import UsageError, channel_arg, client_settings, int_at_least, passthrough_options, topic_arg

#: Go's --log-level words and ours.
LOG_LEVELS = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR", "fatal": "CRITICAL"}


def duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_consume_flags(parser: argparse.ArgumentParser, *, app: str, several_topics: bool = True) -> Any:
    """--topic, --channel, --max-in-flight, --consumer-opt and the runtime's flags; the
    consuming group, for the app's own consuming flags."""
    what = parser.add_argument_group(f"what to consume ({app}'s flags)")
    what.add_argument("--version", action="version", version=f"fastnsq {parser.prog.split()[-1]} v{__version__} "
                      f"(in place of {app})", help="print version string")
    what.add_argument("--topic", action="append", type=topic_arg, default=[], metavar="TOPIC",
                      help="nsq topic" + (" (may be given multiple times)" if several_topics else ""))
    what.add_argument("--channel", type=channel_arg, default=app, help=f"nsq channel (default {app})")
    what.add_argument("--max-in-flight", type=int_at_least(1), default=200, metavar="N",
                      help="max number of messages to allow in flight (default 200)")
    what.add_argument("--consumer-opt", action="append", default=[], metavar="NAME,VALUE",
                      help="option to pass through to the Consumer (go-nsq's names; may be given multiple times)")
    what.add_argument("--log-level", type=str.lower, choices=sorted(LOG_LEVELS), default="info",
                      help="log verbosity: debug, info, warn, error, or fatal, any case (default info)")
    what.add_argument("--log-prefix", default=None, help="accepted for nsq_to_file's command lines; "
                      "our lines carry the app's name and pid instead")
    runtime = parser.add_argument_group("runtime (fastnsq's own)")
    runtime.add_argument("--metrics-port", type=int_at_least(0), metavar="PORT",
                         help="serve /metrics, /healthz and /readyz on this port (0: any free one; default: none)")
    runtime.add_argument("--http-host", default="127.0.0.1", metavar="HOST", help="their address (default 127.0.0.1)")
    runtime.add_argument("--drain-timeout", type=duration_arg, default=30.0, metavar="DURATION",
                         help="on SIGTERM/SIGINT, how long to finish what is held before the rest is requeued "
                              "(default 30s)")
    runtime.add_argument("--dead-letter-topic", type=topic_arg, metavar="TOPIC",
                         help="messages past max_attempts are published to TOPIC (the body as it came), then "
                              "finished (default: finished with a WARNING line naming the message)")
    return what


def consumer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Consumer's options: connection flags, then --consumer-opt (max_in_flight is --max-in-flight's)."""
    connection = {name: value for name, value in client_settings(args).items()
                  if value not in (None, False) and name != "user_agent"}
    passed = passthrough_options(args.consumer_opt, for_="consumer", flag="--consumer-opt")
    passed.pop("max_in_flight", None)  # nsq's apps set it from --max-in-flight after the passthrough
    dead = {"dead_letter_topic": args.dead_letter_topic} if getattr(args, "dead_letter_topic", None) else {}
    return {**connection, **passed, **dead}


def require_servers(args: argparse.Namespace) -> None:
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        raise UsageError("--nsqd-tcp-address or --lookupd-http-address required")


def log_level(args: argparse.Namespace) -> str:
    return "DEBUG" if args.debug else LOG_LEVELS[args.log_level]


def add_app_parser(commands: Any, parents: list[argparse.ArgumentParser], name: str, *, help: str,
                   description: str, epilog: str) -> argparse.ArgumentParser:
    """The app's subcommand, with the shared parents (the common and connection flags)."""
    return commands.add_parser(name, parents=parents, help=help, description=description, epilog=epilog,
                               formatter_class=argparse.RawDescriptionHelpFormatter)


def add_http_timeouts(group: Any, *, request_default: str, note: str = "") -> None:
    """nsq's apps' --http-client-connect-timeout (2s) and --http-client-request-timeout."""
    group.add_argument("--http-client-connect-timeout", type=duration_arg, default=2.0, metavar="DURATION",
                       help=f"timeout for HTTP connect (default 2s{note})")
    group.add_argument("--http-client-request-timeout", type=duration_arg, default=parse_duration(request_default),
                       metavar="DURATION", help=f"timeout for HTTP request (default {request_default}{note})")


def check_http_timeouts(args: argparse.Namespace) -> None:
    for flag in ("http_client_connect_timeout", "http_client_request_timeout"):
        if getattr(args, flag) <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} should be positive")


def run_app_from(args: argparse.Namespace, *, name: str, target: str, topics: list[str],
                 handler_options: dict[str, Any], consumer: dict[str, Any] | None = None,
                 **more: Any) -> int:
    """Run the app on the worker runtime with the shared flags (servers, --channel,
    --max-in-flight, --consumer-opt, the runtime's); ``more``: the rest of
    :class:`~fastnsq.apps.hosting.AppRun`'s fields. A bad setting is a usage error."""
    from ..apps.hosting import AppRun, SettingsError, run_app

    app = AppRun(
        name=name, target=target, topic="", topics=topics, channel=args.channel,
        nsqd_tcp_addresses=args.nsqd_tcp_address, lookupd_http_addresses=args.lookupd_http_address,
        max_in_flight=args.max_in_flight,
        consumer_options=consumer_options(args) if consumer is None else consumer,
        handler_options=handler_options,
        # A quarter of max in flight a batch: several on the wire while nsqd refills the rest.
        batch_size=max(1, args.max_in_flight // 4),
        metrics_port=args.metrics_port, http_host=args.http_host, drain_timeout=args.drain_timeout,
        log_level=log_level(args), **more,
    )
    try:
        return run_app(app)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
