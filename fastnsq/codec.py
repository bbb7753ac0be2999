"""Picks the compiled hot path: the C extensions by default, their pure-Python twins on request.

Four extensions, each with a twin of the same API: the wire codec (``_frame`` /
``_frame_py``), the producer's coalescing of publishes (``_coalesce`` /
``_coalesce_py``), the consumer's per-message path (``_delivery`` /
``_delivery_py``: the connection link, the RDY record it updates, the inbox) and the
blocking producer's round trip on a connection of a thread's own (``_blocking`` /
``_blocking_py``). ``FASTNSQ_NO_EXTENSIONS=1`` selects the twins; otherwise the C
extensions are used, and the twins only when the extensions are missing (an install that
could not compile them: :mod:`._fallback` says why, once, as a ``RuntimeWarning``), or an
``ImportError`` instead with ``FASTNSQ_REQUIRE_EXTENSIONS=1``. ``IMPLEMENTATION`` says which
is active ("c" or "python"), ``WHY_PYTHON`` why the twins are (None on the C extensions);
tests check that it is "c" by default.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from . import _fallback


def _missing_cause(exc: ImportError) -> str:
    """Why the extensions are missing: the cause the build left in the package, else the import's error."""
    note = Path(__file__).with_name(_fallback.NOTE_FILE)
    if note.exists():
        return "this install could not build them: " + note.read_text().strip()
    return f"not built: {exc}"


WHY_PYTHON: str | None = None
if (_contradiction := _fallback.contradiction()) is not None:
    raise ImportError(_contradiction)
if TYPE_CHECKING:  # both implementations follow the .pyi contracts
    from ._blocking import round_trip
    from ._coalesce import Coalescer
    from ._delivery import ConnRdy, Inbox, Link, MessageIterator, finish_all
    from ._frame import *
    from ._frame import IMPLEMENTATION
elif _fallback.flag(_fallback.NO_EXTENSIONS):
    WHY_PYTHON = f"chosen by {_fallback.NO_EXTENSIONS}=1"
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
        WHY_PYTHON = _missing_cause(exc)
        if _fallback.flag(_fallback.REQUIRE_EXTENSIONS):
            raise ImportError(f"fastnsq: the C extensions are not available ({WHY_PYTHON}), and "
                              f"{_fallback.REQUIRE_EXTENSIONS}=1 requires them") from exc
        warnings.warn(_fallback.explain(WHY_PYTHON), RuntimeWarning, stacklevel=2)
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
    "WHY_PYTHON",
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
