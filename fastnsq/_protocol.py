"""NSQ protocol constants and small types shared by both codec implementations.

Values come from nsqd 1.3 and the HA nsqd (nsq's TCP protocol spec, youzan/nsq's source); the C extension
mirrors the numeric ones in C enums and checks them against this module at import.
"""

from __future__ import annotations

from typing import NamedTuple

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

# Message layouts (combined with |), fixed per connection by what it sent.
LAYOUT_UPSTREAM = 0
LAYOUT_HA_ID = 1  # binary id: u64 internal id + u64 trace id
LAYOUT_EXT = 2  # HA ext header: u8 version [+ u16 length + JSON]
LAYOUT_OFFSET = 4  # HA SUB_ORDERED / SUB_ADVANCED: u64 offset + u32 raw size
LAYOUT_ALL = LAYOUT_HA_ID | LAYOUT_EXT | LAYOUT_OFFSET

MAGIC_V2 = b"  V2"
OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

DEFAULT_MAX_MSG_SIZE = 1048576
DEFAULT_MAX_BODY_SIZE = 5242880
DEFAULT_MAX_RDY_COUNT = 2500
DEFAULT_MAX_REQ_TIMEOUT = 3600000
MESSAGE_HEADER_SIZE = 26
MAX_EXT_SIZE = 0xFFFF
# frame type + base header + the largest HA ext header + offset/size + the body.
DEFAULT_MAX_FRAME_SIZE = 4 + MESSAGE_HEADER_SIZE + 3 + MAX_EXT_SIZE + 12 + DEFAULT_MAX_MSG_SIZE
MAX_NAME_LENGTH = 64
HTTP_AS_SIZE = 0x48545450  # b"HTTP" read as a big-endian i32: the client dialed the HTTP port
TRACED_RESPONSE_SIZE = 30
UPSTREAM_MAX_LINE = 16384
HA_MAX_LINE = 4096

#: Commands followed by a u32 length and a body.
BODY_COMMANDS = frozenset(
    {b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE", b"MPUB_TRACE", b"PUB_EXT", b"MPUB_EXT"}
)
#: Body commands whose length is bounded by max_body_size (the others: max_msg_size).
BODY_SIZE_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"MPUB", b"MPUB_TRACE", b"MPUB_EXT"})


class TracedResponse(NamedTuple):
    """The HA 30-byte answer of PUB_TRACE / MPUB_TRACE / PUB_EXT with a trace id."""

    internal_id: int
    trace_id: int
    offset: int
    size: int
