"""The spool of a Parquet file to be: each sync's records appended as one framed Arrow batch, fsynced.

A Parquet file is unreadable until its footer is written, so the file cannot take each sync's
records and stay open while they are FINed. The spool can: at each sync the records become
one Arrow record batch (the archive's columns, :func:`record_batch`), written as an Arrow IPC
stream inside a frame (magic, length, CRC-32) and fsynced before a message is FINed. At
rotation the spool becomes the Parquet file (:mod:`.parquetfile`); after a crash a restart
reads it back (:func:`read_spool`) to its last whole frame: a frame cut short or failing its
CRC was being written when the process died, before its fsync, so none of its messages was
FINed and nsqd delivers them again.

The first frame holds a JSON header: the topic (a restart takes only its own topic's spools),
an id (written into the Parquet file, so a restart knows a spool whose file was already
made), and the ``<REV>`` template of its file's name.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MAGIC = b"FNSQSPOOL1\n"
_FRAME = struct.Struct("<4sQI")  # b"FRAM", payload length, CRC-32 of the payload
_FRAME_TAG = b"FRAM"
SUFFIX = ".spool"
NEW_SUFFIX = ".new"


def spool_name(filename: str) -> str:
    """The spool of the Parquet file ``filename``, beside it: hidden (a leading dot) and not
    ``.parquet``, so Spark, pyarrow and a ``*.parquet`` glob pass it by."""
    return f".{filename}{SUFFIX}"


def file_name(spool: str) -> str:
    """The Parquet file's name back from its spool's."""
    return spool[1:-len(SUFFIX)]


_BODY, _ID, _TIMESTAMP, _ATTEMPTS = (attrgetter(name) for name in ("body", "id", "timestamp", "attempts"))
_PARTITION, _OFFSET = attrgetter("partition"), attrgetter("offset")


def record_batch(records: list[Any]) -> pa.RecordBatch:
    """The archive's columns of ``records``: body, id, timestamp (UTC, microseconds, as the
    Spark source has it: Spark refuses Parquet's nanoseconds), attempts, and partition and
    offset when the messages carry them (an HA topic). A pass over the records per column,
    in C (``map``): this runs for every message archived."""
    nanoseconds = pa.array(list(map(_TIMESTAMP, records)), pa.int64())
    columns: dict[str, Any] = {
        "body": pa.array(list(map(_BODY, records)), pa.binary()),
        "id": _ids(list(map(_ID, records))),
        "timestamp": pc.divide(nanoseconds, 1000).cast(pa.timestamp("us", tz="UTC")),
        "attempts": pa.array(list(map(_ATTEMPTS, records)), pa.int32()),
    }
    partitions = list(map(_PARTITION, records))
    if partitions.count(None) != len(partitions):
        columns["partition"] = pa.array(partitions, pa.int32())
        columns["offset"] = pa.array(list(map(_OFFSET, records)), pa.int64())
    return pa.RecordBatch.from_pydict(columns)


def _ids(ids: list[Any]) -> pa.Array:
    """nsqd's ids are 16 ASCII hex digits: taken as they are, in one cast; any other id (another
    length, or bytes that are not text) as the hex of its bytes, or its ASCII with replacements."""
    if set(map(len, ids)) == {16}:
        try:
            return pa.array(ids, pa.binary()).cast(pa.string())
        except pa.ArrowInvalid:
            pass
    return pa.array([bytes(i).hex() if len(i) != 16 else bytes(i).decode("ascii", "replace") for i in ids],
                    pa.string())


def _frame(payload: bytes | pa.Buffer) -> list[Any]:
    return [_FRAME.pack(_FRAME_TAG, len(payload), zlib.crc32(payload)), payload]


def _write_all(fd: int, parts: list[Any]) -> int:
    written = 0
    for part in parts:
        view = memoryview(part)
        while view:
            done = os.write(fd, view)
            view = view[done:]
            written += done
    return written


def fsync_folder(folder: str) -> None:
    """A file made, linked or removed in ``folder`` stays so after a power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_name(spool: str) -> str:
    """Where a spool is made before it takes its name (with its header whole)."""
    return f"{spool}.{os.getpid()}{NEW_SUFFIX}"


class SpoolWriter:
    """One spool being written. FileExistsError if the path exists (a name is never reused).

    It is made under :func:`new_name` and linked to its name once its header is written, so a
    file at a spool's name always starts with a whole header (a restart reads its topic), and
    one a kill cut before that never had a name to be found by."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        made = new_name(path)
        self.fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            self.size = _write_all(self.fd, [MAGIC, *_frame(json.dumps(header).encode())])
            os.link(made, path)
        except BaseException:
            os.close(self.fd)
            raise
        finally:
            os.unlink(made)
        self.rows = 0

    def append(self, batch: pa.RecordBatch) -> None:
        """``batch`` written and fsynced: after this its messages may be FINed. The first one
        makes the spool's name durable too (the header goes with it: one fsync fewer a file)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as stream:
            stream.write_batch(batch)
        self.size += _write_all(self.fd, _frame(sink.getvalue()))
        os.fsync(self.fd)
        if not self.rows:
            fsync_folder(os.path.dirname(self.path) or ".")
        self.rows += batch.num_rows

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Spool:
    """What a spool holds, read back to its last whole frame."""

    path: str
    header: dict[str, Any]
    batches: list[pa.RecordBatch] = field(default_factory=list)
    torn_bytes: int = 0  # after the last whole frame: never fsynced, so never FINed

    @property
    def rows(self) -> int:
        return sum(batch.num_rows for batch in self.batches)


class NotASpool(ValueError):
    """A file named as a spool that does not start as one (or whose header frame is cut)."""


def read_spool(path: str) -> Spool:
    """The header and every whole frame's batch (memory-mapped: the bodies are not copied)."""
    data = pa.memory_map(path, "r").read_buffer()
    view = memoryview(data)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise NotASpool(f"{path}: not a fastnsq spool")
    offset = len(MAGIC)
    payloads: list[pa.Buffer] = []
    while offset + _FRAME.size <= len(data):
        tag, length, crc = _FRAME.unpack_from(view, offset)
        start, end = offset + _FRAME.size, offset + _FRAME.size + length
        if tag != _FRAME_TAG or end > len(data) or zlib.crc32(view[start:end]) != crc:
            break
        payloads.append(data.slice(start, length))
        offset = end
    if not payloads:
        raise NotASpool(f"{path}: no whole header frame")
    spool = Spool(path, json.loads(payloads[0].to_pybytes()), torn_bytes=len(data) - offset)
    for payload in payloads[1:]:
        spool.batches.extend(pa.ipc.open_stream(payload))
    return spool


def read_header(path: str) -> dict[str, Any]:
    """Only the header (a restart sorting spools by topic reads no batch)."""
    with open(path, "rb") as file:
        head = file.read(len(MAGIC) + _FRAME.size)
        if head[:len(MAGIC)] != MAGIC or len(head) < len(MAGIC) + _FRAME.size:
            raise NotASpool(f"{path}: not a fastnsq spool")
        tag, length, crc = _FRAME.unpack_from(head, len(MAGIC))
        payload = file.read(length) if tag == _FRAME_TAG and length < 1 << 20 else b""
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise NotASpool(f"{path}: no whole header frame")
    header: dict[str, Any] = json.loads(payload)
    return header
