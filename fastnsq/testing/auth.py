"""An embedded nsqd auth server: the HTTP endpoint nsqd asks when a client sends AUTH.

One job: answer nsqd's ``GET /auth?remote_ip=&tls=&secret=&common_name=`` (or the
same fields as a form ``POST``, nsqd 1.3 ``--auth-http-request-method=post``) from
a table secret → identity and authorizations, so that tests can run nsqd (the
embedded one or a real one) with ``auth_http_addresses=[auth.address]``.

A known secret gets 200 and::

    {"ttl": 3600, "identity": "alice", "identity_url": "",
     "authorizations": [{"topic": "events", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}

``topic`` and ``channels`` are regular expressions (nsqd matches them with Go's
regexp); ``permissions`` are ``"subscribe"`` and/or ``"publish"`` (nsqd refuses the
whole answer for any other value, and for a ``ttl`` ≤ 0).

An unknown secret gets 403. nsqd (internal/http_api GETV1) treats every
non-200 answer as a failed AUTH (the client gets ``E_AUTH_FAILED``), except that
on a plain-http 403 it first reads the body as ``{"https_port": N}`` and retries
over https on that port; the body here is plain text, which nsqd cannot read as
JSON, so it gives up at once instead of trying https on port 0.

Secrets are never logged nor kept in :attr:`AuthServer.requests`.

Example::

    async with AuthServer({"s3cret": ("alice", [authorization("events")])}) as auth:
        async with NSQD(auth_http_addresses=[auth.address]) as nsqd:
            ...
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from aiohttp import web

from fastnsq.errors import InvalidValueError

from ._http import JSON_CONTENT_TYPE, HTTPSite, go_json, join_host_port

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["AuthRequest", "AuthServer", "Authorization", "Grant", "authorization"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Authorization:
    """One entry of ``authorizations``: topic regex, channel regexes, permissions."""

    topic: str
    channels: tuple[str, ...] = (".*",)
    permissions: tuple[str, ...] = ("subscribe", "publish")

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "channels": list(self.channels), "permissions": list(self.permissions)}


def authorization(
    topic: str = ".*",
    channels: Sequence[str] = (".*",),
    permissions: Sequence[str] = ("subscribe", "publish"),
) -> Authorization:
    """An :class:`Authorization`; the defaults allow everything on every topic.

    >>> authorization("events", permissions=["publish"]).to_json()
    {'topic': 'events', 'channels': ['.*'], 'permissions': ['publish']}
    """
    return Authorization(topic, _strings(channels, "channels"), _strings(permissions, "permissions"))


@dataclass(frozen=True)
class Grant:
    """What one secret is worth: identity, authorizations, and optionally its own ttl/identity_url."""

    identity: str
    authorizations: tuple[Authorization, ...] = ()
    identity_url: str | None = None
    ttl: int | None = None


@dataclass(frozen=True)
class AuthRequest:
    """One request nsqd made (the secret is not kept): who asked, and what it got."""

    remote_ip: str
    tls: str
    common_name: str
    method: str
    identity: str | None  # None: refused (403)


AuthorizationLike = Authorization | Mapping[str, Any]
GrantLike = Grant | tuple[str, Iterable[AuthorizationLike]]


def _strings(values: Sequence[str], name: str) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise InvalidValueError(f"{name} must be a list of strings, got {values!r}")
    return tuple(values)


def _as_authorization(value: AuthorizationLike) -> Authorization:
    if isinstance(value, Authorization):
        return value
    if not isinstance(value, Mapping) or not isinstance(value.get("topic"), str):
        raise InvalidValueError(
            f"an authorization is an Authorization or a mapping with a 'topic' string, got {value!r}"
        )
    return authorization(
        value["topic"], value.get("channels", (".*",)), value.get("permissions", ("subscribe", "publish"))
    )


def _as_grant(value: GrantLike) -> Grant:
    if isinstance(value, Grant):
        return value
    if not isinstance(value, tuple) or len(value) != 2 or not isinstance(value[0], str):
        raise InvalidValueError(
            f"a secret maps to a Grant or to (identity, authorizations), got {type(value).__name__}"
        )
    identity, authorizations = value
    return Grant(identity, tuple(_as_authorization(a) for a in authorizations))


def _check_ttl(ttl: int) -> int:
    # nsqd decodes ttl into a Go int: a float would fail its JSON decoding.
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise InvalidValueError(f"ttl must be an int (seconds), got {ttl!r}")
    return ttl


class AuthServer:
    """An in-process auth server for nsqd's ``--auth-http-address``.

    ``secrets`` maps each accepted secret to a :class:`Grant` or to
    ``(identity, authorizations)``, where an authorization is an
    :class:`Authorization` (see :func:`authorization`) or a dict with ``topic``,
    ``channels`` and ``permissions``. ``ttl`` (seconds) and ``identity_url`` are
    the defaults for every secret. Set :attr:`fail_status` to answer every
    request with that HTTP status (an auth server that is down or broken).
    """

    def __init__(
        self,
        secrets: Mapping[str, GrantLike] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ttl: int = 3600,
        identity_url: str = "",
    ) -> None:
        self.host = host
        self._port = port
        self.ttl = _check_ttl(ttl)
        self.identity_url = identity_url
        self._grants: dict[str, Grant] = {}
        for secret, grant in (secrets or {}).items():
            self.grant(secret, grant)
        self.requests: list[AuthRequest] = []
        self.fail_status: int | None = None
        self._site = HTTPSite(self._handle)
        self._running = False

    def grant(self, secret: str, grant: GrantLike) -> None:
        """Accept ``secret`` from now on (or change what it grants)."""
        if not isinstance(secret, str) or not secret:
            raise InvalidValueError("a secret must be a non-empty string")
        checked = _as_grant(grant)
        if checked.ttl is not None:
            _check_ttl(checked.ttl)
        self._grants[secret] = checked

    def revoke(self, secret: str) -> None:
        """Refuse ``secret`` from now on (nsqd notices when the ttl of its last answer runs out)."""
        self._grants.pop(secret, None)

    # -- lifecycle

    async def start(self) -> None:
        if self._running:
            raise RuntimeError("AuthServer is already running")
        self._port = await self._site.start(self.host, self._port)
        self._running = True

    async def stop(self) -> None:
        if self._running:
            self._running = False
            await self._site.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        """``host:port``, the form nsqd's ``auth_http_addresses`` takes (it asks ``/auth``)."""
        return join_host_port(self.host, self._port)

    @property
    def url(self) -> str:
        """The full endpoint URL (nsqd 1.3 also accepts this form)."""
        return f"http://{self.address}/auth"

    def __repr__(self) -> str:
        return f"<AuthServer {self.address} secrets={len(self._grants)}>"

    # -- HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/auth":
            return web.Response(status=404, text="NOT_FOUND")
        if request.method not in ("GET", "POST"):
            return web.Response(status=405, text="METHOD_NOT_ALLOWED", headers={"Allow": "GET, POST"})
        params = dict(parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True))
        if request.method == "POST":
            body = (await request.read()).decode("utf-8", "replace")
            params.update(parse_qsl(body, keep_blank_values=True))
        grant = self._grants.get(params.get("secret", ""))
        who = AuthRequest(
            remote_ip=params.get("remote_ip", ""),
            tls=params.get("tls", ""),
            common_name=params.get("common_name", ""),
            method=request.method,
            identity=grant.identity if grant is not None and self.fail_status is None else None,
        )
        self.requests.append(who)
        if self.fail_status is not None:
            logger.info("auth: failing on purpose with %d for %s", self.fail_status, who.remote_ip)
            return web.Response(status=self.fail_status, text="AUTH_SERVER_FAILING")
        if grant is None:
            logger.info("auth: refused an unknown secret from %s", who.remote_ip)
            return web.Response(status=403, text="NOT_AUTHORIZED")
        logger.debug("auth: %s authenticated as %r", who.remote_ip, grant.identity)
        return web.Response(
            status=200, body=go_json(self._answer(grant)), headers={"Content-Type": JSON_CONTENT_TYPE}
        )

    def _answer(self, grant: Grant) -> dict[str, Any]:
        return {
            "ttl": grant.ttl if grant.ttl is not None else self.ttl,
            "identity": grant.identity,
            "identity_url": grant.identity_url if grant.identity_url is not None else self.identity_url,
            "authorizations": [a.to_json() for a in grant.authorizations],
        }
