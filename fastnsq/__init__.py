"""fastnsq: the fastest NSQ client, for upstream nsqd and the partitioned HA dialect.

>>> import fastnsq
>>> async def main():                                     # doctest: +SKIP
...     async with fastnsq.Producer(["127.0.0.1:4150"]) as producer:
...         await producer.publish("events", b"hello")
>>> fastnsq.run(main())                                   # doctest: +SKIP
"""

from ._version import __version__
from .codec import IMPLEMENTATION as CODEC_IMPLEMENTATION
from .codec import Message, TracedResponse
from .config import ConnectionOptions
from .conn import Connection
from .consumer import Batch, ConsumeOffset, Consumer, StopReport
from .errors import (
    ConnectionClosedError,
    InvalidValueError,
    NoConnectionError,
    NSQError,
    ProtocolError,
    PublishTimeoutError,
    ServerError,
)
from .loop import run
from .producer import Producer

__all__ = [
    "CODEC_IMPLEMENTATION",
    "Batch",
    "Connection",
    "ConnectionClosedError",
    "ConnectionOptions",
    "ConsumeOffset",
    "Consumer",
    "InvalidValueError",
    "Message",
    "NSQError",
    "NoConnectionError",
    "Producer",
    "ProtocolError",
    "PublishTimeoutError",
    "ServerError",
    "StopReport",
    "TracedResponse",
    "__version__",
    "run",
]
