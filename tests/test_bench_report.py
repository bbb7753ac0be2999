"""The benchmark report: the README's summary table is what bench/report.py makes of the JSON."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
report = pytest.importorskip("report")

README = ROOT / "README.md"


def readme_summary_and_json() -> tuple[str, Path]:
    text = README.read_text()
    start = text.index(report.README_START) + len(report.README_START) + 1
    summary = text[start : text.index(report.README_END) - 1]
    json_name = re.search(r"\(data: `([^`]+\.json)`\)", summary).group(1)  # type: ignore[union-attr]
    return summary, ROOT / json_name


def test_readme_summary_is_generated_from_the_committed_results():
    summary, json_path = readme_summary_and_json()
    data = report.load(json_path)
    assert summary == report.readme_summary(data, str(json_path.relative_to(ROOT)))


def test_summary_ratios_are_computed_from_the_rows():
    _, json_path = readme_summary_and_json()
    data = report.load(json_path)
    summary = report.readme_summary(data, "x.json")
    pub = [r for r in data["rows"] if r["workload"] == "pub" and "error" not in r]
    fast = max((r for r in pub if r["client"] == "fastnsq"), key=lambda r: r["msgs_per_s"])
    peer = max((r for r in pub if r["client"] != "fastnsq"), key=lambda r: r["msgs_per_s"])
    assert f"| {fast['msgs_per_s'] / peer['msgs_per_s']:.1f}× ({peer['client']}) |" in summary
    assert f"| **fastnsq** | {fast['msgs_per_s']:,.0f} |" in summary


def test_render_writes_report_chart_and_readme_section(tmp_path):
    _, json_path = readme_summary_and_json()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_START}\nold table\n{report.README_END}\noutro\n")
    pytest.importorskip("matplotlib")
    md, png = report.render(json_path, out_dir=tmp_path, readme=readme)
    assert md.read_text().startswith("# fastnsq vs the Python NSQ clients")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = readme.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "| **fastnsq** |" in text


def test_update_readme_without_markers_names_them(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="bench-summary"):
        report.update_readme(readme, "table")
