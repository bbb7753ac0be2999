"""``fastnsq to-file``: a topic archived to files, as nsq_to_file does, FINed only once on disk.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`): it takes batches from
``Consumer.batches()``, holds their messages, and at a sync writes them to the topic's files
(:mod:`.archive`: a plain file, or a Parquet file's spool, per partition folder), fsyncs them,
and only then FINs them. A sync happens when the held messages
reach half of max_in_flight (the other half arrives while it runs), when the consumer is
starved (nsqd sends little more until we answer), every ``--sync-interval``, and on the drain
(SIGTERM/SIGINT). A write or fsync that fails ends the process, as nsq_to_file does. So a killed process leaves each
message in a synced file or unanswered, and nsqd redelivers it: at most max_in_flight
duplicates, nothing lost. SIGHUP (:meth:`ToFile.hup`) syncs what is held and closes the file,
as nsq_to_file does: the next message opens one anew (after logrotate moved it away); a Parquet
file is finished then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

from .archive import Archive
from .filelog import FileOptions, gzip_member
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
        self.log: Archive | None = None
        self.held: list[Any] = []
        self.held_since = 0.0
        self.consumer: Any = None
        self.draining = False
        self.status = StatusLine(status_every)
        self._ticker: asyncio.Task[None] | None = None
        self.writer: asyncio.Task[None] | None = None
        self._file = asyncio.Lock()
        self._closing = asyncio.Event()
        self.sync_wanted = False

    async def setup(self) -> None:
        self._ticker = asyncio.create_task(self._tick())

    def attach(self, consumer: Any) -> None:
        self.consumer, self.topic = consumer, consumer.topic
        self.log = Archive(self.options, self.topic, host_identifier(self.options.host_identifier))
        self.status.prefix = f"[{self.topic}/{self.channel}]:"
        logger.info("[%s/%s] archiving to %s", self.topic, self.channel, describe(self.options))
        self.log.recover()

    async def handle(self, batch: Any) -> None:
        if not self.held:
            self.held_since = time.monotonic()
        self.held.extend(batch)
        starved = self.consumer is not None and self.consumer.is_starved()
        # Half of max in flight, not all of it: while one half is written and fsynced (in a
        # thread), the other half keeps arriving, so nsqd never waits on the disk alone.
        if self.draining or starved or len(self.held) >= max(1, self.max_in_flight // 2):
            self._sync_soon()

    def _sync_soon(self) -> None:
        """Ask for a sync of what is held. One writer at a time: while it writes and fsyncs,
        requests only accumulate, and it then takes everything held at once (a group commit,
        not an fsync per request)."""
        self.sync_wanted = True
        if self.writer is None or self.writer.done():
            self.writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while self.sync_wanted and self.held:
            self.sync_wanted = False
            records, since = self.held, self.held_since
            self.held = []
            await self._sync(records, since)

    async def sync(self) -> None:
        """Sync everything held, and wait until it is on disk and FINed."""
        while self.held or (self.writer is not None and not self.writer.done()):
            self._sync_soon()
            assert self.writer is not None
            await self.writer

    async def _sync(self, records: list[Any], since: float) -> None:
        """Write, fsync, then FIN. The write runs in a thread (zlib, zstd and fsync let go of the
        GIL), so the loop keeps reading meanwhile."""
        if self.log is None:
            return
        logger.debug("[%s/%s] syncing %d records to disk", self.topic, self.channel, len(records))
        try:
            async with self._file:
                await asyncio.to_thread(self.log.sync, records)
        except OSError as exc:
            # nsq_to_file exits here too: nothing unsynced was FINed, so nsqd redelivers it
            # to the process the supervisor starts next.
            logger.critical("[%s/%s] failed syncing messages: %s", self.topic, self.channel, exc)
            os._exit(1)
        for message in records:
            if not message.has_responded:
                message.finish()
        self.status.record(time.monotonic() - since, len(records))

    async def _tick(self) -> None:
        # Ends between ticks when told (never cancelled inside a file operation, whose thread
        # would go on beside teardown's close).
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.sync_interval)
                return
            if self.held:
                await self.sync()
            if self.log is not None:
                # After a sync too: with partition folders, a folder that gets no more records
                # (the last hour's) is closed here however busy the others are.
                async with self._file:  # never beside a sync's write: one thread on the file at a time
                    await asyncio.to_thread(self.log.tick)

    async def hup(self) -> None:
        """nsq_to_file's SIGHUP: sync and FIN what is held, then close the file (fsynced, moved
        to the output dir when there is a work dir); the next sync opens the next one, by
        nsq_to_file's rules (the same name appended to without ``<REV>``, the next ``<REV>``
        with it), and an idle tick replaces it by an empty one unless --skip-empty-files."""
        logger.info("[%s/%s] SIGHUP: syncing and closing the file", self.topic, self.channel)
        await self.sync()
        if self.log is not None:
            async with self._file:  # not beside a sync's write
                await asyncio.to_thread(self.log.hup)

    async def drain(self) -> None:
        self.draining = True
        await self.sync()

    async def teardown(self) -> None:
        self._closing.set()
        if self._ticker is not None:
            await self._ticker
        await self.sync()  # a message a batch brought after the drain began: synced, not lost
        if self.log is not None:
            async with self._file:
                await asyncio.to_thread(self.log.close)  # Parquet: every spool finished


def describe(options: FileOptions) -> str:
    """The start line's account of where and how the files are written."""
    rotation = [f"on each new {options.datetime_format!r}"]
    if options.rotate_interval > 0:
        rotation.append(f"every {options.rotate_interval:g} s")
    if options.rotate_size > 0:
        rotation.append(f"past {options.rotate_size:,} bytes")
    kind = "Parquet" if options.format == "parquet" else "lines"
    if options.compression == "gzip":
        kind += f", gzip level {options.level} ({gzip_member(options.level)[1]})"
    elif options.compression:
        kind += f", {options.compression}"
    where = options.output_dir + (f" through {options.work_dir}" if options.work != options.output_dir else "")
    folders = f", in folders {options.partition_by}" if options.partition_by else ""
    return f"{where}: {kind}{folders}, a file rotated {' or '.join(rotation)}"
