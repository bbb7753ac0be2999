"""A spool made into its Parquet file, in a thread of its own; and a restart finishing what a crash left.

:func:`finish` reads a closed spool (:mod:`.spool`), writes its batches as row groups of up
to ``--parquet-row-group-size`` bytes (Arrow's, uncompressed) into a hidden temporary file
beside it, fsyncs it, and links it to its name in the output dir (a link never overwrites: on
a clash, the next ``<REV>``); only then are the temporary file and the spool removed. The
spool's id is written into the file's key-value metadata, so a spool still there beside its
file (a crash between the link and the removal) is known as done and removed, never written
twice. Every message was FINed when its spool frame was fsynced: the conversion itself loses
nothing when killed, it is done again at the next start.

:class:`Finisher` runs the conversions one after another in a thread, so a sync never waits
for one: the spool after it takes the syncs meanwhile. At start it first finishes every spool
of its topic an earlier run left (:meth:`Finisher.recover`) and says in one line what it found
and did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from .filelog import FileOptions
from .filenames import with_rev
from .spool import (
    MAGIC,
    NEW_SUFFIX,
    SUFFIX,
    NotASpool,
    file_name,
    fsync_folder,
    read_header,
    read_spool,
    spool_name,
)

logger = logging.getLogger("fastnsq.apps.to_file")

ID_KEY = "fastnsq.spool.id"
#: A row group holds at most this many rows (pyarrow's own default cap), whatever their bytes.
MAX_GROUP_ROWS = 1 << 20
#: The column order of every file; partition and offset only when a spool's messages carry them.
COLUMN_ORDER = ("body", "id", "timestamp", "attempts", "partition", "offset")


@dataclass
class Finished:
    """What became of one spool."""

    spool: str
    path: str = ""  # the Parquet file ("" when the spool held no message)
    rows: int = 0
    row_groups: int = 0
    size: int = 0
    torn_bytes: int = 0
    seconds: float = 0.0
    already_done: bool = False  # its file was made before a crash; only the spool was left


def tmp_name(filename: str) -> str:
    return f".{filename}.tmp"


def final_path(spool: str, options: FileOptions) -> str:
    """Where a spool's file goes: its folder under the output dir, as the spool's under the work dir."""
    relative = os.path.relpath(os.path.dirname(spool), options.work)
    return os.path.normpath(os.path.join(options.output_dir, relative, file_name(os.path.basename(spool))))


def _is_ours(path: str, spool_id: str) -> bool:
    try:
        metadata = pq.read_metadata(path).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return metadata.get(ID_KEY.encode()) == spool_id.encode()


def _candidates(final: str, header: dict[str, str | int], spool_folder: str) -> list[str]:
    """The names a spool's file may have: its own, then the next ``<REV>``s while they are taken."""
    template, rev = str(header.get("template", "")), int(header.get("rev", 0))
    if "<REV>" not in template:
        return [final]
    folder, names = os.path.dirname(final), []
    while True:
        name = with_rev(template, rev)
        path = os.path.join(folder, name)
        names.append(path)
        if not (os.path.exists(path) or os.path.exists(os.path.join(spool_folder, spool_name(name)))):
            return names
        rev += 1


def _committed(final: str, header: dict[str, str | int], spool_folder: str) -> str:
    """The file this spool already became (a crash after the link), or ""."""
    for path in _candidates(final, header, spool_folder):
        if os.path.exists(path) and _is_ours(path, str(header["id"])):
            return path
    return ""


def _schema(batches: list[pa.RecordBatch]) -> pa.Schema:
    fields = {f.name: f for batch in batches for f in batch.schema}
    return pa.schema([fields[name] for name in COLUMN_ORDER if name in fields])


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the file's columns (nulls for partition and offset it lacks)."""
    if batch.schema.names == schema.names:
        return batch
    columns = [batch.column(f.name) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
               for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def write_parquet(batches: list[pa.RecordBatch], path: str, options: FileOptions, spool_id: str) -> int:
    """``batches`` into a Parquet file at ``path``, fsynced; the number of row groups."""
    schema = _schema(batches)
    codec = {"gzip": "gzip", "zstd": "zstd"}.get(options.compression, "snappy")
    groups = 0
    with pq.ParquetWriter(path, schema, compression=codec,
                          compression_level=options.level if options.compression else None) as writer:
        writer.add_key_value_metadata({ID_KEY: spool_id})
        pending: list[pa.RecordBatch] = []
        pending_bytes = pending_rows = 0
        for batch in batches:
            pending.append(_conform(batch, schema))
            pending_bytes += batch.nbytes
            pending_rows += batch.num_rows
            if pending_bytes >= options.row_group_size or pending_rows >= MAX_GROUP_ROWS:
                writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=pending_rows)
                groups += 1
                pending, pending_bytes, pending_rows = [], 0, 0
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=pending_rows)
            groups += 1
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return groups


def _link(tmp: str, candidates: list[str], spool_folder: str) -> str:
    """``tmp`` linked at the first candidate name free (no file, no spool holding it)."""
    for path in candidates:
        if os.path.exists(os.path.join(spool_folder, spool_name(os.path.basename(path)))) and path != candidates[0]:
            continue  # another spool's name
        try:
            os.link(tmp, path)
        except FileExistsError:
            logger.warning("%s: taken by another file; trying the next name", path)
            continue
        return path
    raise FileExistsError(f"every name for {tmp} is taken: {candidates}")


class FinishError(Exception):
    """A spool that could not be made into its file: it stays, and the next start tries again."""


def finish(spool: str, options: FileOptions) -> Finished:
    """The spool made into its Parquet file (or found already made), then removed; FinishError
    (naming the spool) when that fails."""
    try:
        return _finish(spool, options)
    except Exception as exc:  # any failure, with the spool's name
        raise FinishError(f"{spool}: {type(exc).__name__}: {exc}") from exc


def _finish(spool: str, options: FileOptions) -> Finished:
    began = time.monotonic()
    read = read_spool(spool)
    folder = os.path.dirname(spool)
    tmp = os.path.join(folder, tmp_name(file_name(os.path.basename(spool))))
    final = final_path(spool, options)
    os.makedirs(os.path.dirname(final), 0o770, exist_ok=True)
    done = Finished(spool, rows=read.rows, torn_bytes=read.torn_bytes)
    committed = _committed(final, read.header, folder)
    if committed:
        done.path, done.already_done = committed, True
    elif read.rows:
        done.row_groups = write_parquet(read.batches, tmp, options, str(read.header["id"]))
        done.path = _link(tmp, _candidates(final, read.header, folder), folder)
        fsync_folder(os.path.dirname(done.path))
        done.size = os.path.getsize(done.path)
    for leftover in (tmp, spool):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass
    done.seconds = time.monotonic() - began
    return done


#: A spool being made (:func:`~.spool.new_name`) older than this is an earlier run's, cut by a kill.
ABANDONED_AGE = 60.0


@dataclass
class FoundSpools:
    """What a restart finds under the work dir."""

    spools: list[str]  # this topic's, to finish
    cut: list[str]  # killed as they were made (no whole header): they never held a message
    unreadable: list[str]  # named as spools, not one: left alone


def _cut_before_header(path: str) -> bool:
    """Whether ``path`` holds no more than a spool's magic: cut before its header was whole."""
    with open(path, "rb") as file:
        head = file.read(len(MAGIC))
    return MAGIC.startswith(head)


def _maker_gone(name: str) -> bool:
    """Whether the process that was making this spool (its pid is in the name) is gone."""
    pid = name[:-len(NEW_SUFFIX)].rpartition(".")[2]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(int(pid))


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped. A SIGKILLed child whose supervisor was
    killed too stays a zombie until init reaps it, and a restart may look before that: its
    spool will never be written again (Linux's /proc; elsewhere it waits ABANDONED_AGE)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")


def _sort(found: FoundSpools, path: str, name: str, topic: str) -> None:
    if name.endswith(NEW_SUFFIX):  # a spool being made: an earlier run's once its maker is gone, or it is old
        if _maker_gone(name) or time.time() - os.path.getmtime(path) > ABANDONED_AGE:
            found.cut.append(path)
        return
    try:
        header = read_header(path)
    except (NotASpool, ValueError):
        # At a spool's name only once its header is whole (or after a power loss, before the
        # first batch was fsynced): nothing in it was FINed.
        (found.cut if _cut_before_header(path) else found.unreadable).append(path)
        return
    if header.get("topic") == topic:
        found.spools.append(path)


def find_spools(options: FileOptions, topic: str) -> FoundSpools:
    """The spools of ``topic`` under the work dir, those killed as they were made, and any
    other file named as a spool."""
    found = FoundSpools([], [], [])
    for folder, _, names in os.walk(options.work):
        for name in names:
            if name.startswith(".") and (name.endswith(SUFFIX) or (SUFFIX + "." in name
                                                                   and name.endswith(NEW_SUFFIX))):
                with contextlib.suppress(FileNotFoundError):  # gone meanwhile: another process's
                    _sort(found, os.path.join(folder, name), name, topic)
    found.spools.sort()
    return found


def _exit_process(exc: BaseException) -> None:
    # As a failed write: nsq_to_file's way. Nothing is lost: the spool stays, and the next
    # process the supervisor starts finishes it.
    logger.critical("failed making a Parquet file: %s (the spool stays: the next start finishes it)", exc)
    os._exit(1)


class Finisher:
    """Spools made into Parquet files one at a time, in a thread; :meth:`close` waits for them."""

    def __init__(self, options: FileOptions, topic: str,
                 on_failure: Callable[[BaseException], None] = _exit_process) -> None:
        self.options, self.topic, self.on_failure = options, topic, on_failure
        self.finished: list[Finished] = []
        self._queue: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"fastnsq-parquet-{topic}", daemon=True)
        self._thread.start()

    def submit(self, spool: str) -> None:
        self._queue.put(lambda: self._finish_one(spool))

    def recover(self) -> None:
        """Finish every spool of the topic an earlier run left, before any spool submitted after.
        Called before this run opens a spool: they are found now, and finished in the thread."""
        found = find_spools(self.options, self.topic)
        self._queue.put(lambda: self._recover(found))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - any failure: the process ends, the spool stays
                self.on_failure(exc)

    def _finish_one(self, spool: str) -> Finished:
        done = finish(spool, self.options)
        self.finished.append(done)
        if done.path:
            logger.info("[%s] wrote %s: %d rows, %d row group(s), %d bytes, in %.2f s", self.topic, done.path,
                        done.rows, done.row_groups, done.size, done.seconds)
        return done

    def _recover(self, found: FoundSpools) -> None:
        where = self.options.work
        if found.unreadable:
            logger.warning("[%s] restart: left alone %d file(s) named as spools but not one: %s", self.topic,
                           len(found.unreadable), ", ".join(found.unreadable))
        for path in found.cut:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        cut = (f"; removed {len(found.cut)} spool(s) killed as they were made (no whole header: they never "
               "held a message)") if found.cut else ""
        if not found.spools:
            logger.info("[%s] no spool of an earlier run in %s: nothing to finish%s", self.topic, where, cut)
            return
        done = [finish(spool, self.options) for spool in found.spools]
        self.finished.extend(done)
        written = [d for d in done if d.path and not d.already_done]
        torn = sum(d.torn_bytes for d in done)
        logger.info(
            "[%s] restart: found %d spool(s) of an earlier run in %s holding %d message(s); wrote %d Parquet "
            "file(s) of %d row(s)%s; %d already written (spool removed); %d empty%s%s", self.topic,
            len(found.spools), where, sum(d.rows for d in done), len(written), sum(d.rows for d in written),
            f" ({', '.join(d.path for d in written)})" if written else "",
            sum(d.already_done for d in done), sum(not d.path for d in done),
            f"; dropped {torn} torn byte(s) at spool ends (never FINed: nsqd delivers those again)" if torn else "",
            cut)
