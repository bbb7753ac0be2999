"""A command written and its answer read on a blocking socket (C ``_blocking`` and its twin ``_blocking_py``)."""

import socket

IMPLEMENTATION: str

def round_trip(sock: socket.socket, command: bytes, answer: bytearray) -> int: ...
