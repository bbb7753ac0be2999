"""``fastnsq bench``: fastnsq's benchmark workloads against an nsqd (or a child one)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._common import (
    UsageError,
    add_auth_option,
    add_compression_options,
    add_tls_options,
    check_nsqd,
    client_settings,
    int_at_least,
    nsqd_address_arg,
    positive_float,
    run_async,
)
from .console import ProgressLine, format_table


class _Workloads:
    """The workload names, read from fastnsq.benchmark only when a --workload is checked: that
    module imports the whole client, which every other command's start-up need not pay for."""

    def _names(self) -> list[str]:
        from ..benchmark import SCENARIOS

        return list(SCENARIOS)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Any:
        return iter(self._names())


def _build_bench(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "bench", parents=[common], help="fastnsq's benchmark workloads, with a progress bar and a table",
        description="Run fastnsq's benchmark scenarios (fastnsq.benchmark, the harness of bench/) against "
        "the embedded nsqd started in a child process, or against --nsqd-tcp-address: a progress line "
        "while each runs, a table at the end (client CPU seconds per million messages; the server's too "
        "when it is the embedded one).",
        epilog="Example: fastnsq bench --workload pub --workload consume-batches --count 100000",
    )
    where = sub.add_argument_group("servers (default: an embedded nsqd in a child process)")
    where.add_argument("--nsqd-tcp-address", type=nsqd_address_arg, metavar="HOST:PORT",
                       help="benchmark this nsqd instead")
    where.add_argument("--nsqd-http-address", type=nsqd_address_arg, metavar="HOST:PORT",
                       help="its HTTP address: consumers end when /stats shows the channel drained, "
                       "and each workload's topic is deleted afterwards")
    sub.add_argument("--workload", action="append", choices=_Workloads(), metavar="NAME",
                     help="run only this workload (may be given multiple times; --list shows them)")
    sub.add_argument("--list", action="store_true", help="list the workloads and exit")
    sub.add_argument("--count", type=int_at_least(1), metavar="N",
                     help="measured messages per workload (default: each workload's own; a tenth more warm up)")
    sub.add_argument("--size", type=int_at_least(1), metavar="BYTES", help="message body size (default 100)")
    sub.add_argument("--max-seconds", type=positive_float, metavar="SECONDS", help="cap each workload's run")
    sub.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    add_tls_options(sub)
    add_auth_option(sub)
    add_compression_options(sub)
    sub.set_defaults(run=_run_bench)


# ---- bench ------------------------------------------------------------------------------------


def _run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..benchmark import SCENARIOS
    from ..testing.process import NSQDProcess  # one home for nsqd child processes; imported on use

    if args.list:
        rows = [[name, scenario.description] for name, scenario in SCENARIOS.items()]
        print(format_table(["WORKLOAD", "WHAT IT MEASURES"], rows))
        return 0
    if args.nsqd_http_address and not args.nsqd_tcp_address:
        raise UsageError("--nsqd-http-address goes with --nsqd-tcp-address")
    settings = client_settings(args)
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
        results = run_async(_bench(names, args, settings, tcp, http, pid))
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
    from .. import benchmark

    await check_nsqd(tcp, settings)
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
