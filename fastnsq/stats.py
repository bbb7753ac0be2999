"""What a consumer or producer has done so far, as typed snapshots.

One job: the shapes of the figures ``Consumer.snapshot()`` and ``Producer.snapshot()``
return. A snapshot is a frozen copy taken when asked (nothing is counted for it on the
message path), so a metrics exporter can read it at scrape time and a caller can keep it.

>>> ProducerStats(published=3, failed=1).as_dict()["published"]
3
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ConnectionStats", "ConsumerStats", "ProducerStats", "deprecated_spelling"]


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One consumer connection: the RDY it holds and what went through it.

    ``express``: the consumer's unbuffered express connection to that nsqd (the express lane of
    :mod:`fastnsq.consumer.express`), not one of its buffered ones.
    """

    address: str
    partition: int | None
    rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    timed_out: int = 0
    express: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer's totals over its life (closed connections included) and its connections now.

    ``timed_out``: messages answered after ``msg_timeout`` (nsqd had given them to someone
    else already); ``given_up``: past ``max_attempts``; ``duplicates_dropped``: repeated
    heads of an ordered HA channel not handed out again; ``reconnects``: connections opened
    again to an nsqd (and partition) connected before. ``finished`` and ``requeued`` count the
    FINs and REQs written to a live connection; ``finish_dropped`` and ``requeue_dropped`` the
    ones given after their connection had closed, never sent (nsqd gives those messages out
    again after ``msg_timeout``).
    """

    topic: str
    channel: str
    received: int = 0
    finished: int = 0
    requeued: int = 0
    timed_out: int = 0
    given_up: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    backoff_level: int = 0
    duplicates_dropped: int = 0
    reconnects: int = 0
    finish_dropped: int = 0
    requeue_dropped: int = 0
    #: Of ``given_up``: those published to ``dead_letter_topic`` (then finished).
    dead_lettered: int = 0
    #: 1 while the ``ready_check`` fails (RDY 0, nothing handed out), else 0.
    holding: int = 0
    #: nsqd's error frames by code (``E_FIN_FAILED``...), fatal or not.
    errors: dict[str, int] = field(default_factory=dict)
    connections: tuple[ConnectionStats, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return _shallow_dict(self)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A producer's messages: ``published`` (acknowledged by nsqd), ``failed`` (their publish or
    mpublish raised); ``retried``: publishes sent again after a lost connection or a moved
    leader; ``reconnects``; ``waiting``: publish calls not answered yet; open ``connections``;
    ``rerouted``: publish commands a suspect nsqd held, sent again elsewhere (each may arrive twice)."""

    published: int = 0
    failed: int = 0
    retried: int = 0
    reconnects: int = 0
    waiting: int = 0
    connections: int = 0
    rerouted: int = 0
    #: nsqd's refusals of publishes by error code (``E_BAD_TOPIC``, ``E_PUB_FAILED``...).
    errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return _shallow_dict(self)


def _shallow_dict(snapshot: Any) -> dict[str, Any]:
    return {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(snapshot)}


def deprecated_spelling(old: str, new: str) -> None:
    """Warn, once per call site, that ``old`` is the old spelling of ``new``."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
