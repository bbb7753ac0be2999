"""Helpers for integration tests: unique names, TLS material, small waits."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pytest
import trustme

from fastnsq.testing import is_external

if TYPE_CHECKING:
    from typing_extensions import Self

_counter = itertools.count()


#: What steers fastnsq's build and import, and what would let a subprocess import another
#: fastnsq than the one it should (the twin pass sets the first).
BUILD_SWITCHES = ("FASTNSQ_NO_EXTENSIONS", "FASTNSQ_REQUIRE_EXTENSIONS", "FASTNSQ_DEBUG", "PYTHONPATH", "VIRTUAL_ENV")


def build_environment(**extra: str) -> dict[str, str]:
    """This environment without BUILD_SWITCHES, plus ``extra``: for a build or a fresh install."""
    env = {name: value for name, value in os.environ.items() if name not in BUILD_SWITCHES}
    env.update(extra)
    return env


def unique(prefix: str = "t") -> str:
    """A topic/channel name no other test (or earlier run against a real nsqd) uses."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}_{os.urandom(3).hex()}"


#: How late a real nsqd may hand back a deferred (REQ with a delay, DPUB, ``/pub?defer=``)
#: or timed-out message: it notices them only in its queue scan, which runs every
#: ``--queue-scan-interval`` (100 ms) over a list of channels it re-reads every 5 s
#: (``QueueScanRefreshInterval``, built in: no flag), so a message of a channel younger
#: than 5 s can come back up to 5.1 s after it was due. Tests wait that long and never
#: assert an upper bound a real nsqd does not keep.
NSQD_SCAN_LATENESS = 5.0 + 0.1
# What a loaded 2-core machine adds to any wait.
_LOAD_MARGIN = 1.0


#: The same for youzan's HA nsqd: its scan runs every 500 ms (``--queue-scan-interval``)
#: over a channel list re-read every 5 s (``--queue-scan-refresh-interval``).
HA_NSQD_SCAN_LATENESS = 5.0 + 0.5


def due_within(delay: float, *, ha: bool = False) -> float:
    """How long to wait for a message due in ``delay`` seconds from a real nsqd (see above)."""
    return delay + (HA_NSQD_SCAN_LATENESS if ha else NSQD_SCAN_LATENESS) + _LOAD_MARGIN


async def upstream_version(embedded: Any, http_address: str | None) -> str:
    """Which upstream nsqd a server answers like: ``"v1.3.0"`` (released) or ``"master"``.

    Embedded (an nsqd or a lookupd): its ``emulate`` option. Real: what the runner
    said (``FASTNSQ_TEST_NSQD_EMULATES``), else nsq master's mark in the nsqd's
    ``/info``: the topology fields (both versions report 1.3.0).
    """
    if embedded is not None:
        options = getattr(embedded, "options", embedded)
        return str(options.emulate)
    said = os.environ.get("FASTNSQ_TEST_NSQD_EMULATES", "").strip()
    if said:
        return said
    if not http_address:
        pytest.skip("which nsqd version this is needs FASTNSQ_TEST_NSQD_EMULATES or FASTNSQ_TEST_NSQD_HTTP")
    import json

    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"http://{http_address}/info") as response:
        info = json.loads(await response.read())
    return "master" if "topology_zone" in info else "v1.3.0"


async def skip_unless_without_tls(server: Any) -> None:
    """Skip when the (real) nsqd offers TLS: the test needs one started without certificates.

    An embedded nsqd has TLS only when given a certificate; a real one is asked
    (IDENTIFY with ``tls_v1``) and the connection closed before any upgrade.
    """
    if not is_external(server):
        return
    import json
    import struct

    host, _, port = server.tcp_address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        body = json.dumps({"feature_negotiation": True, "tls_v1": True}).encode()
        writer.write(b"  V2IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))[0]
        answer = json.loads((await asyncio.wait_for(reader.readexactly(size), 5))[4:])
    finally:
        writer.close()
    if answer.get("tls_v1"):
        pytest.skip(f"the real nsqd {server.tcp_address} offers TLS: the test needs one without")


def skip_if_external(server: Any, why: str) -> None:
    if is_external(server):
        pytest.skip(f"needs an embedded server: {why}")


@dataclass(frozen=True)
class TlsFiles:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed nothing here: verification against it must fail


@lru_cache(maxsize=1)
def tls_files() -> TlsFiles:
    """A test CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    folder = tempfile.mkdtemp(prefix="fastnsq-tls-")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("fastnsq-test-client")
    other = trustme.CA()

    def write(name: str, blob: Any) -> str:
        path = os.path.join(folder, name)
        blob.write_to_path(path)
        return path

    return TlsFiles(
        ca=write("ca.pem", ca.cert_pem),
        server_cert=write("server.pem", server.cert_chain_pems[0]),
        server_key=write("server.key", server.private_key_pem),
        client_cert=write("client.pem", client.cert_chain_pems[0]),
        client_key=write("client.key", client.private_key_pem),
        other_ca=write("other-ca.pem", other.cert_pem),
    )


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0, what: str = "",
                     progress: Callable[[], Any] | None = None) -> None:
    """Wait until ``check()`` is true (polling), or fail the test.

    With ``progress`` (a callable answering a count that grows as the awaited work advances:
    messages relayed, say; it may read what ``check`` stored), ``timeout`` is how long the count
    may go without a new high: a loaded machine that makes the work slow does not fail the wait,
    work that stopped (or goes round in circles) does.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    best = progress() if progress is not None else None
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if progress is not None:
            now = progress()
            if now > best:
                best, deadline = now, loop.time() + timeout
        if loop.time() > deadline:
            stalled = f" without progress (stuck at {best!r})" if progress is not None else ""
            raise AssertionError(f"timed out after {timeout} s{stalled} waiting for {what or check}")
        await asyncio.sleep(0.02)


class Slack:
    """The scheduling slack a busy machine adds, measured beside the test (issue 63).

    Tests do not assert fixed durations: an upper bound on an elapsed time is the configured
    interval(s) plus what this measures while the timed work runs. A ticker sleeps ``tick``
    seconds over and over (a task on the running loop inside ``async with``, so a loop kept
    busy by the test's own servers counts too; a thread inside ``with``, for blocking code)
    and adds up how late each sleep wakes (beyond the timers' own millisecond): ``late`` is
    the time this process lost to other work and other processes. ``allowance()`` is ``base``
    (the work's own cost on a quiet
    machine) plus ``factor`` times that (the other processes of the chain, nsqd's included,
    wait for a core too). A regression that waits (a wrong interval, a missed timeout) makes
    nothing late, so the bound still catches it.
    """

    def __init__(self, tick: float = 0.005) -> None:
        self.tick = tick
        self.late = 0.0  # seconds, summed over the wakes
        self.worst = 0.0  # the latest single wake
        self.wakes = 0
        self._stop = False
        self._runner: Any = None

    #: What a wake may be late by on an idle machine: epoll's timeouts are whole milliseconds.
    GRANULARITY = 0.001

    def _note(self, slept: float) -> None:
        lateness = max(0.0, slept - self.tick - self.GRANULARITY)
        self.late += lateness
        self.worst = max(self.worst, lateness)
        self.wakes += 1

    def allowance(self, base: float = 0.1, factor: float = 3.0) -> float:
        return base + factor * self.late

    async def _tick_on_loop(self) -> None:
        import time

        while not self._stop:
            began = time.monotonic()
            await asyncio.sleep(self.tick)
            self._note(time.monotonic() - began)

    def _tick_in_thread(self) -> None:
        import signal
        import time

        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # signals are the main thread's
        while not self._stop:
            began = time.monotonic()
            time.sleep(self.tick)
            self._note(time.monotonic() - began)

    async def __aenter__(self) -> Self:
        self._runner = asyncio.get_running_loop().create_task(self._tick_on_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._runner

    def __enter__(self) -> Self:
        import threading

        self._runner = threading.Thread(target=self._tick_in_thread, name="slack", daemon=True)
        self._runner.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._runner.join()

    def stop(self) -> None:
        """Stop adding up: what came after (the test's own checks) is not the timed work's."""
        if not self._stop and os.environ.get("FASTNSQ_TEST_SLACK"):  # calibration: what load measures
            import sys

            print(f"\n{self!r} allowance(0)={self.allowance(0):.3f} s", file=sys.stderr)
        self._stop = True

    def __repr__(self) -> str:
        return f"Slack(late={self.late:.3f} s over {self.wakes} wakes, worst {self.worst:.3f} s)"


def is_tls_failure(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


async def stats_json(http_address: str, topic: str) -> dict:
    """nsqd's ``/stats`` for one topic (either envelope)."""
    import json

    import aiohttp

    async with aiohttp.ClientSession() as session:
        url = f"http://{http_address}/stats?format=json&topic={topic}"
        async with session.get(url) as response:
            data = json.loads(await response.read())
    return data.get("data", data)


def topic_entry(stats: dict, topic: str) -> dict:
    return next(t for t in stats["topics"] or [] if t["topic_name"] == topic)
