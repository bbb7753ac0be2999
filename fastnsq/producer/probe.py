"""Is an nsqd's link clean again? A handshake on a connection of its own, timed (issue 57).

A producer's connection to a lossy or hung nsqd is taken out of the rotation
(:mod:`fastnsq.producer.suspects`); what it may take again must be decided without sending it
publishes: each publish a lossy nsqd holds past ``suspect_after`` is re-sent elsewhere, and is
there twice when the nsqd answers it late. No command on a producer's own connection is
answered without a side effect (NOP has no answer; a second IDENTIFY, AUTH, TOUCH, RDY or an
empty PUB are fatal errors there), but a *new* connection's magic and IDENTIFY are: nsqd
answers and forgets the client when it closes. So a probe dials the nsqd, sends magic and an
IDENTIFY asking for no upgrade (nsqd answers IDENTIFY even when it requires TLS or AUTH), and
passes when the answer came within its bound and the kernel retransmitted nothing. On a lossy
link any lost segment costs a retransmission of at least 200 ms (Linux's minimum) and a lost
SYN 1 s, so a bound under that fails a probe that lost anything; a few passes in a row are a
clean link.

The answer's time is the kernel's (the arrival stamp of its segment, ``SO_TIMESTAMPNS``), not
the event loop's: a loop kept busy by the application would otherwise read a clean answer late
and keep a healthy nsqd out of the rotation for ever. Elsewhere than Linux the loop's clock is
the fallback.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import time

from ..codec import WriteBuffer
from ..config import parse_address
from ..dial import resolve

__all__ = ["handshake_answered_within"]

#: The IDENTIFY of a probe: no upgrade, no heartbeats to answer, a name nsqd's log shows.
_IDENTIFY = json.dumps({"client_id": "fastnsq-probe", "hostname": socket.gethostname(),
                        "user_agent": "fastnsq-probe", "feature_negotiation": False,
                        "heartbeat_interval": -1}).encode()
#: Linux's SO_TIMESTAMPNS (and SCM_TIMESTAMPNS): each read's arrival time, a struct timespec.
_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None
_TIMESPEC = struct.Struct("qq")
#: Where struct tcp_info keeps tcpi_total_retrans (after 8 one-byte fields and 23 u32 fields).
_TOTAL_RETRANS = struct.Struct("I")
_TOTAL_RETRANS_OFFSET = 100
#: The size that begins a frame (4 bytes, then that many: the frame's type and data).
_SIZE = 4


def _handshake_bytes() -> bytes:
    commands = WriteBuffer()
    commands.magic()
    commands.identify(_IDENTIFY)
    return commands.take()


_HANDSHAKE = _handshake_bytes()


async def handshake_answered_within(address: str, bound: float, timeout: float) -> bool:
    """True when ``address`` accepted a connection and answered its IDENTIFY within ``bound`` s
    of its sending, the kernel retransmitting nothing (False after ``timeout`` s at most)."""
    host, port = parse_address(address)
    try:
        infos = await resolve(host, port, timeout)
        family, kind, proto, _name, target = infos[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, asyncio.TimeoutError, IndexError):
        return False
    try:
        return await asyncio.wait_for(_exchange(sock, target, bound), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        sock.close()


async def _exchange(sock: socket.socket, target: tuple[str, int], bound: float) -> bool:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    if _TIMESTAMPNS is not None:
        sock.setsockopt(socket.SOL_SOCKET, _TIMESTAMPNS, 1)
    await loop.sock_connect(sock, target)
    sent = time.time()  # the timestamps' clock
    await loop.sock_sendall(sock, _HANDSHAKE)
    answer = b""
    arrived = sent
    # The whole answer frame, then a plain close: nsqd has written all it had, and logs the
    # client leaving as it does any other (a reset made it log two ERROR lines a probe).
    while len(answer) < _SIZE or len(answer) < _SIZE + int.from_bytes(answer[:_SIZE], "big"):
        await _readable(loop, sock)
        try:
            chunk, ancillary, _flags, _from = sock.recvmsg(4096, socket.CMSG_SPACE(_TIMESPEC.size))
        except BlockingIOError:
            continue
        if not chunk:
            return False  # nsqd closed it: not an answer
        answer += chunk
        arrived = _arrival(ancillary)
    return arrived - sent <= bound and _retransmitted(sock) == 0


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> float:
    """When the kernel received what a read returned (now, without its stamp)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            return seconds + nanoseconds / 1e9
    return time.time()


def _retransmitted(sock: socket.socket) -> int:
    """Segments the kernel sent again on ``sock`` (a lost SYN, a lost IDENTIFY); 0 where unknown."""
    info_option = getattr(socket, "TCP_INFO", None)
    if info_option is None:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, info_option, 256)
    except OSError:
        return 0
    if len(info) < _TOTAL_RETRANS_OFFSET + _TOTAL_RETRANS.size:
        return 0
    return int(_TOTAL_RETRANS.unpack_from(info, _TOTAL_RETRANS_OFFSET)[0])
