"""The client side of a recorded conversation, replayed over TCP to any nsqd.

Both the recorder (``record.py``, against a real nsqd) and the replay test (against
the embedded one) talk through :class:`Conversation`: it sends a step's bytes (with
the recorded message ids replaced by the ones this server gave the same messages)
and reads the server's answer until it holds as many frames as the recording's
answer, then a short quiet period (or up to EOF when the recording ended there).
What the server sent after an IDENTIFY that negotiated snappy or deflate is counted
after decompression.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from fastnsq.compression import DeflateStream, SnappyStream

#: How long a step may wait for its frames: long enough for a deferred message on a
#: new channel of a real nsqd (its queue scan re-reads the channel list every 5 s).
STEP_TIMEOUT = 8.0
#: How long the answer must stay quiet after the expected frames (a frame too many shows).
QUIET = 0.15
#: How long a step that expects nothing listens.
EMPTY_WAIT = 0.3
FRAME_MESSAGE = 2

Frame = tuple[int, bytes]


def compression_of(scenario: dict[str, Any]) -> str | None:
    """The compression the scenario's IDENTIFY negotiates (None, "snappy" or "deflate")."""
    for step in scenario["steps"]:
        text = step.get("text", "")
        if text.startswith("IDENTIFY"):
            body = json.loads(text[text.index("{") :])
            if body.get("snappy") and not body.get("deflate"):
                return "snappy"
            if body.get("deflate") and not body.get("snappy"):
                return "deflate"
    return None


def split_frames(data: bytes, limit: int = -1) -> tuple[list[Frame], bytes]:
    """(frame type, data) for each complete frame (at most ``limit``), and the bytes left over."""
    frames: list[Frame] = []
    pos = 0
    while len(data) - pos >= 8 and len(frames) != limit:
        size = struct.unpack_from(">i", data, pos)[0]
        if size < 4 or len(data) - pos - 4 < size:
            break
        frame_type = struct.unpack_from(">i", data, pos + 4)[0]
        frames.append((frame_type, data[pos + 8 : pos + 4 + size]))
        pos += 4 + size
    return frames, data[pos:]


class ServerStream:
    """The frames in what a server sends: plain, and decompressed after the IDENTIFY JSON."""

    def __init__(self, compression: str | None) -> None:
        self.compression = compression
        self._stream: SnappyStream | DeflateStream | None = None
        self._pending = b""  # wire bytes not yet a whole frame (before the switch)
        self._plain = b""  # decompressed bytes not yet a whole frame (after it)

    def feed(self, data: bytes) -> list[Frame]:
        if self._stream is not None:
            return self._split_plain(self._stream.decompress(data))
        self._pending += data
        frames: list[Frame] = []
        while True:
            found, rest = split_frames(self._pending, limit=1)
            if not found:
                return frames
            frames += found
            self._pending = rest
            if self.compression and found[0][1].startswith(b"{"):
                # The IDENTIFY JSON is the last plain frame: the rest is the compressed stream.
                self._stream = SnappyStream() if self.compression == "snappy" else DeflateStream()
                compressed, self._pending = self._pending, b""
                return frames + (self._split_plain(self._stream.decompress(compressed)) if compressed else [])

    def _split_plain(self, data: bytes) -> list[Frame]:
        frames, self._plain = split_frames(self._plain + data)
        return frames


def expected_frames(scenario: dict[str, Any]) -> list[list[Frame]]:
    """The frames of each recv step of a recording, decompressed where the stream is."""
    stream = ServerStream(compression_of(scenario))
    return [stream.feed(bytes.fromhex(step["recv"])) for step in scenario["steps"] if "recv" in step]


def message_id(frame: Frame) -> bytes:
    return frame[1][10:26]


class Conversation:
    """One client connection replaying the client side of a recording."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, compression: str | None) -> None:
        self.reader = reader
        self.writer = writer
        self.stream = ServerStream(compression)
        #: Recorded message id -> the id this server gave the same message.
        self.ids: dict[bytes, bytes] = {}

    @classmethod
    async def open(cls, address: str, scenario: dict[str, Any]) -> Conversation:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, compression_of(scenario))

    async def send(self, data: bytes) -> bytes:
        """Write ``data`` with the recorded ids replaced; returns what was written."""
        for recorded, received in self.ids.items():
            data = data.replace(recorded, received)
        self.writer.write(data)
        await self.writer.drain()
        return data

    async def receive(self, count: int, eof: bool, timeout: float = STEP_TIMEOUT) -> tuple[bytes, list[Frame], bool]:
        """(bytes, frames, closed): what arrives until ``count`` frames and a quiet period, or EOF."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        data = b""
        frames: list[Frame] = []
        closed = False
        while not closed:
            if eof or len(frames) < count:
                wait = deadline - loop.time()
            else:
                wait = QUIET if count else EMPTY_WAIT
            if wait <= 0:
                break
            try:
                chunk = await asyncio.wait_for(self.reader.read(65536), wait)
            except asyncio.TimeoutError:
                break
            closed = not chunk
            data += chunk
            frames += self.stream.feed(chunk)
        return data, frames, closed

    def learn_ids(self, recorded: list[Frame], received: list[Frame]) -> None:
        """Map the recording's message ids to this server's, message by message in order."""
        mine = [f for f in received if f[0] == FRAME_MESSAGE]
        theirs = [f for f in recorded if f[0] == FRAME_MESSAGE]
        for old, new in zip(theirs, mine):
            self.ids.setdefault(message_id(old), message_id(new))

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass
