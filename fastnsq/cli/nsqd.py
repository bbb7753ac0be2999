"""``fastnsq nsqd``: run the embedded nsqd (and nsqlookupd) from the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any

from .. import codec
from ._common import (
    DEFAULT_NSQD_HTTP,
    DEFAULT_NSQD_TCP,
    existing_file,
    install_stop_signals,
    int_at_least,
    listen_address_arg,
    nsqd_address_arg,
    positive_float,
    run_async,
    subparser_of,
)


def _build_nsqd(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "nsqd", parents=[common], help="run the embedded nsqd (and nsqlookupd) until Ctrl-C",
        description="Run fastnsq's embedded nsqd, in memory, until Ctrl-C or SIGTERM; prints its addresses. "
        "Messages live in memory only and are gone when it stops.",
        epilog="Example: fastnsq nsqd --lookupd   (nsqd on 4150/4151, nsqlookupd on 4160/4161)",
    )
    sub.add_argument("--tcp-address", type=listen_address_arg, default=DEFAULT_NSQD_TCP, metavar="HOST:PORT",
                     help="TCP address to listen on, port 0 for any free port (default %(default)s)")
    sub.add_argument("--http-address", type=listen_address_arg, default=DEFAULT_NSQD_HTTP, metavar="HOST:PORT",
                     help="HTTP address to listen on, same host as --tcp-address (default %(default)s)")
    sub.add_argument("--broadcast-address", metavar="HOST",
                     help="address registered with nsqlookupd (default: the listening host)")
    sub.add_argument("--lookupd-tcp-address", action="append", type=nsqd_address_arg, default=[],
                     metavar="HOST:PORT", help="register with this nsqlookupd (may be given multiple times)")
    sub.add_argument("--lookupd", action="store_true",
                     help="also run an embedded nsqlookupd and register with it")
    sub.add_argument("--lookupd-tcp-port", type=int_at_least(0), default=4160, metavar="PORT",
                     help="embedded nsqlookupd TCP port, 0 for any (default %(default)s)")
    sub.add_argument("--lookupd-http-port", type=int_at_least(0), default=4161, metavar="PORT",
                     help="embedded nsqlookupd HTTP port, 0 for any (default %(default)s)")
    # Not asking fastnsq.testing whether HA is available here: building the parser runs for
    # every command, and importing the embedded servers (aiohttp) would slow `fastnsq pub`.
    sub.add_argument("--ha", action="store_true", help="speak the HA (youzan) dialect")
    sub.add_argument("--emulate", choices=("v1.3.0", "master"), default="v1.3.0",
                     help="answer like the released nsqd v1.3.0 (default) or nsq master 3103474b (topology fields)")
    limits = sub.add_argument_group("limits (nsqd's flags, durations in seconds)")
    limits.add_argument("--msg-timeout", type=positive_float, default=60.0, metavar="SECONDS",
                        help="default time before an unanswered message is requeued (default 60)")
    limits.add_argument("--max-rdy-count", type=int_at_least(1), default=codec.DEFAULT_MAX_RDY_COUNT,
                        metavar="N", help="maximum RDY count of a client (default %(default)s)")
    limits.add_argument("--max-msg-size", type=int_at_least(1), default=codec.DEFAULT_MAX_MSG_SIZE,
                        metavar="BYTES", help="maximum message size (default %(default)s)")
    limits.add_argument("--max-body-size", type=int_at_least(1), default=codec.DEFAULT_MAX_BODY_SIZE,
                        metavar="BYTES", help="maximum command body size (default %(default)s)")
    tls = sub.add_argument_group("TLS and AUTH (nsqd's flags)")
    tls.add_argument("--tls-cert", type=existing_file, metavar="PEM", help="server certificate: enables TLS")
    tls.add_argument("--tls-key", type=existing_file, metavar="PEM", help="server private key")
    tls.add_argument("--tls-root-ca-file", type=existing_file, metavar="PEM", help="CA that signs client certificates")
    tls.add_argument("--tls-client-auth-policy", choices=("require", "require-verify"),
                     help="ask clients for a certificate (and verify it)")
    tls.add_argument("--tls-required", action="store_true", help="refuse clients that do not upgrade to TLS")
    tls.add_argument("--auth-http-address", action="append", type=nsqd_address_arg, default=[], metavar="HOST:PORT",
                     help="auth server to ask for AUTH (may be given multiple times)")
    sub.set_defaults(run=_run_nsqd)


# ---- nsqd ---------------------------------------------------------------------------------


def _run_nsqd(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..testing import EMBEDDED_HA_AVAILABLE

    if args.ha and not EMBEDDED_HA_AVAILABLE:
        subparser_of(parser, "nsqd").error("--ha: the embedded nsqd does not speak the HA dialect yet")
    tcp_host, tcp_port = _split_listen(args.tcp_address)
    http_host, http_port = _split_listen(args.http_address)
    if tcp_host != http_host:
        subparser_of(parser, "nsqd").error(
            f"--tcp-address and --http-address must use the same host ({tcp_host} vs {http_host})"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        subparser_of(parser, "nsqd").error("--tls-cert and --tls-key go together")
    run_async(_serve_nsqd(args, tcp_host, tcp_port, http_port))
    return 0


async def _serve_nsqd(args: argparse.Namespace, host: str, tcp_port: int, http_port: int) -> None:
    from ..testing import NSQLookupd
    from ..testing.nsqd import NSQD

    stop = asyncio.Event()
    install_stop_signals(stop.set)
    watch = _watch_parent(stop)
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
    if watch is not None:
        watch.cancel()
    print("stopped", flush=True)


#: How often the embedded nsqd started by fastnsq.testing looks whether its parent is still there.
PARENT_CHECK_INTERVAL = 0.5


def _watch_parent(stop: asyncio.Event) -> asyncio.Task[None] | None:
    """With FASTNSQ_STOP_WITH_PARENT=PID (set by fastnsq.testing's NSQDProcess): stop once this
    process's parent is no longer PID (it died and the process was reparented)."""
    parent = os.environ.get("FASTNSQ_STOP_WITH_PARENT", "")
    if not parent.isdigit():
        return None

    async def watch() -> None:
        while os.getppid() == int(parent):
            await asyncio.sleep(PARENT_CHECK_INTERVAL)
        print(f"the parent process {parent} is gone: stopping", flush=True)
        stop.set()

    return asyncio.get_running_loop().create_task(watch())


def _split_listen(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _hostname() -> str:
    import socket

    return socket.gethostname()
