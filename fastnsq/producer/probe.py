"""Is an nsqd's link clean again? A handshake on a connection of its own, timed (issue 57).

A producer's connection to a lossy or hung nsqd is taken out of the rotation
(:mod:`fastnsq.producer.suspects`); what it may take again must be decided without sending it
publishes: each publish a lossy nsqd holds past ``suspect_after`` is re-sent elsewhere, and is
there twice when the nsqd answers it late. No command on a producer's own connection is
answered without a side effect (NOP has no answer; a second IDENTIFY, AUTH, TOUCH, RDY or an
empty PUB are fatal errors there), but a *new* connection's magic and IDENTIFY are: nsqd
answers and forgets the client when it closes. So a probe dials the nsqd, sends magic and an
IDENTIFY asking for no upgrade (nsqd answers IDENTIFY even when it requires TLS or AUTH), and
passes when the answer's frame header arrives within its bound. On a lossy link any lost
segment costs a retransmission of at least 200 ms (Linux's minimum) and a lost SYN 1 s, so a
bound under that fails a probe that lost anything; a few passes in a row are a clean link.
"""

from __future__ import annotations

import asyncio
import json
import socket

from ..codec import WriteBuffer
from ..config import parse_address
from ..dial import dial

__all__ = ["handshake_answered_within"]

#: The IDENTIFY of a probe: no upgrade, no heartbeats to answer, a name nsqd's log shows.
_IDENTIFY = json.dumps({"client_id": "fastnsq-probe", "hostname": socket.gethostname(),
                        "user_agent": "fastnsq-probe", "feature_negotiation": False,
                        "heartbeat_interval": -1}).encode()
def _handshake_bytes() -> bytes:
    commands = WriteBuffer()
    commands.magic()
    commands.identify(_IDENTIFY)
    return commands.take()


_HANDSHAKE = _handshake_bytes()
#: The size that begins a frame (4 bytes, then that many: the frame's type and data).
_SIZE = 4


async def handshake_answered_within(address: str, bound: float) -> bool:
    """True when ``address`` accepted a connection and answered its IDENTIFY within ``bound`` s."""
    host, port = parse_address(address)
    try:
        return await asyncio.wait_for(_handshake(host, port, bound), bound)
    except (OSError, asyncio.TimeoutError):
        return False


async def _handshake(host: str, port: int, bound: float) -> bool:
    loop = asyncio.get_running_loop()
    sock = await dial(host, port, bound)
    try:
        await loop.sock_sendall(sock, _HANDSHAKE)
        # The whole answer frame, then a plain close: nsqd has written all it had, and logs the
        # client leaving as it does any other (a reset made it log two ERROR lines a probe).
        answer = b""
        while len(answer) < _SIZE or len(answer) < _SIZE + int.from_bytes(answer[:_SIZE], "big"):
            chunk = await loop.sock_recv(sock, 4096)
            if not chunk:
                return False  # nsqd closed it: not an answer
            answer += chunk
        return True
    finally:
        sock.close()
