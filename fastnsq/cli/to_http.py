"""``fastnsq to-http``: nsq_to_http's command line, on fastnsq (:mod:`fastnsq.apps.to_http`)."""

from __future__ import annotations

import argparse
from typing import Any

from ._apps import (
    add_app_parser,
    add_consume_flags,
    add_http_timeouts,
    check_http_timeouts,
    require_servers,
    run_app_from,
)
from ._common import UsageError, int_at_least

_EPILOG = """\
Flags as nsq_to_http's (one dash or two: -topic=events -post=http://...). A message is FINed
when its request succeeds (POST: a 2xx; GET: a 200) and requeued with backoff otherwise.
Beyond nsq_to_http: --batch N (up to N bodies a POST, newline-delimited), --mode fan-out,
--metrics-port, --drain-timeout. docs/apps.md maps every nsq_to_http flag.
"""


def _build_to_http(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = add_app_parser(commands, [common, client], "to-http", help="feed topics to HTTP services (nsq_to_http)",
                         description="Consume TOPIC and make an HTTP request per message (nsq_to_http), or per "
                                     "batch (--batch).", epilog=_EPILOG)
    add_consume_flags(sub, app="nsq_to_http")
    out = sub.add_argument_group("requests (nsq_to_http's flags)")
    out.add_argument("--post", action="append", default=[], metavar="URL",
                     help="HTTP address to make a POST request to.  data will be in the body (may be given "
                          "multiple times)")
    out.add_argument("--get", action="append", default=[], metavar="URL",
                     help="HTTP address to make a GET request to. '%%s' will be printf replaced with data "
                          "(may be given multiple times)")
    out.add_argument("--header", action="append", default=[], metavar="'KEY: VALUE'",
                     help="Custom header for HTTP requests (may be given multiple times)")
    out.add_argument("--content-type", default=None, metavar="TYPE",
                     help="the Content-Type used for POST requests (default application/octet-stream)")
    out.add_argument("--mode", choices=("round-robin", "hostpool", "epsilon-greedy", "fan-out"), default="hostpool",
                     help="round-robin, hostpool (default), epsilon-greedy (taken as hostpool), or fan-out "
                          "(every address gets every message)")
    out.add_argument("-n", "--n", type=int_at_least(1), default=100, metavar="N",
                     help="number of concurrent publishers (requests at once; default 100)")
    out.add_argument("--sample", type=float, default=1.0, metavar="0-1",
                     help="%% of messages to publish (float b/w 0 -> 1)")
    add_http_timeouts(out, request_default="20s")
    out.add_argument("--status-every", type=int, default=250, metavar="N",
                     help="the # of requests between logging status (per handler), 0 disables")
    out.add_argument("--batch", type=int_at_least(1), default=1, metavar="N",
                     help="fastnsq's: up to N bodies a POST, one per line (default 1: a request per message)")
    sub.set_defaults(run=_run_to_http)


def parse_headers(values: list[str]) -> dict[str, str]:
    """``Key: Value`` pairs, trimmed, both non-empty (nsq_to_http's rule)."""
    headers = {}
    for text in values:
        key, sep, value = text.partition(":")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--header {text!r}: invalid header (KEY: VALUE)")
        headers[key.strip()] = value.strip()
    return headers


def _check(args: argparse.Namespace) -> None:
    if not args.topic or not args.channel:
        raise UsageError("--topic and --channel are required")
    require_servers(args)
    if not args.get and not args.post:
        raise UsageError("--get or --post required")
    if args.get and args.post:
        raise UsageError("use --get or --post not both")
    for url in args.get:
        if url.count("%s") != 1:
            raise UsageError(f"--get {url!r}: invalid GET address - must be a printf string with exactly one %s")
    if args.content_type is not None and (not args.post or not args.content_type):
        raise UsageError("--content-type only used with --post" if not args.post
                         else "--content-type requires a value when used")
    if not 0.0 <= args.sample <= 1.0:
        raise UsageError(f"--sample {args.sample}: must be between 0 and 1")
    if args.batch > 1 and args.get:
        raise UsageError(f"--batch {args.batch}: only with --post (a GET carries one body)")
    check_http_timeouts(args)


def _run_to_http(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _check(args)
    return run_app_from(
        args, name="to-http", target="fastnsq.apps.to_http:ToHttp", topics=list(dict.fromkeys(args.topic)),
        batch_wait=0.005, handler_options={
            "method": "POST" if args.post else "GET", "addresses": args.post or args.get, "mode": args.mode,
            "concurrency": args.n, "headers": parse_headers(args.header),
            "content_type": args.content_type or "application/octet-stream",
            "connect_timeout": args.http_client_connect_timeout,
            "request_timeout": args.http_client_request_timeout, "sample": args.sample,
            "per_request": args.batch, "status_every": args.status_every,
        },
    )
