"""``fastnsq to-file``: a topic archived to files, as nsq_to_file does, FINed only once on disk.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`): it takes batches from
``Consumer.batches()``, holds their messages, and at a sync writes them to the topic's file
(:mod:`.filelog`), fsyncs it, and only then FINs them. A sync happens when the held messages
reach max_in_flight, when the consumer is starved (nsqd sends little more until we answer),
every ``--sync-interval``, and on the drain (SIGTERM/SIGINT). So a killed process leaves each
message in a synced file or unanswered, and nsqd redelivers it: at most max_in_flight
duplicates, nothing lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from .filelog import FileLog, FileOptions, make_encoder
from .filenames import host_identifier
from .status import StatusLine

logger = logging.getLogger("fastnsq.apps.to_file")


class ToFile:
    """The handler: ``ToFile(channel=..., max_in_flight=..., sync_interval=..., file={...})``; the
    topic is its consumer's (a process per topic)."""

    answers_batches = True  # the runner leaves FIN to us: after the fsync

    def __init__(self, *, channel: str, max_in_flight: int, sync_interval: float,
                 file: dict[str, Any], status_every: int = 0) -> None:
        self.topic, self.channel = "", channel
        self.max_in_flight = max_in_flight
        self.sync_interval = sync_interval
        self.options = FileOptions(**file)
        self.encoder = make_encoder(self.options)
        self.log: FileLog | None = None
        self.held: list[Any] = []
        self.held_since = 0.0
        self.consumer: Any = None
        self.draining = False
        self.status = StatusLine(status_every)
        self._ticker: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def setup(self) -> None:
        self._ticker = asyncio.create_task(self._tick())

    def attach(self, consumer: Any) -> None:
        self.consumer, self.topic = consumer, consumer.topic
        self.log = FileLog(self.options, self.topic, host_identifier(self.options.host_identifier), self.encoder)
        self.status.prefix = f"[{self.topic}/{self.channel}]:"

    async def handle(self, batch: Any) -> None:
        if not self.held:
            self.held_since = time.monotonic()
        self.held.extend(batch)
        starved = self.consumer is not None and self.consumer.is_starved()
        if self.draining or starved or len(self.held) >= self.max_in_flight:
            await self.sync()

    async def sync(self) -> None:
        """Write, fsync, then FIN what is held. The write runs in a thread (zlib, zstd and
        fsync let go of the GIL), so the loop keeps reading meanwhile."""
        async with self._lock:
            records, self.held = self.held, []
            if not records or self.log is None:
                return
            logger.info("[%s/%s] syncing %d records to disk", self.topic, self.channel, len(records))
            since = self.held_since
            await asyncio.to_thread(self.log.sync, records)
            for message in records:
                if not message.has_responded:
                    message.finish()
            self.status.record(time.monotonic() - since, len(records))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
            if self.held:
                await self.sync()
            elif self.log is not None:
                async with self._lock:
                    await asyncio.to_thread(self.log.tick)

    async def drain(self) -> None:
        self.draining = True
        await self.sync()

    async def teardown(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.sync()  # a message a batch brought after the drain began: synced, not lost
        async with self._lock:
            if self.log is not None:
                self.log.close()
