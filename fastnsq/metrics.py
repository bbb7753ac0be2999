"""Prometheus metrics for consumers and producers, read from their snapshots at scrape time.

One job: turn :meth:`Consumer.snapshot` and :meth:`Producer.snapshot` into Prometheus
metric families when a scraper asks. Nothing is counted for it on the message path; the
only thing measured as it happens is the publish round trip (one observation per write to
nsqd, not per message). Needs the optional extra ``metrics`` (``pip install "fastnsq-client[metrics]"``:
prometheus_client), imported only by this module; without it the import names the extra.

Labels stay bounded: a consumer's ``topic`` and ``channel``, the ``nsqd`` address it
connects to, an error ``code``, an HA ``partition``; a producer's ``producer`` name (given to
:meth:`track`). Never client ports, message ids or bodies. Several clients with the same
labels are summed. Every counter of a tracked client has its series from the first scrape
on, at 0 until its first event (Prometheus' advice: a ``rate()`` of a series that does not
exist yet is empty, and an alert on it never fires): the errors by each code nsqd may send
that client (:data:`fastnsq.errors.CONSUMER_CODES`, ``PRODUCER_CODES``, and an HA consumer's
``HA_CONSUMER_CODES``), any other code from its first.

HA consumers also get per-partition gauges (``position``, ``end``, ``lag``): those are the
channel's figures as each partition's leader reports them, asked at scrape time (one small
``/stats`` request per leader node, at most once a second; :mod:`fastnsq.consumer.progress`).

Example::

    import prometheus_client
    from fastnsq.metrics import NSQMetrics

    metrics = NSQMetrics()          # a collector in prometheus_client's default registry
    metrics.track(consumer)
    metrics.track(producer, name="ingest")
    prometheus_client.start_http_server(9100)
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from .extras import require

try:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError:
    require("metrics", "fastnsq.metrics")  # names the extra when prometheus_client is missing
    raise

from .consumer import Consumer
from .consumer.progress import progress_reader
from .errors import CONSUMER_CODES, HA_CONSUMER_CODES, PRODUCER_CODES
from .producer import Producer
from .stats import ProducerStats

__all__ = ["ROUND_TRIP_BUCKETS", "NSQMetrics", "ProducerLike"]


@runtime_checkable
class ProducerLike(Protocol):
    """What a producer gives the metrics (``fastnsq.sync.Producer`` has it; that module sits
    above this one, so it is named by what it does)."""

    def snapshot(self) -> ProducerStats: ...

    def set_round_trip_observer(self, observer: Callable[[float], object] | None) -> None: ...


#: Publish round trips (seconds): from a write to nsqd to the answer of its last command.
ROUND_TRIP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0)

_CONSUMER_COUNTERS = (
    ("received", "messages received from nsqd"),
    ("finished", "messages finished (FIN written to a live connection)"),
    ("requeued", "messages requeued (REQ written to a live connection)"),
    ("finish_dropped", "FINs not sent: their connection had closed (nsqd gives the message out again)"),
    ("requeue_dropped", "REQs not sent: their connection had closed (nsqd gives the message out again)"),
    ("timed_out", "messages answered after their msg_timeout (nsqd had given them out again)"),
    ("given_up", "messages past max_attempts, finished and handed to the give-up hook"),
    ("dead_lettered", "messages past max_attempts published to the dead_letter_topic, then finished"),
    ("duplicates_dropped", "HA ordered channels: repeated deliveries of a partition's head, not handed out again"),
)
_CONSUMER_GAUGES = (
    ("in_flight", ("messages this process holds: received and not finished or requeued yet (nsqd's "
                   "in_flight_count also counts those on their way both ways; at most nsq_consumer_rdy)")),
    ("max_in_flight", "the consumer's max_in_flight"),
    ("backoff_level", "the backoff level (0: consuming normally)"),
    ("holding", "1 while the ready_check fails: RDY 0, the messages held (0: consuming)"),
)
_PARTITION_GAUGES = (
    ("position", "HA: the channel's confirmed queue offset in the partition (everything before it is finished)"),
    ("end", "HA: the partition's end queue offset (where its next message will be written)"),
    ("lag", "HA: messages of the partition the channel has not finished (from its position to the end)"),
)
_PRODUCER_COUNTERS = (
    ("published", "messages acknowledged by nsqd", "messages_published"),
    ("failed", "messages whose publish raised", "messages_failed"),
    ("retried", "publishes sent again after a lost connection or a moved leader", "retries"),
    ("reconnects", "connections re-opened after a loss", "reconnects"),
    ("rerouted", "publish commands a suspect nsqd held, sent again elsewhere (each may arrive twice)", "rerouted"),
)


class NSQMetrics(Collector):
    """A Prometheus collector of the consumers and producers given to :meth:`track`.

    ``registry``: where to register (prometheus_client's default registry unless given;
    None registers nowhere: call ``registry.register(metrics)`` yourself). ``namespace``
    prefixes every metric name (``nsq_consumer_messages_received_total``...).
    ``progress_wait``: how long a scrape waits for the HA leaders' figures (the last ones
    read are reported if they take longer).
    """

    def __init__(
        self, registry: CollectorRegistry | None = REGISTRY, *, namespace: str = "nsq", progress_wait: float = 2.0
    ) -> None:
        self.namespace = namespace
        self.progress_wait = progress_wait
        self._consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
        self._producers: weakref.WeakKeyDictionary[Producer | ProducerLike, str] = weakref.WeakKeyDictionary()
        # Observed as publishes are answered; kept out of any registry and reported by collect().
        self._round_trips = Histogram(
            f"{namespace}_producer_publish_round_trip_seconds",
            "seconds from a write of publishes to nsqd to the answer of its last command",
            labelnames=("producer",), buckets=ROUND_TRIP_BUCKETS, registry=None,
        )
        if registry is not None:
            registry.register(self)

    def track(self, client: Consumer | Producer | ProducerLike, *, name: str = "default") -> None:
        """Report ``client`` from the next scrape on (until it is garbage-collected or untracked):
        a consumer, or a producer (``fastnsq.sync.Producer`` too).

        ``name`` labels a producer's metrics (``producer="..."``); a consumer is labelled by
        its topic and channel.
        """
        if isinstance(client, Consumer):
            self._consumers.add(client)
        elif isinstance(client, (Producer, ProducerLike)):
            self._producers[client] = name
            client.set_round_trip_observer(self._round_trips.labels(producer=name).observe)
        else:
            raise TypeError(f"track() takes a fastnsq Consumer or Producer, not {type(client).__name__}")

    def untrack(self, client: Consumer | Producer | ProducerLike) -> None:
        """Stop reporting ``client`` (its counts leave the sums: Prometheus sees a counter reset)."""
        if isinstance(client, (Producer, ProducerLike)) and client in self._producers:
            client.set_round_trip_observer(None)
            del self._producers[client]
        self._consumers.discard(client)  # type: ignore[arg-type]

    def describe(self) -> list[Metric]:
        return []  # families depend on what is tracked; describe nothing, as custom collectors may

    def collect(self) -> Iterator[Metric]:
        yield from self._consumer_families()
        yield from self._producer_families()
        yield from self._round_trips.collect()

    # ---- consumers ----------------------------------------------------------------------

    def _consumer_families(self) -> Iterator[Metric]:
        prefix = f"{self.namespace}_consumer"
        consumers = list(self._consumers)
        snapshots = [consumer.snapshot() for consumer in consumers]
        labels = ["topic", "channel"]
        totals: dict[str, dict[tuple[str, ...], float]] = defaultdict(lambda: defaultdict(float))
        per_nsqd: dict[str, dict[tuple[str, ...], float]] = defaultdict(lambda: defaultdict(float))
        errors: dict[tuple[str, ...], float] = defaultdict(float)
        for consumer, stats in zip(consumers, snapshots):
            key = (stats.topic, stats.channel)
            for field, _ in (*_CONSUMER_COUNTERS, *_CONSUMER_GAUGES, ("reconnects", "")):
                totals[field][key] += getattr(stats, field)
            known = (*CONSUMER_CODES, *(HA_CONSUMER_CODES if _reads_partitions(consumer) else ()))
            _add_errors(errors, key, known, stats.errors)
            for conn in stats.connections:
                per_nsqd["connections"][(*key, conn.address)] += 1
                per_nsqd["rdy"][(*key, conn.address)] += conn.rdy
        for field, help_text in _CONSUMER_COUNTERS:
            yield _counter(f"{prefix}_messages_{field}", help_text, labels, totals[field])
        for field, help_text in _CONSUMER_GAUGES:
            yield _gauge(f"{prefix}_{field}", help_text, labels, totals[field])
        yield _counter(f"{prefix}_reconnects", "connections opened again to an nsqd connected before", labels,
                       totals["reconnects"])
        yield _counter(f"{prefix}_errors", "error frames from nsqd, by code", [*labels, "code"], errors)
        yield _gauge(f"{prefix}_connections", "open connections, by nsqd", [*labels, "nsqd"],
                     per_nsqd["connections"])
        yield _gauge(f"{prefix}_rdy", "the RDY count held, by nsqd", [*labels, "nsqd"], per_nsqd["rdy"])
        yield from self._partition_families(prefix)

    def _partition_families(self, prefix: str) -> Iterator[Metric]:
        """HA: where each tracked consumer's channel stands in each partition, as its leader says
        (:mod:`fastnsq.consumer.progress`; read at scrape time, waiting up to ``progress_wait``).
        The figures are the channel's, not the consumer's: two consumers of one channel show them
        once."""
        figures: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        for consumer in list(self._consumers):
            if not _reads_partitions(consumer):
                continue  # an upstream nsqd's topic: no partitions, no queue offsets
            for partition, progress in progress_reader(consumer).read_from_thread(self.progress_wait).items():
                key = (consumer.topic, consumer.channel, str(partition))
                for field in ("position", "end", "lag"):
                    figures[field][key] = getattr(progress, field)
        labels = ["topic", "channel", "partition"]
        for field, help_text in _PARTITION_GAUGES:
            yield _gauge(f"{prefix}_partition_{field}", help_text, labels, figures[field])

    # ---- producers ----------------------------------------------------------------------

    def _producer_families(self) -> Iterator[Metric]:
        prefix = f"{self.namespace}_producer"
        totals: dict[str, dict[tuple[str, ...], float]] = defaultdict(lambda: defaultdict(float))
        errors: dict[tuple[str, ...], float] = defaultdict(float)
        for producer, name in list(self._producers.items()):
            stats = producer.snapshot()
            for field in ("published", "failed", "retried", "reconnects", "rerouted", "waiting", "connections"):
                totals[field][(name,)] += getattr(stats, field)
            _add_errors(errors, (name,), PRODUCER_CODES, stats.errors)
        for field, help_text, metric in _PRODUCER_COUNTERS:
            yield _counter(f"{prefix}_{metric}", help_text, ["producer"], totals[field])
        yield _counter(f"{prefix}_errors", "messages refused by nsqd, by error code", ["producer", "code"], errors)
        yield _gauge(f"{prefix}_waiting", "publish calls not answered yet", ["producer"], totals["waiting"])
        yield _gauge(f"{prefix}_connections", "open connections", ["producer"], totals["connections"])


def _reads_partitions(consumer: Consumer) -> bool:
    """Whether the consumer reads an HA topic's partitions (an upstream nsqd's topic has none)."""
    return any(partition is not None for partition in consumer.partitions)


def _add_errors(into: dict[tuple[str, ...], float], key: tuple[str, ...], known: tuple[str, ...],
                counted: dict[str, int]) -> None:
    """A client's errors by code: every ``known`` code (at 0 until its first) and any other counted."""
    for code in known:
        into[(*key, code)] += 0
    for code, count in counted.items():
        into[(*key, code)] += count


def _counter(name: str, help_text: str, labels: list[str], values: dict[tuple[str, ...], float]) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=labels)
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family


def _gauge(name: str, help_text: str, labels: list[str], values: dict[tuple[str, ...], float]) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family
