"""``fastnsq to-http``: a topic fed to HTTP services, as nsq_to_http does; ``--batch N`` bodies a request.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`). Each message (or, with
``--batch N``, up to N bodies joined by newlines, ours) goes out as one request: ``--post``
with the body, or ``--get`` with ``%s`` replaced by the URL-escaped body (Go's
url.QueryEscape). ``--mode``: round-robin or hostpool over the addresses (:mod:`.hostpool`),
or fan-out to every one. A POST succeeds on a 2xx, a GET on a 200 (nsq_to_http's rules);
anything else, a timeout or a refused connection requeues the messages with backoff, and the
Consumer gives a message up (its give-up hook logs it) past max_attempts. At most ``--n``
requests run at once, over keep-alive connections (:mod:`.httpconn`), TLS verified. The requests
are nsq_to_http's to the byte (:func:`request_headers`): its User-Agent, its header names and order.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from typing import Any
from urllib.parse import quote_plus, urlsplit

from yarl import URL

from .hostpool import HostPool
from .httpconn import Endpoint, HttpClient, endpoint_of
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
    ``http://h:80/`` gives ``h:80`` (a server or proxy that matches Host exactly sees
    nsq_to_http's). None when the host is not ASCII: Go sends its IDNA form then."""
    host = urlsplit(url).netloc.rpartition("@")[2]
    return host if host and host.isascii() else None


def host_header(url: str) -> str:
    """The Host header of a request to ``url``: :func:`go_host`, or the IDNA form of a host that
    is not ASCII (with the port, when one is written)."""
    host = go_host(url)
    if host is not None:
        return host
    parts = urlsplit(url)
    idna = (parts.hostname or "").encode("idna").decode("ascii")
    return f"{idna}:{parts.port}" if parts.port else idna


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
        self.client: HttpClient | None = None
        # --n long-lived senders take the requests from one queue: no task or semaphore a message.
        self.queue: asyncio.Queue[list[Any]] | None = None
        self.senders: list[asyncio.Task[None]] = []
        self.queued = self.answered = 0  # requests queued and answered so far (the drain's mark)
        self.progress = asyncio.Event()  # set as requests are answered
        self.post_heads: dict[tuple[str, int], bytes] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self.targets: dict[str, str] = {}  # a --post address's request target (path and query)
        self.hosts = {address: host_header(address) for address in self.addresses}
        self.tail = "".join(f"{key}: {value}\r\n" for key, value in {**self.before, **self.after}.items())
        self.status = StatusLine(status_every)
        self.per_address = {address: StatusLine(status_every, f"[{address}]:")
                            for address in self.addresses} if len(self.addresses) > 1 else {}

    async def setup(self) -> None:
        self.client = HttpClient(self.connect_timeout, self.request_timeout)
        if self.method == "POST":
            self.endpoints = {address: endpoint_of(address) for address in self.addresses}  # parsed once
            self.targets = {address: URL(address).raw_path_qs for address in self.addresses}
        self.queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.senders = [loop.create_task(self._sender()) for _ in range(self.concurrency)]
        # A request makes short-lived objects: the collector ran every few hundred requests and
        # rescanned all that lives. What is alive now lives as long as the app: out of its
        # passes; and a young pass every 20,000 objects.
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
            self.queued += 1

    async def _sender(self) -> None:
        """One of the --n request slots: sends what the queue holds, one request at a time."""
        assert self.queue is not None
        while True:
            messages = await self.queue.get()
            try:
                await self._send(messages)
            finally:
                self.queue.task_done()
                self.answered += 1
                self.progress.set()

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
        assert self.client is not None
        try:
            if self.method == "POST":
                status = await self.client.request(self.endpoints[address], self._post_head(address, len(body)) + body)
            else:
                text = go_sprintf(address, quote_plus(body, safe=""))  # the URL goes out byte for byte
                parts = urlsplit(text)
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                head = f"GET {target} HTTP/1.1\r\nHost: {host_header(text)}\r\n{self.tail}\r\n"
                status = await self.client.request(endpoint_of(text), head.encode())
            ok = 200 <= status < 300 if self.method == "POST" else status == 200
            if not ok:
                raise RequestFailed(f"got status code {status}")
        except Exception:
            self.pool.mark(address, False)
            raise
        self.pool.mark(address, True)

    def _post_head(self, address: str, length: int) -> bytes:
        """A POST's request line and headers to ``address`` for a body of ``length`` bytes, made
        once each: Host, User-Agent and Content-Length where Go's client writes them, then the rest."""
        head = self.post_heads.get((address, length))
        if head is None:
            if len(self.post_heads) >= 256:  # bodies of many lengths: keep the cache small
                self.post_heads.clear()
            before = "".join(f"{key}: {value}\r\n" for key, value in self.before.items())
            after = "".join(f"{key}: {value}\r\n" for key, value in self.after.items())
            head = (f"POST {self.targets[address]} HTTP/1.1\r\nHost: {self.hosts[address]}\r\n{before}"
                    f"Content-Length: {length}\r\n{after}\r\n").encode()
            self.post_heads[address, length] = head
        return head

    async def drain(self) -> None:
        """Wait until the requests queued so far are answered (FIN or REQ). Not for those queued
        meanwhile: the consumer goes on delivering until its stop, which comes after this, and a
        fast sink would keep the queue from ever emptying while a backlog lasts."""
        if self.queue is None:
            return
        target = self.queued
        while self.answered < target:
            self.progress.clear()
            await self.progress.wait()

    async def teardown(self) -> None:
        await self.drain()  # the consumer has stopped: nothing is queued any more
        for sender in self.senders:
            sender.cancel()
        await asyncio.gather(*self.senders, return_exceptions=True)
        if self.client is not None:
            self.client.close()


def go_sprintf(template: str, value: str) -> str:
    """Go's ``fmt.Sprintf(template, value)`` for a --get address: its one ``%s`` is the value
    and ``%%`` is ``%`` (the address has exactly one ``%s``, checked at start)."""
    parts = template.split("%%")
    for index, part in enumerate(parts):
        if "%s" in part:
            parts[index] = part.replace("%s", value, 1)
            break
    return "%".join(parts)
