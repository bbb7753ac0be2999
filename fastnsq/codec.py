"""Picks the compiled hot path: the C extensions by default, their pure-Python twins on request.

Four extensions, each with a twin of the same API: the wire codec (``_frame`` /
``_frame_py``), the producer's coalescing of publishes (``_coalesce`` /
``_coalesce_py``), the consumer's per-message path (``_delivery`` /
``_delivery_py``: the connection link, the RDY record it updates, the inbox) and the
blocking producer's round trip on a connection of a thread's own (``_blocking`` /
``_blocking_py``). ``FASTNSQ_NO_EXTENSIONS=1`` selects the twins; otherwise the C
extensions are used, and the twins only when an extension is missing (a build
without a compiler), with a warning. ``IMPLEMENTATION`` says which is active ("c"
or "python"); tests check that it is "c" by default.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # both implementations follow the .pyi contracts
    from ._blocking import round_trip
    from ._coalesce import Coalescer
    from ._delivery import ConnRdy, Inbox, Link, MessageIterator, finish_all
    from ._frame import *
    from ._frame import IMPLEMENTATION
elif os.environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0"):
    from ._blocking_py import round_trip
    from ._coalesce_py import Coalescer
    from ._delivery_py import ConnRdy, Inbox, Link, MessageIterator, finish_all
    from ._frame_py import *
    from ._frame_py import IMPLEMENTATION
else:
    try:
        from ._blocking import round_trip
        from ._coalesce import Coalescer
        from ._delivery import ConnRdy, Inbox, Link, MessageIterator, finish_all
        from ._frame import *
        from ._frame import IMPLEMENTATION
    except ImportError as exc:  # pragma: no cover - depends on the build
        warnings.warn(
            f"fastnsq's C extensions are not built ({exc}); using the pure-Python ones, "
            "which are several times slower",
            RuntimeWarning,
            stacklevel=2,
        )
        from ._blocking_py import round_trip
        from ._coalesce_py import Coalescer
        from ._delivery_py import ConnRdy, Inbox, Link, MessageIterator, finish_all
        from ._frame_py import *
        from ._frame_py import IMPLEMENTATION

__all__ = [
    "BODY_COMMANDS",
    "CLOSE_WAIT",
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MSG_SIZE",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_MAX_REQ_TIMEOUT",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "FRAME_RESPONSE",
    "HEARTBEAT",
    "IMPLEMENTATION",
    "LAYOUT_EXT",
    "LAYOUT_HA_ID",
    "LAYOUT_OFFSET",
    "LAYOUT_UPSTREAM",
    "MAGIC_V2",
    "MESSAGE_HEADER_SIZE",
    "OK",
    "Coalescer",
    "CommandReader",
    "ConnRdy",
    "FrameReader",
    "Inbox",
    "Link",
    "Message",
    "MessageIterator",
    "TracedResponse",
    "WriteBuffer",
    "decode_mpub",
    "decode_traced_response",
    "encode_error",
    "encode_message",
    "encode_response",
    "encode_traced_response",
    "finish_all",
    "fits_one_mpub",
    "message_columns",
    "round_trip",
    "valid_channel_name",
    "valid_topic_name",
]
