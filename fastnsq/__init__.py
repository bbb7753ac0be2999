"""fastnsq: an NSQ client on a Cython hot path and uvloop, for upstream nsqd and the partitioned HA dialect.

>>> import fastnsq
>>> async def main():                                     # doctest: +SKIP
...     async with fastnsq.Producer(["127.0.0.1:4150"]) as producer:
...         await producer.publish("events", b"hello")
>>> fastnsq.run(main())                                   # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _fallback
from ._lazy import attribute_loader
from ._version import __version__

if _fallback.flag(_fallback.REQUIRE_EXTENSIONS) or _fallback.flag(_fallback.NO_EXTENSIONS):
    # The codec switches are judged at ``import fastnsq``, as documented: a missing C codec
    # under FASTNSQ_REQUIRE_EXTENSIONS=1 (or both switches at once) fails here, not at first use.
    from . import codec as _codec  # noqa: F401

if TYPE_CHECKING:  # the names below, for type checkers and editors; imported when first used
    from .codec import IMPLEMENTATION as CODEC_IMPLEMENTATION
    from .codec import Message, TracedResponse
    from .config import ConnectionOptions
    from .conn import Connection
    from .consumer import Batch, ConsumeOffset, Consumer, StopReport
    from .errors import (
        ConnectionClosedError,
        InvalidValueError,
        NoConnectionError,
        NsqdDown,
        NSQError,
        ProtocolError,
        PublishTimeoutError,
        ServerError,
    )
    from .loop import run
    from .producer import Producer

#: Where each public name lives. They are imported on first use, so that ``fastnsq worker`` and
#: the apps' supervisors, and any ``fastnsq.x`` import, do not pay for the whole client (the
#: consumer, the producer, their codecs: most of a command's start-up) before they need it.
_HOMES = {
    "CODEC_IMPLEMENTATION": ("codec", "IMPLEMENTATION"), "Message": ("codec", "Message"),
    "TracedResponse": ("codec", "TracedResponse"), "ConnectionOptions": ("config", "ConnectionOptions"),
    "Connection": ("conn", "Connection"), "Batch": ("consumer", "Batch"), "ConsumeOffset": ("consumer", "ConsumeOffset"),
    "Consumer": ("consumer", "Consumer"), "StopReport": ("consumer", "StopReport"),
    "ConnectionClosedError": ("errors", "ConnectionClosedError"), "InvalidValueError": ("errors", "InvalidValueError"),
    "NoConnectionError": ("errors", "NoConnectionError"), "NsqdDown": ("errors", "NsqdDown"), "NSQError": ("errors", "NSQError"),
    "ProtocolError": ("errors", "ProtocolError"), "PublishTimeoutError": ("errors", "PublishTimeoutError"),
    "ServerError": ("errors", "ServerError"), "run": ("loop", "run"), "Producer": ("producer", "Producer"),
}


if not TYPE_CHECKING:  # checkers see the imports above: a misspelt name stays an error, not Any
    __getattr__ = attribute_loader(__name__, _HOMES)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "NsqdDown",
    "Producer",
    "ProtocolError",
    "PublishTimeoutError",
    "ServerError",
    "StopReport",
    "TracedResponse",
    "__version__",
    "run",
]
