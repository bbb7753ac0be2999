"""The extras match the documentation: pyproject.toml, fastnsq.extras and the pages agree, and a
feature whose extra is missing fails where it starts, naming the extra to install."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fastnsq import extras
from fastnsq.cli import main
from fastnsq.runner.settings import SettingsError, WorkerSettings, check

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

#: The distribution that brings each module of an extra.
DISTRIBUTION_OF = {"pyarrow": "pyarrow", "prometheus_client": "prometheus_client", "opentelemetry": "opentelemetry-api",
                   "pyspark": "pyspark", "isal": "isal", "asyncpg": "asyncpg"}
#: What on a page means its reader needs an extra.
NEEDS = {
    "parquet": r"--format parquet",
    "metrics": r"--metrics-port|fastnsq\.metrics|NSQMetrics",
    "otel": r"fastnsq\.otel",
    "spark": r"fastnsq\.spark(?!\.\*)|pyspark",  # not the logger names fastnsq.spark.*
    "gzip": r"ISA-L",
    "postgres": r"to-postgres",
}
#: Pages about the code rather than for its users (the API pages render the modules' docstrings,
#: checked below; the architecture page draws the modules).
NOT_USER_PAGES = {"architecture.md", "changelog.md"}


def optional_dependencies() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in requirements}


def test_each_extra_brings_the_modules_fastnsq_imports_for_it() -> None:
    declared = optional_dependencies()
    for extra, modules in extras.EXTRAS.items():
        assert {DISTRIBUTION_OF[module] for module in modules} <= names(declared[extra]), extra


def test_all_is_every_users_extra() -> None:
    (everything,) = optional_dependencies()["all"]
    listed = re.fullmatch(r"fastnsq-client\[([a-z,]+)\]", everything)
    assert listed is not None and set(listed.group(1).split(",")) == set(extras.EXTRAS)


def test_every_page_that_needs_an_extra_says_which() -> None:
    unsaid = []
    for page in sorted(DOCS.glob("*.md")):
        if page.name in NOT_USER_PAGES:
            continue
        text = page.read_text()
        unsaid += [f"{page.name}: {extra}" for extra, pattern in NEEDS.items()
                   if re.search(pattern, text) and extras.install_command(extra) not in text]
    assert unsaid == []


@pytest.mark.parametrize(("module", "extra"), [("fastnsq.metrics", "metrics"), ("fastnsq.otel", "otel"),
                                               ("fastnsq.spark", "spark")])
def test_the_api_pages_modules_name_their_extra(module: str, extra: str) -> None:
    source = ROOT / (module.replace(".", "/") + ".py")
    if not source.exists():
        source = source.with_suffix("") / "__init__.py"
    assert extras.install_command(extra) in source.read_text().split('"""')[1]


def test_getting_started_lists_every_extra() -> None:
    text = (DOCS / "getting-started.md").read_text()
    for extra in [*extras.EXTRAS, "all"]:
        assert extras.install_command(extra) in text, extra


def test_a_missing_module_names_the_feature_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed: find_spec says None
    with pytest.raises(extras.MissingExtra) as raised:
        extras.require("parquet", "--format parquet")
    assert str(raised.value) == '--format parquet needs pyarrow, which is not installed: pip install "fastnsq-client[parquet]"'
    assert isinstance(raised.value, ImportError)


def test_an_installed_extra_passes() -> None:
    extras.require("metrics", "fastnsq.metrics")  # prometheus_client is in the test extra


def test_to_file_parquet_without_pyarrow_fails_at_start(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    status = main(["to-file", "--topic", "events", "--output-dir", str(tmp_path), "--format", "parquet",
                   "--nsqd-tcp-address", "127.0.0.1:1"])
    assert status == 2
    assert 'needs pyarrow, which is not installed: pip install "fastnsq-client[parquet]"' in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_metrics_port_without_prometheus_client_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    settings = WorkerSettings(target="tasks:handle", topic="events", channel="work", metrics_port=9100)
    with pytest.raises(SettingsError, match=re.escape('--metrics-port 9100 (its /metrics) needs prometheus_client, '
                                                      'which is not installed: pip install "fastnsq-client[metrics]"')):
        check(settings)
    check(WorkerSettings(target="tasks:handle", topic="events", channel="work"))  # no port: no extra needed


@pytest.mark.parametrize(("module", "missing", "extra"), [
    ("fastnsq.metrics", "prometheus_client", "metrics"),
    ("fastnsq.otel", "opentelemetry", "otel"),
    ("fastnsq.spark", "pyspark", "spark"),
])
def test_a_module_whose_extra_is_missing_names_it_on_import(module: str, missing: str, extra: str) -> None:
    code = f"import sys; sys.modules[{missing!r}] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert f'fastnsq.extras.MissingExtra: {module} needs {missing}, which is not installed: ' \
           f'pip install "fastnsq-client[{extra}]"' in done.stderr
