"""An app's dead letters: a message it can never take, published to a dead-letter topic, then finished.

One job: put a message aside with its body intact, on the nsqd it came from (the topic is
created there on the first publish), so that a bad body neither stops the app nor is retried
forever nor dropped. The reason is logged (one WARNING line per message, the first few
hundred, then one line per thousand) since an NSQ message carries no headers. A publish that
fails leaves the message to be requeued by the caller: nothing is finished before its dead
letter is accepted.
"""

from __future__ import annotations

import logging
from typing import Any

from ..producer import Producer

logger = logging.getLogger("fastnsq.apps.deadletter")

#: Log every dead letter up to this many, then one line per DETAIL_EVERY (a flood of bad bodies).
DETAIL_LIMIT = 200
DETAIL_EVERY = 1000


def dead_letter_topic_for(topic: str) -> str:
    """The default dead-letter topic of ``topic``: ``<topic>.dead`` (``#ephemeral`` kept last)."""
    name, sep, ephemeral = topic.partition("#")
    return f"{name[:59]}.dead{sep}{ephemeral}"


class DeadLetters:
    """Publishes put-aside messages to ``topic`` on their own nsqd, a Producer per nsqd."""

    def __init__(self, topic: str, producer_options: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self.producer_options = dict(producer_options or {})
        self.producers: dict[str, Producer] = {}
        self.count = 0

    async def put(self, entries: list[tuple[Any, str]]) -> int:
        """Publish each ``(message, reason)`` and finish it; requeue those whose publish failed.
        Returns how many were dead-lettered."""
        by_address: dict[str, list[tuple[Any, str]]] = {}
        for message, reason in entries:
            by_address.setdefault(message.address, []).append((message, reason))
        done = 0
        for address, group in by_address.items():
            try:
                producer = await self._producer(address)
                await producer.mpublish(self.topic, [message.body for message, _ in group])
            except Exception as exc:  # noqa: BLE001 - the messages come back later; nothing is lost
                logger.warning("publishing %d dead letter(s) to %s on %s failed: %s; requeueing them",
                               len(group), self.topic, address, exc)
                for message, _ in group:
                    if not message.has_responded:
                        message.requeue()
                continue
            for message, reason in group:
                self.count += 1
                if self.count <= DETAIL_LIMIT or self.count % DETAIL_EVERY == 0:
                    logger.warning("message %s to dead-letter topic %s (%d so far): %s",
                                   _id(message), self.topic, self.count, reason)
                message.finish()
                done += 1
        return done

    async def _producer(self, address: str) -> Producer:
        producer = self.producers.get(address)
        if producer is None:
            producer = self.producers[address] = Producer([address], **self.producer_options)
            await producer.start()  # one attempt; a failed publish then requeues
        return producer

    async def close(self) -> None:
        for producer in self.producers.values():
            await producer.close()


def _id(message: Any) -> str:
    identifier = message.id
    return identifier.decode(errors="replace") if isinstance(identifier, bytes) else str(identifier)
