"""The files of ``fastnsq to-file``: their options, names and rotation, and the plain (lines) file.

nsq_to_file's file rules, in our words: a file is opened under ``--work-dir`` (default: the
output dir) with the first free ``<REV>``; without gzip or ``--rotate-interval`` an existing
file is appended to (``O_APPEND``), with them a new one is required (``O_EXCL``). A file
rotates when ``<DATETIME>`` changes, after ``--rotate-interval``, or past ``--rotate-size``
bytes (the uncompressed bytes written, as nsq_to_file counts them). Closing fsyncs it and
moves it to the output dir without overwriting (a link, then unlink; on a clash the next
``<REV>``).

A file per partition folder (``--partition-by``, :mod:`.partitioning`) when asked: the folder
sits between the work (or output) dir and the file's name. :class:`RotatingFile` is what both
formats share (the name, the first free ``<REV>``, when to rotate); the Parquet file is
:mod:`.parquetlog`'s.

Records reach a plain file only at :meth:`FileLog.sync`: the records since the last sync are
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .filenames import compute_format, with_datetime, with_rev

logger = logging.getLogger("fastnsq.apps.to_file")

Opened = TypeVar("Opened")


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
    partition_by: str = ""  # a --partition-by spec (.partitioning); "": no folders
    row_group_size: int = 64 << 20  # Parquet: the Arrow bytes of a row group, at most

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


def gzip_member(level: int) -> tuple[Callable[[bytes], bytes], str]:
    """A function making one gzip member of ``data`` at ``level`` (1-9), and the library it uses.

    Compression is most of an archive's cost at nsq_to_file's usual ``--gzip-level 1``, so the
    fastest well-kept implementation at hand does it: ISA-L (``isal``, the ``gzip`` extra) for
    levels 1-3 (its own levels 1-3, which compress about as well as zlib's 1-3, several times
    faster), else cramjam's (a dependency already; about 3x zlib's speed at level 1), else zlib.
    Every one writes a standard gzip member, which ``gzip -d`` and nsq_to_file's readers take.
    """
    if level <= 3:
        try:
            from isal import isal_zlib
        except ImportError:
            pass
        else:
            def isal_member(data: bytes) -> bytes:
                packer = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 31)  # 31: a gzip member
                return bytes(packer.compress(data) + packer.flush())

            return isal_member, "isal"
    try:
        import cramjam  # a dependency of fastnsq (snappy framing); its gzip is a newer addition
    except ImportError:  # pragma: no cover - a dependency
        pass
    else:
        if hasattr(cramjam, "gzip"):
            return (lambda data: bytes(cramjam.gzip.compress(data, level=level))), "cramjam"

    def zlib_member(data: bytes) -> bytes:
        packer = zlib.compressobj(level, zlib.DEFLATED, 31)
        return packer.compress(data) + packer.flush()

    return zlib_member, "zlib"


class Lines:
    """One body per line, compressed per sync when asked (a gzip member, a zstd frame)."""

    def __init__(self, compression: str, level: int) -> None:
        self.compression, self.level = compression, level
        self.codec = ""  # the gzip library in use
        if compression == "zstd":
            import cramjam  # a dependency of fastnsq already (snappy framing)

            self._zstd = cramjam.zstd
        elif compression == "gzip":
            self._gzip, self.codec = gzip_member(level)

    def encode(self, records: list[Any]) -> bytes:
        data = b"\n".join([record.body for record in records]) + b"\n"
        if self.compression == "gzip":
            return self._gzip(data)
        if self.compression == "zstd":
            return bytes(self._zstd.compress(data, self.level))
        return data


class RotatingFile:
    """One file of a topic (in one partition folder) at a time: its name and when it rotates.
    Not thread safe: one sync at a time."""

    def __init__(self, options: FileOptions, topic: str, identifier: str, folder: str = "") -> None:
        self.options = options
        self.topic = topic
        self.folder = folder  # the partition folder ("k=v/k=v"), "" without --partition-by
        self.format = compute_format(options.filename_format, topic, identifier=identifier,
                                     rev_needed=options.rev_needed, suffix=options.suffix)
        self.path = ""  # the file open now (under the work dir)
        self.filename = ""  # its name with <DATETIME> replaced, <REV> not yet
        self.rev = 0
        self.opened_at = 0.0
        self.size = 0
        self.files_closed: list[str] = []  # where each closed file ended up

    @property
    def is_open(self) -> bool:
        raise NotImplementedError

    def open_next(self) -> None:
        """Close the current file (if any) and open the next one, at the first free ``<REV>``."""
        raise NotImplementedError

    def sync(self, records: list[Any]) -> None:
        """Write ``records`` (rotating first if due) and fsync: after this they are on disk."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def current_filename(self) -> str:
        return with_datetime(self.format, self.options.datetime_format)

    def needs_rotation(self) -> bool:
        if not self.is_open:
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

    def _open_first_free(self, attempt: Callable[[str], Opened | None], what: str = "") -> tuple[str, Opened]:
        """The file opened at the first ``<REV>`` ``attempt`` takes (it answers None for a
        name taken), under the work dir and the partition folder; one line says which, and
        how many names before it were taken (by earlier runs' files, after a restart)."""
        filename = self.current_filename()
        self.rev = 0 if filename != self.filename else self.rev + 1
        self.filename = filename
        self.opened_at = time.monotonic()
        template = os.path.join(self.options.work, self.folder, filename)
        os.makedirs(os.path.dirname(template) or ".", 0o770, exist_ok=True)
        skipped = 0
        while True:
            path = with_rev(template, self.rev)
            opened = attempt(path)
            if opened is not None:
                break
            self.rev += 1
            skipped += 1
        logger.info("[%s] opening %s%s%s", self.topic, what, path,
                    f" (the {skipped} name(s) before it taken)" if skipped else "")
        self.path = path
        return path, opened

    def _taken_in_output_dir(self, path: str) -> bool:
        if self.options.work == self.options.output_dir:
            return False
        final = self._output_path(path)
        os.makedirs(os.path.dirname(final) or ".", 0o770, exist_ok=True)
        return os.path.exists(final)

    def _output_path(self, path: str) -> str:
        relative = os.path.relpath(path, self.options.work)
        return os.path.join(self.options.output_dir, relative)


class FileLog(RotatingFile):
    """The plain file (lines) of one topic in one partition folder."""

    def __init__(self, options: FileOptions, topic: str, identifier: str, folder: str = "") -> None:
        super().__init__(options, topic, identifier, folder)
        self.encoder = Lines(options.compression, options.level)
        self.fd: int | None = None

    @property
    def is_open(self) -> bool:
        return self.fd is not None

    def open_next(self) -> None:
        """Close the current file (if any) and open the next one, at the first free ``<REV>``."""
        self.close()
        exclusive = bool(self.options.compression or self.options.rotate_interval > 0)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)

        def attempt(path: str) -> tuple[int, int] | None:
            if self._taken_in_output_dir(path):
                return None
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                return None
            size = os.fstat(fd).st_size
            if self.options.rotate_size > 0 and size > self.options.rotate_size:
                os.close(fd)  # an earlier run's file already past the size: the next <REV>
                return None
            return fd, size

        _, (self.fd, self.size) = self._open_first_free(attempt)

    # ---- writing ----------------------------------------------------------------------------

    def sync(self, records: list[Any]) -> None:
        """Write ``records`` (rotating first if due) and fsync: after this they are on disk.

        With ``--rotate-size`` a file takes records until it is past the size, then the next
        one starts, as nsq_to_file checks before each message; the date and the interval are
        checked once per sync."""
        if not records:
            return
        if self.needs_rotation():
            self.open_next()
        start, limit = 0, self.options.rotate_size
        if limit > 0:
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
        self._write(records[start:])

    def _write(self, records: list[Any]) -> None:
        assert self.fd is not None
        if not records:
            return
        view = memoryview(self.encoder.encode(records))
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        os.fsync(self.fd)

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
        template = self._output_path(os.path.join(self.options.work, self.folder, self.filename))
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
