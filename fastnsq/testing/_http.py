"""HTTP pieces the embedded servers share: Go's JSON, nsq's v1 answers, a restartable site.

The embedded nsqlookupd (both dialects) and the auth server answer through these, so
that what goes out matches nsqio's ``internal/http_api`` byte for byte.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web

__all__ = [
    "JSON_CONTENT_TYPE",
    "V1_HEADER",
    "V1_HEADER_VALUE",
    "HTTPAPIError",
    "HTTPSite",
    "go_json",
    "join_host_port",
    "listen_socket",
    "parse_go_query",
    "respond_legacy",
    "respond_plain",
    "respond_v1",
]

# Response headers of nsqio/nsq internal/http_api RespondV1 (Go canonicalises the name).
V1_HEADER = "X-Nsq-Content-Type"
V1_HEADER_VALUE = "nsq; version=1.0"
JSON_CONTENT_TYPE = "application/json; charset=utf-8"

# Go's encoding/json escapes these even with HTML escaping in strings only; they can
# only occur inside strings, so a plain translate on the encoded text is exact.
_GO_JSON_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def go_json(value: Any) -> bytes:
    """Encode ``value`` as Go's ``json.Marshal`` would: compact, UTF-8, HTML characters escaped.

    Dicts keep their order: build them in Go's order (struct field order, or sorted
    keys for a Go map).
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_GO_JSON_ESCAPES).encode("utf-8", "surrogatepass")


def respond_v1(status: int, data: Any = None) -> web.Response:
    """An answer as nsqio's ``http_api.RespondV1`` writes it.

    ``status`` 200: ``data`` ``None`` gives an empty body without a Content-Type
    (what Go's net/http does for an empty body), a ``str`` goes out as is
    (Content-Type left to the client, as Go sniffs it), anything else as JSON.
    Other statuses: ``{"message":"<data>"}`` as JSON.
    """
    headers = {V1_HEADER: V1_HEADER_VALUE}
    if status != 200:
        # RespondV1 formats the text into the JSON with %s, without escaping.
        body = b'{"message":"' + str(data).encode("utf-8") + b'"}'
        headers["Content-Type"] = JSON_CONTENT_TYPE
        return web.Response(status=status, body=body, headers=headers)
    if data is None:
        return web.Response(status=200, body=b"", headers=headers)
    if isinstance(data, str):
        headers["Content-Type"] = "text/plain; charset=utf-8"
        return web.Response(status=200, body=data.encode("utf-8"), headers=headers)
    headers["Content-Type"] = JSON_CONTENT_TYPE
    return web.Response(status=200, body=go_json(data), headers=headers)


def respond_legacy(status: int, data: Any = None) -> web.Response:
    """An answer as youzan's ``http_api.Respond`` writes it (no v1 Accept header).

    Errors become a 500 ``{"status_code":500,"status_txt":"<text>","data":null}``; a
    ``str`` answer goes out as is (no wrapper; Go sniffs it as plain text); anything
    else, ``None`` included, in ``{"status_code":200,"status_txt":"OK","data":...}``.
    """
    if status != 200:
        body = go_json({"status_code": 500, "status_txt": str(data), "data": None})
        return web.Response(status=500, body=body, headers={"Content-Type": JSON_CONTENT_TYPE})
    if isinstance(data, str):
        return web.Response(status=200, body=data.encode("utf-8"), headers={"Content-Type": "text/plain; charset=utf-8"})
    body = go_json({"status_code": 200, "status_txt": "OK", "data": data})
    return web.Response(status=200, body=body, headers={"Content-Type": JSON_CONTENT_TYPE})


def respond_plain(text: str, status: int = 200) -> web.Response:
    """An answer as nsqio's ``http_api.PlainText`` writes it (``/ping``)."""
    return web.Response(
        status=status, body=text.encode("utf-8"), headers={"Content-Type": "text/plain; charset=utf-8"}
    )


class HTTPAPIError(Exception):
    """An ``http_api.Err``: the status and the message text of a v1 error answer."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(status, text)
        self.status = status
        self.text = text


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def parse_go_query(raw: str) -> dict[str, str]:
    """Parse a raw query string as Go's ``url.ParseQuery`` + ``ReqParams.Get`` see it.

    Returns the first value of every key. Raises ``HTTPAPIError(400, "INVALID_REQUEST")``
    where Go reports an error: a ``;`` separator or a bad ``%`` escape.
    """
    values: dict[str, str] = {}
    for part in raw.split("&"):
        if not part:
            continue
        if ";" in part or _BAD_ESCAPE.search(part):
            raise HTTPAPIError(400, "INVALID_REQUEST")
        key, _, value = part.partition("=")
        values.setdefault(unquote_plus(key), unquote_plus(value))
    return values


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets (Go's ``net.JoinHostPort``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port), SO_REUSEADDR set.

    SO_REUSEADDR lets a stopped server start again on the same port at once.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return socket.create_server(sockaddr[:2], family=family, backlog=128)


class HTTPSite:
    """One aiohttp application served on one socket; start, stop, start again on the same port."""

    def __init__(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        self._handler = handler
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Serve on ``host:port``; returns the bound port."""
        app = web.Application()
        # One catch-all route: the handler answers 404/405 itself, as httprouter does.
        app.router.add_route("*", "/{path:.*}", self._handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        sock = listen_socket(host, port)
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._runner = runner
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        """Stop serving; idle keep-alive connections are closed."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
