"""When a connection to nsqd is dead although nothing refused it: a hung nsqd, a black hole.

Two watches, one job: a connection that cannot carry traffic ends, so the clients reconnect
(issue 57: a SIGSTOPped nsqd or a black-holed port was noticed after 60-90 s, and a
connection that outlived a black hole sat out TCP's retransmission backoff after it healed).

* :class:`SilenceWatch`: nothing read for ``dead_after`` seconds (``read_timeout``, or two
  heartbeat intervals: nsqd sends a heartbeat every interval whatever else it sends) and the
  connection is aborted at that bound, not at the next look of a periodic check.
* :func:`tune_socket`: TCP keepalive and, where the platform has it, ``TCP_USER_TIMEOUT``, so
  that data the kernel cannot get acknowledged for ``dead_after`` ends the socket instead of
  being retransmitted with a doubling wait for ~15 minutes (and a connection whose own
  heartbeats are off, the blocking producer's, is still probed); and ``TCP_RTO_MAX_MS`` (Linux
  6.15+), so that a connection that lived through a lossy spell retransmits what it holds within
  a second of the loss ending, not after a backed-off wait of up to two minutes.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any, Protocol

from .config import ConnectionOptions
from .errors import ConnectionClosedError

__all__ = ["KEEPALIVE_DEFAULT", "SilenceWatch", "Watched", "tune_socket"]

#: Keepalive's idle time for a connection with no silence bound (heartbeats off): seconds.
KEEPALIVE_DEFAULT = 10.0
#: The longest wait between two retransmissions of a client socket: milliseconds (the kernel's
#: floor for the option; its default is 120,000). Under 30 % loss a PUB or a FIN lost a few times
#: in a row otherwise waited out a doubled timeout of seconds after the loss had ended.
RTO_MAX_MS = 1000
#: ``TCP_RTO_MAX_MS`` from Linux's uapi tcp.h (Python's socket module does not name it); other
#: platforms may use the number for something else.
TCP_RTO_MAX_MS = getattr(socket, "TCP_RTO_MAX_MS", 44) if sys.platform.startswith("linux") else None


class Watched(Protocol):
    """What the watch needs of a connection (``fastnsq.conn.Connection`` has it)."""

    address: str
    options: ConnectionOptions
    last_read: float  # the loop's time of the last bytes read

    def abort(self, error: BaseException | None = None) -> None: ...


class SilenceWatch:
    """Aborts ``conn`` once it has read nothing for ``dead_after`` seconds; one timer, moved on
    to the new bound only when it comes due (reads just stamp ``last_read``)."""

    __slots__ = ("_conn", "_dead_after", "_loop", "_timer")

    def __init__(self, conn: Watched, dead_after: float) -> None:
        self._conn = conn
        self._dead_after = dead_after
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(dead_after, self._check)

    @classmethod
    def start(cls, conn: Watched) -> SilenceWatch | None:
        """The watch of ``conn`` (None when its options set no bound: heartbeats off, no read_timeout)."""
        dead_after = conn.options.dead_after
        return None if dead_after is None else cls(conn, dead_after)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        """Due ``dead_after`` after the last read as last known: dead at that bound, not a check later."""
        conn = self._conn
        silent = self._loop.time() - conn.last_read
        if silent >= self._dead_after:
            self._timer = None
            why = "read_timeout" if conn.options.read_timeout is not None else "two heartbeat intervals"
            conn.abort(ConnectionClosedError(f"{conn.address} sent nothing for {silent:.1f} s ({why}): connection dead"))
            return
        # At least a millisecond: the loop's clock is in milliseconds under uvloop.
        self._timer = self._loop.call_later(max(self._dead_after - silent, 0.001), self._check)


def tune_socket(sock: Any, dead_after: float | None) -> None:
    """Keepalive, ``TCP_USER_TIMEOUT`` and ``TCP_RTO_MAX_MS`` on a client socket (each where the
    platform has it).

    ``TCP_USER_TIMEOUT`` = ``dead_after``: written data unacknowledged that long ends the
    connection (the kernel's own bound is ~15 minutes of retransmissions). Keepalive probes an
    idle connection after half of it (``KEEPALIVE_DEFAULT`` without a bound), every second
    after, three times. ``TCP_RTO_MAX_MS`` = ``RTO_MAX_MS``: retransmissions at least once a
    second. Failures are ignored: an option the platform (or an older kernel) lacks is not an error.
    """
    if sock is None:
        return
    bound = KEEPALIVE_DEFAULT if dead_after is None else dead_after
    settings = [(socket.SOL_SOCKET, getattr(socket, "SO_KEEPALIVE", None), 1),
                (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), max(1, int(bound / 2))),
                (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 1),
                (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
                (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), max(1, int(bound * 1000))),
                (socket.IPPROTO_TCP, TCP_RTO_MAX_MS, RTO_MAX_MS)]
    for level, option, value in settings:
        if option is None:
            continue
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass
