"""The fault table: every scenario of tests/test_faults.py, its ledger and recovery time.

    python bench/faults.py --real ~/nsq-real/bin     # real nsqd/nsqlookupd from that folder
    python bench/faults.py                           # the embedded servers

Runs the scenarios with pytest (through ``python -m fastnsq.testing.real BIN_DIR`` for
real servers, which the scenarios then start, restart and kill themselves), collects the
rows they write (``FASTNSQ_FAULT_TABLE``) and writes bench/results/faults-<server>-<date>.json
and .md: published, acknowledged, raised, consumed (unique), duplicated, lost, recovery
time (from the end of the fault to the first message published after it being consumed).
Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("published", "acknowledged", "raised", "consumed", "duplicated", "lost", "recovery_s")


def markdown(rows: list[dict], title: str) -> str:
    lines = [f"# {title}", "", "| scenario | " + " | ".join(COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for row in rows:
        cells = ["–" if row.get(c) is None else f"{row[c]:,}" if isinstance(row[c], int) else str(row[c]) for c in COLUMNS]
        lines.append(f"| {row['scenario']} | " + " | ".join(cells) + " |")
    servers = sorted({row["server"] for row in rows})
    lines += ["", "Servers: " + "; ".join(servers) + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, help="folder with real nsqd and nsqlookupd (default: embedded servers)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    table = Path(tempfile.mkstemp(prefix="fastnsq-faults-", suffix=".json")[1])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_faults.py", *args.pytest_args]
    if args.real is not None:
        command = [sys.executable, "-m", "fastnsq.testing.real", str(args.real.expanduser()), "--nsqds", "1", "--", *command]
    status = subprocess.call(command, cwd=ROOT, env=dict(os.environ, FASTNSQ_FAULT_TABLE=str(table)))
    rows = json.loads(table.read_text() or "[]")
    table.unlink()
    if not rows:
        print("no rows were written", file=sys.stderr)
        return status or 1
    kind = "embedded"
    if args.real is not None:
        from fastnsq.testing.real import version_of

        printed, emulates = version_of(args.real.expanduser() / "nsqd")
        kind = f"nsqd-{emulates}"
        title = f"Fault scenarios on a real {printed} ({emulates})"
    else:
        title = "Fault scenarios on the embedded nsqd and nsqlookupd"
    stamp = datetime.now()
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
              "machine": f"{platform.machine()} {os.cpu_count()} cores", "pytest_status": status, "rows": rows,
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    out = ROOT / "bench" / "results" / f"faults-{kind}-{stamp:%Y%m%d-%H%M}"  # kind may hold dots: no with_suffix
    Path(f"{out}.json").write_text(json.dumps(result, indent=1))
    text = markdown(rows, title) + f"\npytest exit status {status}; {result['date']}; `{result['command']}`.\n"
    Path(f"{out}.md").write_text(text)
    print(text)
    print(f"written to {out}.json and .md")
    return status


if __name__ == "__main__":
    sys.exit(main())
