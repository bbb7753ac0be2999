"""Start-up of ``fastnsq worker`` and the apps beside nsq's apps: from the command to the first message.

Each run: a real nsqd (``--real BIN``) holds one message on a new topic; the command is started
and nsqd's ``/stats`` is polled every 2 ms until the message has left the channel's queue for
the app (the channel made by the app's SUB shows depth 0 with the message taken: in flight or
finished). That moment is the first message handed to the app; ``fastnsq worker``'s handler,
to-file, to-nsq and to-http take it on arrival. The time is from the process's start (Popen) to
that poll. Rounds alternate the commands; medians are reported.

    .venv/bin/python bench/app_startup.py --real ~/nsq-real/bin --rounds 7

Writes ``bench/results/app-startup-<date>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from fastnsq.benchmark import process_tree
from fastnsq.testing.process import NSQDProcess

HANDLER = "def handle(message):\n    pass\n"


def commands(nsqd: str, topic: str, work: Path, go_bin: Path, destination: str, sink: str) -> dict[str, list[str]]:
    """Each command under test, consuming ``topic`` from ``nsqd``."""
    fastnsq = [sys.executable, "-m", "fastnsq"]
    common = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd}"]
    found = {
        "fastnsq worker": [*fastnsq, "worker", "startup_handler:handle", "--topic", topic, "--channel", "c",
                           "--nsqd-tcp-address", nsqd],
        "fastnsq to-file": [*fastnsq, "to-file", *common, f"-output-dir={work / 'ours'}"],
        "fastnsq to-nsq": [*fastnsq, "to-nsq", *common, f"-destination-nsqd-tcp-address={destination}"],
        "fastnsq to-http": [*fastnsq, "to-http", *common, f"-post={sink}"],
    }
    for name, extra in (("nsq_to_file", [f"-output-dir={work / 'go'}"]),
                        ("nsq_to_nsq", [f"-destination-nsqd-tcp-address={destination}"]),
                        ("nsq_to_http", [f"-post={sink}"])):
        if (go_bin / name).exists():
            found[name] = [str(go_bin / name), *common, *extra]
    return found


def channel_of(http: str, topic: str) -> dict[str, Any] | None:
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={topic}", timeout=5) as response:
        stats = json.load(response)
    for entry in stats.get("topics") or []:
        if entry["topic_name"] == topic and entry["channels"]:
            return dict(entry["channels"][0])
    return None


def publish_one(http: str, topic: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://{http}/pub?topic={topic}", data=b"first", method="POST"),
                           timeout=5).read()


def one_run(name: str, argv_for: Any, nsqd: NSQDProcess, work: Path, timeout: float) -> float:
    topic = f"startup_{os.getpid()}_{time.monotonic_ns()}"
    publish_one(nsqd.http_address, topic)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), str(ROOT)]))
    began = time.perf_counter()
    app = subprocess.Popen(argv_for(topic)[name], cwd=work, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            channel = channel_of(nsqd.http_address, topic)
            if channel and channel["depth"] == 0 and channel["message_count"] >= 1:
                return time.perf_counter() - began
            if time.perf_counter() - began > timeout or app.poll() is not None:
                raise RuntimeError(f"{name}: no message taken within {timeout} s (exit {app.poll()})")
            time.sleep(0.002)
    finally:
        for pid in reversed(process_tree(app.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        app.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", required=True, metavar="BIN", help="the folder of nsqd (and nsq's apps)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--out", default=str(HERE / "results" / f"app-startup-{time.strftime('%Y-%m-%d-%H%M')}.json"))
    args = parser.parse_args()
    bin_dir = Path(args.real).expanduser()
    nsqd = NSQDProcess(binary=bin_dir / "nsqd")
    destination = NSQDProcess(binary=bin_dir / "nsqd")
    nsqd.start()
    destination.start()
    sink = subprocess.Popen([sys.executable, "-c", SINK, "0"], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    sink_url = f"http://127.0.0.1:{sink.stdout.readline().strip()}/in"
    work = Path(tempfile.mkdtemp(prefix="fastnsq-app-startup-"))
    (work / "startup_handler.py").write_text(HANDLER)
    runs: dict[str, list[float]] = {}
    try:
        argv_for = lambda topic: commands(nsqd.tcp_address, topic, work, bin_dir, destination.tcp_address, sink_url)
        names = list(argv_for("t"))
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else reversed(names):
                runs.setdefault(name, []).append(one_run(name, argv_for, nsqd, work, args.timeout))
    finally:
        sink.terminate()
        nsqd.stop()
        destination.stop()
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "python": platform.python_version(),
              "cpu": _cpu_model(), "load_average_1m": os.getloadavg()[0], "nsqd": str(bin_dir / "nsqd"),
              "runs": runs, "median_seconds": medians}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, value in medians.items():
        print(f"{name:18} {value * 1000:7.0f} ms  (runs: {', '.join(f'{v * 1000:.0f}' for v in runs[name])})")
    print(f"written: {args.out}")
    return 0


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")


SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Ok)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

if __name__ == "__main__":
    sys.exit(main())
