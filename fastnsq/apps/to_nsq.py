"""``fastnsq to-nsq``: a topic relayed to other nsqd, as nsq_to_nsq does, a batch per MPUB.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`). Each batch from
``Consumer.batches()`` goes through the JSON filter (:mod:`.jsonfilter`, only when its flags
are given), then out as one MPUB to the destination :mod:`.hostpool` picks; its messages are
FINed when that nsqd answers OK, and requeued (with backoff) when it fails, the destination
then marked down; of several, one whose connection does not answer (suspect: its oldest publish
unanswered for ``suspect_after``) gets none while another does. With a single destination (one nsqd, or the lookupd producer), a batch that
finds it down is held instead, its messages touched, until it answers again: nothing is
requeued, no attempt spent, no backoff to wait out, and the relay goes on within a second of
the destination's return (the batches held fill max in flight, so nothing more is taken
meanwhile). A batch's publish runs as a task, so several batches are on the wire at once
(all within max in flight). Destinations: ``--destination-nsqd-tcp-address`` (a Producer per
nsqd, as nsq_to_nsq), or ``--destination-lookupd-http-address`` (ours: one Producer that finds
them). Across dialects (:mod:`.crossing`, with ``--destination-lookupd-http-address``): to a
partitioned youzan HA topic, with a sharding key from a JSON field, its ext headers and trace ids
carried; a batch then goes out as one MPUB per partition, each part answered by its own outcome.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from ..config import secret_text
from ..errors import NoConnectionError
from ..producer import RECALL, SLOW_HOLD, Producer
from ..sharding import murmur3_32
from ..topology import TopicRoute, Topology
from .crossing import Crossing, Part
from .hostpool import HostPool
from .jsonfilter import JsonFilter, Verdict
from .status import StatusLine

logger = logging.getLogger("fastnsq.apps.to_nsq")

#: The key of the one Producer that finds its nsqd through nsqlookupd.
LOOKUPD = "nsqlookupd"
#: A batch held for a destination that is down: its messages touched this often (nsqd's
#: default msg_timeout is 60 s), and held this long at most (nsqd's --max-msg-timeout is 15 min).
TOUCH_EVERY = 5.0
MAX_HOLD = 600.0
#: Of several destinations, how often a batch waiting for one looks whether it still answers.
WATCH_EVERY = 0.1


class ToNsq:
    """The handler: ``ToNsq(destinations=[...], destination_topic=..., mode=..., ...)``."""

    answers_batches = True  # FIN after the destination's OK, REQ after its failure

    def __init__(self, *, channel: str, destinations: list[str], destination_lookupd: list[str] | None = None,
                 destination_topic: str = "", mode: str = "hostpool", producer_options: dict[str, Any] | None = None,
                 require_json_field: str = "", require_json_value: str = "",
                 whitelist_json_fields: list[str] | None = None, sharding_key_json_field: str = "",
                 status_every: int = 250) -> None:
        self.channel = channel
        self.destinations = list(destinations)
        self.destination_lookupd = list(destination_lookupd or [])
        self.destination_topic = destination_topic
        self.producer_options = dict(producer_options or {})
        self.filter = JsonFilter(require_json_field, require_json_value, whitelist_json_fields or ())
        self.pool = HostPool(self.destinations or [LOOKUPD], mode)
        self.crossing = Crossing(sharding_key_json_field, self.producer_options.get("hasher") or murmur3_32)
        self.routes: Topology | None = None  # the destination topic's partitions, with its lookupds
        self.producers: dict[str, Producer] = {}
        self.topic = destination_topic
        self.publishing: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.rerouted = 0  # messages sent again to another destination (may be there twice)
        self.slow: dict[str, float] = {}  # destination -> when it answered a batch sent elsewhere meanwhile
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
            self.routes = Topology(self.destination_lookupd, access="w",
                                   poll_interval=float(options.get("lookupd_poll_interval", 60.0)),
                                   poll_timeout=float(options.get("lookupd_poll_timeout", 60.0)),
                                   auth_secret=secret_text(options.get("auth_secret")))
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
        try:
            parts = self.crossing.split(await self._route(), messages, bodies)
        except Exception as exc:  # noqa: BLE001 - no partitions for the keys yet: requeued, tried again later
            self._failed(messages, LOOKUPD, exc)
            return
        if len(parts) == 1:
            await self._publish_part(parts[0])
        else:
            await asyncio.gather(*(self._publish_part(part) for part in parts))

    async def _route(self) -> TopicRoute | None:
        """The destination topic's route: kept by the Topology for its poll interval (no wait then);
        one that lists no nsqd (the topic not created yet) is asked for again at the next batch."""
        if self.routes is None:
            return None
        route = self.routes.cached(self.topic)
        if route is None or not route.endpoints:
            route = await self.routes.refresh(self.topic)
        return route

    def _destination(self) -> str:
        """The pool's next destination; of several, one whose producer answers when one does: a hung,
        black-holed or lossy nsqd gets no batch once its connection is suspect (issue 57; each
        batch sent there waited publish_timeout, holding its share of max in flight)."""
        address = self.pool.get()
        if len(self.producers) > 1 and not self.producers[address].answering():
            for _ in range(len(self.producers) - 1):
                other = self.pool.get()
                if self.producers[other].answering():
                    return other
        return address

    async def _publish_part(self, part: Part) -> None:
        address = self._destination()
        began = time.monotonic()
        try:
            address = await self._mpublish_watched(address, part)
        except Exception as exc:  # noqa: BLE001 - every failure requeues; the next batch may go elsewhere
            self._failed(part.messages, address, exc)
            return
        self.pool.mark(address, True)
        for message in part.messages:
            if not message.has_responded:
                message.finish()
        took = time.monotonic() - began
        self.status.record(took, len(part.messages))
        if address in self.per_destination:
            self.per_destination[address].record(took, len(part.messages))

    async def _mpublish_watched(self, address: str, part: Part) -> str:
        """:meth:`_mpublish` to ``address``; of several destinations, sent to another once this one
        stops answering (suspect) while another answers, as the Producer reroutes what a suspect
        connection holds: it may then arrive twice; from a destination that answered such a batch
        after all (slow, not dead) within RECALL s, only once the batch waited SLOW_HOLD s, as
        the Producer's rule for a slow nsqd. Returns the destination that answered."""
        sending = asyncio.ensure_future(self._mpublish(self.producers[address], part))
        if len(self.producers) == 1:
            await sending
            return address
        loop = asyncio.get_running_loop()
        began = loop.time()
        slow = began - self.slow.get(address, float("-inf")) < RECALL
        # As the Producer's rule: within the publish timeout (its half), else the batch would fail.
        hold = min(SLOW_HOLD, self.producers[address].publish_timeout / 2) if slow else 0.0
        while not sending.done():
            await asyncio.wait({sending}, timeout=WATCH_EVERY)
            if not sending.done() and not self.producers[address].answering() and loop.time() - began >= hold:
                other = self._destination()
                if other != address and self.producers[other].answering():
                    sending.add_done_callback(functools.partial(self._answered_after_all, address))
                    logger.warning("%s does not answer: %d messages sent to %s instead (they may arrive twice)",
                                   address, len(part.messages), other)
                    self.rerouted += len(part.messages)
                    return await self._mpublish_watched(other, part)
        sending.result()
        return address

    def _answered_after_all(self, address: str, task: asyncio.Future[None]) -> None:
        """A batch sent again elsewhere: its first attempt's outcome is no one's, but one that
        succeeded says ``address`` was slow, not dead (that batch is there twice)."""
        if not task.cancelled() and task.exception() is None:
            self.slow[address] = asyncio.get_running_loop().time()

    async def _mpublish(self, producer: Producer, part: Part) -> None:
        """One MPUB; with a single destination that is down (nothing was sent), held until it is
        back: its messages touched every TOUCH_EVERY s, for MAX_HOLD s at most."""
        loop = asyncio.get_running_loop()
        held_since = touched = loop.time()
        warned = False
        while True:
            try:
                await producer.mpublish(self.topic, part.bodies, **part.publish_options())
                return
            except NoConnectionError as exc:
                if len(self.producers) > 1 or self.stopping or loop.time() - held_since > MAX_HOLD:
                    raise
                if not warned:
                    warned = True
                    logger.warning("publishing %d messages to %s failed: %s; holding them until it answers",
                                   len(part.messages), self.topic, exc)
            # At least 0.2 s, then until a connection is open (the producer's recovery rule tries).
            again = loop.time() + 0.2
            while (loop.time() < again or not producer.connections) and not self.stopping \
                    and loop.time() - held_since <= MAX_HOLD:
                if loop.time() - touched >= TOUCH_EVERY:
                    touched = loop.time()
                    for message in part.messages:
                        message.touch()
                await asyncio.sleep(0.02)

    def _failed(self, messages: list[Any], address: str, exc: Exception) -> None:
        self.pool.mark(address, False)
        logger.warning("publishing %d messages to %s (%s) failed: %s; requeueing them", len(messages),
                       address, self.topic, exc)
        for message in messages:
            if not message.has_responded:
                message.requeue()

    async def drain(self) -> None:
        """Wait for the batches on the wire: their answers FIN or requeue them (held ones are requeued)."""
        self.stopping = True
        while self.publishing:
            await asyncio.gather(*list(self.publishing), return_exceptions=True)

    async def teardown(self) -> None:
        await self.drain()
        for producer in self.producers.values():
            await producer.close()
        if self.routes is not None:
            await self.routes.close()
