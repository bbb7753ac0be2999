"""The benchmark reports: the README tables are what bench/report.py makes of committed JSON.

README.md shows the run against a real nsqd (``run_all.py --real``); bench/README.md
shows the run against the embedded server. Both tables sit between the bench-summary
markers and must be exactly what the report renders from the JSON they name.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
report = pytest.importorskip("report")

README = ROOT / "README.md"
BENCH_README = ROOT / "bench" / "README.md"


def summary_and_json(readme: Path) -> tuple[str, Path]:
    text = readme.read_text()
    start = text.index(report.README_START) + len(report.README_START) + 1
    summary = text[start : text.index(report.README_END) - 1]
    json_name = re.search(r"\(data: `([^`]+\.json)`\)", summary).group(1)  # type: ignore[union-attr]
    return summary, ROOT / json_name


@pytest.mark.parametrize("readme", [README, BENCH_README], ids=["README", "bench-README"])
def test_readme_summary_is_generated_from_the_committed_results(readme: Path) -> None:
    summary, json_path = summary_and_json(readme)
    data = report.load(json_path)
    assert summary == report.readme_summary(data, str(json_path.relative_to(ROOT)))


def test_the_readme_headline_is_a_real_nsqd_and_the_bench_readme_the_embedded_one() -> None:
    _, real = summary_and_json(README)
    _, embedded = summary_and_json(BENCH_README)
    assert report.is_real(report.load(real))
    assert report.load(real)["server"]["version"].startswith("nsqd 1.3")
    assert report.load(embedded)["server"]["kind"] == "embedded"


def test_real_summary_ratios_are_medians_of_same_round_ratios() -> None:
    summary, json_path = summary_and_json(README)
    data = report.load(json_path)
    rows = {(r["workload"], r["client"], r.get("label") or ""): r for r in data["rows"] if "error" not in r}
    sync = rows[("consume", "fastnsq", "sync handler")]
    go = rows[("consume", "go-nsq", "Consumer")]
    rounds_sync = dict(zip(sync["runs_rounds"], sync["runs_msgs_per_s"]))
    rounds_go = dict(zip(go["runs_rounds"], go["runs_msgs_per_s"]))
    ratios = sorted(rounds_sync[k] / rounds_go[k] for k in rounds_sync.keys() & rounds_go.keys())
    assert len(ratios) >= 3, "the headline needs at least three alternated rounds"
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    line = next(line for line in summary.splitlines() if line.startswith("| consume, sync handler | `--mem-queue-size"))
    assert f" | **{sync['msgs_per_s']:,.0f} " in line and f" ({sync['cpu_per_million']:.2f} µs)** |" in line
    assert line.endswith(f"| {median:.2f}× |")
    verdicts = {item["what"]: item["verdict"] for item in report.acceptance(data)}
    for what, verdict in verdicts.items():
        assert f"- {what}: **{verdict}**" in summary


def test_paired_ratios_pair_runs_of_the_same_round() -> None:
    a = {"msgs_per_s": 10.0, "runs_msgs_per_s": [10.0, 20.0, 30.0], "runs_rounds": [0, 1, 2]}
    b = {"msgs_per_s": 5.0, "runs_msgs_per_s": [5.0, 40.0], "runs_rounds": [0, 2]}
    assert report.paired_ratios(a, b) == [2.0, 0.75]


def test_render_writes_report_chart_and_readme_section(tmp_path: Path) -> None:
    _, json_path = summary_and_json(README)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_START}\nold table\n{report.README_END}\noutro\n")
    pytest.importorskip("matplotlib")
    md, png = report.render(json_path, out_dir=tmp_path, readme=readme)
    assert md.read_text().startswith("# fastnsq against a real nsqd 1.3")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = readme.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "| consume, sync handler | `--mem-queue-size=10000000` | **" in text


def test_render_without_readme_writes_the_table_beside_the_report_only(tmp_path: Path) -> None:
    """Issue 62: the table a run would put in README.md goes to readme-summary.md; no README changes."""
    summary, json_path = summary_and_json(README)
    pytest.importorskip("matplotlib")
    before = {path: path.read_bytes() for path in (README, BENCH_README)}
    md, _ = report.render(json_path, out_dir=tmp_path)
    beside = (md.parent / report.SUMMARY_NAME).read_text()
    assert beside == f"{report.README_START}\n{summary}\n{report.README_END}\n"
    assert {path: path.read_bytes() for path in before} == before


@pytest.mark.parametrize("script", ["report", "run_all"])
def test_the_old_readme_flag_is_refused_at_once(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--readme`` used to rewrite README.md; it now stops before anything runs, naming --write-readme."""
    module = pytest.importorskip(script)
    with pytest.raises(SystemExit) as stopped:
        module.main(["--readme"])
    assert stopped.value.code == 2
    assert "--write-readme" in capsys.readouterr().err


def test_update_readme_without_markers_names_them(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="bench-summary"):
        report.update_readme(readme, "table")


@pytest.mark.parametrize("name,consumer", [("latency-patterns.md", "fastnsq, unbuffered"),
                                           ("latency-patterns-go-nsq-consumer.md", "go-nsq, unbuffered"),
                                           ("latency-patterns-fastnsq-defaults-consumer.md", "fastnsq with its default")])
def test_pattern_tables_are_generated_from_the_committed_results(name: str, consumer: str) -> None:
    """Each --patterns run renders into its consumer's file, naming that consumer; the tables
    above the hand-written part are what the report makes of the JSON they name."""
    latency = pytest.importorskip("latency")
    latency_report = pytest.importorskip("latency_report")
    path = ROOT / "bench" / "results" / name
    text = path.read_text()
    json_name = re.search(r"Data: `([^`]+\.json)`", text).group(1)  # type: ignore[union-attr]
    data = json.loads((ROOT / json_name).read_text())
    rows = [latency.Row(r["name"], r["client"], r["config"], [], []) for r in data["rows"]]
    data["summary"] = latency.summarize(rows, data["points"])
    assert latency_report.patterns_target(data) == path
    assert f"Consumer of every row: {consumer}" in text
    tables = text.split(latency_report.KEPT_MARKER)[0].rstrip("\n")
    assert tables == latency_report.patterns_markdown(data, json_name).rstrip("\n")


def test_fastnsq_bench_mpub_runs_as_many_in_flight_as_the_readmes_row() -> None:
    """Issue 62: ``fastnsq bench``'s mpub ran 16 MPUBs in flight where the README's row (run_all.py
    --real, every client alike) says 4."""
    from fastnsq import benchmark

    run_all = pytest.importorskip("run_all")
    in_flight = benchmark.SCENARIOS["mpub"].settings["concurrency"]
    assert in_flight == run_all.REAL_MPUB_CONCURRENCY == 4
    assert f"| MPUB ×{run_all.MPUB_BATCH}, {in_flight} in flight |" in README.read_text()
    assert f"{in_flight} MPUBs in flight" in benchmark.SCENARIOS["mpub"].description


# ---- issue 62: one caller publishing, nsqd with its default flags, coalesced PUB beside MPUB ------------


def _with_issue62_rows(data: dict) -> dict:
    """``data`` (a run before issue 62) with the rows and the second nsqd a run now has, from copies of its rows."""
    import copy

    data = copy.deepcopy(data)
    data["rows"] = [r for r in data["rows"] if r["workload"] not in ("pub1", "pub1_1k", "consume_default")]
    rows = {(r["workload"], r["client"], r.get("label") or ""): r for r in data["rows"]}
    new = []
    for workload, size, fast_rate, go_rate in (("pub1", 100, 24_000.0, 20_000.0), ("pub1_1k", 1024, 21_000.0, 20_000.0)):
        for client, label, rate in (("fastnsq", "one task", fast_rate), ("go-nsq", "one goroutine", go_rate)):
            row = copy.deepcopy(rows[("pub", client, "coalesce off" if client == "fastnsq" else "shared Producer")])
            row.update(workload=workload, label=label, body_size=size, nsqd="main", msgs_per_s=rate,
                       runs_msgs_per_s=[rate * f for f in (0.95, 1.0, 1.05)], runs_rounds=[0, 1, 2])
            new.append(row)
    for key in (report.SYNC, report.GO_CONSUMER):
        row = copy.deepcopy(rows[key])
        row.update(workload="consume_default", nsqd="default", msgs_per_s=row["msgs_per_s"] / 2,
                   runs_msgs_per_s=[x / 2 for x in row["runs_msgs_per_s"]])
        new.append(row)
    data["rows"] += new
    default = {**data["server"], "command": "nsqd --data-path=/tmp/x", "flags": {"mem_queue_size": None}}
    data["servers"] = {"main": data["server"], "default": default}
    return data


def test_real_summary_has_the_single_caller_and_default_flag_rows_with_their_flags() -> None:
    _, json_path = summary_and_json(README)
    data = _with_issue62_rows(report.load(json_path))
    summary = report.readme_summary(data, "x.json")
    table = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    by_name = {}
    for line in table:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        by_name.setdefault(cells[0], []).append(cells)
    # every number stands beside the nsqd flags it was measured with
    assert all(cells[1] in ("defaults", "`--mem-queue-size=10000000`") for rows in by_name.values() for cells in rows)
    default, memq = by_name["consume, sync handler"]
    assert default[1] == "defaults" and memq[1] == "`--mem-queue-size=10000000`"
    one_100 = next(cells for name, rows in by_name.items() for cells in rows if name.startswith("PUB, one caller") and
                   "100 B" in name)
    one_1k = next(cells for name, rows in by_name.items() for cells in rows if name.startswith("PUB, one caller") and
                  "1 KiB" in name)
    assert one_100[2].startswith("**24,000 ±5% (") and one_100[3].startswith("one goroutine: 20,000 ±5% (")
    assert one_100[-1] == "1.20×" and one_1k[-1] == "1.05×"
    assert "1 KiB" in summary.split("Cells:")[1].split("Ratios")[0]  # the sizes are said beside the table
    assert "every flag at nsqd's default (`--mem-queue-size` 10000" in summary
    # coalesced PUB right after MPUB, compared with go-nsq's MPUB, and the note says why
    names = [line.split(" | ")[0][2:] for line in table]
    mpub = next(i for i, n in enumerate(names) if n.startswith("MPUB"))
    assert names[mpub + 1].startswith("PUB, 1,000 callers, coalesced")
    coalesced = table[mpub + 1].split(" | ")
    assert coalesced[3].startswith("MPUB ×200, shared Producer: ")
    go_mpub = report.find(data, report.GO_MPUB)
    pub_on = report.find(data, report.PUB_ON)
    assert coalesced[-1] == f"{report._median(report.paired_ratios(pub_on, go_mpub)):.2f}× |"
    assert "sends the publishes of one event-loop pass as one MPUB, so the like-for-like go-nsq figure is its MPUB" \
        in summary
    # the issue's acceptance lines, at both sizes
    assert ("- PUB from one caller (an async task awaiting each publish, the defaults) ≥ 1.0× go-nsq's one goroutine, "
            "100-byte bodies: **met**: 1.20×") in summary
    assert "1 KiB bodies: **met**: 1.05×" in summary


def test_real_summary_without_python_peers_has_no_python_column() -> None:
    """``--clients fastnsq,go-nsq``: no empty "best Python peer" column."""
    _, json_path = summary_and_json(README)
    data = report.load(json_path)
    data["rows"] = [r for r in data["rows"] if r["client"] not in report.PYTHON_PEERS]
    summary = report.readme_summary(data, "x.json")
    assert "best Python peer" not in summary
    assert summary.splitlines()[0] == ("| Workload | nsqd flags | fastnsq | go-nsq library | nsq raw tool | "
                                       "fastnsq ÷ go-nsq |")


def test_run_all_rows_for_one_caller_and_the_default_flag_nsqd() -> None:
    run_all = pytest.importorskip("run_all")
    fast = {(r.workload, r.label): r for r in run_all.fastnsq_rows(4, real=True)}
    info = {"library_workloads": ["consume", "pub", "mpub"], "raw_workloads": ["mpub", "consume"]}
    go = {(r.workload, r.label): r for r in run_all.go_rows(info, "/bin", 4)}
    for workload, size in (("pub1", 100), ("pub1_1k", 1024)):
        mine, theirs = fast[(workload, "one task")], go[(workload, "one goroutine")]
        assert mine.command[mine.command.index("--concurrency") + 1] == "1" and "--no-coalesce" not in mine.command
        assert theirs.command[theirs.command.index("--concurrency") + 1] == "1" and "--shared" not in theirs.command
        assert mine.size == theirs.size == size and mine.nsqd == theirs.nsqd == "main"
        assert run_all.REAL_COUNTS[workload] >= 100_000  # a few seconds at 20-30 thousand a second
    assert fast[("consume_default", "sync handler")].nsqd == go[("consume_default", "Consumer")].nsqd == "default"
    assert fast[("consume", "sync handler")].nsqd == "main"
    # an embedded run has none of them (no go-nsq, no nsqd flags)
    assert not [r for r in run_all.fastnsq_rows(16, real=False) if r.workload not in run_all.DEFAULT_COUNTS]


def test_fastnsq_benchmark_takes_a_body_size() -> None:
    from fastnsq import benchmark

    args = benchmark.build_parser().parse_args(["--workload", "pub", "--concurrency", "1", "--size", "1024"])
    options = benchmark._options(args)
    assert options["size"] == 1024 and options["concurrency"] == 1 and options["coalesce"] is True
    args = benchmark.build_parser().parse_args(["--workload", "consume", "--size", "1024"])
    assert "size" not in benchmark._options(args)  # a consumer reads what is there (--prefill writes that size)


def test_the_committed_readme_has_the_issue62_rows() -> None:
    """The README's run has one caller publishing at 100 B and 1 KiB and consume on a default-flag nsqd."""
    summary, json_path = summary_and_json(README)
    data = report.load(json_path)
    for key in (report.PUB1, report.GO_PUB1, report.PUB1K, report.GO_PUB1K, report.SYNC_DEFAULT,
                report.GO_CONSUMER_DEFAULT):
        assert report.find(data, key) is not None, key
    assert report.find(data, report.PUB1K)["body_size"] == 1024
    assert data["servers"]["default"]["flags"]["mem_queue_size"] is None
    assert "--mem-queue-size" not in data["servers"]["default"]["command"]
    assert "| consume, sync handler | defaults | **" in summary
    assert "| PUB, one caller in a loop, 100 B " in summary and "| PUB, one caller in a loop, 1 KiB " in summary
