"""How fast one nsqd channel delivers to fastnsq over 1, 2, 4, ... connections (is the server the limit?).

Starts the real nsqd of ``--real`` on loopback (``--mem-queue-size=10000000``), and per run
pre-fills a fresh topic's channel with more than the run reads (so nsqd never runs dry and
never waits on its output-buffer timer), then consumes ``--count`` messages with a sync
handler over N connections, ``max_in_flight`` 2500 per connection, in a child process:
the clock runs from connect to the count-th message. Rows alternate; medians of
``--repeat`` rounds; nsqd's CPU per message from /proc.

    .venv/bin/python bench/consume_ceiling.py --real ~/nsq-real/bin [--connections 1,2,4,8] [--repeat 3]

If more connections do not raise the rate while the machine still has CPU to spare, the
channel inside nsqd, not the client, is the limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastnsq.benchmark import prefill
from fastnsq.loop import run
from fastnsq.testing.real import free_port

PER_CONNECTION = 2500
MARGIN = 0.1


def _post(http: str, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://{http}{path}", method="POST"), timeout=10).read()


def start_nsqd(bin_dir: Path) -> tuple[subprocess.Popen[bytes], str, str, str]:
    data = tempfile.mkdtemp(prefix="consume-ceiling-")
    tcp, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [str(bin_dir / "nsqd"), f"--data-path={data}", f"--tcp-address={tcp}", f"--http-address={http}",
         "--https-address=", "--broadcast-address=127.0.0.1", "--mem-queue-size=10000000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://{http}/ping", timeout=1).read()
            return proc, tcp, http, data
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def one_run(tcp: str, http: str, pid: int, connections: int, count: int) -> dict[str, float]:
    topic = f"ceiling_{connections}_{time.time_ns()}"
    mif = PER_CONNECTION * connections
    run(prefill(tcp, topic, int(count * (1 + MARGIN)) + mif, nsqd_http_address=http, channel="bench"))
    out = subprocess.run(
        [sys.executable, "-m", "fastnsq.benchmark", "--workload", "consume", "--nsqd-tcp-address", tcp,
         "--topic", topic, "--count", str(count), "--warmup", "0", "--max-in-flight", str(mif),
         "--connections", str(connections), "--server-pid", str(pid)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    _post(http, f"/topic/delete?topic={topic}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"msgs_per_s": result["msgs_per_s"], "client_us": result["cpu_per_million"],
            "nsqd_us": result["server_cpu_per_million"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", required=True, type=Path, metavar="BIN", help="folder with the real nsqd")
    parser.add_argument("--connections", default="1,2,4,8")
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.connections.split(",")]
    proc, tcp, http, data = start_nsqd(args.real.expanduser())
    runs: dict[int, list[dict[str, float]]] = {c: [] for c in counts}
    try:
        for _ in range(args.repeat):
            for connections in counts:
                runs[connections].append(one_run(tcp, http, proc.pid, connections, args.count))
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(data, ignore_errors=True)
    print(f"nsqd {args.real}/nsqd --mem-queue-size=10000000; fastnsq sync handler, {PER_CONNECTION} in flight "
          f"per connection, {args.count:,} messages per run, median of {args.repeat} alternated rounds")
    rows = []
    for connections, done in runs.items():
        row = {"connections": connections, **{k: statistics.median(r[k] for r in done) for k in done[0]},
               "runs_msgs_per_s": [round(r["msgs_per_s"]) for r in done]}
        rows.append(row)
        print(f"  {connections} connection(s): {row['msgs_per_s']:>9,.0f} msg/s   client {row['client_us']:.2f} µs, "
              f"nsqd {row['nsqd_us']:.2f} µs CPU per message   runs {row['runs_msgs_per_s']}")
    print(json.dumps({"server": str(args.real / "nsqd"), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
