"""Render a benchmark JSON (from bench/run_all.py) as bench/results/report.md and bench/results/chart.png.

    /work/venv/bin/python bench/report.py                       # the newest bench/results/*-*.json
    /work/venv/bin/python bench/report.py bench/results/2026-11-21-host.json

The table has one row per (workload, client, variant) with messages/s, the
client's CPU seconds per million messages and the server's, and for fastnsq's
rows one "vs." column per peer. The chart is one PNG: a panel per workload,
a bar per row, messages/s on a log scale.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

WORKLOAD_TITLES = {
    "pub": "PUB: single publishes from 1,000 concurrent callers",
    "pub16": "PUB: single publishes from 16 concurrent callers",
    "pub1": ("PUB: one caller publishing in a loop, awaiting each answer (fastnsq: one async task, the defaults; "
             "go-nsq: one goroutine), 100-byte bodies"),
    "pub1_1k": ("PUB: one caller publishing in a loop, awaiting each answer (fastnsq: one async task, the defaults; "
                "go-nsq: one goroutine), 1 KiB bodies"),
    "mpub": "MPUB: batches of 200",
    "consume": "Consume: pre-filled topic, max_in_flight 2500, trivial handler, until the last FIN",
}
#: Against a real nsqd the consumers stop at their count-th message (the backlog is larger).
REAL_CONSUME_TITLE = "Consume: pre-filled topic, max_in_flight 2500, trivial handler, clock from connect to the 1,000,000th"
#: The same against the second nsqd of a real run, the one with every flag at its default.
DEFAULT_CONSUME_TITLE = ("Consume on nsqd with its default flags (--mem-queue-size 10000: the backlog beyond 10,000 "
                         "in nsqd's disk queue), max_in_flight 2500, trivial handler, clock from connect to the "
                         "1,000,000th")
#: Shorter panel titles for the chart (the report's sections say the rest).
CHART_TITLES = {
    "pub1": "PUB: one caller in a loop (fastnsq: one task; go-nsq: one goroutine), 100 B",
    "pub1_1k": "PUB: one caller in a loop (fastnsq: one task; go-nsq: one goroutine), 1 KiB",
    "consume": "Consume: max_in_flight 2500, to the 1,000,000th message",
    "consume_default": "Consume on nsqd with its default flags (the backlog in its disk queue)",
}
#: Every workload a report shows, in order.
ALL_WORKLOADS = ("pub", "pub16", "pub1", "pub1_1k", "mpub", "consume", "consume_default")
RAW = "nsq raw tools"
CLIENT_ORDER = ["fastnsq", "go-nsq", RAW, "pynsq", "gnsq", "ansq", "asyncnsq"]
PEER_NAMES = [c for c in CLIENT_ORDER if c != "fastnsq"]
PYTHON_PEERS = ["pynsq", "gnsq", "ansq", "asyncnsq"]
COLORS = {
    "fastnsq": "#1f6feb",
    "pynsq": "#8c6d31",
    "gnsq": "#6b8e23",
    "ansq": "#b5527a",
    "asyncnsq": "#d97706",
    "go-nsq": "#4b5563",
    RAW: "#9ca3af",
}

#: Targets from the issues: fastnsq's best row vs the best Python peer.
SPEED_TARGET = 5.0


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def is_real(data: dict[str, Any]) -> bool:
    """A run against a real nsqd started by the harness (``run_all.py --real``)."""
    return data.get("server", {}).get("kind") == "real"


def _title(data: dict[str, Any], workload: str) -> str:
    if workload == "consume_default":
        return DEFAULT_CONSUME_TITLE
    return REAL_CONSUME_TITLE if workload == "consume" and is_real(data) else WORKLOAD_TITLES[workload]


def newest_json() -> Path:
    candidates = sorted(p for p in RESULTS.glob("*-*.json") if p.name[:4].isdigit())
    if not candidates:
        raise SystemExit("no bench/results/<date>-<host>.json yet: run bench/run_all.py")
    return max(candidates, key=lambda p: p.stat().st_mtime)


def _rows(data: dict[str, Any], workload: str) -> list[dict[str, Any]]:
    rows = [r for r in data["rows"] if r["workload"] == workload]
    return sorted(rows, key=lambda r: CLIENT_ORDER.index(r["client"]) if r["client"] in CLIENT_ORDER else 99)


def _ok(row: dict[str, Any]) -> bool:
    return "error" not in row and bool(row.get("messages"))


def _variant(row: dict[str, Any]) -> str:
    return row.get("label") or row.get("variant") or ""


def _best(rows: list[dict[str, Any]], client: str) -> dict[str, Any] | None:
    candidates = [r for r in rows if r["client"] == client and _ok(r)]
    return max(candidates, key=lambda r: r["msgs_per_s"]) if candidates else None


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _spread(row: dict[str, Any]) -> str:
    """The runs' range around the median, e.g. "±4 %" (one run: its count)."""
    rates = row.get("runs_msgs_per_s") or []
    if len(rates) < 2:
        return f"{len(rates)}"
    return f"{len(rates)}, ±{(max(rates) - min(rates)) / 2 / row['msgs_per_s']:.0%}"


def _peers_present(data: dict[str, Any]) -> list[str]:
    measured = {r["client"] for r in data["rows"] if _ok(r)}
    return [p for p in PEER_NAMES if p in measured]


def _vs_cell(row: dict[str, Any], peer: dict[str, Any] | None) -> str:
    if peer is None or not _ok(row):
        return "–"
    speed = row["msgs_per_s"] / peer["msgs_per_s"]
    if row.get("cpu_per_million") and peer.get("cpu_per_million"):
        return f"{speed:.1f}× ({peer['cpu_per_million'] / row['cpu_per_million']:.1f}×)"
    return f"{speed:.1f}×"


# ---- markdown ---------------------------------------------------------------------------------


def markdown(data: dict[str, Any], json_name: str) -> str:
    if is_real(data):
        return markdown_real(data, json_name)
    machine, server, fast = data["machine"], data["server"], data["fastnsq"]
    settings = data["settings"]
    peers = _peers_present(data)
    lines = [
        "# fastnsq vs the Python NSQ clients",
        "",
        (f"{data['date'][:10]}, {machine['cpu_model']} ({machine['cores']} cores), {machine['os']}; "
        f"fastnsq {fast['version']} (codec {fast['codec']}) on uvloop {fast['uvloop']}, Python {data['python']}; "
        f"server: {server['version']} ({server['description']}). Each client runs each workload in its own "
        f"process against the same server process; 100-byte bodies; {settings['warmup']}; one process's CPU "
        f"(user + system, getrusage) over the measured window; each row is the median of {settings['repeat']} "
        "run(s), taken in rounds over all rows so that changes in the machine's load touch every client alike."),
        "",
        ("Cells: messages per second (the median run; *runs*: how many, and half their range relative to the "
        "median); CPU seconds per million messages (client, and the server while serving "
        "it); for fastnsq rows, **vs. peer** = fastnsq msgs/s ÷ the peer's best msgs/s in that workload, and in "
        "brackets the peer's client CPU per message ÷ fastnsq's."),
        "",
    ]
    header = ["Client", "Variant", "msgs/s", "runs", "client CPU s/M", "server CPU s/M",
              *[f"vs. {p}" for p in peers]]
    for workload in ("pub", "mpub", "consume"):
        rows = _rows(data, workload)
        if not rows:
            continue
        lines += [f"### {WORKLOAD_TITLES[workload]}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
        best_peer = {p: _best(rows, p) for p in peers}
        for row in rows:
            if not _ok(row):
                cells = [row["client"], _variant(row), "not measured", "–", "–", "–", *["–"] * len(peers)]
            else:
                vs = [_vs_cell(row, best_peer[p]) if row["client"] == "fastnsq" else "" for p in peers]
                loop = f" [{row['loop']}]" if row.get("loop") else ""
                cells = [f"**{row['client']}**" if row["client"] == "fastnsq" else row["client"],
                         _variant(row) + loop, _num(row["msgs_per_s"], 0), _spread(row), _num(row["cpu_per_million"]),
                         _num(row.get("server_cpu_per_million")), *vs]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += targets(data)
    lines += not_measured(data)
    lines += method_notes(data)
    return "\n".join(lines + footer(fast, data, json_name))


def targets(data: dict[str, Any]) -> list[str]:
    out = ["## Targets", ""]
    for workload, name in (("pub", "single publishes"), ("consume", "consumer")):
        rows = _rows(data, workload)
        fast = _best(rows, "fastnsq")
        python_peers = [r for r in (_best(rows, p) for p in PEER_NAMES if p != "go-nsq") if r]
        if fast is None or not python_peers:
            out.append(f"- {name}: not measured")
            continue
        peer = max(python_peers, key=lambda r: r["msgs_per_s"])
        ratio = fast["msgs_per_s"] / peer["msgs_per_s"]
        verdict = "**met**" if ratio >= SPEED_TARGET else "**not met**"
        low, high = _ratio_range(fast, peer)
        robust = ""
        if low < SPEED_TARGET <= high:
            robust = f" Not robust: the runs' ratios span {low:.1f}× to {high:.1f}×, across the target."
        elif high > low:
            robust = f" The runs' ratios span {low:.1f}× to {high:.1f}×."
        cpu = ""
        if fast.get("cpu_per_million") and peer.get("cpu_per_million"):
            cpu = (f" Per message, {peer['client']} used {peer['cpu_per_million'] / fast['cpu_per_million']:.1f}× "
                   "the client CPU of fastnsq.")
        out.append(f"- fastnsq {name} ≥ {SPEED_TARGET:g}× the best Python peer: {verdict}: "
                   f"{_variant(fast)} {fast['msgs_per_s']:,.0f} msg/s vs {peer['client']} "
                   f"{peer['msgs_per_s']:,.0f} msg/s = {ratio:.1f}×.{robust}{cpu}")
    mpub = _best(_rows(data, "mpub"), "fastnsq")
    if mpub is None:
        out.append("- MPUB limited by the server: not measured")
    elif mpub.get("server_cpu") is None:
        out.append("- MPUB limited by the server: unknown (the server's CPU was not measured: give --nsqd-pid)")
    else:
        # Capacity: one core's worth of messages per second for each side. The side with the
        # lower capacity is the one that limits a run on dedicated cores.
        client_capacity = 1e6 / mpub["cpu_per_million"]
        server_capacity = 1e6 / mpub["server_cpu_per_million"]
        # Within 10 % the two are the same within this harness's noise: say so rather than pick a side.
        ratio = client_capacity / server_capacity
        verdict = "**met**" if ratio > 1.1 else "**not met**" if ratio < 0.9 else "**a tie (within 10 %)**"
        out.append(
            f"- MPUB throughput limited by the server, not the client: {verdict}: per million messages fastnsq "
            f"used {mpub['cpu_per_million']:.2f} CPU s and the server {mpub['server_cpu_per_million']:.2f}, so one "
            f"core feeds {client_capacity / 1e6:.1f} M msg/s through fastnsq but only {server_capacity / 1e6:.1f} M "
            f"through the server (during the window fastnsq was busy {mpub['cpu_s'] / mpub['seconds']:.0%} of a "
            f"core, the server {mpub['server_cpu'] / mpub['seconds']:.0%})."
        )
    return out + [""]


def _ratio_range(fast: dict[str, Any], peer: dict[str, Any]) -> tuple[float, float]:
    """The lowest and highest fastnsq ÷ peer ratio the individual runs allow."""
    fast_runs = fast.get("runs_msgs_per_s") or [fast["msgs_per_s"]]
    peer_runs = peer.get("runs_msgs_per_s") or [peer["msgs_per_s"]]
    return min(fast_runs) / max(peer_runs), max(fast_runs) / min(peer_runs)


def not_measured(data: dict[str, Any]) -> list[str]:
    out = []
    for name, peer in data.get("peers", {}).items():
        if peer.get("error"):
            out.append(f"- {name}: {peer['error']}")
    for row in data["rows"]:
        if not _ok(row):
            out.append(f"- {row['client']} {row['workload']}: {row.get('error', 'no messages measured')}")
    return (["## Not measured", "", *out, ""]) if out else []


def method_notes(data: dict[str, Any]) -> list[str]:
    out = ["## How each client was driven", ""]
    for name, peer in data.get("peers", {}).items():
        if "error" not in peer:
            out.append(f"- {name} {peer.get('version', '')} on Python {peer.get('python', '?')}: {peer.get('notes', '')}")
    seen = set()
    for row in data["rows"]:
        if _ok(row) and row.get("notes") and (row["client"], row["notes"]) not in seen:
            seen.add((row["client"], row["notes"]))
            out.append(f"- {row['client']} {row['workload']}: {row['notes']}")
    load = _max_load(data)
    cores = data["machine"].get("cores") or 1
    if load is not None and load > cores:
        out.append(f"- the machine was shared: the 1-minute load average reached {load:.1f} on {cores} "
                   "cores during the run, so wall-clock rates are lower than on an idle machine; CPU seconds "
                   "per message are less affected")
    capped = [f"{r['client']} {r['workload']}" for r in data["rows"] if _ok(r) and r.get("capped")]
    if capped:
        out.append(f"- stopped by --max-seconds before the full count (rate from what was done): {', '.join(capped)}")
    return out


def _max_load(data: dict[str, Any]) -> float | None:
    """The highest 1-minute load average seen around any run (None if not recorded)."""
    loads = [x for r in data["rows"] for pair in (r.get("runs_loadavg_1m") or [r.get("loadavg_1m") or []])
             for x in pair if x is not None]
    return max(loads) if loads else None


# ---- a real nsqd (run_all.py --real) ----------------------------------------------------------

#: (workload, client, label) of the rows the acceptance lines compare.
SYNC = ("consume", "fastnsq", "sync handler")
SYNC2 = ("consume", "fastnsq", "sync handler, 2 connections")
BATCHES = ("consume", "fastnsq", "batches()")
ASYNC_FOR = ("consume", "fastnsq", "async for")
GO_CONSUMER = ("consume", "go-nsq", "Consumer")
BENCH_READER = ("consume", RAW, "bench_reader")
PUB_OFF = ("pub", "fastnsq", "coalesce off")
PUB_ON = ("pub", "fastnsq", "coalesce on")
GO_PUB_SHARED = ("pub", "go-nsq", "shared Producer")
PUB16 = ("pub16", "fastnsq", "coalesce off")
GO_PUB16 = ("pub16", "go-nsq", "16 Producers")
PUB1 = ("pub1", "fastnsq", "one task")
GO_PUB1 = ("pub1", "go-nsq", "one goroutine")
PUB1K = ("pub1_1k", "fastnsq", "one task")
GO_PUB1K = ("pub1_1k", "go-nsq", "one goroutine")
SYNC_DEFAULT = ("consume_default", "fastnsq", "sync handler")
GO_CONSUMER_DEFAULT = ("consume_default", "go-nsq", "Consumer")
MPUB = ("mpub", "fastnsq", "")
GO_MPUB = ("mpub", "go-nsq", "shared Producer")
BENCH_WRITER = ("mpub", RAW, "bench_writer")

#: Issue 15's acceptance lines: (what, row, against, target ratio of msgs/s).
TARGETS = [
    (("consume, sync handler ≥ 1.0× nsq's raw bench_reader (fastnsq with one connection, max_in_flight 2500; "
     "bench_reader with two, RDY 2500 each)"), SYNC, BENCH_READER, 1.0),
    (("consume, sync handler ≥ 1.0× nsq's raw bench_reader, in bench_reader's shape (two connections, 2500 in "
     "flight on each)"), SYNC2, BENCH_READER, 1.0),
    ("consume, sync handler ≥ 5× the go-nsq Consumer", SYNC, GO_CONSUMER, 5.0),
    ("consume, batches() ≥ 1.0× the sync handler", BATCHES, SYNC, 1.0),
    ("consume, async for ≥ 0.9× the sync handler", ASYNC_FOR, SYNC, 0.9),
    ("PUB from 1,000 callers, coalesce=False, ≥ 2× go-nsq's shared Producer", PUB_OFF, GO_PUB_SHARED, 2.0),
    ("PUB from 16 callers, coalesce=False, ≥ 2× go-nsq's 16 Producers", PUB16, GO_PUB16, 2.0),
    ("MPUB ≥ 1.0× go-nsq", MPUB, GO_MPUB, 1.0),
    # Issue 62: one caller publishing in a loop.
    (("PUB from one caller (an async task awaiting each publish, the defaults) ≥ 1.0× go-nsq's one goroutine, "
     "100-byte bodies"), PUB1, GO_PUB1, 1.0),
    (("PUB from one caller (an async task awaiting each publish, the defaults) ≥ 1.0× go-nsq's one goroutine, "
     "1 KiB bodies"), PUB1K, GO_PUB1K, 1.0),
]
#: Client CPU per message of the sync-handler consumer, µs (= CPU seconds per million).
SYNC_CPU_TARGET = 1.5


def find(data: dict[str, Any], key: tuple[str, str, str]) -> dict[str, Any] | None:
    workload, client, label = key
    for row in data["rows"]:
        if row["workload"] == workload and row["client"] == client and (row.get("label") or "") == label and _ok(row):
            return row
    return None


def paired_ratios(row: dict[str, Any], other: dict[str, Any]) -> list[float]:
    """msgs/s of ``row`` ÷ ``other`` in each round both ran (rows of a round ran back to back)."""
    def by_round(r: dict[str, Any]) -> dict[Any, float]:
        rates = r.get("runs_msgs_per_s") or [r["msgs_per_s"]]
        rounds = r.get("runs_rounds") or list(range(len(rates)))
        return dict(zip(rounds, rates))

    mine, theirs = by_round(row), by_round(other)
    return [mine[k] / theirs[k] for k in sorted(set(mine) & set(theirs), key=str) if theirs[k]]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def acceptance(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured ratio: the median of the per-round ratios decides."""
    out = []
    for what, key, versus, target in TARGETS:
        row, other = find(data, key), find(data, versus)
        if row is None or other is None:
            out.append({"what": what, "target": target, "verdict": "not measured"})
            continue
        per_round = paired_ratios(row, other)
        ratio = _median(per_round) if per_round else row["msgs_per_s"] / other["msgs_per_s"]
        out.append({"what": what, "target": target, "ratio": ratio, "per_round": per_round,
                    "of_medians": row["msgs_per_s"] / other["msgs_per_s"],
                    "verdict": "met" if ratio >= target else "not met"})
    sync = find(data, SYNC)
    if sync is not None:
        cpus = sync.get("runs_cpu_per_million") or [sync["cpu_per_million"]]
        cpu = _median(cpus)
        out.append({"what": f"consume, sync handler: client CPU ≤ {SYNC_CPU_TARGET} µs per message",
                    "target": SYNC_CPU_TARGET, "cpu": cpu, "per_round": cpus,
                    "verdict": "met" if cpu <= SYNC_CPU_TARGET else "not met"})
    return out


def _acceptance_line(item: dict[str, Any]) -> str:
    if item["verdict"] == "not measured":
        return f"- {item['what']}: **not measured**"
    if "cpu" in item:
        runs = ", ".join(f"{c:.2f}" for c in item["per_round"])
        return f"- {item['what']}: **{item['verdict']}**: {item['cpu']:.2f} µs (median of the runs: {runs})"
    runs = ", ".join(f"{r:.2f}" for r in item["per_round"])
    return (f"- {item['what']}: **{item['verdict']}**: {item['ratio']:.2f}× (median of the rounds' ratios: "
            f"{runs}; ratio of the median rates {item['of_medians']:.2f}×)")


def _server_line(data: dict[str, Any]) -> str:
    server = data["server"]
    line = f"{server['version']} (`{server.get('command', '')}`)"
    default = (data.get("servers") or {}).get("default")
    if default:
        line += (f"; the rows on nsqd's default flags: a second {default['version']} (`{default.get('command', '')}`, "
                 "every flag at its default: --mem-queue-size 10000)")
    return line


def _servers(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The nsqd processes of a run by name ("main", "default"); a run before issue 62 had one."""
    return data.get("servers") or {"main": data["server"]}


def _flags(data: dict[str, Any], row: dict[str, Any]) -> str:
    """The nsqd flags that matter for ``row`` (the rest are the harness's loopback addresses and data path)."""
    server = _servers(data).get(row.get("nsqd", "main")) or data["server"]
    size = (server.get("flags") or {}).get("mem_queue_size")
    return f"`--mem-queue-size={size}`" if size else "defaults"


def _load_range(data: dict[str, Any]) -> tuple[float, float] | None:
    loads = [x for r in data["rows"] for pair in (r.get("runs_loadavg_1m") or [r.get("loadavg_1m") or []])
             for x in pair if x is not None]
    return (min(loads), max(loads)) if loads else None


def _rate_cpu(row: dict[str, Any] | None, *, label: bool = False) -> str:
    if row is None:
        return "–"
    name = f"{row.get('label')}: " if label and row.get("label") else ""
    return f"{name}{row['msgs_per_s']:,.0f} ({row['cpu_per_million']:.2f} µs)"


def _best_python(data: dict[str, Any], workload: str) -> dict[str, Any] | None:
    rows = [r for r in _rows(data, workload) if r["client"] in PYTHON_PEERS and _ok(r)]
    return max(rows, key=lambda r: r["msgs_per_s"]) if rows else None


def markdown_real(data: dict[str, Any], json_name: str) -> str:
    machine, fast, settings = data["machine"], data["fastnsq"], data["settings"]
    load = _max_load(data)
    lines = [
        (f"# fastnsq against a real {data['server']['version']}: go-nsq, nsq's raw tools"
         f"{' and the Python clients' if any(r['client'] in PYTHON_PEERS for r in data['rows']) else ''}"),
        "",
        (f"{data['date'][:10]}, {machine['cpu_model']} ({machine['cores']} cores"
         f"{f', shared: load average up to {load:.1f}' if load else ''}), {machine['os']}; "
         f"fastnsq {fast['version']} (codec {fast['codec']}) on uvloop {fast['uvloop']}, Python {data['python']}. "
         f"Server: {_server_line(data)}, started by the harness; every other flag at nsqd's default. "
         f"Each client runs each workload in its own process; 100-byte bodies unless the section says 1 KiB; "
         f"warm-up: {settings['warmup']}. "
         f"Consumers read a topic pre-filled with {settings.get('consume_backlog', 'more than they read')} "
         f"(nsq's bench_reader: {settings.get('raw_reader', 'a fixed time')}). "
         f"CPU: user + system of the client's process over the window (getrusage; the Go tools: their own "
         f"getrusage, or the child's rusage), the server's from /proc. Rows run in rounds, one after the "
         f"other, {settings['repeat']} rounds; a cell is the median run; a ratio below is the median of the "
         f"ratios of runs of the same round."),
        "",
        "## Targets (issues 15 and 62)",
        "",
        *[_acceptance_line(item) for item in acceptance(data)],
        *_coalesced_note(data),
        "",
    ]
    header = ["Client", "Variant", "msgs/s", "runs", "client CPU µs/msg", "nsqd CPU µs/msg", "vs. go-nsq"]
    for workload in ALL_WORKLOADS:
        rows = _rows(data, workload)
        if not rows:
            continue
        go = _best(rows, "go-nsq")
        lines += [f"## {_title(data, workload)}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
        for row in rows:
            if not _ok(row):
                lines.append(f"| {row['client']} | {_variant(row)} | not measured | – | – | – | – |")
                continue
            vs = ""
            if row["client"] == "fastnsq" and go is not None:
                per_round = paired_ratios(row, go)
                vs = f"{_median(per_round):.2f}×" if per_round else f"{row['msgs_per_s'] / go['msgs_per_s']:.2f}×"
            name = f"**{row['client']}**" if row["client"] == "fastnsq" else row["client"]
            capped = " (capped)" if row.get("capped") else ""
            lines.append(f"| {name} | {_variant(row)}{capped} | {_num(row['msgs_per_s'], 0)} | {_spread(row)} | "
                         f"{_num(row['cpu_per_million'])} | {_num(row.get('server_cpu_per_million'))} | {vs} |")
        lines.append("")
    lines += not_measured(data)
    lines += method_notes(data)
    return "\n".join(lines + footer(fast, data, json_name))


def _coalesced_note(data: dict[str, Any]) -> list[str]:
    """Coalesced publishing: what goes on the wire (MPUBs), and how busy nsqd was (it, not fastnsq, sets the rate)."""
    row = find(data, PUB_ON)
    if row is None:
        return []
    note = (f"- PUB from 1,000 callers, coalesced (the default): {row['msgs_per_s']:,.0f} msg/s. fastnsq sends the "
            "publishes of one event-loop pass as one MPUB, so the like-for-like go-nsq figure is its MPUB")
    mpub, go_mpub, go_pub = find(data, MPUB), find(data, GO_MPUB), find(data, GO_PUB_SHARED)
    if go_mpub is not None:
        note += f" ({_same_round_ratio(row, go_mpub):.2f}× go-nsq's MPUB"
        note += f", {_same_round_ratio(row, mpub):.2f}× fastnsq's own)" if mpub is not None else ")"
    if go_pub is not None:
        note += (f"; against go-nsq's 1,000 goroutines sending one PUB each ({go_pub['msgs_per_s']:,.0f} msg/s) "
                 f"it is {_same_round_ratio(row, go_pub):.2f}×, which compares MPUBs with PUBs")
    if row.get("server_cpu") is not None and row.get("seconds"):
        note += (f". nsqd was busy {row['server_cpu'] / row['seconds']:.0%} of a core "
                 f"({row['server_cpu_per_million']:.2f} µs per message), fastnsq {row['cpu_s'] / row['seconds']:.0%} "
                 f"({row['cpu_per_million']:.2f} µs)")
    return [note]


#: The README's rows: (name, row, its go-nsq counterpart, nsq's raw tool, the Python peers' workload). Groups:
#: consume (nsqd with default flags first), one caller publishing, many callers publishing, and MPUB
#: with coalesced PUB beside it (coalesced PUB sends MPUBs: go-nsq's MPUB is its like-for-like figure).
README_ROWS: list[tuple[str, tuple[str, str, str], tuple[str, str, str], tuple[str, str, str] | None, str | None]] = [
    ("consume, sync handler", SYNC_DEFAULT, GO_CONSUMER_DEFAULT, None, None),
    ("consume, sync handler", SYNC, GO_CONSUMER, BENCH_READER, "consume"),
    ("consume, sync handler, 2 connections, 2 × 2500 in flight", SYNC2, GO_CONSUMER, BENCH_READER, None),
    ("consume, `batches()`", BATCHES, GO_CONSUMER, None, None),
    ("consume, `async for`", ASYNC_FOR, GO_CONSUMER, None, None),
    ("PUB, one caller in a loop, 100 B (an async task, the defaults; go-nsq: one goroutine)", PUB1, GO_PUB1, None,
     None),
    ("PUB, one caller in a loop, 1 KiB (the same)", PUB1K, GO_PUB1K, None, None),
    ("PUB, 16 callers, `coalesce=False`", PUB16, GO_PUB16, None, None),
    ("PUB, 1,000 callers, `coalesce=False`", PUB_OFF, GO_PUB_SHARED, None, "pub"),
    ("MPUB ×{batch}, {in_flight} in flight", MPUB, GO_MPUB, BENCH_WRITER, "mpub"),
    ("PUB, 1,000 callers, coalesced (the default): sent as MPUBs, so against go-nsq's MPUB", PUB_ON, GO_MPUB, None,
     None),
]


def _readme_cell(row: dict[str, Any] | None, *, label: bool = False) -> str:
    """msgs/s ±half the runs' range (client CPU per message)."""
    if row is None:
        return "–"
    name = f"{row.get('label')}: " if label and row.get("label") else ""
    rates = row.get("runs_msgs_per_s") or []
    spread = f" ±{(max(rates) - min(rates)) / 2 / row['msgs_per_s']:.0%}" if len(rates) > 1 else ""
    return f"{name}{row['msgs_per_s']:,.0f}{spread} ({row['cpu_per_million']:.2f} µs)"


def _same_round_ratio(row: dict[str, Any], other: dict[str, Any]) -> float:
    per_round = paired_ratios(row, other)
    return _median(per_round) if per_round else row["msgs_per_s"] / other["msgs_per_s"]


def readme_summary_real(data: dict[str, Any], json_name: str) -> str:
    """The README's headline: fastnsq next to go-nsq and the raw tools (and the best Python peer when measured),
    the nsqd flags of every row, and the targets."""
    settings = data["settings"]
    python = any(_best_python(data, w) for w in ("pub", "mpub", "consume"))
    header = ["Workload", "nsqd flags", "fastnsq", "go-nsq library", "nsq raw tool",
              *(["best Python peer"] if python else []), "fastnsq ÷ go-nsq"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for name, key, versus, raw, python_workload in README_ROWS:
        row = find(data, key)
        if row is None:
            continue
        name = name.format(batch=settings["mpub_batch"], in_flight=settings["mpub_concurrency"])
        other = find(data, versus)
        ratio = f"{_same_round_ratio(row, other):.2f}×" if other is not None else "–"
        go_cell = _readme_cell(other, label=True)
        if versus == GO_MPUB and key != MPUB and other is not None:  # coalesced PUB: say the go-nsq cell is MPUB
            go_cell = f"MPUB ×{settings['mpub_batch']}, {go_cell}"
        cells = [name, _flags(data, row), f"**{_readme_cell(row)}**", go_cell,
                 _readme_cell(find(data, raw), label=True) if raw else "–"]
        if python:
            peer = _best_python(data, python_workload) if python_workload else None
            cells.append(f"{peer['client']} {_readme_cell(peer)}" if peer else "–")
        lines.append("| " + " | ".join([*cells, ratio]) + " |")
    machine = data["machine"]
    loads = _load_range(data)
    load = f"; 1-minute load average {loads[0]:.1f} to {loads[1]:.1f} during the runs" if loads else ""
    servers = _servers(data)
    main = servers["main"]
    started = (f"two **{main['version']}** processes, the released binary, started by the harness on loopback "
               f"(`--tcp-address`, `--http-address`, `--data-path`, `--https-address=`, "
               f"`--broadcast-address=127.0.0.1`), one with `--mem-queue-size="
               f"{main.get('flags', {}).get('mem_queue_size', '?')}` (every pre-filled topic in memory) and one with "
               f"every flag at nsqd's default (`--mem-queue-size` 10000: a backlog beyond 10,000 messages "
               f"waits in nsqd's disk queue); the *nsqd flags* column says which served the row"
               if "default" in servers else
               f"**{main['version']}**, the released binary, started by the harness with `--mem-queue-size="
               f"{main.get('flags', {}).get('mem_queue_size', '?')}` (every pre-filled topic in memory; all other "
               f"flags at their defaults)")
    lines += [
        "",
        (f"Cells: messages per second ± half the runs' range (client CPU per message). Measured "
         f"{data['date'][:10]} on {machine['cpu_model']} ({machine['cores']} cores, {machine['os']}{load}), "
         f"Python {data['python']}, against {started}. Each client in its own process, rows alternating, median "
         f"of {settings['repeat']} rounds; 100-byte bodies unless the row says 1 KiB; max_in_flight 2500; no "
         f"warm-up: the clock runs from connect (consumers; go-nsq's raw bench_reader from its first RDY, with "
         f"two connections) or the first publish to the count-th message handled or acknowledged. Ratios are "
         f"medians of same-round ratios. nsqd's own CPU, every variant and the spread: `bench/results/report.md` "
         f"(data: `{json_name}`). Reproduce: `{data['command']}`."),
        "",
        *[_acceptance_line(item) for item in acceptance(data)],
        *_coalesced_note(data),
    ]
    missing = [line[2:] for line in not_measured(data)[2:] if line]
    if missing:
        lines += ["", "Not measured: " + "; ".join(missing) + "."]
    return "\n".join(lines)


# ---- README summary ---------------------------------------------------------------------------

README_START = "<!-- bench-summary: generated by bench/report.py --write-readme; do not edit by hand -->"
README_END = "<!-- /bench-summary -->"


def readme_summary(data: dict[str, Any], json_name: str) -> str:
    """One compact table (fastnsq's best variant and each peer's, per workload) and where it ran."""
    if is_real(data):
        return readme_summary_real(data, json_name)
    peers = [p for p in _peers_present(data) if p in PYTHON_PEERS or p == "go-nsq"]
    workloads = [w for w in ("pub", "mpub", "consume") if _rows(data, w)]
    best = {w: {c: _best(_rows(data, w), c) for c in ["fastnsq", *peers]} for w in workloads}
    short = {"pub": "PUB", "mpub": "MPUB", "consume": "consume"}
    header = ["Client"] + [cell for w in workloads for cell in (f"{short[w]} msgs/s", f"{short[w]} CPU s/M")]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for client in ["fastnsq", *peers]:
        cells = [f"**{client}**" if client == "fastnsq" else client]
        for w in workloads:
            row = best[w][client]
            cells += [_num(row["msgs_per_s"], 0), _num(row["cpu_per_million"])] if row else ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    ratio = ["fastnsq ÷ best peer"]
    for w in workloads:
        fast = best[w]["fastnsq"]
        rivals = [r for p, r in best[w].items() if p != "fastnsq" and r]
        if fast is None or not rivals:
            ratio += ["–", "–"]
            continue
        top = max(rivals, key=lambda r: r["msgs_per_s"])
        leanest = min(rivals, key=lambda r: r["cpu_per_million"])
        ratio += [f"{fast['msgs_per_s'] / top['msgs_per_s']:.1f}× ({top['client']})",
                  f"{leanest['cpu_per_million'] / fast['cpu_per_million']:.1f}× less ({leanest['client']})"]
    lines.append("| " + " | ".join(ratio) + " |")
    machine, server, settings = data["machine"], data["server"], data["settings"]
    variants = ", ".join(f"{short[w]}: {_variant(best[w]['fastnsq'])}" for w in workloads if best[w]["fastnsq"])
    missing = [line[2:] for line in not_measured(data)[2:] if line]
    lines += [
        "",
        (f"Measured {data['date'][:10]} on {machine['cpu_model']} ({machine['cores']} cores), Python "
         f"{data['python']}, against **{server['description']}** (speaking {server['version']}), "
         f"each client in its own process; 100-byte bodies; median of {settings['repeat']} rounds. "
         f"PUB: 1,000 concurrent callers; MPUB: batches of 200; consume: max_in_flight 2500, until the last FIN. "
         f"fastnsq's row is its best variant ({variants}); CPU s/M is the client's CPU seconds per million "
         f"messages. Every variant, the server's CPU and the spread of the runs: `bench/results/embedded/report.md` "
         f"(data: `{json_name}`)."),
    ]
    if missing:
        lines += ["", "Not measured: " + "; ".join(missing) + "."]
    return "\n".join(lines)


def update_readme(readme: Path, summary: str) -> None:
    """Replace the text between the README's bench-summary markers."""
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: the markers {README_START!r} ... {README_END!r} are missing")
    readme.write_text(text[: start + len(README_START)] + "\n" + summary + "\n" + text[end:])


# ---- chart ------------------------------------------------------------------------------------


def chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = [(w, [r for r in _rows(data, w) if _ok(r)]) for w in ALL_WORKLOADS]
    panels = [(w, rows) for w, rows in panels if rows]
    if not panels:
        return
    heights = [max(len(rows), 1) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, 1.2 + 0.42 * sum(heights) + 0.6 * len(panels)),
                             gridspec_kw={"height_ratios": heights, "width_ratios": [3, 2]}, sharex="col",
                             squeeze=False)
    rates = [r["msgs_per_s"] for _, rows in panels for r in rows]
    cpus = [r["cpu_per_million"] for _, rows in panels for r in rows if r.get("cpu_per_million")]
    for (rate_ax, cpu_ax), (workload, rows) in zip(axes, panels):
        labels = [f"{r['client']} · {r['label']}" if r.get("label") else r["client"] for r in rows]
        y = list(range(len(rows)))[::-1]
        colors = [COLORS.get(r["client"], "#999") for r in rows]
        # fastnsq's bars are labelled against go-nsq's library when it ran (a real nsqd), else the Python peers.
        gonsq = [r for r in rows if r["client"] == "go-nsq"]
        peers = gonsq if is_real(data) and gonsq else [r for r in rows if r["client"] in PYTHON_PEERS]
        versus = "go-nsq" if is_real(data) and gonsq else "the best Python peer"
        best = max(peers, key=lambda r: r["msgs_per_s"], default=None)
        bars = rate_ax.barh(y, [r["msgs_per_s"] for r in rows], color=colors, height=0.7)
        for bar, row in zip(bars, rows):
            text = f"{row['msgs_per_s']:,.0f}"
            if row["client"] == "fastnsq" and best is not None:
                # as the tables: the median of same-round ratios (falls back to the medians' ratio)
                text += f"  ({_same_round_ratio(row, best):.2f}× {versus})"
                if (row["workload"], row["client"], row.get("label") or "") == PUB_ON:
                    text += ", sent as MPUBs: compare MPUB"
            rate_ax.text(bar.get_width() * 1.06, bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8.5)
        rate_ax.set_yticks(y, labels, fontsize=9)
        rate_ax.set_title(CHART_TITLES.get(workload) or _title(data, workload), fontsize=10, loc="left")
        rate_ax.set_xscale("log")
        rate_ax.set_xlim(min(rates) / 2, max(rates) * 12)
        leanest = min((r["cpu_per_million"] for r in peers if r.get("cpu_per_million")), default=None)
        bars = cpu_ax.barh(y, [r.get("cpu_per_million") or 0 for r in rows], color=colors, height=0.7)
        for bar, row in zip(bars, rows):
            cpu = row.get("cpu_per_million")
            if not cpu:
                continue
            text = f"{cpu:.2f}"
            if row["client"] == "fastnsq" and leanest:
                text += f"  ({leanest / cpu:.1f}× less than {'go-nsq' if versus == 'go-nsq' else 'the leanest peer'})"
            cpu_ax.text(cpu * 1.06, bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8.5)
        cpu_ax.set_yticks(y, [""] * len(rows))
        cpu_ax.set_title("client CPU per million messages", fontsize=10, loc="left")
        cpu_ax.set_xscale("log")
        if cpus:
            cpu_ax.set_xlim(min(cpus) / 2, max(cpus) * 12)
        for ax in (rate_ax, cpu_ax):
            ax.grid(axis="x", which="major", alpha=0.3)
            ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].xaxis.set_major_formatter(FuncFormatter(_si))
    axes[-1, 0].set_xlabel("messages per second (log scale; higher is better)")
    axes[-1, 1].set_xlabel("CPU seconds per million messages, client process (log scale; lower is better)")
    server = data["server"]["version"]
    python = any(r["client"] in PYTHON_PEERS and _ok(r) for r in data["rows"])
    who = (f"go-nsq, nsq's raw tools{' and the Python NSQ clients' if python else ''}" if is_real(data)
            else "Python NSQ clients")
    sizes = " (1 KiB where the panel says)" if any(r.get("body_size", 100) != 100 for r in data["rows"]) else ""
    flags = ""
    if is_real(data):
        size = (data["server"].get("flags") or {}).get("mem_queue_size")
        flags = f" --mem-queue-size={size}" if size else ""
        flags += " (default flags where the panel says)" if "default" in _servers(data) else ""
    fig.suptitle(f"fastnsq vs {who} — {data['date'][:10]}, {data['machine']['cores']} cores, "
                 f"100-byte messages{sizes}, server: {server}{flags}", fontsize=9.5)
    load = _max_load(data)
    cores = data["machine"].get("cores") or 1
    if load is not None and load > cores:
        fig.text(0.01, 0.005, f"Shared machine: load average up to {load:.1f} on {cores} cores during the run; "
                 "rates are lower than on an idle machine; CPU per message is less affected.",
                 fontsize=8, color="#555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _si(value: float, _pos: Any = None) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:g}{unit}"
    return f"{value:g}"


#: The README's summary table, as ``--write-readme`` would put it there, written beside report.md on every render.
SUMMARY_NAME = "readme-summary.md"
#: What --readme did (rewrite README.md's table) is asked for by this name now.
README_RENAMED = ("--readme is now --write-readme (it rewrites the summary table in README.md, or bench/README.md "
                  "for the embedded server); without it the table goes to readme-summary.md beside report.md")


def render(json_path: Path, out_dir: Path | None = None, readme: Path | None = None) -> tuple[Path, Path]:
    """Write report.md, chart.png and readme-summary.md (the README's summary table) for
    ``json_path`` (next to it unless ``out_dir``); with ``readme``, also replace the summary
    table between that file's bench-summary markers."""
    json_path = Path(json_path)
    out_dir = out_dir or json_path.parent
    data = load(json_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "report.md"
    png = out_dir / "chart.png"
    root = Path(__file__).resolve().parents[1]
    shown = json_path.resolve()
    shown_name = str(shown.relative_to(root)) if shown.is_relative_to(root) else str(shown)
    md.write_text(markdown(data, shown_name) + "\n![chart](chart.png)\n")
    chart(data, png)
    summary = readme_summary(data, shown_name)
    (out_dir / SUMMARY_NAME).write_text(f"{README_START}\n{summary}\n{README_END}\n")
    if readme is not None:
        update_readme(readme, summary)
    return md, png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render report.md and chart.png from a run_all.py JSON.")
    parser.add_argument("json", nargs="?", default=None, help="default: the newest bench/results/<date>-<host>.json")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--write-readme", action="store_true",
                        help="also replace the summary table in README.md (without it: readme-summary.md beside "
                        "report.md only)")
    parser.add_argument("--readme", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.readme:
        parser.error(README_RENAMED)
    readme = Path(__file__).resolve().parents[1] / "README.md" if args.write_readme else None
    md, png = render(Path(args.json) if args.json else newest_json(), Path(args.out_dir) if args.out_dir else None,
                     readme)
    print(f"wrote {md}, {png} and {md.parent / SUMMARY_NAME}" + (" and README.md's summary table" if readme else ""))
    return 0



def footer(fast: dict[str, Any], data: dict[str, Any], json_name: str) -> list[str]:
    """The report's last lines: the commit measured (and what was uncommitted), the data, the command."""
    lines: list[str] = []
    commit = fast.get("commit")
    if commit:
        dirty = fast.get("uncommitted_library_files") or []
        lines += ["", f"fastnsq at commit `{commit[:12]}`" + (
            f", with uncommitted changes in {', '.join(f'`{f}`' for f in dirty)}" if dirty else "") + "."]
    return lines + ["", f"Data: `{json_name}`. Reproduce: `{data['command']}` (took {data.get('duration_s', '?')} s).", ""]


if __name__ == "__main__":
    sys.exit(main())
