"""One ``/metrics`` for the group: the children's Prometheus texts added up, and the group's own figures.

One job: merging. Each child sends the text of its whole default registry (fastnsq's
collector, the process and GC collectors, and whatever the user's handler registered).
Samples with the same name and labels are added: counters (and histograms and summaries)
over every child, including the last figures of children that have exited, so that a
restart never makes a group counter go down; gauges over the live children, but
``nsq_consumer_backoff_level``, which is the highest. Figures that mean nothing summed
(start times, descriptor limits, ``*_created`` stamps, ``python_info``) are left out, the
``*_created`` families with their stamps (no ``# TYPE`` line left without a sample). The group's
text orders each family's samples as a single process's prometheus_client does: a label set's
histogram buckets by increasing ``le``, ``+Inf`` last, then its ``_count`` and ``_sum``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: Families whose sum over processes means nothing.
DROPPED = frozenset({"process_start_time_seconds", "process_max_fds", "python_info"})
#: Gauges whose group value is the highest child's, not the sum.
HIGHEST = frozenset({"nsq_consumer_backoff_level"})
#: Sample kinds that only go up while a process lives: kept after it exits.
CUMULATIVE = frozenset({"counter", "histogram", "summary"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Family:
    name: str
    kind: str
    documentation: str
    samples: dict[SampleKey, float] = field(default_factory=dict)


def parse(text: str) -> list[Family]:
    """A child's exposition as families of samples (``*_created`` stamps left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    metrics = list(text_string_to_metric_families(text))
    # prometheus_client's text format gives a counter's, histogram's or summary's creation time
    # a gauge family of its own, NAME_created: left out whole, or its HELP and TYPE stay with
    # no sample under them. A gauge of the user's that happens to end in _created stays.
    stamps = {f"{metric.name}_created" for metric in metrics if metric.type in CUMULATIVE}
    families = []
    for metric in metrics:
        if metric.name in DROPPED or (metric.name in stamps and metric.type == "gauge"):
            continue
        family = Family(metric.name, metric.type, metric.documentation)
        for sample in metric.samples:
            if sample.name != f"{metric.name}_created":  # OpenMetrics' stamp, in the family itself
                family.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        families.append(family)
    return families


class Gatherer:
    """The group's figures: live children's latest texts, plus the counters of exited ones."""

    def __init__(self) -> None:
        self._retired: dict[str, Family] = {}

    def retire(self, text: str) -> None:
        """A child exited: keep its counters (its last report) in the group's totals."""
        for family in parse(text):
            if family.kind not in CUMULATIVE:
                continue
            kept = self._retired.setdefault(family.name, Family(family.name, family.kind, family.documentation))
            for key, value in family.samples.items():
                kept.samples[key] = kept.samples.get(key, 0.0) + value

    def merge(self, texts: Iterable[str]) -> list[Family]:
        merged: dict[str, Family] = {}
        for text in texts:
            for family in parse(text):
                into = merged.setdefault(family.name, Family(family.name, family.kind, family.documentation))
                pick = max if family.name in HIGHEST else _add
                for key, value in family.samples.items():
                    into.samples[key] = pick(into.samples[key], value) if key in into.samples else value
        for name, retired in self._retired.items():
            into = merged.setdefault(name, Family(name, retired.kind, retired.documentation))
            for key, value in retired.samples.items():
                into.samples[key] = into.samples.get(key, 0.0) + value
        return list(merged.values())


def _add(a: float, b: float) -> float:
    return a + b


def render(families: Iterable[Family]) -> bytes:
    """The Prometheus text format of ``families``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric

    class _Fixed:
        def collect(self) -> Iterator[Any]:
            for family in families:
                metric = Metric(family.name, family.documentation, family.kind)
                for (sample_name, labels), value in sorted(family.samples.items(), key=_exposition_order):
                    metric.add_sample(sample_name, dict(labels), value)
                yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed())
    return generate_latest(registry)


#: Where a sample goes within its label set: buckets (or quantiles), then the count, then the sum.
_SUFFIX_RANK = {"_bucket": 0, "_count": 1, "_gcount": 1, "_sum": 2, "_gsum": 2}
#: The labels that bound a bucket or name a quantile: ordered as numbers ("+Inf" last), not as text.
_BOUNDS = ("le", "quantile")


def _exposition_order(item: tuple[SampleKey, float]) -> tuple[Any, ...]:
    """A single process's order: by label set (the bound aside), then bucket, count, sum, and
    the buckets by increasing bound; sorted as text, "+Inf" came first and "100.0" before "50.0"."""
    (sample_name, labels), _ = item
    rest = tuple(pair for pair in labels if pair[0] not in _BOUNDS)
    bound = next((_number(value) for name, value in labels if name in _BOUNDS), 0.0)
    suffix = next((rank for end, rank in _SUFFIX_RANK.items() if sample_name.endswith(end)), 0)
    return rest, suffix, bound, sample_name


def _number(text: str) -> float:
    try:
        return float(text)  # "+Inf" included
    except ValueError:
        return float("inf")


def group_family(name: str, kind: str, documentation: str, value: float) -> Family:
    """One of the supervisor's own figures (no labels)."""
    sample = f"{name}_total" if kind == "counter" else name
    return Family(name, kind, documentation, {(sample, ()): float(value)})
