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
    assert f"| consume, sync handler | **{sync['msgs_per_s']:,.0f} ({sync['cpu_per_million']:.2f} µs)** |" in summary
    assert f"| {median:.2f}× |" in summary.splitlines()[2]
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
    assert "| consume, sync handler | **" in text


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
