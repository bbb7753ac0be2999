"""Picks the compiled hot path: the C extensions by default, their pure-Python twins on request.

Two extensions, each with a twin of the same API: the wire codec (``_frame`` /
``_frame_py``) and the producer's coalescing of publishes (``_coalesce`` /
``_coalesce_py``). ``FASTNSQ_NO_EXTENSIONS=1`` selects the twins; otherwise the C
extensions are used, and the twins only when an extension is missing (a build
without a compiler), with a warning. ``IMPLEMENTATION`` says which is active ("c"
or "python"); tests check that it is "c" by default.
"""

from __future__ import annotations

import os
import warnings

if os.environ.get("FASTNSQ_NO_EXTENSIONS", "") not in ("", "0"):
    from ._coalesce_py import Coalescer
    from ._frame_py import *  # noqa: F403
    from ._frame_py import IMPLEMENTATION
else:
    try:
        from ._coalesce import Coalescer
        from ._frame import *  # noqa: F403
        from ._frame import IMPLEMENTATION
    except ImportError as exc:  # pragma: no cover - depends on the build
        warnings.warn(
            f"fastnsq's C extensions are not built ({exc}); using the pure-Python ones, "
            "which are several times slower",
            RuntimeWarning,
            stacklevel=2,
        )
        from ._coalesce_py import Coalescer
        from ._frame_py import *  # noqa: F403
        from ._frame_py import IMPLEMENTATION

__all__ = [
    "IMPLEMENTATION",
    "Coalescer",
    "FRAME_RESPONSE",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "LAYOUT_UPSTREAM",
    "LAYOUT_HA_ID",
    "LAYOUT_EXT",
    "LAYOUT_OFFSET",
    "MAGIC_V2",
    "OK",
    "HEARTBEAT",
    "CLOSE_WAIT",
    "DEFAULT_MAX_MSG_SIZE",
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_MAX_REQ_TIMEOUT",
    "DEFAULT_MAX_FRAME_SIZE",
    "MESSAGE_HEADER_SIZE",
    "BODY_COMMANDS",
    "TracedResponse",
    "Message",
    "FrameReader",
    "WriteBuffer",
    "CommandReader",
    "valid_topic_name",
    "valid_channel_name",
    "encode_response",
    "encode_error",
    "encode_message",
    "encode_traced_response",
    "decode_mpub",
    "decode_traced_response",
]
