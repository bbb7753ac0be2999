"""One topic's output files for ``fastnsq to-file``: open, write, sync, rotate, close, move.

nsq_to_file's file rules, in our words: a file is opened under ``--work-dir`` (default: the
output dir) with the first free ``<REV>``; without gzip or ``--rotate-interval`` an existing
file is appended to (``O_APPEND``), with them a new one is required (``O_EXCL``). A file
rotates when ``<DATETIME>`` changes, after ``--rotate-interval``, or past ``--rotate-size``
bytes (the uncompressed bytes written, as nsq_to_file counts them). Closing fsyncs it and
moves it to the output dir without overwriting (a link, then unlink; on a clash the next
``<REV>``).

Records reach the file only at :meth:`FileLog.sync`: the records since the last sync are
written at once, as one gzip member or zstd frame when compressed (a complete member per
sync, as nsq_to_file closes its gzip stream at each sync), then fsynced. So a killed process
leaves every synced record readable, and nothing half-written that was acknowledged.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from ..extras import require
from .filenames import compute_format, with_datetime, with_rev

logger = logging.getLogger("fastnsq.apps.to_file")


@dataclass
class FileOptions:
    """The file flags of ``fastnsq to-file`` (nsq_to_file's names)."""

    output_dir: str = "/tmp"
    work_dir: str = ""  # "": the output dir
    filename_format: str = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
    datetime_format: str = "%Y-%m-%d_%H"
    host_identifier: str = ""
    compression: str = ""  # "", "gzip" or "zstd"
    level: int = 6
    rotate_size: int = 0
    rotate_interval: float = 0.0
    skip_empty_files: bool = False
    format: str = "lines"  # or "parquet"

    @property
    def work(self) -> str:
        return self.work_dir or self.output_dir

    @property
    def rev_needed(self) -> bool:
        return bool(self.compression or self.format == "parquet" or self.rotate_size > 0
                    or self.rotate_interval > 0 or self.work != self.output_dir)

    @property
    def suffix(self) -> str:
        if self.format == "parquet":
            return ".parquet"
        return {"gzip": ".gz", "zstd": ".zst"}.get(self.compression, "")


class Encoder(Protocol):
    """What turns the records of one sync into the bytes appended to the file; ``groups``: the
    sizes of the consumer's batches they came in (Parquet makes each a row group)."""

    def encode(self, records: list[Any], groups: list[int] | None = None) -> bytes: ...


class Lines:
    """One body per line, compressed per sync when asked (a gzip member, a zstd frame)."""

    def __init__(self, compression: str, level: int) -> None:
        self.compression, self.level = compression, level
        if compression == "zstd":
            import cramjam  # a dependency of fastnsq already (snappy framing)

            self._zstd = cramjam.zstd

    def encode(self, records: list[Any], groups: list[int] | None = None) -> bytes:
        data = b"\n".join([record.body for record in records]) + b"\n"
        if self.compression == "gzip":
            packer = zlib.compressobj(self.level, zlib.DEFLATED, 31)  # 31: a gzip member
            return packer.compress(data) + packer.flush()
        if self.compression == "zstd":
            return bytes(self._zstd.compress(data, self.level))
        return data


class Parquet:
    """A whole Parquet file per sync (pyarrow), a row group per batch the consumer delivered:
    a footer-less file is unreadable, so a file is finished before its records are
    acknowledged. Columns body, id, timestamp, attempts, and partition and offset when the
    messages carry them (an HA topic)."""

    def __init__(self, compression: str, level: int) -> None:
        require("parquet", "--format parquet")  # names the extra (fastnsq-client[parquet]) when pyarrow is missing
        import pyarrow
        import pyarrow.parquet
        self.pa, self.pq = pyarrow, pyarrow.parquet
        self.compression = {"gzip": "gzip", "zstd": "zstd"}.get(compression, "snappy")
        self.level = level if compression else None

    def encode(self, records: list[Any], groups: list[int] | None = None) -> bytes:
        pa = self.pa
        columns: dict[str, Any] = {
            "body": pa.array([r.body for r in records], pa.binary()),
            "id": pa.array([bytes(r.id).hex() if len(r.id) != 16 else bytes(r.id).decode("ascii", "replace")
                            for r in records], pa.string()),
            # Microseconds, as fastnsq.spark's schema has it: Spark refuses Parquet's nanosecond timestamps.
            "timestamp": pa.array([r.timestamp // 1000 for r in records], pa.timestamp("us", tz="UTC")),
            "attempts": pa.array([r.attempts for r in records], pa.int32()),
        }
        if any(r.partition is not None for r in records):
            columns["partition"] = pa.array([r.partition for r in records], pa.int32())
            columns["offset"] = pa.array([r.offset for r in records], pa.int64())
        sink = pa.BufferOutputStream()
        table = pa.table(columns)
        with self.pq.ParquetWriter(sink, table.schema, compression=self.compression,
                                   compression_level=self.level) as writer:
            start = 0
            for size in groups or [len(records)]:  # each write a row group: one batch's records
                writer.write_table(table.slice(start, size), row_group_size=size)
                start += size
        return bytes(sink.getvalue())


def make_encoder(options: FileOptions) -> Encoder:
    if options.format == "parquet":
        return Parquet(options.compression, options.level)
    return Lines(options.compression, options.level)


class FileLog:
    """The current file of one topic. Not thread safe: one sync at a time."""

    def __init__(self, options: FileOptions, topic: str, identifier: str, encoder: Encoder) -> None:
        self.options = options
        self.topic = topic
        self.encoder = encoder
        self.format = compute_format(options.filename_format, topic, identifier=identifier,
                                     rev_needed=options.rev_needed, suffix=options.suffix)
        self.fd: int | None = None
        self.path = ""  # the file open now (under the work dir)
        self.filename = ""  # its name with <DATETIME> replaced, <REV> not yet
        self.rev = 0
        self.opened_at = 0.0
        self.size = 0
        self.files_closed: list[str] = []  # where each closed file ended up

    # ---- rotation ---------------------------------------------------------------------------

    def current_filename(self) -> str:
        return with_datetime(self.format, self.options.datetime_format)

    def needs_rotation(self) -> bool:
        if self.fd is None:
            return True
        if self.current_filename() != self.filename:
            logger.info("[%s] new filename %s, rotating...", self.topic, self.current_filename())
            return True
        if self.options.rotate_interval > 0 and time.monotonic() - self.opened_at > self.options.rotate_interval:
            logger.info("[%s] %.1fs since last open, rotating...", self.topic, time.monotonic() - self.opened_at)
            return True
        if self.options.rotate_size > 0 and self.size > self.options.rotate_size:
            logger.info("[%s] %s currently %d bytes (> %d), rotating...", self.topic, self.path, self.size,
                        self.options.rotate_size)
            return True
        return False

    def open_next(self) -> None:
        """Close the current file (if any) and open the next one, at the first free ``<REV>``."""
        self.close()
        filename = self.current_filename()
        self.rev = 0 if filename != self.filename else self.rev + 1
        self.filename = filename
        self.opened_at = time.monotonic()
        template = os.path.join(self.options.work, filename)
        os.makedirs(os.path.dirname(template) or ".", 0o770, exist_ok=True)
        exclusive = bool(self.options.compression or self.options.format == "parquet"
                         or self.options.rotate_interval > 0)
        while True:
            path = with_rev(template, self.rev)
            if self._taken_in_output_dir(path):
                self.rev += 1
                continue
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                logger.warning("[%s] working file already exists: %s", self.topic, path)
                self.rev += 1
                continue
            size = os.fstat(fd).st_size
            if self.options.rotate_size > 0 and size > self.options.rotate_size:
                os.close(fd)  # an earlier run's file already past the size: the next <REV>
                self.rev += 1
                continue
            break
        logger.info("[%s] opening %s", self.topic, path)
        self.fd, self.path, self.size = fd, path, size

    def _taken_in_output_dir(self, path: str) -> bool:
        if self.options.work == self.options.output_dir:
            return False
        final = self._output_path(path)
        os.makedirs(os.path.dirname(final) or ".", 0o770, exist_ok=True)
        if os.path.exists(final):
            logger.warning("[%s] output file already exists: %s", self.topic, final)
            return True
        return False

    def _output_path(self, path: str) -> str:
        relative = os.path.relpath(path, self.options.work)
        return os.path.join(self.options.output_dir, relative)

    # ---- writing ----------------------------------------------------------------------------

    def sync(self, records: list[Any], groups: list[int] | None = None) -> None:
        """Write ``records`` (rotating first if due) and fsync: after this they are on disk.
        ``groups``: the sizes of the batches they came in, in order (Parquet's row groups).

        With ``--rotate-size`` a file takes records until it is past the size, then the next
        one starts, as nsq_to_file checks before each message; the date and the interval are
        checked once per sync."""
        if not records:
            return
        whole_files = self.options.format == "parquet"
        if whole_files or self.needs_rotation():
            self.open_next()
        start, limit = 0, self.options.rotate_size
        if limit > 0 and not whole_files:
            for index, record in enumerate(records):
                if self.size > limit:
                    self._write(records[start:index])
                    logger.info("[%s] %s currently %d bytes (> %d), rotating...", self.topic, self.path,
                                self.size, limit)
                    self.open_next()
                    start = index
                self.size += len(record.body) + 1
        else:
            self.size += sum(len(record.body) + 1 for record in records)
        self._write(records[start:], groups if whole_files else None)
        if whole_files:
            self.close()

    def _write(self, records: list[Any], groups: list[int] | None = None) -> None:
        assert self.fd is not None
        if not records:
            return
        view = memoryview(self.encoder.encode(records, groups))
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        os.fsync(self.fd)

    def tick(self) -> None:
        """The sync interval passed without records: rotate an idle file when due."""
        if self.options.format == "parquet":
            return  # a Parquet file is whole at each sync: none is left open
        if self.needs_rotation():
            if self.options.skip_empty_files:
                self.close()
            else:
                self.open_next()

    def close(self) -> None:
        """fsync and close the current file, then move it to the output dir (never over another)."""
        if self.fd is None:
            return
        fd, path, self.fd = self.fd, self.path, None
        os.fsync(fd)
        os.close(fd)
        final = path
        if self.options.work != self.options.output_dir:
            final = self._move(path)
        self.files_closed.append(final)

    def _move(self, path: str) -> str:
        destination = self._output_path(path)
        template = self._output_path(os.path.join(self.options.work, self.filename))
        rev = self.rev
        while True:
            logger.info("[%s] moving finished file %s to %s", self.topic, path, destination)
            try:
                os.link(path, destination)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                rev += 1
                destination = with_rev(template, rev)
                continue
            os.unlink(path)
            return destination
