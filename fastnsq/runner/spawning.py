"""A child process of the group: started, waited for, and the first one started early.

One job: the process itself. :func:`spawn_child` starts ``python -m fastnsq.runner.child``
with its end of a socket pair inherited (:data:`FD_ENV` names the descriptor), in a session
of its own (a terminal's Ctrl-C reaches the supervisor only, which forwards one stop);
:class:`ChildProcess` is what the supervisor holds: the pid, the exit status once known, and
``await wait()`` on its event loop (a pidfd where Linux has one, else a thread).

:func:`start_first_child` is called by the ``fastnsq`` entry point as soon as the command line
says a group will run, before the command line's modules, asyncio and the settings are imported
(about 150 ms here): the child's interpreter and its imports (about as long) overlap the
supervisor's instead of following them. The supervisor adopts it as worker 0's first process
(:func:`adopt_first_child`); it waits for its settings on the pipe, so a command that ends
before (``--help`` was not asked, yet a flag was bad) only closes the pipe, and the child
exits 1 without a word. Nothing here imports asyncio until a wait is awaited.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

#: The environment variable naming the child's end of the pipe (a file descriptor).
FD_ENV = "FASTNSQ_WORKER_FD"


class ChildProcess:
    """One child: its :class:`subprocess.Popen` and the supervisor's end of its pipe."""

    def __init__(self, popen: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.popen = popen
        self.sock = sock

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once :meth:`wait` has seen the exit (negative: killed by that signal)."""
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.returncode is None:
            self.popen.kill()

    async def wait(self) -> int:
        """The exit status, without blocking the loop."""
        import asyncio  # here, not at the top: the early start must not pay for it

        if self.popen.poll() is not None:
            return self.popen.returncode
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()
        try:
            pidfd = os.pidfd_open(self.popen.pid)
        except (AttributeError, OSError):  # not Linux 5.3+: a thread waits (as asyncio's own watcher does)
            threading.Thread(target=self._wait_in_thread, args=(loop, exited), daemon=True).start()
            await exited
            return self.popen.wait()
        loop.add_reader(pidfd, _settle, exited)  # readable once the process has exited
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return self.popen.wait()

    def _wait_in_thread(self, loop: asyncio.AbstractEventLoop, exited: asyncio.Future[None]) -> None:
        self.popen.wait()
        loop.call_soon_threadsafe(_settle, exited)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def spawn_child() -> ChildProcess:
    """Start one child; it waits on the pipe for its settings."""
    ours, theirs = socket.socketpair()
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", "fastnsq.runner.child"],
            pass_fds=(theirs.fileno(),), env={**os.environ, FD_ENV: str(theirs.fileno())},
            start_new_session=True,  # Ctrl-C reaches the supervisor only: one stop per child
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return ChildProcess(popen, ours)


_first_child: ChildProcess | None = None


def start_first_child() -> None:
    """Start worker 0's process now, for the supervisor to adopt (once per process)."""
    global _first_child
    if _first_child is None:
        _first_child = spawn_child()


def adopt_first_child() -> ChildProcess | None:
    """The child :func:`start_first_child` started, if any and still running; then no more."""
    global _first_child
    child, _first_child = _first_child, None
    if child is not None and child.popen.poll() is not None:
        child.sock.close()
        return None
    return child
