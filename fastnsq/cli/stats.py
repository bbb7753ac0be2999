"""``fastnsq stats``: the topics and channels of an nsqd, or of every nsqd a lookupd knows."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
from typing import Any

from ._common import (
    AUTH_SECRET_ENV,
    DEFAULT_NSQD_HTTP,
    CommandError,
    add_auth_option,
    add_tls_options,
    channel_arg,
    describe_error,
    http_address_arg,
    positive_float,
    run_async,
    topic_arg,
)
from .console import format_table


def _build_stats(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "stats", parents=[common], help="topics and channels of an nsqd or a lookupd's cluster",
        description="Show the topics and channels of nsqd (its /stats over HTTP) or of every nsqd a "
        "nsqlookupd knows (its /nodes): depth, in flight, deferred, requeued, timed out, messages, "
        "clients. Like nsq_stat, it talks to the HTTP ports.",
        epilog="Default: --nsqd-http-address 127.0.0.1:4151. Addresses may be http(s)://host:port.",
    )
    where = sub.add_argument_group("servers")
    where.add_argument("--nsqd-http-address", action="append", type=http_address_arg, default=[], metavar="HOST:PORT",
                       help="nsqd HTTP address (may be given multiple times)")
    where.add_argument("--lookupd-http-address", action="append", type=http_address_arg, default=[],
                       metavar="HOST:PORT", help="nsqlookupd HTTP address: every nsqd it lists (may be repeated)")
    sub.add_argument("--topic", type=topic_arg, help="only this topic")
    sub.add_argument("--channel", type=channel_arg, help="only this channel")
    sub.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    sub.add_argument("--timeout", type=positive_float, default=5.0, metavar="SECONDS",
                     help="HTTP request timeout (default 5)")
    add_tls_options(sub)
    add_auth_option(sub)
    sub.set_defaults(run=_run_stats)


# ---- stats ------------------------------------------------------------------------------------


_STATS_COLUMNS = ("DEPTH", "IN-FLIGHT", "DEFERRED", "REQUEUED", "TIMED-OUT", "MESSAGES", "CLIENTS")


def _run_stats(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    nodes = run_async(_collect_stats(args))
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

    from ..lookupd import LookupdClient, normalize_lookupd_address

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
