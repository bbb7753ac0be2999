"""Throughput of the embedded nsqd (fastnsq.testing.nsqd), server and client in two processes.

The server runs alone in a child process (uvloop when installed); the client is a raw
protocol client built on the project's codec (``codec.WriteBuffer`` to write,
``codec.FrameReader`` as an ``asyncio.BufferedProtocol`` reader), so the numbers
measure the server, not a client library. Three runs:

- ``mpub``: one connection publishes MPUBs of ``--batch`` messages, pipelined (up to
  ``--window`` unanswered), into a topic with one channel; messages accepted per
  second (counted when their OK arrives).
- ``pub``: the same with single PUBs, pipelined.
- ``deliver``: the channel is filled first (untimed), then one consumer connection
  with RDY ``--rdy`` receives everything and FINs in batches (one write per read);
  messages delivered per second, from the RDY to the last message.

Prints a table and writes the JSON to bench/results/. Example::

    /work/venv/bin/python bench/bench_server.py --messages 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastnsq import codec

RESULTS = ROOT / "bench" / "results"


def use_uvloop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


# ---- the server process ----------------------------------------------------------------


async def serve() -> None:
    from fastnsq.testing.nsqd import NSQD

    nsqd = NSQD(msg_timeout=600.0)
    await nsqd.start()
    print(f"READY {nsqd.tcp_address} {nsqd.http_address}", flush=True)
    # Run until the parent closes our stdin.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await nsqd.stop()


def start_server(loop_name: str) -> tuple[subprocess.Popen[str], str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--loop", loop_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = process.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("READY "):
        process.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    _, tcp, http = line.split()
    return process, tcp, http


# ---- the raw client -----------------------------------------------------------------------


class Client(asyncio.BufferedProtocol):
    """Counts OKs and messages; FINs what it received at the end of every read."""

    def __init__(self) -> None:
        self.reader = codec.FrameReader(self._on_message, self._on_response, self._on_error)
        self.out = codec.WriteBuffer()
        self.transport: asyncio.Transport | None = None
        self.oks = 0
        self.messages = 0
        self.auto_fin = False
        self.waiter: asyncio.Future[None] | None = None
        self.wake_at = 0  # wake the waiter when oks or messages reach this

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.buffer_updated(nbytes)
        if self.auto_fin and len(self.out):
            self.transport.write(self.out.take())  # type: ignore[union-attr]
        if (
            self.waiter is not None
            and max(self.oks, self.messages) >= self.wake_at
            and not self.waiter.done()
        ):
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"server closed the connection: {exc}"))

    def _on_message(self, message: Any) -> None:
        self.messages += 1
        if self.auto_fin:
            self.out.fin(message)

    def _on_response(self, data: Any) -> None:
        if data == b"OK":
            self.oks += 1
        elif data == codec.HEARTBEAT:
            self.out.nop()

    def _on_error(self, code: str, description: str) -> None:
        raise RuntimeError(f"server error {code} {description}")

    async def wait_for(self, count: int) -> None:
        self.wake_at = count
        if max(self.oks, self.messages) >= count:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter
        self.waiter = None

    def send(self) -> None:
        self.transport.write(self.out.take())  # type: ignore[union-attr]


async def connect(address: str) -> Client:
    host, port = address.rsplit(":", 1)
    _, client = await asyncio.get_running_loop().create_connection(Client, host, int(port))
    client.out.magic()
    client.out.identify(json.dumps({"feature_negotiation": True, "heartbeat_interval": 60000}).encode())
    client.send()
    await asyncio.sleep(0.05)  # the JSON answer is not an OK: skip it
    client.oks = 0
    return client


async def create_channel(address: str, topic: str) -> Client:
    """A subscribed consumer with RDY 0, so that the channel exists and fills."""
    client = await connect(address)
    client.out.sub(topic, "bench")
    client.send()
    await client.wait_for(1)
    return client


async def publish_mpub(address: str, topic: str, total: int, body: bytes, batch: int, window: int) -> float:
    client = await connect(address)
    bodies = [body] * batch
    batches = total // batch
    started = time.perf_counter()
    sent = 0
    while sent < batches:
        # Keep up to `window` MPUBs unanswered.
        room = min(window - (sent - client.oks), batches - sent)
        for _ in range(room):
            client.out.mpub(topic, bodies)
        client.send()
        sent += room
        await client.wait_for(sent - window // 2 if sent < batches else batches)
    elapsed = time.perf_counter() - started
    client.transport.close()  # type: ignore[union-attr]
    return batches * batch / elapsed


async def publish_pub(address: str, topic: str, total: int, body: bytes, window: int) -> float:
    client = await connect(address)
    started = time.perf_counter()
    sent = 0
    chunk = 500
    while sent < total:
        room = min(window - (sent - client.oks), total - sent)
        for _ in range(room):
            client.out.pub(topic, body)
        client.send()
        sent += room
        await client.wait_for(sent - min(chunk, window // 2) if sent < total else total)
    elapsed = time.perf_counter() - started
    client.transport.close()  # type: ignore[union-attr]
    return total / elapsed


async def deliver(address: str, topic: str, total: int, body: bytes, rdy: int) -> float:
    consumer = await create_channel(address, topic)
    await publish_mpub(address, topic, total, body, 200, 64)
    consumer.auto_fin = True
    consumer.messages = 0
    started = time.perf_counter()
    consumer.out.rdy(rdy)
    consumer.send()
    await consumer.wait_for(total)
    elapsed = time.perf_counter() - started
    consumer.transport.close()  # type: ignore[union-attr]
    return total / elapsed


async def run(args: argparse.Namespace, address: str, http: str) -> dict[str, float]:
    body = b"x" * args.size
    results: dict[str, float] = {}
    for attempt in range(args.repeat):
        mpub_topic = f"bench_mpub_{attempt}"
        consumer = await create_channel(address, mpub_topic)
        rate = await publish_mpub(address, mpub_topic, args.messages, body, args.batch, args.window)
        results["mpub_accepted"] = max(results.get("mpub_accepted", 0.0), rate)
        consumer.transport.close()  # type: ignore[union-attr]
        await delete_topic(http, mpub_topic)
        pub_topic = f"bench_pub_{attempt}"
        consumer = await create_channel(address, pub_topic)
        rate = await publish_pub(address, pub_topic, args.messages // 4, body, 2000)
        results["pub_accepted"] = max(results.get("pub_accepted", 0.0), rate)
        consumer.transport.close()  # type: ignore[union-attr]
        await delete_topic(http, pub_topic)
        deliver_topic = f"bench_deliver_{attempt}"
        rate = await deliver(address, deliver_topic, args.messages, body, args.rdy)
        results["delivered"] = max(results.get("delivered", 0.0), rate)
        await delete_topic(http, deliver_topic)
    return results


async def delete_topic(http: str, topic: str) -> None:
    """Free the server's memory between runs."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await session.post(f"http://{http}/topic/delete?topic={topic}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per run (default 1M)")
    parser.add_argument("--size", type=int, default=100, help="message body size (default 100)")
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB (default 200)")
    parser.add_argument("--window", type=int, default=64, help="unanswered MPUBs at most (default 64)")
    parser.add_argument("--rdy", type=int, default=2500, help="consumer RDY (default 2500)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported (default 3)")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    loop_name = use_uvloop() if args.loop == "uvloop" else "asyncio"
    if args.serve:
        asyncio.run(serve())
        return
    load_before = os.getloadavg()[0]
    process, address, http = start_server(loop_name)
    try:
        results = asyncio.run(run(args, address, http))
    finally:
        process.stdin.close()  # type: ignore[union-attr]
        process.wait(10)
    report(args, loop_name, results, (load_before, os.getloadavg()[0]))


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def report(
    args: argparse.Namespace, loop_name: str, results: dict[str, float], load: tuple[float, float]
) -> None:
    rows = [
        (f"delivered (1 consumer, RDY {args.rdy}, FIN batched)", results["delivered"]),
        (f"accepted via MPUB of {args.batch}", results["mpub_accepted"]),
        ("accepted via pipelined PUB", results["pub_accepted"]),
    ]
    print(
        f"\nembedded nsqd, {args.size}-byte bodies, {args.messages} messages per run, best of {args.repeat}"
    )
    # Other processes on the machine skew the numbers: the 1-minute load average
    # before and after says how quiet it was (2 cores: above ~2 the runs compete).
    print(f"load average before/after: {load[0]:.2f} / {load[1]:.2f} on {os.cpu_count()} cpus")
    print(f"{'run':<48}{'msg/s':>12}")
    for name, rate in rows:
        print(f"{name:<48}{rate:>12,.0f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = {
        "benchmark": "bench_server",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "load_average_before_after": list(load),
        "python": platform.python_version(),
        "loop": loop_name,
        "codec": codec.IMPLEMENTATION,
        "args": {k: v for k, v in vars(args).items() if k != "serve"},
        "msg_per_s": {
            "delivered": results["delivered"],
            "mpub_accepted": results["mpub_accepted"],
            "pub_accepted": results["pub_accepted"],
        },
        "git_commit": git_commit(),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
    }
    path = RESULTS / f"bench_server_{stamp}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
