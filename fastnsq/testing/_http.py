"""HTTP pieces the embedded servers share: Go's JSON, nsq's v1 answers, a restartable site.

The embedded nsqlookupd (both dialects) and the auth server answer through these, so
that what goes out matches nsqio's ``internal/http_api`` byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_plus

from aiohttp import web

from ._ports import PortKeeper, listen_socket

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


class HTTPSite:
    """One aiohttp application served on one socket; start, stop, start again on the same port.

    While stopped, the port stays bound (see :mod:`._ports`): nothing else can take it
    before the restart, and connections are refused as by a server that is down.
    """

    def __init__(
        self,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
        *,
        app_factory: Callable[[], web.Application] | None = None,
        shutdown_timeout: float = 1.0,
    ) -> None:
        if (handler is None) == (app_factory is None):
            raise TypeError("HTTPSite takes a handler or an app_factory")
        self._handler = handler
        self._app_factory = app_factory
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._address: tuple[str, int] | None = None
        self._ports = PortKeeper()

    def _make_app(self) -> web.Application:
        if self._app_factory is not None:
            return self._app_factory()
        assert self._handler is not None
        app = web.Application()
        # One catch-all route: the handler answers 404/405 itself, as httprouter does.
        app.router.add_route("*", "/{path:.*}", self._handler)
        return app

    async def start(self, host: str, port: int) -> int:
        """Serve on ``host:port``; returns the bound port."""
        runner = web.AppRunner(
            self._make_app(), access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_timeout
        )
        await runner.setup()
        protocol_factory = runner.server
        assert protocol_factory is not None  # set by setup()
        sock = listen_socket(host, port)
        try:
            # The low-level server, not a site: stop() closes the listener itself, at once.
            server = await asyncio.get_running_loop().create_server(protocol_factory, sock=sock)
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        bound = int(sock.getsockname()[1])
        self._ports.release(host, bound)
        self._runner, self._server, self._address = runner, server, (host, bound)
        return bound

    async def stop(self) -> None:
        """Stop serving; idle keep-alive connections are closed."""
        runner, server, self._runner, self._server = self._runner, self._server, None, None
        if server is not None:
            server.close()
            assert self._address is not None
            self._ports.hold(*self._address)
        if runner is not None:
            await runner.cleanup()
