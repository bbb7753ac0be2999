"""What the tests of nsq's apps on fastnsq share: running an app (ours or Go's) as a real process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from fastnsq.benchmark import process_tree
from fastnsq.testing import drain
from fastnsq.testing.real import real_bin_dir

ROOT = Path(__file__).resolve().parent.parent
#: Every app process a test started: whatever is still running when the test ends (it failed
#: or timed out before its own stop) is killed by tests/conftest.py, not left behind.
STARTED: list[App] = []


class App:
    """A running app process and the log it writes."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process, self.log_path = process, log

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def stop(self, timeout: float = 30.0) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def kill(self) -> None:
        """SIGKILL the working child first (it runs in a session of its own), then the supervisor:
        a crash, with no drain anywhere."""
        for pid in process_tree(self.process.pid)[1:]:
            os.kill(pid, signal.SIGKILL)
        if self.process.returncode is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        await self.process.wait()
        await asyncio.sleep(0.1)

    def kill_now(self) -> None:
        """SIGKILL the app and its children without waiting (the test's loop may be gone)."""
        for pid in process_tree(self.process.pid)[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def kill_leftovers() -> None:
    """Kill the apps the finished test left running."""
    while STARTED:
        app = STARTED.pop()
        if app.running:
            app.kill_now()


async def start(command: str, *args: str, log: Path) -> App:
    """``python -m fastnsq COMMAND ARGS`` in a session of its own (a kill takes its children too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fastnsq", command, *args, env=env, stdout=out, stderr=out, start_new_session=True)
    return _started(App(process, log))


async def start_go(binary: str, *args: str, log: Path) -> App:
    """One of nsq's own apps from the real pass's binaries."""
    folder = real_bin_dir()
    assert folder is not None
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            str(folder / binary), *args, stdout=out, stderr=out, start_new_session=True)
    return _started(App(process, log))


def _started(app: App) -> App:
    STARTED.append(app)
    return app


def go_app(binary: str) -> bool:
    """True in the real pass when nsq's own app is built beside nsqd."""
    folder = real_bin_dir()
    return folder is not None and (folder / binary).exists()


async def run_to_exit(command: str, *args: str, timeout: float = 20.0) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fastnsq", command, *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode or 0, out.decode()


async def create_channels(http_address: str, topic: str, *channels: str) -> None:
    """Topic and channels made in nsqd before publishing, so each channel gets every message."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{http_address}/topic/create", params={"topic": topic}) as resp:
            resp.raise_for_status()
        for channel in channels:
            async with session.post(f"http://{http_address}/channel/create",
                                    params={"topic": topic, "channel": channel}) as resp:
                resp.raise_for_status()


class Sink:
    """An HTTP server that records each request and answers 200 (or ``failing`` status until a time)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.fail_until = 0.0
        self.fail_status = 500
        self.runner = None
        self.port = 0

    async def start(self, port: int = 0) -> Sink:
        """Listen on ``port`` (a free one when 0); OSError when it cannot be had."""
        from aiohttp import web

        from fastnsq.testing.process import free_port

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        self.port = port or free_port()
        try:
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        except OSError:
            await self.runner.cleanup()
            raise
        return self

    async def _answer(self, request):
        from aiohttp import web

        body = await request.read()
        failing = asyncio.get_running_loop().time() < self.fail_until
        self.requests.append({"method": request.method, "path": request.raw_path, "body": body,
                              "headers": dict(request.headers), "failed": failing,
                              # as they came: each name's case, in order
                              "raw_headers": [(k.decode(), v.decode()) for k, v in request.raw_headers]})
        return web.Response(status=self.fail_status if failing else 200, text="ok")

    def fail_for(self, seconds: float) -> None:
        self.fail_until = asyncio.get_running_loop().time() + seconds

    def url(self, path: str = "/in") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self) -> list[bytes]:
        """Every body received with a 200, one per line."""
        return [line for r in self.requests if not r["failed"] for line in r["body"].split(b"\n")]

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def channel_drained(http_address: str, topic: str, channel: str, *, published: int) -> bool:
    """The app's source channel has taken the ``published`` messages and holds none: none waiting
    (in it or still in its topic), in flight, or requeued with a delay, in two /stats answers in a
    row (fastnsq.testing.drain says why the channel's own counts of one answer are not enough)."""
    return await drain.channel_drained(http_address, topic, channel, published=published)


class Source:
    """The source channel of an app as its waits read it: ``done()``, the messages it has let go of
    and not got back (``message_count`` less what is queued, deferred or in flight; the highest
    seen), is the progress a wait times out on the lack of (issue 63: an fsync-per-message
    destination on a loaded machine relayed 3,000 messages in more than 30 s, steadily)."""

    def __init__(self, http_address: str, topic: str, channel: str) -> None:
        self.http_address, self.topic, self.channel = http_address, topic, channel
        self.finished = 0

    def done(self) -> int:
        return self.finished

    async def taken(self, count: int) -> bool:
        """More than ``count`` messages taken from the channel (in flight included)."""
        from .test_consumer import channel_stats

        stats = await channel_stats([self.http_address], self.topic, self.channel)
        if not stats:
            return False
        entry = stats[0]
        self.finished = max(self.finished, entry["message_count"] - entry["depth"] - entry["in_flight_count"]
                            - entry["deferred_count"])
        return entry["message_count"] - entry["depth"] > count

    async def drained(self, published: int) -> bool:
        """:func:`channel_drained`, the progress read on the way."""
        await self.taken(0)
        return await channel_drained(self.http_address, self.topic, self.channel, published=published)
