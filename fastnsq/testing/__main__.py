"""Run the embedded nsqd (and nsqlookupd) from a shell until Ctrl-C or SIGTERM.

One job: ``python -m fastnsq.testing`` starts the servers, prints their addresses
and keeps them up, for manual tests and demos without a real NSQ install::

    python -m fastnsq.testing                     # nsqd on 4150/4151
    python -m fastnsq.testing --lookupd           # + nsqlookupd on 4160/4161, nsqd registered with it
    python -m fastnsq.testing --tcp-port 0 --http-port 0   # any free ports
    python -m fastnsq.testing --ha --lookupd      # the HA (youzan) dialect, standalone

Everything is in memory: messages are gone when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from fastnsq.errors import InvalidValueError

from . import EMBEDDED_HA_AVAILABLE
from ._nsqd_base import HA_VERSION
from .lookupd import NSQLookupd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fastnsq.testing",
        description="Run fastnsq's embedded nsqd (and nsqlookupd), in memory, until Ctrl-C or SIGTERM.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument(
        "--broadcast-address", default=None, help="address nsqd registers with lookupd (default: --host)"
    )
    parser.add_argument(
        "--tcp-port", type=int, default=4150, help="nsqd TCP port, 0 for any (default %(default)s)"
    )
    parser.add_argument(
        "--http-port", type=int, default=4151, help="nsqd HTTP port, 0 for any (default %(default)s)"
    )
    parser.add_argument("--no-nsqd", action="store_true", help="run only the nsqlookupd (implies --lookupd)")
    parser.add_argument(
        "--lookupd", action="store_true", help="also run an nsqlookupd and register nsqd with it"
    )
    parser.add_argument(
        "--lookupd-tcp-port", type=int, default=4160, help="nsqlookupd TCP port (default %(default)s)"
    )
    parser.add_argument(
        "--lookupd-http-port", type=int, default=4161, help="nsqlookupd HTTP port (default %(default)s)"
    )
    parser.add_argument("--ha", action="store_true", help="speak the HA (youzan) dialect")
    parser.add_argument(
        "--emulate",
        choices=("v1.3.0", "master"),
        default="v1.3.0",
        help="answer like the released nsqd v1.3.0 (default) or nsq master 3103474b (topology fields)",
    )
    parser.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop (default: uvloop if installed)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log registrations and connections")
    return parser


async def serve(args: argparse.Namespace, ready: asyncio.Future[list[str]] | None = None) -> None:
    """Start the servers ``args`` describe, print their addresses, run until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
            loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        lines: list[str] = []
        lookupd_tcp: list[str] = []
        if args.lookupd or args.no_nsqd:
            # With --ha a standalone lookupd, as youzan's runs beside a standalone nsqd.
            extra: dict[str, Any] = {"ha_cluster": False} if args.ha else {"emulate": args.emulate}
            lookupd = NSQLookupd(
                host=args.host,
                tcp_port=args.lookupd_tcp_port,
                http_port=args.lookupd_http_port,
                ha=args.ha,
                **extra,
            )
            await stack.enter_async_context(lookupd)
            lookupd_tcp.append(lookupd.tcp_address)
            lines.append(f"nsqlookupd  tcp {lookupd.tcp_address}  http {lookupd.http_address}")
        if not args.no_nsqd:
            from .nsqd import NSQD

            options: dict[str, Any] = {
                "host": args.host,
                "tcp_port": args.tcp_port,
                "http_port": args.http_port,
            }
            options["broadcast_address"] = args.broadcast_address or args.host
            nsqd = NSQD(lookupd_tcp_addresses=lookupd_tcp, ha=args.ha, emulate=args.emulate, **options)
            await stack.enter_async_context(nsqd)
            lines.append(f"nsqd        tcp {nsqd.tcp_address}  http {nsqd.http_address}")
        for line in lines:
            print(line, flush=True)
        like = f"the HA nsqd {HA_VERSION}" if args.ha else f"nsqd {args.emulate}"
        print(f"running (answering like {like}); Ctrl-C to stop", flush=True)
        if ready is not None:
            ready.set_result(lines)
        await stop.wait()
    print("stopped", flush=True)


def _run(args: argparse.Namespace) -> None:
    if args.loop == "asyncio":
        asyncio.run(serve(args))
        return
    try:
        import uvloop
    except ImportError:
        if args.loop == "uvloop":
            raise SystemExit("uvloop is not installed") from None
        asyncio.run(serve(args))
        return
    uvloop.run(serve(args))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ha and not EMBEDDED_HA_AVAILABLE:
        print("error: HA mode not built yet", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        _run(args)
    except ModuleNotFoundError as exc:
        if exc.name != "fastnsq.testing.nsqd":
            raise
        print(
            "error: the embedded nsqd is not built yet; run with --no-nsqd for nsqlookupd alone",
            file=sys.stderr,
        )
        return 2
    except (InvalidValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
