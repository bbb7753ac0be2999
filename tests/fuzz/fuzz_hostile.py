"""A hostile nsqd, coverage-guided with atheris: the client's connection against any bytes.

    python tests/fuzz/fuzz_hostile.py -atheris_runs=100000
    python tests/fuzz/run_fuzz.py --target hostile --runs 1000000   # recorded in bench/results/

Each input is what a server sends after it answered IDENTIFY and SUB properly: raw bytes,
or (first byte odd) frames built from the input: responses and errors nobody asked for,
messages with bad ids, sizes that are huge, negative or short, frames cut anywhere, unknown
frame types. A real :class:`fastnsq.conn.Connection` reads them over a loopback TCP
connection (the server closes after sending). It must end closed within 3 s (no hang), its
error ``None``, a ProtocolError, a ServerError or an OSError (a clear error, nothing else),
its read buffer bounded (memory), and the loop must have caught no other exception.
atheris instruments fastnsq.conn and the Python codec for coverage; the connection runs
on the C codec unless FASTNSQ_NO_EXTENSIONS=1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import sys

import atheris

with atheris.instrument_imports():
    from fastnsq import conn as _conn  # noqa: F401  (instrumented for coverage)

from fastnsq import codec
from fastnsq.config import ConnectionOptions
from fastnsq.conn import Connection
from fastnsq.errors import ProtocolError, ServerError

IDENTIFY_ANSWER = codec.encode_response(json.dumps({"max_rdy_count": 2500, "version": "1.3.0"}).encode())
SUB_OK = codec.encode_response(b"OK")
MAX_FRAME = 1 << 20  # the connection's default max_msg_size bound is above this; capacity checked below


def frames_from(fdp: atheris.FuzzedDataProvider) -> bytes:
    """A stream of well-formed and broken frames, steered by the input."""
    out = bytearray()
    for _ in range(fdp.ConsumeIntInRange(0, 12)):
        kind = fdp.ConsumeIntInRange(0, 9)
        if kind == 0:
            out += codec.encode_response(fdp.PickValueInList([b"OK", b"_heartbeat_", b"CLOSE_WAIT", b"{}", b"junk"]))
        elif kind == 1:
            code = fdp.PickValueInList([b"E_INVALID", b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED",
                                        b"E_BAD_MESSAGE", b"E_WHATEVER", b""])
            out += codec.encode_error(code + b" " + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)))
        elif kind in (2, 3):
            message_id = fdp.ConsumeBytes(16).ljust(16, b"z")  # not hex: a bad id for the upstream layout
            if kind == 3:
                message_id = b"%016x" % fdp.ConsumeIntInRange(0, 2**64 - 1)
            out += codec.encode_message(fdp.ConsumeIntInRange(-(2**63), 2**63 - 1), fdp.ConsumeIntInRange(0, 65535),
                                        message_id, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200)))
        elif kind == 4:  # a size far above any limit, or negative, or below the frame type
            out += struct.pack(">i", fdp.PickValueInList([0x7FFFFFF0, -5, 0, 3, MAX_FRAME * 4])) + b"\0\0\0\2"
        elif kind == 5:  # an unknown frame type
            body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 30))
            out += struct.pack(">ii", 4 + len(body), fdp.ConsumeIntInRange(3, 2**31 - 1)) + body
        elif kind == 6:  # truncate what came so far anywhere
            out = out[: fdp.ConsumeIntInRange(0, len(out))]
        elif kind == 7:  # a message frame shorter than a message header
            body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 25))
            out += struct.pack(">ii", 4 + len(body), codec.FRAME_MESSAGE) + body
        else:
            out += fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    return bytes(out)


class Hostile:
    """One loopback server for the whole run; each input is one connection's worth of bytes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.payload = b""
        self.errors: list[object] = []
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(context))
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readexactly(4 + len(b"IDENTIFY\n"))
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
            writer.write(IDENTIFY_ANSWER)
            await reader.readline()  # SUB
            writer.write(SUB_OK + self.payload)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def exchange(self) -> Connection:
        conn = Connection(self.address, ConnectionOptions(heartbeat_interval=1.0), on_message=lambda m: None)
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.rdy(100)
        await asyncio.wait_for(conn.wait_closed(), 3.0)  # a hang fails here
        return conn

    def run(self, payload: bytes) -> None:
        self.payload = payload
        conn = self.loop.run_until_complete(self.exchange())
        if conn.state != "closed":
            raise AssertionError(f"the connection is {conn.state} after the server closed")
        error = conn.close_error
        if error is not None and not isinstance(error, (ProtocolError, ServerError, OSError)):
            raise AssertionError(f"closed with an unclear error: {error!r}")
        if conn.reader.capacity > 4 * MAX_FRAME + 65536:
            raise AssertionError(f"the read buffer grew to {conn.reader.capacity} bytes")
        if self.errors:
            raise AssertionError(f"the loop caught: {self.errors[0]!r}")


HOSTILE: Hostile | None = None


def one_input(raw: bytes) -> None:
    global HOSTILE
    if HOSTILE is None:
        HOSTILE = Hostile()
    if not raw:
        return
    payload = frames_from(atheris.FuzzedDataProvider(raw[1:])) if raw[0] & 1 else raw[1:]
    HOSTILE.run(payload)


def main() -> None:
    logging.getLogger("fastnsq").setLevel(logging.CRITICAL)  # every input closes a connection with a warning
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
