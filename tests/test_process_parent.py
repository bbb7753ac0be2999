"""An embedded nsqd started by fastnsq.testing ends with the process that started it.

A test run killed by a signal (a CI job's timeout, `timeout`, a second Ctrl-C that SIGKILLs)
never runs its teardown: its embedded nsqd kept running, listening, for as long as nobody
looked (86 minutes once). Now ``fastnsq nsqd`` watches its parent's pid and stops when it is
gone. Counted, not timed: the test waits for the server's exit, which it reads from /proc.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import os, signal, sys
from fastnsq.testing.process import NSQDProcess
nsqd = NSQDProcess()
nsqd.start()
print(nsqd.pid, nsqd.tcp_port, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no teardown, as a killed test run
"""


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie lingers where pid 1 does not reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_the_embedded_nsqd_stops_when_the_process_that_started_it_is_killed() -> None:
    run = subprocess.run([sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=60)
    assert run.returncode == -9, run.stderr
    pid = int(run.stdout.split()[0])
    deadline = time.monotonic() + 30  # the server checks every 0.5 s: generous for a loaded machine
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):  # leave nothing behind, then fail
        subprocess.run(["kill", "-9", str(pid)], check=False)
        raise AssertionError(f"the embedded nsqd {pid} outlived the process that started it")
