"""AUTH for the embedded nsqd: asking an auth HTTP server, as nsqd 1.3 does.

nsqd (``internal/auth/authorizations.go``) sends
``GET http://<auth server>/auth?remote_ip=..&tls=true|false&secret=..&common_name=..``
with ``Accept: application/vnd.nsq; version=1.0`` and expects, with status 200::

    {"ttl": 3600, "identity": "...", "identity_url": "...",
     "authorizations": [{"topic": "<regex>", "channels": ["<regex>"],
                         "permissions": ["subscribe", "publish"]}]}

It tries the servers from a random start and takes the first good answer; an answer
with an unknown permission, a regex that does not compile or ``ttl <= 0`` is an
error. A permission is a regex *search* (Go's ``MatchString``) on the topic and on
the channel; a publish is checked with the channel ``""``, so it needs a channel
pattern that matches the empty string (``".*"``), exactly as in nsqd.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["AuthState", "Authorization", "query_any_auth_server"]

log = logging.getLogger("fastnsq.testing.nsqd")

_PERMISSIONS = frozenset({"subscribe", "publish"})


@dataclass(frozen=True)
class Authorization:
    """One entry of ``authorizations``: regexes for the topic and the channels."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions or not self.topic.search(topic):
            return False
        return any(pattern.search(channel) for pattern in self.channels)


@dataclass
class AuthState:
    """What the auth server answered for one client, valid until ``expires``."""

    identity: str = ""
    identity_url: str = ""
    ttl: int = 0
    authorizations: list[Authorization] = field(default_factory=list)
    expires: float = 0.0  # time.monotonic()

    def expired(self) -> bool:
        return self.expires < time.monotonic()

    def allows(self, topic: str, channel: str) -> bool:
        return any(entry.allows(topic, channel) for entry in self.authorizations)

    @classmethod
    def from_answer(cls, answer: Any) -> AuthState:
        """Validate an auth server's JSON like nsqd's QueryAuthd (ValueError if bad)."""
        if not isinstance(answer, dict):
            raise ValueError("auth answer is not a JSON object")  # noqa: TRY004 - a bad answer
        entries = []
        for item in answer.get("authorizations") or []:
            permissions = item.get("permissions") or []
            for permission in permissions:
                if permission not in _PERMISSIONS:
                    raise ValueError(f"unknown permission {permission}")
            try:
                topic = re.compile(item.get("topic") or "")
                channels = tuple(re.compile(c) for c in item.get("channels") or [])
            except (re.error, TypeError) as exc:
                raise ValueError(f"unable to compile regex: {exc}") from None
            entries.append(Authorization(topic, channels, frozenset(permissions)))
        ttl = answer.get("ttl")
        if type(ttl) is not int or ttl <= 0:
            raise ValueError(f"invalid TTL {ttl} (must be >0)")
        return cls(
            identity=str(answer.get("identity") or ""),
            identity_url=str(answer.get("identity_url") or ""),
            ttl=ttl,
            authorizations=entries,
            expires=time.monotonic() + ttl,
        )


async def query_any_auth_server(
    session: aiohttp.ClientSession,
    addresses: Sequence[str],
    remote_ip: str,
    tls: bool,
    common_name: str,
    secret: str,
) -> AuthState | None:
    """The first good answer of the auth servers (random start), or None if none."""
    count = len(addresses)
    start = random.randrange(count) if count else 0
    params = {
        "remote_ip": remote_ip,
        "tls": "true" if tls else "false",
        "secret": secret,
        "common_name": common_name,
    }
    for i in range(count):
        address = addresses[(start + i) % count]
        url = address if address.startswith(("http://", "https://")) else f"http://{address}"
        try:
            async with session.get(
                f"{url}/auth", params=params, headers={"Accept": "application/vnd.nsq; version=1.0"}
            ) as response:
                body = await response.read()
                if response.status != 200:
                    raise ValueError(f"got response {response.status}")
                return AuthState.from_answer(json.loads(body))
        except (aiohttp.ClientError, ValueError, OSError, TimeoutError) as exc:
            # Never log the secret (it is in the URL): only the server and the error.
            log.warning(
                "auth server %s failed: %s", address, type(exc).__name__ if "secret" in str(exc) else exc
            )
    return None
