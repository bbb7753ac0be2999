"""A command written and its answer read on a blocking socket: the twin of ``_blocking.pyx``.

Same API and behaviour (see that module's docstring), through the ``socket`` module (which
gives the GIL up and takes it back around each of the two syscalls); used with
``FASTNSQ_NO_EXTENSIONS=1`` or when the extension is missing.
"""

from __future__ import annotations

import socket

IMPLEMENTATION = "python"


def round_trip(sock: socket.socket, command: bytes, answer: bytearray) -> int:
    """Write all of ``command``, then read once into ``answer``: the count of bytes read."""
    if not answer:
        raise ValueError("answer has no room: a bytearray of at least one byte is needed")
    sock.sendall(command)
    return sock.recv_into(answer)
