"""Tracing hooks around publishes and handled messages; and the HA trace log.

One job: the switch the hot paths read, and the hooks they call when it is on. Two kinds
of tracer plug in here, each optional and both free when off (the hot paths read one
module attribute, :data:`ENABLED`):

* the **trace log** (:func:`enable`): the logger ``fastnsq.trace`` gets one INFO record per
  traced publish (topic, partition, internal id, trace id, disk-queue offset, size, nsqd
  address) and one per consumed message (topic, partition, internal id, trace id, offset
  and raw size on ordered/advanced subscriptions, timestamp, attempts, local and remote
  address). Bodies are never logged;
* **hooks** (:func:`add_hook`), such as :mod:`fastnsq.otel`'s OpenTelemetry spans: a
  context manager around each publish call and each handler call.

While either is on, a consumer's messages take the Python path (the C fast lane steps
aside) and every publish takes the producer's slow path.

>>> from fastnsq import tracing
>>> tracing.enable()
>>> tracing.is_enabled()
True
>>> tracing.enable(False)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = [
    "PublishCall", "TraceHook", "add_hook", "consumed", "enable", "handling", "is_enabled", "logger",
    "published", "publishing", "remove_hook",
]

logger = logging.getLogger("fastnsq.trace")

#: Read on the hot paths: the trace log is on or a hook is installed.
ENABLED = False
#: The trace log alone (:func:`enable`).
LOG_ENABLED = False
#: Some hook is installed (:func:`add_hook`).
HOOKED = False


class PublishCall:
    """One publish or mpublish call as the hooks see it.

    ``exts``: the JSON ext headers to send, one per message (None: a plain publish, nothing
    to carry context in); a hook may add keys (a ``traceparent``) before it is sent.
    ``answer``: nsqd's answer once acknowledged (a ``TracedResponse`` for traced publishes).
    """

    __slots__ = ("answer", "count", "exts", "partition", "topic")

    def __init__(self, topic: str, partition: int | None, exts: list[dict[str, Any]] | None, count: int) -> None:
        self.topic = topic
        self.partition = partition
        self.exts = exts
        self.count = count
        self.answer: Any = None


class TraceHook(Protocol):
    """What a tracer implements: a context around each publish call and each handler call.

    The context is entered before the publish is sent (or the handler called) and left when
    it is acknowledged or raises (or the handler returns or raises); an exception passes
    through it.
    """

    def publishing(self, call: PublishCall) -> AbstractContextManager[object]: ...

    def handling(self, topic: str, channel: str, message: Any) -> AbstractContextManager[object]: ...


_hooks: list[TraceHook] = []


def enable(on: bool = True) -> None:
    """Turn the trace log on (or off with ``enable(False)``), at any time."""
    global LOG_ENABLED
    LOG_ENABLED = bool(on)
    _refresh()


def is_enabled() -> bool:
    """Whether the trace log is on."""
    return LOG_ENABLED


def add_hook(hook: TraceHook) -> None:
    """Install ``hook`` (once); from now on every publish and handler call goes through it."""
    if hook not in _hooks:
        _hooks.append(hook)
    _refresh()


def remove_hook(hook: TraceHook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)
    _refresh()


def _refresh() -> None:
    global ENABLED, HOOKED
    HOOKED = bool(_hooks)
    ENABLED = LOG_ENABLED or HOOKED


@contextlib.contextmanager
def publishing(call: PublishCall) -> Iterator[PublishCall]:
    """Every hook's context around one publish call (the producer's slow path, when ENABLED)."""
    with contextlib.ExitStack() as stack:
        for hook in _hooks:
            stack.enter_context(hook.publishing(call))
        yield call


@contextlib.contextmanager
def handling(topic: str, channel: str, message: Any) -> Iterator[None]:
    """Every hook's context around one handler call (the consumer's Python path, when ENABLED)."""
    with contextlib.ExitStack() as stack:
        for hook in _hooks:
            stack.enter_context(hook.handling(topic, channel, message))
        yield


def published(topic: str, partition: int | None, answer: Any, address: str) -> None:
    """Log a traced publish's answer (a TracedResponse), or a plain OK as such."""
    internal_id = getattr(answer, "internal_id", None)
    if internal_id is None:
        logger.info("published topic=%s partition=%s nsqd=%s answer=OK", topic, partition, address)
        return
    logger.info(
        "published topic=%s partition=%s internal_id=%d trace_id=%d offset=%d size=%d nsqd=%s",
        topic, partition, internal_id, answer.trace_id, answer.offset, answer.size, address,
    )


def consumed(topic: str, partition: int | None, message: Any, local: Any, remote: Any) -> None:
    """Log one consumed message's ids and position (never its body)."""
    logger.info(
        "consumed topic=%s partition=%s internal_id=%s trace_id=%s offset=%s raw_size=%s timestamp=%d "
        "attempts=%d local=%s remote=%s",
        topic, partition, message.internal_id, message.trace_id, message.offset, message.raw_size,
        message.timestamp, message.attempts, local, remote,
    )
