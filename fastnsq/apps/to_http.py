"""``fastnsq to-http``: a topic fed to HTTP services, as nsq_to_http does; ``--batch N`` bodies a request.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`). Each message (or, with
``--batch N``, up to N bodies joined by newlines, ours) goes out as one request: ``--post``
with the body, or ``--get`` with ``%s`` replaced by the URL-escaped body (Go's
url.QueryEscape). ``--mode``: round-robin or hostpool over the addresses (:mod:`.hostpool`),
or fan-out to every one. A POST succeeds on a 2xx, a GET on a 200 (nsq_to_http's rules);
anything else, a timeout or a refused connection requeues the messages with backoff, and the
Consumer gives a message up (its give-up hook logs it) past max_attempts. At most ``--n``
requests run at once, over aiohttp's keep-alive connections, TLS verified. The requests are
nsq_to_http's to the byte (:func:`request_headers`): its User-Agent, its header names and order.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from typing import Any
from urllib.parse import quote_plus, urlsplit

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from .hostpool import HostPool
from .status import StatusLine

logger = logging.getLogger("fastnsq.apps.to_http")

#: nsq_to_http's User-Agent, of the version whose requests ours repeat: a service that routes,
#: allows or counts requests by it sees no change when the binary is swapped. ``--header
#: 'User-Agent: ...'`` sets another, as with nsq_to_http.
USER_AGENT = "nsq_to_http v1.3.0"
#: Headers Go's client writes in a place of their own (Host, Content-Length) or not at all.
_PLACED = {"host", "content-length", "user-agent"}


def canonical_key(key: str) -> str:
    """Go's textproto.CanonicalMIMEHeaderKey: ``x-team`` -> ``X-Team`` (a key with a byte that is
    not a token character stays as it is)."""
    if not key or any(not (c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~")) for c in key):
        return key
    return "-".join(part[:1].upper() + part[1:].lower() for part in key.split("-"))


def request_headers(method: str, content_type: str, custom: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The headers of nsq_to_http's requests, in the order Go's client writes them: (those before
    Content-Length, those after). Host (aiohttp's, first), User-Agent, Content-Length (a POST's),
    then the rest sorted by name (Content-Type and the custom ones, Set by Go as they come: a
    custom User-Agent or Content-Type replaces nsq_to_http's), then Go's transport's
    ``Accept-Encoding: gzip`` unless a custom one was given."""
    named = {canonical_key(key): value for key, value in custom.items()}
    rest = {**({"Content-Type": content_type} if method == "POST" else {}), **named}
    before = {"User-Agent": rest.pop("User-Agent", USER_AGENT)}
    after = {key: rest[key] for key in sorted(rest) if key.lower() not in _PLACED}
    after.setdefault("Accept-Encoding", "gzip")
    return before, after


def go_host(url: str) -> str | None:
    """The Host header Go's client writes for ``url``: its host as written, port included, so
    ``http://h:80/`` gives ``h:80`` where aiohttp writes ``h`` (a server or proxy that matches
    Host exactly sees nsq_to_http's). None when the host is not ASCII: both send its IDNA form."""
    host = urlsplit(url).netloc.rpartition("@")[2]
    return host if host and host.isascii() else None


class RequestFailed(Exception):
    """A request that did not succeed (its status, or why it got none)."""


class ToHttp:
    """The handler: ``ToHttp(method="POST", addresses=[...], mode=..., concurrency=..., ...)``."""

    answers_batches = True  # FIN after the answer, REQ after a failure

    def __init__(self, *, method: str, addresses: list[str], mode: str = "hostpool", concurrency: int = 100,
                 headers: dict[str, str] | None = None, content_type: str = "application/octet-stream",
                 connect_timeout: float = 2.0, request_timeout: float = 20.0, sample: float = 1.0,
                 per_request: int = 1, status_every: int = 250) -> None:
        self.method, self.addresses, self.mode = method, list(addresses), mode
        self.pool = HostPool(self.addresses, "hostpool" if mode == "fan-out" else mode)
        self.concurrency = concurrency
        self.before, self.after = request_headers(method, content_type, headers or {})
        self.connect_timeout, self.request_timeout = connect_timeout, request_timeout
        self.sample, self.per_request = sample, per_request
        self.session: Any = None
        self.urls: dict[str, URL] = {}
        # --n long-lived senders take the requests from one queue: no task or semaphore a message.
        self.queue: asyncio.Queue[list[Any]] | None = None
        self.senders: list[asyncio.Task[None]] = []
        self.post_headers: dict[tuple[str, int], CIMultiDictProxy[str]] = {}
        self.hosts = {address: go_host(address) for address in self.addresses}
        self.status = StatusLine(status_every)
        self.per_address = {address: StatusLine(status_every, f"[{address}]:")
                            for address in self.addresses} if len(self.addresses) > 1 else {}

    async def setup(self) -> None:
        import aiohttp

        # Keep-alive connections, at most --n at once; TLS verified (aiohttp's default).
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=self.connect_timeout)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                             # No Accept header, as nsq_to_http sends none.
                                             skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                                             cookie_jar=aiohttp.DummyCookieJar(),
                                             # The answer's body is read and dropped: never inflated.
                                             auto_decompress=False)
        self.urls = {address: URL(address) for address in self.addresses}  # parsed once, not per request
        self.queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.senders = [loop.create_task(self._sender()) for _ in range(self.concurrency)]
        # A request makes dozens of short-lived objects: the collector ran every ~10 requests and
        # rescanned all that lives (~10% of a request's CPU with it off, measured). What is alive
        # now lives as long as the app: out of its passes; and a young pass every 20,000 objects.
        gc.freeze()
        gc.set_threshold(20_000, 10, 10)

    async def handle(self, batch: Any) -> None:
        messages = list(batch)
        if self.sample < 1.0:
            kept = []
            for message in messages:
                if random.random() > self.sample:
                    message.finish()  # not sampled: answered, never sent
                else:
                    kept.append(message)
            messages = kept
        assert self.queue is not None
        for start in range(0, len(messages), self.per_request):
            self.queue.put_nowait(messages[start:start + self.per_request])  # max in flight bounds it

    async def _sender(self) -> None:
        """One of the --n request slots: sends what the queue holds, one request at a time."""
        assert self.queue is not None
        while True:
            messages = await self.queue.get()
            try:
                await self._send(messages)
            finally:
                self.queue.task_done()

    async def _send(self, messages: list[Any]) -> None:
        began = time.monotonic()
        body = messages[0].body if len(messages) == 1 else b"\n".join([m.body for m in messages])
        try:
            targets = self.addresses if self.mode == "fan-out" else [self.pool.get()]
            for address in targets:
                await self._request(address, body)
                if address in self.per_address:
                    self.per_address[address].record(time.monotonic() - began, len(messages))
        except Exception as exc:  # noqa: BLE001 - every failure requeues; the Consumer gives up past max_attempts
            logger.warning("%s %s: %s; requeueing %d message(s)", self.method, targets[-1] if targets else "?",
                           exc, len(messages))
            for message in messages:
                if not message.has_responded:
                    message.requeue()
        else:
            for message in messages:
                if not message.has_responded:
                    message.finish()
            self.status.record(time.monotonic() - began, len(messages))

    async def _request(self, address: str, body: bytes) -> None:
        try:
            if self.method == "POST":
                response = await self.session.post(self.urls[address], data=body,
                                                   headers=self._post_headers(address, len(body)))
            else:
                # encoded=True: the URL goes out byte for byte (yarl would turn %2F back into /).
                text = go_sprintf(address, quote_plus(body, safe=""))
                host = go_host(text)
                response = await self.session.get(URL(text, encoded=True),
                                                  headers={**({"Host": host} if host else {}), **self.before, **self.after})
            async with response:
                await response.read()  # the whole answer read: the connection goes back to the pool
                ok = 200 <= response.status < 300 if self.method == "POST" else response.status == 200
                if not ok:
                    raise RequestFailed(f"got status code {response.status}")
        except Exception:
            self.pool.mark(address, False)
            raise
        self.pool.mark(address, True)

    def _post_headers(self, address: str, length: int) -> CIMultiDictProxy[str]:
        """A POST's headers to ``address`` for a body of ``length`` bytes, made once each: a
        multidict, which aiohttp takes as it is (a dict it converts on every request)."""
        headers = self.post_headers.get((address, length))
        if headers is None:
            if len(self.post_headers) >= 256:  # bodies of many lengths: keep the cache small
                self.post_headers.clear()
            host = self.hosts[address]
            # Content-Length here, so that it goes where Go's client writes it; Host first, as aiohttp puts it.
            headers = CIMultiDictProxy(CIMultiDict({**({"Host": host} if host else {}), **self.before,
                                                    "Content-Length": str(length), **self.after}))
            self.post_headers[address, length] = headers
        return headers

    async def drain(self) -> None:
        if self.queue is not None:
            await self.queue.join()  # every queued request answered (FIN or REQ)

    async def teardown(self) -> None:
        await self.drain()
        for sender in self.senders:
            sender.cancel()
        await asyncio.gather(*self.senders, return_exceptions=True)
        if self.session is not None:
            await self.session.close()


def go_sprintf(template: str, value: str) -> str:
    """Go's ``fmt.Sprintf(template, value)`` for a --get address: its one ``%s`` is the value
    and ``%%`` is ``%`` (the address has exactly one ``%s``, checked at start)."""
    parts = template.split("%%")
    for index, part in enumerate(parts):
        if "%s" in part:
            parts[index] = part.replace("%s", value, 1)
            break
    return "%".join(parts)
