"""Message tracing for the HA dialect: a switch that can be flipped at run time.

When on, the logger ``fastnsq.trace`` gets one INFO record per traced publish
(topic, partition, internal id, trace id, disk-queue offset, size, nsqd address) and
one per consumed message (topic, partition, internal id, trace id, offset and raw
size on ordered/advanced subscriptions, timestamp, attempts, local and remote
address). Bodies are never logged. When off (the default) it costs one check.

>>> from fastnsq import tracing
>>> tracing.enable()
>>> tracing.is_enabled()
True
>>> tracing.enable(False)
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["consumed", "enable", "is_enabled", "logger", "published"]

logger = logging.getLogger("fastnsq.trace")

#: Read on the hot path; change it with :func:`enable`.
ENABLED = False


def enable(on: bool = True) -> None:
    """Turn tracing on (or off with ``enable(False)``), at any time."""
    global ENABLED
    ENABLED = bool(on)


def is_enabled() -> bool:
    return ENABLED


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
