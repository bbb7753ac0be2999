"""``fastnsq to-nsq``: a topic relayed to other nsqd, as nsq_to_nsq does, a batch per MPUB.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`). Each batch from
``Consumer.batches()`` goes through the JSON filter (:mod:`.jsonfilter`, only when its flags
are given), then out as one MPUB to the destination :mod:`.hostpool` picks; its messages are
FINed when that nsqd answers OK, and requeued (with backoff) when it fails, the destination
then marked down. A batch's publish runs as a task, so several batches are on the wire at once
(all within max in flight). Destinations: ``--destination-nsqd-tcp-address`` (a Producer per
nsqd, as nsq_to_nsq), or ``--destination-lookupd-http-address`` (ours: one Producer that finds
them). Youzan's HA cluster as a destination is a later step (its partitions and MPUB_EXT).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..producer import Producer
from .hostpool import HostPool
from .jsonfilter import JsonFilter, Verdict
from .status import StatusLine

logger = logging.getLogger("fastnsq.apps.to_nsq")

#: The key of the one Producer that finds its nsqd through nsqlookupd.
LOOKUPD = "nsqlookupd"


class ToNsq:
    """The handler: ``ToNsq(destinations=[...], destination_topic=..., mode=..., ...)``."""

    answers_batches = True  # FIN after the destination's OK, REQ after its failure

    def __init__(self, *, channel: str, destinations: list[str], destination_lookupd: list[str] | None = None,
                 destination_topic: str = "", mode: str = "hostpool", producer_options: dict[str, Any] | None = None,
                 require_json_field: str = "", require_json_value: str = "",
                 whitelist_json_fields: list[str] | None = None, status_every: int = 250) -> None:
        self.channel = channel
        self.destinations = list(destinations)
        self.destination_lookupd = list(destination_lookupd or [])
        self.destination_topic = destination_topic
        self.producer_options = dict(producer_options or {})
        self.filter = JsonFilter(require_json_field, require_json_value, whitelist_json_fields or ())
        self.pool = HostPool(self.destinations or [LOOKUPD], mode)
        self.producers: dict[str, Producer] = {}
        self.topic = destination_topic
        self.publishing: set[asyncio.Task[None]] = set()
        self.status = StatusLine(status_every)
        self.per_destination = {address: StatusLine(status_every, f"[{address}]:")
                                for address in self.destinations} if len(self.destinations) > 1 else {}

    async def setup(self) -> None:
        options = {"user_agent": "fastnsq-to-nsq", **self.producer_options}
        if self.destinations:
            for address in self.destinations:
                self.producers[address] = Producer([address], **options)
        else:
            self.producers[LOOKUPD] = Producer(lookupd_http_addresses=self.destination_lookupd, **options)
        for producer in self.producers.values():
            await producer.start(background=True)  # a destination down at start: retried, as go-nsq's

    def attach(self, consumer: Any) -> None:
        self.topic = self.destination_topic or consumer.topic

    async def handle(self, batch: Any) -> None:
        passing, bodies = self._filtered(batch)
        if passing:
            task = asyncio.get_running_loop().create_task(self._publish(passing, bodies))
            self.publishing.add(task)
            task.add_done_callback(self.publishing.discard)

    def _filtered(self, batch: Any) -> tuple[list[Any], list[bytes]]:
        if not self.filter.active:
            return list(batch), [message.body for message in batch]
        passing, bodies = [], []
        for message in batch:
            verdict, body = self.filter.apply(message.body)
            if verdict is Verdict.PASS:
                passing.append(message)
                bodies.append(body)
            elif verdict is Verdict.DROP:
                message.finish()
            else:
                message.requeue()
        return passing, bodies

    async def _publish(self, messages: list[Any], bodies: list[bytes]) -> None:
        address = self.pool.get()
        began = time.monotonic()
        try:
            await self.producers[address].mpublish(self.topic, bodies)
        except Exception as exc:  # noqa: BLE001 - every failure requeues; the next batch may go elsewhere
            self.pool.mark(address, False)
            logger.warning("publishing %d messages to %s (%s) failed: %s; requeueing them", len(messages),
                           address, self.topic, exc)
            for message in messages:
                if not message.has_responded:
                    message.requeue()
            return
        self.pool.mark(address, True)
        for message in messages:
            if not message.has_responded:
                message.finish()
        took = time.monotonic() - began
        self.status.record(took, len(messages))
        if address in self.per_destination:
            self.per_destination[address].record(took, len(messages))

    async def drain(self) -> None:
        """Wait for the batches on the wire: their answers FIN or requeue them."""
        while self.publishing:
            await asyncio.gather(*list(self.publishing), return_exceptions=True)

    async def teardown(self) -> None:
        await self.drain()
        for producer in self.producers.values():
            await producer.close()
