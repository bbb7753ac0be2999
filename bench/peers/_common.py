"""What every peer driver shares: its command line, the measured window, nsqd's /stats, the result line.

Standard library only: each driver runs in its peer's own virtualenv (under
bench/.peers/), with whatever Python that peer needs, where neither fastnsq nor
its dependencies are installed. The window has the same meaning as in
``fastnsq/benchmark.py``: it opens when the warm-up messages are acknowledged and
closes when the last message is (its OK for a publish; nsqd's /stats showing the
channel drained for a consumer).

A driver prints one line ``RESULT {json}`` on stdout; ``bench/run_all.py`` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

BODY_SIZE = 100
#: Single publishes a caller claims and counts at once: the harness's bookkeeping should cost nothing.
CHUNK = 16


def build_parser(client: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{client} driver", description=f"One benchmark workload with {client}.")
    parser.add_argument("--workload", choices=("pub", "mpub", "consume", "info"), required=True)
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--nsqd-http-address", default=None)
    parser.add_argument("--topic", default="peer_bench")
    parser.add_argument("--channel", default="bench")
    parser.add_argument("--count", type=int, default=100_000, help="measured messages")
    parser.add_argument("--warmup", type=int, default=10_000, help="messages before the clock starts")
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--size", type=int, default=BODY_SIZE)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop", help="asyncio-based peers")
    return parser


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of another process (Linux /proc), or None."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def install_loop(name: str) -> str:
    """Make ``name`` the asyncio loop of this process; returns the loop actually used."""
    if name == "uvloop":
        try:
            import asyncio

            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            return "uvloop"
        except ImportError:
            return "asyncio"
    return "asyncio"


class Meter:
    """Counts acknowledged messages; the window opens after the warm-up and closes at the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.total = args.warmup + args.count
        self.warmup = args.warmup
        self.max_seconds = args.max_seconds
        self.server_pid = args.server_pid
        self.issued = 0
        self.done = 0
        self.capped = False
        self._claims = 0
        self.on_all_done: Callable[[], None] | None = None
        self._start: tuple[float, Any, float | None, int] | None = None
        self._stop: tuple[float, Any, float | None, int] | None = None
        if self.warmup == 0:
            self.open_window()

    def _snapshot(self) -> tuple[float, Any, float | None, int]:
        return (
            time.perf_counter(),
            resource.getrusage(resource.RUSAGE_SELF),
            process_cpu_seconds(self.server_pid),
            self.done,
        )

    def open_window(self) -> None:
        if self._start is None:
            self._start = self._snapshot()

    def close_window(self) -> None:
        if self._stop is None:
            self.open_window()
            self._stop = self._snapshot()

    def past_deadline(self) -> bool:
        if self.max_seconds is None or self._start is None:
            return False
        if time.perf_counter() - self._start[0] >= self.max_seconds:
            self.capped = True
            return True
        return False

    def claim(self, n: int = 1) -> int:
        """How many of the next ``n`` messages a caller may send (0: stop)."""
        if self.issued >= self.total or self.capped:
            return 0
        self._claims += 1
        # The clock is read every 64th claim only: the harness should cost the client nothing.
        if not self._claims & 63 and self.past_deadline():
            return 0
        take = min(n, self.total - self.issued)
        self.issued += take
        return take

    def add(self, n: int = 1) -> None:
        self.done += n
        if self._start is None and self.done >= self.warmup:
            self.open_window()
        if self.done >= self.total and self.on_all_done is not None:
            callback, self.on_all_done = self.on_all_done, None
            callback()

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def result(self, *, client: str, version: str, workload: str, variant: str, loop: str, end: str,
               settings: dict[str, Any], notes: str = "") -> dict[str, Any]:
        assert self._start is not None and self._stop is not None
        t0, r0, s0, n0 = self._start
        t1, r1, s1, n1 = self._stop
        messages = n1 - n0
        seconds = t1 - t0
        cpu_user = r1.ru_utime - r0.ru_utime
        cpu_system = r1.ru_stime - r0.ru_stime
        server_cpu = None if s0 is None or s1 is None else s1 - s0
        return {
            "workload": workload,
            "variant": variant,
            "client": client,
            "client_version": version,
            "python": platform.python_version(),
            "loop": loop,
            "messages": messages,
            "seconds": seconds,
            "msgs_per_s": messages / seconds if seconds > 0 else 0.0,
            "cpu_user": cpu_user,
            "cpu_system": cpu_system,
            "cpu_s": cpu_user + cpu_system,
            "cpu_per_million": (cpu_user + cpu_system) / messages * 1e6 if messages else None,
            "server_cpu": server_cpu,
            "server_cpu_per_million": server_cpu / messages * 1e6 if server_cpu is not None and messages else None,
            "capped": self.capped,
            "end": end,
            "settings": settings,
            "notes": notes,
        }


def channel_counts(http_address: str, topic: str, channel: str) -> dict[str, Any] | None:
    query = urllib.parse.urlencode(
        {"format": "json", "topic": topic, "channel": channel, "include_clients": "false", "include_mem": "false"}
    )
    with urllib.request.urlopen(f"http://{http_address}/stats?{query}", timeout=10) as response:
        stats = json.loads(response.read())
    for entry in stats.get("topics") or []:
        for chan in entry.get("channels") or []:
            if chan["channel_name"] == channel:
                return chan
    return None


def wait_drained(http_address: str, topic: str, channel: str, *, interval: float = 0.002,
                 timeout: float = 60.0) -> None:
    """Block until /stats shows the channel with nothing queued, in flight or deferred.

    Blocking: call it from a thread (or the gevent thread pool) so the client's own
    loop keeps sending its last FINs meanwhile.
    """
    deadline = time.perf_counter() + timeout
    while True:
        chan = channel_counts(http_address, topic, channel)
        if chan is not None and not (chan["depth"] or chan["in_flight_count"] or chan["deferred_count"]):
            return
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{topic}/{channel} not drained within {timeout} s: {chan}")
        time.sleep(interval)


DRAINED = "nsqd /stats: channel drained (last FIN processed)"
HANDLED = "the handler saw the last message"


async def end_of_consume(meter: Meter, args: argparse.Namespace) -> str:
    """After an asyncio driver's handler saw its last message: wait (in a thread, so the
    client's loop keeps writing its last FINs) until nsqd has them; the window's end label."""
    import asyncio

    if meter.finished and args.nsqd_http_address:
        await asyncio.get_running_loop().run_in_executor(
            None, wait_drained, args.nsqd_http_address, args.topic, args.channel
        )
        return DRAINED
    return "max_seconds" if meter.capped else HANDLED


def run_asyncio_driver(client: str, version: str, runners: dict[str, Callable[..., Any]]) -> None:
    """The main() of a driver whose workloads are coroutines ``runner(args, meter, loop_name)``."""
    import asyncio

    args = build_parser(client).parse_args()
    loop_name = install_loop(args.loop)
    if args.workload == "info":
        emit_info(client, version, loop_name)
        return

    async def run() -> dict[str, Any]:
        return await runners[args.workload](args, Meter(args), loop_name)

    emit(asyncio.run(run()))


def emit(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def emit_info(client: str, version: str, loop: str) -> None:
    emit({"client": client, "client_version": version, "python": platform.python_version(), "loop": loop,
          "executable": sys.executable})


def body(size: int) -> bytes:
    return b"x" * size
