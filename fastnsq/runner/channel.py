"""The pipe between the supervisor and a child: JSON objects, one per line, over a socket pair.

One job: framing. Every message is a JSON object with a ``"type"``. The supervisor sends
``settings`` (first, once: the settings travel here rather than on the command line, so
that an AUTH secret stays out of ``ps``), ``assign`` (the nsqd a child consumes from with
``--split-nsqd``, numbered by ``seq``), ``report`` (asks for a report now) and ``stop``
(drain and exit). A child sends ``started``, ``report`` (its Prometheus text and health:
every second, and with the request's ``id`` when asked), ``assigned`` (the ``seq`` it
applied: the nsqd it lost are let go), ``activity`` (``--split-nsqd``: its busy nsqd and
whether it is idle, when that changes), ``fatal`` (why it is about to exit) and ``stopped``
(its drain report, with a last report).
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

#: A report carries a child's whole Prometheus exposition: far more than asyncio's 64 KiB default.
LINE_LIMIT = 64 * 1024 * 1024


class Channel:
    """One end of the pipe: ``send(obj)`` and ``await receive()`` (None at end of file)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_connection(sock=sock, limit=LINE_LIMIT)
        return cls(reader, writer)

    def send(self, message: dict[str, Any]) -> None:
        if self._writer.is_closing():
            return  # the other end is gone: nothing to tell it
        self._writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def flush(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            pass

    async def receive(self) -> dict[str, Any] | None:
        try:
            line = await self._reader.readline()
        except (ConnectionError, OSError, ValueError):
            return None
        if not line:
            return None
        message = json.loads(line)
        return message if isinstance(message, dict) else None

    def close(self) -> None:
        self._writer.close()
