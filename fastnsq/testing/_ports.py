"""The embedded servers' listening sockets, and the ports of a stopped server kept for its restart.

A server that restarts on its old ports (so that clients reconnect where they left it) races
every other socket on the machine for them while it is down: the kernel may hand a freed
port to another server's ``bind(0)`` in the meantime (seen in the test suite: an embedded
nsqd's HTTP port taken by a parallel worker's server during a 1 s restart, and the restart
failing with EADDRINUSE). :class:`PortKeeper` closes that window: a socket that is bound but
does not listen keeps the port out of the kernel's choices and still refuses connections, as
a server that is down does; a new listener binds beside it (both have SO_REUSEADDR), so the
hold is let go only once the server listens again.
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["PortKeeper", "listen_socket"]


def listen_socket(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port), SO_REUSEADDR set.

    SO_REUSEADDR lets a stopped server start again on the same port at once.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return socket.create_server(sockaddr[:2], family=family, backlog=backlog)


class PortKeeper:
    """The ports of a stopped server, bound but not listening until it listens on them again."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], socket.socket] = {}

    def hold(self, host: str, port: int) -> None:
        """Keep ``host:port`` (just closed by its listener) bound; best effort: a port
        something else took already is not held."""
        if port == 0 or (host, port) in self._held:
            return
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr[:2])
        except OSError:
            sock.close()
            return
        self._held[(host, port)] = sock

    def release(self, host: str, port: int) -> None:
        """Let the port go: call it once the new listener is bound beside the hold."""
        sock = self._held.pop((host, port), None)
        if sock is not None:
            sock.close()

    def release_all(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()

    def __del__(self) -> None:
        # A server dropped while stopped: its holds go quietly (no ResourceWarning).
        with contextlib.suppress(Exception):
            self.release_all()
