"""One HTTP request to one nsqlookupd per call (aiohttp, imported on first use)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from fastnsq.errors import InvalidValueError

from .answers import (
    ACCEPT_V1,
    ListLookupResult,
    LookupdError,
    LookupdHTTPError,
    LookupdInfo,
    LookupResult,
    NodeInfo,
    normalize_lookupd_address,
    parse_channels,
    parse_info,
    parse_listlookup,
    parse_lookup,
    parse_nodes,
    parse_topics,
)

if TYPE_CHECKING:
    import aiohttp
    from typing_extensions import Self

# aiohttp and yarl are imported on first use, not here: importing aiohttp takes about a
# quarter of a second (its connector builds an SSL context), which every `import fastnsq`,
# every `fastnsq pub` and every Spark worker would pay without ever asking a lookupd.

Access = Literal["r", "w"]


class LookupdClient:
    """Asks one lookupd per call over HTTP (aiohttp).

    Every request sends ``Accept: application/vnd.nsq; version=1.0``; with
    ``auth_secret`` it also sends ``Authorization: Bearer <secret>``, as go-nsq
    does for lookupd. ``address`` is ``host:port`` or ``http(s)://host:port``.
    A session passed in is used and left open; without one the client makes its
    own and :meth:`close` closes it.

    Example::

        async with LookupdClient(timeout=5.0) as client:
            result = await client.lookup("127.0.0.1:4161", "events", access="r")
            print([node.address for node in result.producers])
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        *,
        timeout: float = 60.0,
        auth_secret: str | None = None,
    ) -> None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise InvalidValueError(f"lookupd timeout must be a number of seconds > 0, got {timeout!r}")
        if auth_secret is not None and not isinstance(auth_secret, str):
            raise InvalidValueError("auth_secret must be a string or None")
        import aiohttp

        self._session = session
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=float(timeout))
        self._headers = {"Accept": ACCEPT_V1}
        if auth_secret:
            self._headers["Authorization"] = f"Bearer {auth_secret}"

    def __repr__(self) -> str:
        # Never show the secret; only whether one is set.
        auth = "set" if "Authorization" in self._headers else "none"
        return f"<LookupdClient timeout={self._timeout.total}s auth={auth}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session if this client created it."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def lookup(
        self,
        address: str,
        topic: str,
        *,
        access: Access | None = None,
        metainfo: bool = False,
        partition: int | None = None,
    ) -> LookupResult:
        """``GET /lookup?topic=T[&access=r|w][&metainfo=true][&partition=P]``.

        ``access``, ``metainfo`` and ``partition`` are HA parameters; upstream
        ignores them, so sending them to either lookupd is safe. An unknown topic
        gives a result with no producers.
        """
        if not isinstance(topic, str) or not topic:
            raise InvalidValueError(f"topic must be a non-empty string, got {topic!r}")
        query: dict[str, str] = {"topic": topic}
        if access is not None:
            if access not in ("r", "w"):
                raise InvalidValueError(f"access must be 'r', 'w' or None, got {access!r}")
            query["access"] = access
        if metainfo:
            query["metainfo"] = "true"
        if partition is not None:
            if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
                raise InvalidValueError(f"partition must be an integer >= 0 or None, got {partition!r}")
            query["partition"] = str(partition)
        return await self._get(address, "lookup", query, parse_lookup)

    async def listlookup(self, address: str) -> ListLookupResult:
        """``GET /listlookup``: the lookupd nodes of an HA cluster (``supported=False`` upstream)."""
        return await self._get(address, "listlookup", {}, parse_listlookup)

    async def topics(self, address: str) -> tuple[str, ...]:
        """``GET /topics``: every topic the lookupd knows."""
        return await self._get(address, "topics", {}, parse_topics)

    async def channels(self, address: str, topic: str) -> tuple[str, ...]:
        """``GET /channels?topic=T``: the channels registered for a topic."""
        if not isinstance(topic, str) or not topic:
            raise InvalidValueError(f"topic must be a non-empty string, got {topic!r}")
        return await self._get(address, "channels", {"topic": topic}, parse_channels)

    async def nodes(self, address: str) -> tuple[NodeInfo, ...]:
        """``GET /nodes``: every nsqd registered with the lookupd."""
        return await self._get(address, "nodes", {}, parse_nodes)

    async def info(self, address: str) -> LookupdInfo:
        """``GET /info``: version, and ``ha_support`` on an HA lookupd."""
        return await self._get(address, "info", {}, parse_info)

    async def _get(
        self,
        address: str,
        path: str,
        query: Mapping[str, str],
        parse: Callable[[int, Mapping[str, str], bytes], Any],
    ) -> Any:
        import aiohttp
        from yarl import URL

        url = URL(normalize_lookupd_address(address)) / path
        if query:
            url = url.with_query(query)
        session = self._ensure_session()
        try:
            async with session.get(url, headers=self._headers, timeout=self._timeout) as response:
                body = await response.read()
                status, headers = response.status, response.headers
        except asyncio.TimeoutError:  # aiohttp raises it; an alias of TimeoutError only from 3.11
            raise LookupdError(f"nsqlookupd {url} did not answer within {self._timeout.total}s") from None
        except aiohttp.ClientError as exc:
            raise LookupdError(f"nsqlookupd {url} unreachable: {exc}") from exc
        try:
            return parse(status, headers, body)
        except LookupdHTTPError as exc:
            raise LookupdHTTPError(exc.status, exc.message, str(url)) from None
        except LookupdError as exc:
            raise LookupdError(f"{exc} (from {url})") from None

    def _ensure_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop, which aiohttp wants.
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession()
        return self._session
