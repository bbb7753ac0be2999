"""fastnsq: the fastest NSQ client, for upstream nsqd and the partitioned HA dialect."""

from ._version import __version__
from .errors import (
    ConnectionClosedError,
    InvalidValueError,
    NSQError,
    ProtocolError,
    ServerError,
)

__all__ = [
    "__version__",
    "NSQError",
    "ProtocolError",
    "InvalidValueError",
    "ConnectionClosedError",
    "ServerError",
]
