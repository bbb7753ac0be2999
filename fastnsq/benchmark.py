"""fastnsq's own benchmark workloads: publish, MPUB and consume against a given nsqd.

Each workload function runs in the calling process against an nsqd that is
already up (a real one, or ``python -m fastnsq.testing``) and returns a
:class:`BenchResult`: messages, seconds, messages/s and the CPU seconds this
process spent per million messages, plus the server's CPU when its pid is
given (Linux ``/proc``). ``bench/run_all.py`` runs every workload in its own
process so the CPU figures belong to the client alone; the ``fastnsq bench``
command reuses the same functions: :data:`SCENARIOS` names the six rows fastnsq
has in the comparison, and :func:`run_scenario` runs one on a fresh topic
(pre-filled for a consumer, deleted afterwards).

The measured window: the first ``warmup`` messages are not timed (connections,
allocator and caches warm up), then the clock and the CPU counters start, and
they stop when the last of ``warmup + count`` messages is acknowledged: for a
publish when nsqd's ``OK`` for it has arrived; for a consumer when nsqd's
``/stats`` shows the channel drained (nothing queued, nothing in flight), which
is when nsqd has processed the last ``FIN``. ``max_seconds`` caps a run: past
it no new work starts, and the rate is computed from what was done.

Example (against ``python -m fastnsq.testing``)::

    >>> from fastnsq import benchmark                              # doctest: +SKIP
    >>> r = benchmark.run_workload("pub", "127.0.0.1:4150", topic="bench", count=100_000)
    >>> print(f"{r.msgs_per_s:,.0f} msg/s, {r.cpu_per_million:.2f} CPU s per million")

Or from a shell: ``python -m fastnsq.benchmark --workload consume --nsqd-tcp-address
127.0.0.1:4150 --nsqd-http-address 127.0.0.1:4151 --prefill`` (prints a JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .consumer import Consumer
from .loop import run as run_on_default_loop
from .producer import Producer

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "BODY_SIZE",
    "SCENARIOS",
    "WORKLOADS",
    "BenchResult",
    "Progress",
    "Scenario",
    "consume_workload",
    "mpublish_workload",
    "prefill",
    "process_cpu_seconds",
    "publish_workload",
    "run_scenario",
    "run_workload",
    "wait_drained",
]

#: The message size of every workload: small messages stress the client, not the wire.
BODY_SIZE = 100

#: ``progress(done, total, elapsed_seconds)``: called about once a second while a workload runs.
Progress = Callable[[int, int, float], None]

_CONSUME_MODES = ("handler", "async", "batches", "iter")
#: Publishes a caller claims and counts at once (the window's edges move by at most this much per caller).
_CHUNK = 16


@dataclass
class BenchResult:
    """One measured row: what ran, how many messages, how long, how much CPU."""

    workload: str  # "pub", "mpub" or "consume"
    variant: str  # e.g. "coalesce on", "sync handler"
    messages: int  # measured messages (the warm-up excluded)
    seconds: float  # wall time of the measured window
    cpu_user: float  # this process's CPU seconds in the window
    cpu_system: float
    server_cpu: float | None  # the server's CPU seconds in the window, when its pid is known
    loop: str  # "uvloop" or "asyncio"
    client: str = "fastnsq"
    client_version: str = __version__
    python: str = field(default_factory=platform.python_version)
    acknowledged: int = 0  # every message acknowledged, the warm-up included
    capped: bool = False  # max_seconds stopped it before `count` messages
    end: str = ""  # what marked the end of the window
    settings: dict[str, Any] = field(default_factory=dict)
    notes: str = ""

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_user + self.cpu_system

    @property
    def cpu_per_million(self) -> float:
        """Client CPU seconds per million messages."""
        return self.cpu_seconds / self.messages * 1e6 if self.messages else float("nan")

    @property
    def server_cpu_per_million(self) -> float | None:
        if self.server_cpu is None or not self.messages:
            return None
        return self.server_cpu / self.messages * 1e6

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data, with the derived rates."""
        data = asdict(self)
        data["msgs_per_s"] = self.msgs_per_s
        data["cpu_s"] = self.cpu_seconds
        data["cpu_per_million"] = self.cpu_per_million
        data["server_cpu_per_million"] = self.server_cpu_per_million
        return data


# ---- measuring ------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of another process (Linux /proc), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = stat[stat.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (Linux /proc): a supervisor and its workers, whose
    CPU seconds add up to the app's."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


class _Meter:
    """Counts acknowledged messages; opens the window after the warm-up, closes it at the end."""

    def __init__(
        self,
        total: int,
        warmup: int,
        *,
        max_seconds: float | None,
        server_pid: int | None,
        progress: Progress | None,
    ) -> None:
        self.total = total
        self.warmup = warmup
        self.max_seconds = max_seconds
        self.server_pid = server_pid
        self.progress = progress
        self.issued = 0
        self.done = 0
        self.capped = False
        self._claims = 0
        self.all_done = asyncio.get_running_loop().create_future()
        self._began = time.perf_counter()
        self._start: tuple[float, resource.struct_rusage, float | None, int] | None = None
        self._stop: tuple[float, resource.struct_rusage, float | None, int] | None = None
        self._ticker: asyncio.TimerHandle | None = None
        if warmup == 0:
            self.open_window()
        if progress is not None:
            self._tick()

    def _snapshot(self) -> tuple[float, resource.struct_rusage, float | None, int]:
        server = process_cpu_seconds(self.server_pid) if self.server_pid else None
        return time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), server, self.done

    def open_window(self) -> None:
        if self._start is None:
            self._start = self._snapshot()

    def close_window(self) -> None:
        if self._stop is None:
            self.open_window()
            self._stop = self._snapshot()
        if self._ticker is not None:
            self._ticker.cancel()

    def claim(self, n: int = 1) -> int:
        """How many of the next ``n`` messages a caller may send (0: stop)."""
        if self.issued >= self.total or self.capped:
            return 0
        self._claims += 1
        # The clock is read every 64th claim only: the harness should cost the client nothing.
        if not self._claims & 63 and self.past_deadline():
            self.capped = True
            return 0
        take = min(n, self.total - self.issued)
        self.issued += take
        return take

    def add(self, n: int = 1) -> None:
        """``n`` more messages acknowledged (published, or handled by the consumer)."""
        self.done += n
        if self._start is None and self.done >= self.warmup:
            self.open_window()
        if self.done >= self.total and not self.all_done.done():
            self.all_done.set_result(None)

    def past_deadline(self) -> bool:
        return (
            self.max_seconds is not None
            and self._start is not None
            and time.perf_counter() - self._start[0] >= self.max_seconds
        )

    def _tick(self) -> None:
        assert self.progress is not None
        self.progress(self.done, self.total, time.perf_counter() - self._began)
        self._ticker = asyncio.get_running_loop().call_later(1.0, self._tick)

    def result(self, workload: str, variant: str, **extra: Any) -> BenchResult:
        assert self._start is not None and self._stop is not None, "the window was never closed"
        t0, r0, s0, n0 = self._start
        t1, r1, s1, n1 = self._stop
        return BenchResult(
            workload=workload,
            variant=variant,
            messages=n1 - n0,
            seconds=t1 - t0,
            cpu_user=r1.ru_utime - r0.ru_utime,
            cpu_system=r1.ru_stime - r0.ru_stime,
            server_cpu=None if s0 is None or s1 is None else s1 - s0,
            loop=_loop_name(),
            acknowledged=self.done,
            capped=self.capped,
            **extra,
        )


def _loop_name() -> str:
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


# ---- nsqd's HTTP API --------------------------------------------------------------------------


async def _http(session: aiohttp.ClientSession, method: str, url: str, **params: str) -> Any:
    async with session.request(method, url, params=params) as response:
        text = await response.text()
        if response.status >= 400:
            raise RuntimeError(f"{method} {url} {params}: HTTP {response.status} {text[:200]}")
        return json.loads(text) if text.startswith(("{", "[")) else text


async def _channel_counts(session: aiohttp.ClientSession, http_address: str, topic: str, channel: str) -> Any:
    stats = await _http(
        session,
        "GET",
        f"http://{http_address}/stats",
        format="json",
        topic=topic,
        channel=channel,
        include_clients="false",
        include_mem="false",
    )
    for entry in stats.get("topics") or []:
        for chan in entry.get("channels") or []:
            if chan["channel_name"] == channel:
                return chan
    return None


async def wait_drained(
    http_address: str, topic: str, channel: str, *, interval: float = 0.002, timeout: float = 60.0
) -> None:
    """Return once nsqd's ``/stats`` shows the channel with nothing queued, in flight or deferred."""
    import aiohttp  # the HTTP API only when asked: the CLI imports this module to list SCENARIOS

    deadline = time.perf_counter() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            chan = await _channel_counts(session, http_address, topic, channel)
            if chan is not None and not (chan["depth"] or chan["in_flight_count"] or chan["deferred_count"]):
                return
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{topic}/{channel} not drained within {timeout} s: {chan}")
            await asyncio.sleep(interval)


async def prefill(
    nsqd_tcp_address: str,
    topic: str,
    count: int,
    *,
    nsqd_http_address: str | None = None,
    channel: str | None = None,
    size: int = BODY_SIZE,
    batch: int = 1000,
    concurrency: int = 8,
    options: dict[str, Any] | None = None,
) -> None:
    """Publish ``count`` messages with MPUB; create ``channel`` first so they queue there.

    ``options``: Producer/connection options (TLS, AUTH, ...), as for the workloads.
    """
    if nsqd_http_address and channel:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            base = f"http://{nsqd_http_address}"
            await _http(session, "POST", f"{base}/topic/create", topic=topic)
            await _http(session, "POST", f"{base}/channel/create", topic=topic, channel=channel)
    body = b"x" * size
    remaining = count

    async def sender(producer: Producer) -> None:
        nonlocal remaining
        while remaining > 0:
            n = min(batch, remaining)
            remaining -= n
            await producer.mpublish(topic, [body] * n)

    async with Producer([nsqd_tcp_address], **{"publish_timeout": 60.0, **(options or {})}) as producer:
        await asyncio.gather(*(sender(producer) for _ in range(concurrency)))


# ---- the workloads ----------------------------------------------------------------------------


class Observer:
    """What a run is observed with (``--observe``): nothing, Prometheus metrics scraped every
    second, or the OpenTelemetry adapter imported and not instrumented (tracing off)."""

    KINDS = ("none", "metrics", "otel-off")

    def __init__(self, kind: str = "none") -> None:
        if kind not in self.KINDS:
            raise ValueError(f"observe must be one of {self.KINDS}, got {kind!r}")
        self.kind = kind
        self._metrics: Any = None
        self._registry: Any = None
        self._scraper: asyncio.Task[None] | None = None
        if kind == "otel-off":
            import fastnsq.otel  # noqa: F401 - installed and imported, never instrumented
        elif kind == "metrics":
            from prometheus_client import CollectorRegistry

            from .metrics import NSQMetrics

            self._registry = CollectorRegistry()
            self._metrics = NSQMetrics(self._registry)

    def attach(self, client: Any) -> None:
        if self._metrics is None:
            return
        self._metrics.track(client)
        if self._scraper is None:
            self._scraper = asyncio.get_running_loop().create_task(self._scrape())

    async def _scrape(self) -> None:
        from prometheus_client import generate_latest

        while True:  # as Prometheus would, every second (usually every 15 s or more)
            await asyncio.sleep(1.0)
            generate_latest(self._registry)

    def close(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()


#: The observer of this process's runs (``--observe``); attach() is a no-op for "none".
OBSERVER = Observer()


async def publish_workload(
    nsqd_tcp_address: str,
    topic: str,
    *,
    count: int = 200_000,
    warmup: int = 20_000,
    concurrency: int = 1000,
    coalesce: bool = True,
    size: int = BODY_SIZE,
    max_seconds: float | None = None,
    server_pid: int | None = None,
    progress: Progress | None = None,
    options: dict[str, Any] | None = None,
) -> BenchResult:
    """``concurrency`` tasks, each awaiting ``producer.publish(topic, body)`` in a loop.

    ``coalesce=True`` (the Producer's default) turns the publishes of one loop pass
    into one MPUB; ``coalesce=False`` sends one PUB each, pipelined on the connection.
    ``options``: more Producer/connection options (TLS, AUTH, ...).
    """
    body = b"x" * size
    async with Producer([nsqd_tcp_address], **{**(options or {}), "coalesce": coalesce}) as producer:
        OBSERVER.attach(producer)
        meter = _Meter(warmup + count, warmup, max_seconds=max_seconds, server_pid=server_pid, progress=progress)

        async def caller() -> None:
            # Counted in chunks: the harness's own bookkeeping should cost the client nothing.
            while n := meter.claim(_CHUNK):
                for _ in range(n):
                    await producer.publish(topic, body)
                meter.add(n)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        meter.close_window()
    return meter.result(
        "pub",
        "coalesce on" if coalesce else "coalesce off (pipelined PUB)",
        end="the OK of the last publish",
        settings={"concurrency": concurrency, "size": size, "coalesce": coalesce, "warmup": warmup},
    )


async def mpublish_workload(
    nsqd_tcp_address: str,
    topic: str,
    *,
    count: int = 1_000_000,
    warmup: int = 100_000,
    batch: int = 200,
    concurrency: int = 16,
    size: int = BODY_SIZE,
    max_seconds: float | None = None,
    server_pid: int | None = None,
    progress: Progress | None = None,
    options: dict[str, Any] | None = None,
) -> BenchResult:
    """``concurrency`` tasks, each awaiting ``producer.mpublish(topic, [body] * batch)`` in a loop."""
    body = b"x" * size
    async with Producer([nsqd_tcp_address], **(options or {})) as producer:
        OBSERVER.attach(producer)
        meter = _Meter(warmup + count, warmup, max_seconds=max_seconds, server_pid=server_pid, progress=progress)

        async def caller() -> None:
            while n := meter.claim(batch):
                await producer.mpublish(topic, [body] * n)
                meter.add(n)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        meter.close_window()
    return meter.result(
        "mpub",
        f"batches of {batch}, {concurrency} in flight",
        end="the OK of the last MPUB",
        settings={"batch": batch, "concurrency": concurrency, "size": size, "warmup": warmup},
    )


async def consume_workload(
    nsqd_tcp_address: str,
    topic: str,
    channel: str = "bench",
    *,
    nsqd_http_address: str | None = None,
    count: int = 500_000,
    warmup: int = 50_000,
    mode: str = "handler",
    max_in_flight: int = 2500,
    batch_size: int = 250,
    max_seconds: float | None = None,
    server_pid: int | None = None,
    progress: Progress | None = None,
    options: dict[str, Any] | None = None,
) -> BenchResult:
    """Consume ``warmup + count`` messages already in ``topic``/``channel`` (see :func:`prefill`).

    ``mode``: ``"handler"`` (a trivial sync handler, FIN on return), ``"async"`` (a
    trivial ``async def`` handler), ``"batches"`` (``async for batch in
    consumer.batches(batch_size)`` then ``batch.finish()``) or ``"iter"`` (``async for
    message in consumer`` then ``message.finish()``). With
    ``nsqd_http_address`` the window ends when nsqd's ``/stats`` shows the channel
    drained (the last FIN processed); without it, when the handler has seen the
    last message. ``options``: more Consumer/connection options (TLS, AUTH, ...).
    """
    if mode not in _CONSUME_MODES:
        raise ValueError(f"mode must be one of {_CONSUME_MODES}, got {mode!r}")
    total = warmup + count
    meter = _Meter(total, warmup, max_seconds=max_seconds, server_pid=server_pid, progress=progress)
    add = meter.add
    handler: Callable[[Any], Any] | None = None
    if mode == "handler":

        def handler(message: Any) -> None:
            add()

    elif mode == "async":

        async def handler(message: Any) -> None:
            add()

    consumer = Consumer(
        topic,
        channel,
        nsqd_tcp_addresses=[nsqd_tcp_address],
        handler=handler,
        **{**(options or {}), "max_in_flight": max_in_flight},
    )
    OBSERVER.attach(consumer)
    await consumer.start()
    batches_task: asyncio.Task[None] | None = None
    if mode == "batches":

        async def take_batches() -> None:
            async for batch in consumer.batches(max_size=batch_size, max_wait=0.05):
                batch.finish()
                add(len(batch))

        batches_task = asyncio.create_task(take_batches())
    elif mode == "iter":

        async def take_messages() -> None:
            async for message in consumer:
                message.finish()
                add()

        batches_task = asyncio.create_task(take_messages())
    try:
        await _wait_done_or_deadline(meter)
        if not meter.capped and nsqd_http_address:
            await wait_drained(nsqd_http_address, topic, channel)
            end = "nsqd /stats: channel drained (last FIN processed)"
        else:
            end = "the handler saw the last message" if not meter.capped else "max_seconds"
        meter.close_window()
    finally:
        await consumer.stop(timeout=5.0)
        if batches_task is not None:
            batches_task.cancel()
    variant = {"handler": "sync handler", "async": "async handler", "batches": f"batches({batch_size})",
               "iter": "async for"}[mode]
    return meter.result(
        "consume",
        variant,
        end=end,
        settings={"max_in_flight": max_in_flight, "mode": mode, "warmup": warmup, "batch_size": batch_size,
                  "connections": (options or {}).get("connections_per_nsqd", 1)},
    )


async def _wait_done_or_deadline(meter: _Meter) -> None:
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(meter.all_done), 0.05)
            return
        except asyncio.TimeoutError:
            if meter.past_deadline():
                meter.capped = True
                return


#: name -> (workload coroutine function, one line of what it measures)
WORKLOADS: dict[str, tuple[Callable[..., Awaitable[BenchResult]], str]] = {
    "pub": (publish_workload, "single publishes from many concurrent tasks"),
    "mpub": (mpublish_workload, "MPUB batches from a few concurrent tasks"),
    "consume": (consume_workload, "consume a pre-filled topic, FIN each message"),
}


@dataclass(frozen=True)
class Scenario:
    """A named workload with its settings: the rows of fastnsq in bench/run_all.py."""

    name: str
    workload: str  # a key of WORKLOADS
    description: str
    settings: dict[str, Any] = field(default_factory=dict)


#: The scenarios ``fastnsq bench`` lists and runs, in order.
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("pub", "pub", "1,000 tasks awaiting publish(), coalesced into MPUBs (the default)"),
        Scenario("pub-pipelined", "pub", "1,000 tasks awaiting publish(), coalesce=False: one PUB each, pipelined",
                 {"coalesce": False}),
        # 4 in flight: the README's MPUB row (bench/run_all.py --real, every client alike).
        Scenario("mpub", "mpub", "4 tasks awaiting mpublish() of 200 messages: 4 MPUBs in flight, as in the "
                 "README's row", {"concurrency": 4}),
        Scenario("consume", "consume", "consume a pre-filled topic, sync handler, max_in_flight 2500",
                 {"mode": "handler"}),
        Scenario("consume-async", "consume", "the same with an async def handler", {"mode": "async"}),
        Scenario("consume-batches", "consume", "the same with async for batch in consumer.batches(250)",
                 {"mode": "batches"}),
    )
}


async def run_scenario(
    name: str,
    nsqd_tcp_address: str,
    *,
    nsqd_http_address: str | None = None,
    count: int | None = None,
    size: int = BODY_SIZE,
    topic: str | None = None,
    progress: Progress | None = None,
    server_pid: int | None = None,
    max_seconds: float | None = None,
    options: dict[str, Any] | None = None,
) -> BenchResult:
    """Run one of :data:`SCENARIOS` on a fresh topic: pre-fill it for a consumer, delete it afterwards.

    ``count``: measured messages (the warm-up adds 10 %); ``options``: connection
    options for every Producer and Consumer (TLS, AUTH, ...). Without
    ``nsqd_http_address`` the topic is not deleted and a consumer's window ends
    when its handler has seen the last message.

    >>> result = fastnsq.run(run_scenario("pub", "127.0.0.1:4150", count=50_000))  # doctest: +SKIP
    """
    try:
        scenario = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}") from None
    workload = WORKLOADS[scenario.workload][0]
    defaults = workload.__kwdefaults__ or {}
    count = count if count is not None else defaults["count"]
    warmup = max(count // 10, 1)
    topic = topic or f"fastnsq_bench_{name.replace('-', '_')}_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    kwargs: dict[str, Any] = {
        **scenario.settings,
        "count": count,
        "warmup": warmup,
        "progress": progress,
        "server_pid": server_pid,
        "max_seconds": max_seconds,
        "options": options,
    }
    if scenario.workload == "consume":
        await prefill(
            nsqd_tcp_address, topic, count + warmup, nsqd_http_address=nsqd_http_address, channel="bench",
            size=size, options=options,
        )
        kwargs.update(channel="bench", nsqd_http_address=nsqd_http_address)
    else:
        kwargs["size"] = size
    try:
        result = await workload(nsqd_tcp_address, topic, **kwargs)
    finally:
        if nsqd_http_address:
            await _delete_topic(nsqd_http_address, topic)
    return result


async def _delete_topic(http_address: str, topic: str) -> None:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session:
            await _http(session, "POST", f"http://{http_address}/topic/delete", topic=topic)
    except (aiohttp.ClientError, RuntimeError, OSError):
        pass  # a topic left behind costs nothing but memory


def run_workload(name: str, nsqd_tcp_address: str, **options: Any) -> BenchResult:
    """Run one workload on fastnsq's default loop (uvloop when installed) and return its result."""
    try:
        workload = WORKLOADS[name][0]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}") from None
    return run_on_default_loop(workload(nsqd_tcp_address, **options))


# ---- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fastnsq.benchmark", description="Run one fastnsq benchmark workload; prints a JSON line."
    )
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--nsqd-http-address", default=None, help="for creating the channel and /stats")
    parser.add_argument("--topic", default="fastnsq_bench")
    parser.add_argument("--channel", default="bench")
    parser.add_argument("--count", type=int, default=None, help="measured messages")
    parser.add_argument("--warmup", type=int, default=None, help="messages before the clock starts")
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--batch", type=int, default=200, help="MPUB batch size")
    parser.add_argument("--size", type=int, default=BODY_SIZE,
                        help=f"body size in bytes (pub, mpub, consume's --prefill; default {BODY_SIZE})")
    parser.add_argument("--no-coalesce", action="store_true", help="pub: one PUB per publish")
    parser.add_argument("--mode", choices=_CONSUME_MODES, default="handler", help="consume: how messages are handled")
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--connections", type=int, default=1,
                        help="consume: connections to the nsqd (connections_per_nsqd; max_in_flight is shared)")
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--server-pid", type=int, default=None, help="measure this process's CPU as the server's")
    parser.add_argument("--prefill", action="store_true", help="consume: publish warmup+count messages first")
    parser.add_argument("--progress", action="store_true", help="a progress line per second on stderr")
    parser.add_argument("--observe", choices=Observer.KINDS, default="none",
                        help="metrics: tracked by fastnsq.metrics and scraped every second; otel-off: the "
                             "OpenTelemetry adapter imported, not instrumented")
    return parser


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"max_seconds": args.max_seconds, "server_pid": args.server_pid}
    for name in ("count", "warmup", "concurrency"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.workload == "pub":
        options.update(coalesce=not args.no_coalesce, size=args.size)
    elif args.workload == "mpub":
        options.update(batch=args.batch, size=args.size)
    else:
        options.pop("concurrency", None)
        options.update(
            channel=args.channel,
            nsqd_http_address=args.nsqd_http_address,
            mode=args.mode,
            max_in_flight=args.max_in_flight,
            options={"connections_per_nsqd": args.connections} if args.connections != 1 else None,
        )
    if args.progress:
        options["progress"] = _print_progress
    return options


def _print_progress(done: int, total: int, elapsed: float) -> None:
    print(f"  {elapsed:6.1f} s  {done:>10,} / {total:,}", file=sys.stderr, flush=True)


async def _main(args: argparse.Namespace) -> BenchResult:
    global OBSERVER
    OBSERVER = Observer(args.observe)
    options = _options(args)
    workload = WORKLOADS[args.workload][0]
    if args.workload == "consume" and args.prefill:
        defaults = consume_workload.__kwdefaults__ or {}
        total = options.get("count", defaults["count"]) + options.get("warmup", defaults["warmup"])
        await prefill(
            args.nsqd_tcp_address,
            args.topic,
            total,
            nsqd_http_address=args.nsqd_http_address,
            channel=args.channel,
            size=args.size,
        )
    return await workload(args.nsqd_tcp_address, args.topic, **options)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_on_default_loop(_main(args))
    print(json.dumps({**result.as_dict(), "observe": args.observe}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
