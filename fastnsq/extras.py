"""The optional extras: which modules each brings, and the error that names the extra when one is missing.

One job: turn "this feature needs a library that is not installed" into one error that says
which extra installs it (``pip install "fastnsq-client[parquet]"``), raised where the
feature starts (an app's option at its start, a module at its import), never halfway
through a run. The extras are pyproject.toml's ``[project.optional-dependencies]`` of the
same names; ``tests/test_extras.py`` keeps the two and the documentation's pages in step.
"""

from __future__ import annotations

import importlib.util

__all__ = ["DISTRIBUTION", "EXTRAS", "MissingExtra", "install_command", "missing_modules", "require"]

#: The name on PyPI (the import name, fastnsq, was taken there by an unrelated project).
DISTRIBUTION = "fastnsq-client"

#: Each extra's modules, as imported. ``all`` installs every one of them.
EXTRAS: dict[str, tuple[str, ...]] = {
    "parquet": ("pyarrow",),  # fastnsq to-file --format parquet
    "metrics": ("prometheus_client",),  # fastnsq.metrics, /metrics of the worker and the apps
    "otel": ("opentelemetry",),  # fastnsq.otel
    "spark": ("pyspark", "pyarrow"),  # fastnsq.spark (PySpark brings its own need of pandas)
    "postgres": ("asyncpg",),  # fastnsq to-postgres
    "gzip": ("isal",),  # to-file --gzip through ISA-L (without it: cramjam's gzip, then zlib's; never required)
}


class MissingExtra(ImportError):
    """A feature was asked for whose extra is not installed; the message names the extra."""

    def __init__(self, feature: str, extra: str, missing: list[str]) -> None:
        self.feature, self.extra, self.missing = feature, extra, missing
        super().__init__(f"{feature} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                         f"not installed: {install_command(extra)}")


def install_command(extra: str) -> str:
    """The command that installs ``extra``, as the documentation gives it."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found, not imported: this is cheap)."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtra` naming ``feature`` and ``extra`` unless all of its modules are installed."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(feature, extra, missing)
