"""Option ``rowTransport=tcp``: the rows of a micro-batch reach Spark's read tasks over TCP.

With the default transport (``plan``) a micro-batch's rows ride inside its input
partitions: Spark copies them from the source process into the query plan, into each
task, and into the read task's Python worker, which unpickles them. Here the source
process keeps each slice as an Arrow IPC stream and a :class:`RowServer` thread serves
it; the input partition carries only a :class:`RowHandle`, and the read task fetches
its slice with :func:`fetch_rows`.

Spark's contract stays the same: a slice is served, as often as it is asked for (task
retries, a batch read twice), until the batch is committed; then it is dropped with its
FIN. The server binds ``rowServerHost`` (127.0.0.1 by default: Spark on this host) and
answers only requests carrying the session's random token, which travels in the plan.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import NSQError

__all__ = ["RowHandle", "RowServer", "fetch_rows", "ipc_stream"]

logger = logging.getLogger(__name__)

_REQUEST_LIMIT = 4096  # a request is one short JSON line
_HEADER = struct.Struct(">BQ")  # status (0: rows follow, 1: an error text follows), payload size
_CONNECT_TIMEOUT = 30.0
_READ_TIMEOUT = 300.0
#: How long a request for a slice still being read waits for it (under the fetcher's read timeout).
_PENDING_WAIT = 240.0


@dataclass(frozen=True)
class RowHandle:
    """Where one slice of a micro-batch is served: what an input partition carries instead of rows."""

    host: str
    port: int
    token: str
    batch: int  # the batch's end seq: slices are dropped when everything before it is FINed
    index: int
    rows: int  # -1: not known when planned (readMode=offsets' prefetch)


def ipc_stream(batch: pa.RecordBatch) -> pa.Buffer:
    """``batch`` as an Arrow IPC stream, the bytes the server sends."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


class RowServer:
    """Serves the slices of the batches Spark has not committed yet (one daemon thread per request)."""

    def __init__(self, host: str, port: int) -> None:
        self.token = secrets.token_hex(32)
        self._slices: dict[tuple[int, int], pa.Buffer] = {}
        #: slices announced before their rows exist (readMode=offsets' prefetch): set when put or failed
        self._pending: dict[tuple[int, int], threading.Event] = {}
        self._failed: dict[tuple[int, int], str] = {}
        self._lock = threading.Lock()
        try:
            self._server = _Server((host, port), self)
        except OSError as exc:
            raise NSQError(
                f"the nsq source cannot listen on {host}:{port} for its read tasks "
                f"(options rowServerHost / rowServerPort): {exc}"
            ) from exc
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="fastnsq-spark-rows", daemon=True)
        self._thread.start()

    def put(self, batch: int, slices: list[pa.RecordBatch]) -> list[RowHandle]:
        """Keep the slices of the batch ending at seq ``batch``; the handles that fetch them."""
        streams = [ipc_stream(s) for s in slices]
        with self._lock:
            for index, stream in enumerate(streams):
                self._slices[(batch, index)] = stream
        return [RowHandle(self.host, self.port, self.token, batch, index, s.num_rows) for index, s in enumerate(slices)]

    def reserve(self, batch: int, index: int) -> None:
        """Announce a slice whose rows come later (:meth:`put_one` or :meth:`fail`): a request
        for it waits for them."""
        with self._lock:
            self._pending[(batch, index)] = threading.Event()

    def put_one(self, batch: int, index: int, rows: pa.RecordBatch) -> None:
        """The rows of a slice announced by :meth:`reserve`."""
        stream = ipc_stream(rows)
        with self._lock:
            ready = self._pending.pop((batch, index), None)
            if ready is not None:  # not dropped meanwhile
                self._slices[(batch, index)] = stream
        if ready is not None:
            ready.set()

    def fail(self, batch: int, index: int, why: str) -> None:
        """A slice announced by :meth:`reserve` will not come: a request for it is told why."""
        with self._lock:
            ready = self._pending.pop((batch, index), None)
            if ready is not None:
                self._failed[(batch, index)] = why
        if ready is not None:
            ready.set()

    def wait_ready(self, timeout: float) -> bool:
        """Whether every announced slice has its rows or its failure within ``timeout`` s."""
        with self._lock:
            waiting = list(self._pending.values())
        return all(event.wait(timeout) for event in waiting)

    def drop_through(self, seq: int) -> None:
        """Forget the batches that end at or before ``seq`` (everything before it is FINed)."""
        with self._lock:
            for held in (self._slices, self._pending, self._failed):
                for key in [key for key in held if key[0] <= seq]:
                    del held[key]

    def held(self) -> int:
        """Slices kept right now (for tests and logs)."""
        with self._lock:
            return len(self._slices)

    def answer(self, request: dict[str, Any]) -> tuple[int, bytes | pa.Buffer]:
        """The status and payload for one request."""
        token = str(request.get("token", ""))
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return 1, b"refused: wrong token (the partition belongs to another nsq source session)"
        key = (int(request.get("batch", -1)), int(request.get("index", -1)))
        with self._lock:
            pending = self._pending.get(key)
        if pending is not None and not pending.wait(_PENDING_WAIT):
            return 1, f"batch {key[0]}, slice {key[1]}: its rows are still being read after {_PENDING_WAIT:.0f} s".encode()
        with self._lock:
            stream, failed = self._slices.get(key), self._failed.get(key)
        if failed is not None:
            return 1, f"batch {key[0]}, slice {key[1]} could not be read: {failed}".encode()
        if stream is None:
            return 1, (f"batch ending at seq {key[0]}, slice {key[1]} is not held: it was committed "
                       "(and FINed) already, or never planned by this session").encode()
        return 0, stream

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            self._slices.clear()
            waiting = list(self._pending.values())
            self._pending.clear()
        for event in waiting:  # a request still waiting is answered "not held"
            event.set()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], rows: RowServer) -> None:
        self.rows = rows
        super().__init__(address, _Handler)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(_REQUEST_LIMIT)
        try:
            request = json.loads(line)
            status, payload = self.server.rows.answer(request)
        except (ValueError, TypeError, AttributeError) as exc:
            status, payload = 1, f"bad request: {exc}".encode()
        self.wfile.write(_HEADER.pack(status, len(payload)))
        self.wfile.write(memoryview(payload))  # pa.Buffer exports the buffer protocol
        if status:
            logger.warning("nsq source row server: %s", bytes(payload).decode(errors="replace"))


def _recv_exactly(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"the nsq source closed the connection after {got} of {size} bytes")
        got += n
    return data


def fetch_rows(handle: RowHandle) -> pa.RecordBatch:
    """The slice ``handle`` names, from the source process that planned it (in a read task)."""
    where = f"{handle.host}:{handle.port}"
    try:
        sock = socket.create_connection((handle.host, handle.port), timeout=_CONNECT_TIMEOUT)
    except OSError as exc:
        raise NSQError(
            f"cannot reach the nsq source's row server at {where} from this Spark task: {exc}. "
            "With option rowTransport=tcp (or prefetchRanges=true) the read tasks fetch their rows from the "
            "driver's source process: set option rowServerHost to an address of the driver that the "
            "executors can reach, or use rowTransport=plan (prefetchRanges=false)"
        ) from exc
    with sock:
        sock.settimeout(_READ_TIMEOUT)
        request = {"token": handle.token, "batch": handle.batch, "index": handle.index}
        sock.sendall(json.dumps(request).encode() + b"\n")
        status, size = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
        payload = _recv_exactly(sock, size)
    if status:
        raise NSQError(f"the nsq source at {where} could not serve a slice: {payload.decode(errors='replace')}")
    batch = pa.ipc.open_stream(pa.py_buffer(payload)).read_next_batch()
    if handle.rows >= 0 and batch.num_rows != handle.rows:
        raise NSQError(f"the nsq source at {where} sent {batch.num_rows} rows for a slice of {handle.rows}")
    return batch
