"""OpenTelemetry spans for publishes and handled messages (extra ``otel``: ``pip install "fastnsq-client[otel]"``).

One job: adapt :mod:`fastnsq.tracing`'s hooks to the OpenTelemetry API. Off until
:func:`instrument` is called; then

* each ``publish()`` / ``mpublish()`` call gets a PRODUCER span ``publish <topic>`` that
  covers it until nsqd acknowledges (retries included). One span per call, not per MPUB
  the coalescer sends: a caller's publish is what a trace should show, and a coalesced
  MPUB mixes the messages of unrelated callers. Where the publish carries a JSON ext header
  (``ext=`` on an HA ext topic) the span's context goes in it as W3C ``traceparent`` (and
  ``tracestate``), so the consumer's span becomes its child;
* each message a consumer's ``handler`` runs gets a CONSUMER span ``process <topic>``,
  current while the handler runs (its own spans nest under it), child of the producer's
  span when the message carries a ``traceparent``. Plain bodies carry no context: their
  spans are linked through the attributes they carry: ``messaging.message.id`` (nsqd's
  message id: 16 characters upstream, 32 hex digits on HA), and on HA ``nsq.trace_id`` / ``nsq.internal_id`` (a traced publish's
  answer carries the same ids, set on its producer span).

``async for`` and ``batches()`` hand messages to your code without a handler call to wrap:
start your span with ``context=fastnsq.otel.context_of(message)``.

Example::

    from opentelemetry.sdk.trace import TracerProvider
    import fastnsq.otel

    fastnsq.otel.instrument(TracerProvider())   # or the global provider, when None
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .extras import require

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind
except ImportError:
    require("otel", "fastnsq.otel")  # names the extra when the OpenTelemetry API is missing
    raise

from . import tracing
from ._version import __version__

__all__ = ["context_of", "instrument", "uninstrument"]

_hook: _SpanHook | None = None


class _SpanHook:
    """The tracing hook that makes OpenTelemetry spans."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    @contextlib.contextmanager
    def publishing(self, call: tracing.PublishCall) -> Iterator[None]:
        attributes: dict[str, Any] = {
            "messaging.system": "nsq",
            "messaging.operation.type": "publish",
            "messaging.destination.name": call.topic,
        }
        if call.count != 1:
            attributes["messaging.batch.message_count"] = call.count
        if call.partition is not None:
            attributes["messaging.destination.partition.id"] = str(call.partition)
        with self._tracer.start_as_current_span(f"publish {call.topic}", kind=SpanKind.PRODUCER,
                                                attributes=attributes) as span:
            for ext in call.exts or ():
                propagate.inject(ext)  # traceparent (and tracestate) into the JSON ext header
            yield
            answer = call.answer
            internal_id = getattr(answer, "internal_id", None)
            if internal_id is not None:  # a traced publish's answer (HA)
                span.set_attribute("nsq.internal_id", internal_id)
                span.set_attribute("nsq.trace_id", answer.trace_id)
                span.set_attribute("nsq.offset", answer.offset)

    @contextlib.contextmanager
    def handling(self, topic: str, channel: str, message: Any) -> Iterator[None]:
        attributes: dict[str, Any] = {
            "messaging.system": "nsq",
            "messaging.operation.type": "process",
            "messaging.destination.name": topic,
            "messaging.consumer.group.name": channel,
            "messaging.message.id": _message_id(message),
            "nsq.attempts": message.attempts,
        }
        for name in ("partition", "trace_id", "internal_id", "offset"):
            value = getattr(message, name, None)
            if value is not None:
                attributes["messaging.destination.partition.id" if name == "partition" else f"nsq.{name}"] = (
                    str(value) if name == "partition" else value
                )
        with self._tracer.start_as_current_span(f"process {topic}", context=context_of(message),
                                                kind=SpanKind.CONSUMER, attributes=attributes):
            yield


def instrument(tracer_provider: trace.TracerProvider | None = None) -> None:
    """Make spans from now on, with ``tracer_provider`` (the global one when None)."""
    global _hook
    uninstrument()
    _hook = _SpanHook(trace.get_tracer("fastnsq", __version__, tracer_provider=tracer_provider))
    tracing.add_hook(_hook)


def uninstrument() -> None:
    """Stop making spans (the hot paths go back to what they do without tracing)."""
    global _hook
    if _hook is not None:
        tracing.remove_hook(_hook)
        _hook = None


def context_of(message: Any) -> Context | None:
    """The trace context a message carries in its JSON ext header (``traceparent``), or None."""
    ext = getattr(message, "ext", None)
    if not isinstance(ext, dict) or "traceparent" not in ext:
        return None
    return propagate.extract(ext)


def _message_id(message: Any) -> str:
    """The id as nsqd shows it: upstream ids are 16 hex characters already; HA ids are 16
    binary bytes (internal id + trace id), shown as 32 hex digits."""
    raw = bytes(message.id)
    return raw.hex() if getattr(message, "internal_id", None) is not None else raw.decode("latin-1")
