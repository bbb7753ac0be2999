"""The HTTP API of the embedded HA nsqd (youzan ``nsqdserver/http.go``), on aiohttp.

A subset, enough for tests and tools: ``GET /ping``, ``GET /info`` (with
``ha_support``, true only on a cluster node), ``GET /stats`` (one entry per topic
partition, with ``topic_partition`` and ``is_leader``), ``POST /pub``, ``/mpub``,
``/pubtrace``, ``/pub_ext`` (``topic=``, ``partition=``; ``trace_id=``; ``ext=`` plus
``X-Nsqext-<key>`` headers), ``GET /message/get`` (``search_mode=count|virtual_offset``,
``search_pos=``: where a message begins) and ``POST /channel/create|delete|empty|pause|unpause|setorder|setoffset``
(``topic=``, ``partition=``, ``channel=``; ``order=true|false``; ``setoffset``'s body is a
start position, ``<type>:<value>``, applied whatever clients the channel has).

Answers follow youzan's content negotiation: with ``Accept: application/vnd.nsq;
version=1.0`` the bare answer and ``X-Nsq-Content-Type``, otherwise the legacy
wrapper ``{"status_code","status_txt","data"}`` in which every error is a 500
(youzan nsqlookupd's ``http.go``); the routes youzan declares v1-only always answer bare.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from aiohttp import web

from fastnsq import codec

from ._http import respond_legacy
from ._nsqd_base import NSQDIdentity
from ._nsqd_ha import parse_start, set_channel_offset
from ._nsqd_http import _HTTPError, _memory_stats, _read_limited
from ._nsqd_parse import go_atoi, go_parse_uint

if TYPE_CHECKING:  # pragma: no cover
    from ._nsqd_ha import HATopic

__all__ = ["HAHTTPServer", "build_ha_app", "respond_negotiated"]


class HAHTTPServer(NSQDIdentity, Protocol):
    """What the HA HTTP API uses of its nsqd."""

    @property
    def start_time(self) -> int: ...

    @property
    def ha_cluster(self) -> bool: ...

    @property
    def partitions(self) -> dict[tuple[str, int], HATopic]: ...

    def default_partition(self, topic: str) -> int: ...

    def stats(
        self, topic_name: str = "", channel_name: str = "", include_clients: bool = True
    ) -> dict[str, Any]: ...

ACCEPT_V1 = "application/vnd.nsq; version=1.0"
_V1_HEADER = {"X-Nsq-Content-Type": "nsq; version=1.0"}
_EXT_HEADER_PREFIX = "x-nsqext-"

Handler = Callable[[web.Request], Awaitable[web.Response]]


def _json(status: int, data: Any, headers: dict[str, str]) -> web.Response:
    body = json.dumps(data, separators=(",", ":")).encode()
    return web.Response(
        status=status, body=body, content_type="application/json", charset="utf-8", headers=headers
    )


def respond_negotiated(
    request: web.Request, status: int, data: Any, *, v1_only: bool = False
) -> web.Response:
    """youzan's http_api NegotiateVersion (or V1 for ``v1_only`` routes)."""
    # acceptVersion compares the whole header, not one of its values.
    if v1_only or request.headers.get("Accept", "") == ACCEPT_V1:
        if status != 200:
            return _json(status, {"message": data}, dict(_V1_HEADER))
        if data is None:
            return web.Response(status=200, body=b"", headers=dict(_V1_HEADER))
        if isinstance(data, str):
            return web.Response(
                status=200, text=data, content_type="text/plain", charset="utf-8", headers=dict(_V1_HEADER)
            )
        return _json(200, data, dict(_V1_HEADER))
    return respond_legacy(status, data)


def _route(
    nsqd: HAHTTPServer, handler: Callable[[HAHTTPServer, web.Request], Awaitable[Any]], *, v1_only: bool = False
) -> Handler:
    async def respond(request: web.Request) -> web.Response:
        try:
            data = await handler(nsqd, request)
        except _HTTPError as err:
            return respond_negotiated(request, err.status, err.message, v1_only=v1_only)
        return respond_negotiated(request, 200, data, v1_only=v1_only)

    return respond


def _topic_partition(nsqd: HAHTTPServer, request: web.Request) -> HATopic:
    """GetTopicPartitionArgs, then the existing partition (404 E_TOPIC_NOT_EXIST)."""
    query = request.query
    name = query.get("topic", "")
    if not name:
        raise _HTTPError(400, "MISSING_ARG_TOPIC")
    if not codec.valid_topic_name(name):
        raise _HTTPError(400, "INVALID_ARG_TOPIC")
    partition = -1
    raw = query.get("partition", "")
    if raw:
        try:
            partition = go_atoi(raw.encode())
        except ValueError:
            raise _HTTPError(400, "INVALID_ARG_TOPIC_PARTITION") from None
    if partition == -1:
        partition = nsqd.default_partition(name)
    topic = nsqd.partitions.get((name, partition))
    if topic is None:
        raise _HTTPError(404, "E_TOPIC_NOT_EXIST")
    return topic


async def _ping(nsqd: HAHTTPServer, request: web.Request) -> web.Response:
    return web.Response(text="OK", content_type="text/plain", charset="utf-8")


async def _info(nsqd: HAHTTPServer, request: web.Request) -> Any:
    return {
        "version": nsqd.version,
        "broadcast_address": nsqd.options.broadcast_address,
        "hostname": nsqd.hostname,
        "http_port": nsqd.http_port,
        "tcp_port": nsqd.tcp_port,
        "start_time": nsqd.start_time,
        "ha_support": nsqd.ha_cluster,
    }


async def _body(nsqd: HAHTTPServer, request: web.Request, limit: int, too_big: str) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise _HTTPError(413, too_big)
    body = await _read_limited(request, limit)
    if len(body) > limit:
        raise _HTTPError(413, too_big)
    return body


async def _pub_common(nsqd: HAHTTPServer, request: web.Request, *, traced: bool, ext: bool) -> Any:
    body = await _body(nsqd, request, nsqd.options.max_msg_size, "MSG_TOO_BIG")
    if not body:
        raise _HTTPError(406, "MSG_EMPTY")
    topic = _topic_partition(nsqd, request)
    if not topic.leader:
        raise _HTTPError(400, "E_FAILED_ON_NOT_LEADER")
    trace_text = request.query.get("trace_id", "")
    trace_id = 0
    if traced:
        try:
            trace_id = go_parse_uint(trace_text.encode())
        except ValueError:
            raise _HTTPError(400, "INVALID_TRACE_ID") from None
    ext_version, ext_bytes, want_trace = 0, None, traced
    if ext:
        header_text = unquote(request.query.get("ext", ""))
        try:
            header = json.loads(header_text) if header_text else None
        except ValueError:
            header = None
        if not isinstance(header, dict):
            raise _HTTPError(400, "E_INVALID_JSON_HEADER")
        for key, value in request.headers.items():
            if key.lower().startswith(_EXT_HEADER_PREFIX):
                header[key[len(_EXT_HEADER_PREFIX) :].lower()] = value
        if "##trace_id" in header:
            value = header["##trace_id"]
            if not isinstance(value, str):
                raise _HTTPError(400, "INVALID_TRACE_ID")
            try:
                trace_id = go_parse_uint(value.encode())
            except ValueError:
                raise _HTTPError(400, "INVALID_TRACE_ID") from None
            trace_text, want_trace = value, True
        ext_version, ext_bytes = 4, json.dumps(header, separators=(",", ":")).encode()
        if not topic.ext:
            if not nsqd.options.allow_ext_compatible:
                raise _HTTPError(400, "E_EXT_NOT_SUPPORT")
            ext_version, ext_bytes = 0, None
    internal_id, offset, size = topic.publish([(body, trace_id, ext_version, ext_bytes)])
    if want_trace:
        return {
            "status": "OK",
            "id": internal_id,
            "trace_id": trace_text,
            "queue_offset": offset,
            "rawsize": size,
        }
    return "OK"


async def _pub(nsqd: HAHTTPServer, request: web.Request) -> Any:
    return await _pub_common(nsqd, request, traced=False, ext=False)


async def _pub_trace(nsqd: HAHTTPServer, request: web.Request) -> Any:
    return await _pub_common(nsqd, request, traced=True, ext=False)


async def _pub_ext(nsqd: HAHTTPServer, request: web.Request) -> Any:
    return await _pub_common(nsqd, request, traced=False, ext=True)


async def _mpub(nsqd: HAHTTPServer, request: web.Request) -> Any:
    options = nsqd.options
    body = await _body(nsqd, request, options.max_body_size, "BODY_TOO_BIG")
    topic = _topic_partition(nsqd, request)
    if not topic.leader:
        raise _HTTPError(400, "E_FAILED_ON_NOT_LEADER")
    if request.query.get("binary", "") in ("true", "1"):
        try:
            bodies = codec.decode_mpub(body, options.max_msg_size, options.max_body_size)
        except ValueError as exc:
            raise _HTTPError(413, exc.args[0][2:]) from None
    else:
        bodies = [line for line in body.split(b"\n") if line]
        if any(len(line) > options.max_msg_size for line in bodies):
            raise _HTTPError(413, "MSG_TOO_BIG")
    if bodies:
        topic.publish_bodies(bodies)
    return "OK"


def _channel_of(nsqd: HAHTTPServer, request: web.Request) -> tuple[HATopic, str]:
    topic = _topic_partition(nsqd, request)
    name = request.query.get("channel", "")
    if not name:
        raise _HTTPError(400, "MISSING_ARG_CHANNEL")
    if not codec.valid_channel_name(name):
        raise _HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, name


async def _channel_create(nsqd: HAHTTPServer, request: web.Request) -> Any:
    topic, name = _channel_of(nsqd, request)
    if not topic.leader:
        raise _HTTPError(400, "E_FAILED_ON_NOT_LEADER")
    if topic.disable_channel_auto_create:
        # Only the lookupd's POST /channel/create registers channels of such a topic.
        raise _HTTPError(403, f"channel {name} not registered. channel should be initialized before use.")
    topic.get_channel(name)
    return None


async def _channel_delete(nsqd: HAHTTPServer, request: web.Request) -> Any:
    topic, name = _channel_of(nsqd, request)
    if not topic.delete_channel(name):
        raise _HTTPError(404, "CHANNEL_NOT_FOUND")
    return None


def _existing_channel(nsqd: HAHTTPServer, request: web.Request) -> Any:
    topic, name = _channel_of(nsqd, request)
    channel = topic.channels.get(name)
    if channel is None:
        raise _HTTPError(404, "CHANNEL_NOT_FOUND")
    return channel


async def _channel_empty(nsqd: HAHTTPServer, request: web.Request) -> Any:
    _existing_channel(nsqd, request).empty()
    return None


async def _channel_pause(nsqd: HAHTTPServer, request: web.Request) -> Any:
    channel = _existing_channel(nsqd, request)
    if "unpause" in request.path:
        channel.unpause()
    else:
        channel.pause()
    return None


async def _channel_setorder(nsqd: HAHTTPServer, request: web.Request) -> Any:
    channel = _existing_channel(nsqd, request)
    order = request.query.get("order", "")
    if order not in ("true", "false"):
        raise _HTTPError(400, "INVALID_ARG_ORDER")
    channel.set_ordered(order == "true")
    return None


async def _channel_setoffset(nsqd: HAHTTPServer, request: web.Request) -> Any:
    """doSetChannelOffset: the channel moves to the start in the body (force: any clients)."""
    topic, name = _channel_of(nsqd, request)
    channel = topic.channels.get(name)
    if channel is None:
        raise _HTTPError(404, "CHANNEL_NOT_FOUND")
    body = await request.read()
    if not body:
        raise _HTTPError(406, "MSG_EMPTY")
    try:
        start = parse_start(body)
    except ValueError as exc:
        raise _HTTPError(400, str(exc)) from None
    if not topic.leader:
        raise _HTTPError(400, "E_FAILED_ON_NOT_LEADER")
    error = set_channel_offset(nsqd, topic, channel, start)  # type: ignore[arg-type]
    if error is not None:
        raise _HTTPError(500, error)
    return None


async def _message_get(nsqd: HAHTTPServer, request: web.Request) -> Any:
    """doMessageGet by count (the n-th message, from 1; 0 reads as 1) or by offset (the first
    message at or after it). youzan answers 500 INTERNAL_ERROR past the end, and for what
    retention cleaned; ``queue_cnt_index`` is the found message's count from 1."""
    topic = _topic_partition(nsqd, request)
    mode = request.query.get("search_mode", "")
    try:
        position = int(request.query.get("search_pos", ""))
    except ValueError as exc:
        raise _HTTPError(400, str(exc)) from None
    if mode not in ("count", "virtual_offset"):
        raise _HTTPError(400, "search mode should be one of id/count/virtual_offset")
    found = topic.message_at_count(position) if mode == "count" else topic.message_at_offset(position)
    if found is None:
        raise _HTTPError(500, "INTERNAL_ERROR")
    offset, count, body, timestamp, trace_id = found
    return {"id": 0, "trace_id": trace_id, "body": body.decode("utf-8", "replace"), "timestamp": timestamp,
            "attempts": 0, "offset": offset, "queue_cnt_index": count, "ext": ""}


async def _stats(nsqd: HAHTTPServer, request: web.Request) -> Any:
    query = request.query
    stats = nsqd.stats(query.get("topic", ""), query.get("channel", ""), True)
    return {
        "version": nsqd.version,
        "health": "OK",
        "start_time": nsqd.start_time,
        "topics": stats["topics"] or [],
        "memory": _memory_stats(),
        "producers": stats["producers"],
        "time": int(time.time()),
    }


@web.middleware
async def _not_found(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return respond_negotiated(request, 405, "METHOD_NOT_ALLOWED", v1_only=True)
    except web.HTTPNotFound:
        return respond_negotiated(request, 404, "NOT_FOUND", v1_only=True)


def build_ha_app(nsqd: HAHTTPServer) -> web.Application:
    """The aiohttp application serving an HA ``nsqd``'s HTTP API."""
    app = web.Application(middlewares=[_not_found], client_max_size=nsqd.options.max_body_size + 1)

    async def ping(request: web.Request) -> web.Response:
        return await _ping(nsqd, request)

    app.router.add_get("/ping", ping, allow_head=False)
    app.router.add_get("/info", _route(nsqd, _info), allow_head=False)
    app.router.add_get("/stats", _route(nsqd, _stats), allow_head=False)
    app.router.add_get("/message/get", _route(nsqd, _message_get, v1_only=True), allow_head=False)
    app.router.add_post("/pub", _route(nsqd, _pub))
    app.router.add_post("/mpub", _route(nsqd, _mpub))
    app.router.add_post("/pub_ext", _route(nsqd, _pub_ext))
    app.router.add_post("/pubtrace", _route(nsqd, _pub_trace, v1_only=True))
    for path, handler in (
        ("/channel/create", _channel_create),
        ("/channel/delete", _channel_delete),
        ("/channel/empty", _channel_empty),
        ("/channel/pause", _channel_pause),
        ("/channel/unpause", _channel_pause),
        ("/channel/setorder", _channel_setorder),
        ("/channel/setoffset", _channel_setoffset),
    ):
        app.router.add_post(path, _route(nsqd, handler, v1_only=True))
    return app
