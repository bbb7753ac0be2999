"""The HTTP API of the embedded nsqd (nsqd 1.3's ``nsqd/http.go``), on aiohttp.

Routes, status codes, error names and headers as nsqd answers them:

- ``GET /ping`` -> ``OK`` (text/plain, no X-Nsq-Content-Type);
- ``GET /info``, ``GET /stats`` (``format=json``, ``topic=``, ``channel=``,
  ``include_clients=``, ``include_mem=``; text otherwise);
- ``POST /pub?topic=`` (``defer=`` ms), ``POST /mpub?topic=`` (newline-separated, or
  ``binary=true`` for the MPUB body format);
- ``POST /topic/create|delete|empty|pause|unpause?topic=``,
  ``POST /channel/create|delete|empty|pause|unpause?topic=&channel=``.

Every answer but /ping carries ``X-Nsq-Content-Type: nsq; version=1.0``; a 200 with a
text body is ``text/plain; charset=utf-8`` (Go sniffs it), JSON bodies and errors are
``application/json; charset=utf-8`` (errors are ``{"message": "<NAME>"}``), and an
empty 200 has no Content-Type at all.
"""

from __future__ import annotations

import gc
import json
import resource
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from fastnsq import codec

from ._nsqd_base import NSQDIdentity
from ._nsqd_queue import new_message

if TYPE_CHECKING:  # pragma: no cover
    from ._nsqd_queue import Topic

__all__ = ["HTTPServer", "build_app"]


class HTTPServer(NSQDIdentity, Protocol):
    """What the HTTP API uses of its nsqd."""

    @property
    def start_time(self) -> int: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    def next_id(self) -> bytes: ...

    def take_ids(self, count: int) -> int: ...

    async def get_topic_async(self, name: str) -> Topic: ...

    def delete_topic(self, name: str) -> bool: ...

    def stats(
        self, topic_name: str = "", channel_name: str = "", include_clients: bool = True
    ) -> dict[str, Any]: ...

_V1 = {"X-Nsq-Content-Type": "nsq; version=1.0"}
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

Handler = Callable[[web.Request], Awaitable[web.Response]]


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


def _respond(status: int, data: Any) -> web.Response:
    """nsqd's http_api.RespondV1."""
    headers = dict(_V1)
    if status != 200:
        body = json.dumps({"message": data}, separators=(",", ":")).encode()
        return web.Response(
            status=status, body=body, content_type="application/json", charset="utf-8", headers=headers
        )
    if data is None:
        return web.Response(status=200, body=b"", headers=headers)
    if isinstance(data, str):
        return web.Response(
            status=200, text=data, content_type="text/plain", charset="utf-8", headers=headers
        )
    body = json.dumps(data, separators=(",", ":")).encode()
    return web.Response(
        status=200, body=body, content_type="application/json", charset="utf-8", headers=headers
    )


def _v1(handler: Callable[[HTTPServer, web.Request], Awaitable[Any]], nsqd: HTTPServer) -> Handler:
    async def respond(request: web.Request) -> web.Response:
        try:
            data = await handler(nsqd, request)
        except _HTTPError as err:
            return _respond(err.status, err.message)
        return _respond(200, data)

    return respond


def _topic_from_query(request: web.Request) -> str:
    """getTopicFromQuery: MISSING_ARG_TOPIC / INVALID_TOPIC."""
    if "topic" not in request.query:
        raise _HTTPError(400, "MISSING_ARG_TOPIC")
    name = request.query.getall("topic")[0]
    if not codec.valid_topic_name(name):
        raise _HTTPError(400, "INVALID_TOPIC")
    return name


def _topic_channel_args(request: web.Request) -> tuple[str, str]:
    """http_api.GetTopicChannelArgs."""
    query = request.query
    if "topic" not in query:
        raise _HTTPError(400, "MISSING_ARG_TOPIC")
    topic = query.getall("topic")[0]
    if not codec.valid_topic_name(topic):
        raise _HTTPError(400, "INVALID_ARG_TOPIC")
    if "channel" not in query:
        raise _HTTPError(400, "MISSING_ARG_CHANNEL")
    channel = query.getall("channel")[0]
    if not codec.valid_channel_name(channel):
        raise _HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit + 1`` bytes of the body (nsqd's io.LimitReader)."""
    chunks = []
    size = 0
    while size <= limit:
        chunk = await request.content.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def _ping(nsqd: HTTPServer, request: web.Request) -> web.Response:
    # PlainText decorator: no X-Nsq-Content-Type.
    return web.Response(text="OK", content_type="text/plain", charset="utf-8")


async def _info(nsqd: HTTPServer, request: web.Request) -> Any:
    options = nsqd.options
    info = {
        "version": nsqd.version,
        "broadcast_address": options.broadcast_address,
        "hostname": nsqd.hostname,
        "http_port": nsqd.http_port,
        "tcp_port": nsqd.tcp_port,
        "start_time": nsqd.start_time,
        "max_heartbeat_interval": round(options.max_heartbeat_interval * 1e9),
        "max_output_buffer_size": options.max_output_buffer_size,
        "max_output_buffer_timeout": round(options.max_output_buffer_timeout * 1e9),
        "max_deflate_level": options.max_deflate_level,
    }
    if options.topology:
        info["topology_zone"] = options.topology_zone
        info["topology_region"] = options.topology_region
    return info


async def _pub(nsqd: HTTPServer, request: web.Request) -> Any:
    options = nsqd.options
    if request.content_length is not None and request.content_length > options.max_msg_size:
        raise _HTTPError(413, "MSG_TOO_BIG")
    body = await _read_limited(request, options.max_msg_size)
    if len(body) > options.max_msg_size:
        raise _HTTPError(413, "MSG_TOO_BIG")
    if not body:
        raise _HTTPError(400, "MSG_EMPTY")
    name = _topic_from_query(request)
    defer_ms = 0
    if "defer" in request.query:
        try:
            defer_ms = int(request.query.getall("defer")[0], 10)
        except ValueError:
            raise _HTTPError(400, "INVALID_DEFER") from None
        if defer_ms < 0 or defer_ms > int(options.max_req_timeout * 1000):
            raise _HTTPError(400, "INVALID_DEFER")
    topic = await nsqd.get_topic_async(name)
    msg = new_message(nsqd.next_id(), body, time.time_ns(), defer_ms)
    topic.put([msg], len(body), deferrable=defer_ms > 0)
    return "OK"


async def _mpub(nsqd: HTTPServer, request: web.Request) -> Any:
    options = nsqd.options
    if request.content_length is not None and request.content_length > options.max_body_size:
        raise _HTTPError(413, "BODY_TOO_BIG")
    name = _topic_from_query(request)
    binary = False
    if "binary" in request.query:
        # Any other value is a deprecated "true" in nsqd.
        binary = _BOOL_PARAMS.get(request.query.getall("binary")[0], True)
    topic = await nsqd.get_topic_async(name)
    body = await _read_limited(request, options.max_body_size)
    if binary:
        try:
            bodies = codec.decode_mpub(body, options.max_msg_size, options.max_body_size)
        except ValueError as exc:
            raise _HTTPError(413, exc.args[0][2:]) from None
    else:
        if len(body) > options.max_body_size:
            raise _HTTPError(413, "BODY_TOO_BIG")
        bodies = [line for line in body.split(b"\n") if line]
        for line in bodies:
            if len(line) > options.max_msg_size:
                raise _HTTPError(413, "MSG_TOO_BIG")
    if bodies:
        first = nsqd.take_ids(len(bodies))
        timestamp = time.time_ns()
        msgs = [(b"%016x" % (first + i), data, timestamp, 0, 0) for i, data in enumerate(bodies)]
        topic.put(msgs, sum(map(len, bodies)))
    return "OK"


async def _topic_create(nsqd: HTTPServer, request: web.Request) -> Any:
    await nsqd.get_topic_async(_topic_from_query(request))
    return None


def _existing_topic_name(request: web.Request, validate: bool) -> str:
    if "topic" not in request.query:
        raise _HTTPError(400, "MISSING_ARG_TOPIC")
    name = request.query.getall("topic")[0]
    if validate and not codec.valid_topic_name(name):
        raise _HTTPError(400, "INVALID_TOPIC")
    return name


async def _topic_delete(nsqd: HTTPServer, request: web.Request) -> Any:
    if not nsqd.delete_topic(_existing_topic_name(request, validate=False)):
        raise _HTTPError(404, "TOPIC_NOT_FOUND")
    return None


async def _topic_empty(nsqd: HTTPServer, request: web.Request) -> Any:
    topic = nsqd.topics.get(_existing_topic_name(request, validate=True))
    if topic is None:
        raise _HTTPError(404, "TOPIC_NOT_FOUND")
    topic.empty()
    return None


async def _topic_pause(nsqd: HTTPServer, request: web.Request) -> Any:
    topic = nsqd.topics.get(_existing_topic_name(request, validate=False))
    if topic is None:
        raise _HTTPError(404, "TOPIC_NOT_FOUND")
    if "unpause" in request.path:
        topic.unpause()
    else:
        topic.pause()
    return None


def _existing_channel(nsqd: HTTPServer, request: web.Request) -> tuple[Any, str]:
    topic_name, channel_name = _topic_channel_args(request)
    topic = nsqd.topics.get(topic_name)
    if topic is None:
        raise _HTTPError(404, "TOPIC_NOT_FOUND")
    return topic, channel_name


async def _channel_create(nsqd: HTTPServer, request: web.Request) -> Any:
    topic, channel_name = _existing_channel(nsqd, request)
    topic.get_channel(channel_name)
    return None


async def _channel_delete(nsqd: HTTPServer, request: web.Request) -> Any:
    topic, channel_name = _existing_channel(nsqd, request)
    if not topic.delete_channel(channel_name):
        raise _HTTPError(404, "CHANNEL_NOT_FOUND")
    return None


async def _channel_empty(nsqd: HTTPServer, request: web.Request) -> Any:
    topic, channel_name = _existing_channel(nsqd, request)
    channel = topic.channels.get(channel_name)
    if channel is None:
        raise _HTTPError(404, "CHANNEL_NOT_FOUND")
    channel.empty()
    return None


async def _channel_pause(nsqd: HTTPServer, request: web.Request) -> Any:
    topic, channel_name = _existing_channel(nsqd, request)
    channel = topic.channels.get(channel_name)
    if channel is None:
        raise _HTTPError(404, "CHANNEL_NOT_FOUND")
    if "unpause" in request.path:
        channel.unpause()
    else:
        channel.pause()
    return None


def _memory_stats() -> dict[str, int]:
    """The ``memory`` section: Go runtime fields, filled with what Python can tell."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    counts = gc.get_count()
    return {
        "heap_objects": sum(counts),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": usage.ru_maxrss * 1024,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": 0,
        "gc_pause_usec_99": 0,
        "gc_pause_usec_95": 0,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


async def _stats(nsqd: HTTPServer, request: web.Request) -> Any:
    query = request.query
    topic_name = query.get("topic", "")
    channel_name = query.get("channel", "")
    include_clients = _BOOL_PARAMS.get(query.get("include_clients", ""), True)
    include_mem = _BOOL_PARAMS.get(query.get("include_mem", ""), True)
    stats = nsqd.stats(topic_name, channel_name, include_clients)
    if query.get("format", "") != "json":
        return _stats_text(nsqd, stats)
    out: dict[str, Any] = {
        "version": nsqd.version,
        "health": "OK",
        "start_time": nsqd.start_time,
        "topics": stats["topics"],
    }
    if include_mem:
        out["memory"] = _memory_stats()
    out["producers"] = stats["producers"]
    return out


def _stats_text(nsqd: HTTPServer, stats: dict[str, Any]) -> str:
    """The plain-text /stats (nsqd's printStats, abridged)."""
    lines = [f"nsqd v{nsqd.version} (embedded fastnsq)", f"start_time {nsqd.start_time}", "", "Health: OK", ""]
    topics = stats["topics"] or []
    if not topics:
        lines.append("Topics: None")
    else:
        lines.append("Topics:")
    for topic in topics:
        prefix = "*P " if topic["paused"] else "   "
        lines.append(
            f"{prefix}[{topic['topic_name']:<15}] depth: {topic['depth']:<5} be-depth: 0     "
            f"msgs: {topic['message_count']:<8} e2e%: "
        )
        for channel in topic["channels"]:
            prefix = "   *P " if channel["paused"] else "      "
            lines.append(
                f"{prefix}[{channel['channel_name']:<25}] depth: {channel['depth']:<5} be-depth: 0     "
                f"inflt: {channel['in_flight_count']:<4} def: {channel['deferred_count']:<4} "
                f"re-q: {channel['requeue_count']:<5} timeout: {channel['timeout_count']:<5} "
                f"msgs: {channel['message_count']:<8} e2e%: "
            )
    producers = stats["producers"] or []
    lines.append("")
    lines.append("Producers: None" if not producers else "Producers:")
    for producer in producers:
        lines.append(f"   [V2 {producer['hostname']}:{producer['remote_address']}] {producer['pub_counts']}")
    return "\n".join(lines) + "\n"


@web.middleware
async def _not_found(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """httprouter's NotFound / MethodNotAllowed answers in nsqd's JSON form."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return _respond(405, "METHOD_NOT_ALLOWED")
    except web.HTTPNotFound:
        return _respond(404, "NOT_FOUND")


def build_app(nsqd: HTTPServer) -> web.Application:
    """The aiohttp application serving ``nsqd``'s HTTP API."""
    app = web.Application(middlewares=[_not_found], client_max_size=nsqd.options.max_body_size + 1)

    async def ping(request: web.Request) -> web.Response:
        return await _ping(nsqd, request)

    app.router.add_get("/ping", ping, allow_head=False)
    app.router.add_get("/info", _v1(_info, nsqd), allow_head=False)
    app.router.add_post("/pub", _v1(_pub, nsqd))
    app.router.add_post("/mpub", _v1(_mpub, nsqd))
    app.router.add_get("/stats", _v1(_stats, nsqd), allow_head=False)
    for path, handler in (
        ("/topic/create", _topic_create),
        ("/topic/delete", _topic_delete),
        ("/topic/empty", _topic_empty),
        ("/topic/pause", _topic_pause),
        ("/topic/unpause", _topic_pause),
        ("/channel/create", _channel_create),
        ("/channel/delete", _channel_delete),
        ("/channel/empty", _channel_empty),
        ("/channel/pause", _channel_pause),
        ("/channel/unpause", _channel_pause),
    ):
        app.router.add_post(path, _v1(handler, nsqd))
    return app
