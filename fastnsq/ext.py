"""The JSON ext header of youzan's HA messages: its reserved keys, and go-nsq's MsgExt in Python.

One job: build and read the header youzan/go-nsq builds with ``MsgExt{TraceID, DispatchTag,
Custom}.ToJson()`` and reads with ``Message.GetJsonExt()`` (``producer.go``, ``message.go``):
a JSON object of strings, where ``##trace_id`` carries the trace id (a decimal string) and
``##client_dispatch_tag`` the tag that routes the message to consumers with that
``desired_tag`` (youzan/go-nsq's ``MsgExt``).

>>> header = msg_ext({"k": "v"}, dispatch_tag="red")
>>> header
{'k': 'v', '##client_dispatch_tag': 'red'}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidValueError

__all__ = ["DISPATCH_TAG_KEY", "TRACE_ID_KEY", "dispatch_tag", "msg_ext"]

TRACE_ID_KEY = "##trace_id"
DISPATCH_TAG_KEY = "##client_dispatch_tag"


def msg_ext(custom: Mapping[str, Any] | None = None, *, dispatch_tag: str | None = None,
            trace_id: int | None = None) -> dict[str, Any]:
    """An ext header for ``publish(..., ext=...)``: ``custom`` plus the reserved keys given.

    (``publish(..., trace_id=...)`` with ``ext`` adds the trace id itself and answers traced.)
    """
    header = dict(custom or {})
    if dispatch_tag is not None:
        if not isinstance(dispatch_tag, str) or not dispatch_tag or len(dispatch_tag.encode()) > 100:
            raise InvalidValueError(f"dispatch_tag must be a string of 1..100 bytes, got {dispatch_tag!r}")
        header[DISPATCH_TAG_KEY] = dispatch_tag
    if trace_id is not None:
        if isinstance(trace_id, bool) or not isinstance(trace_id, int) or not 0 <= trace_id < 2**64:
            raise InvalidValueError(f"trace_id must be an int in 0..2**64-1, got {trace_id!r}")
        header[TRACE_ID_KEY] = str(trace_id)
    return header


def dispatch_tag(message: Any) -> str | None:
    """The tag ``message`` was published with (go-nsq's ``GetJsonExt().DispatchTag``), or None."""
    ext = message.ext
    tag = ext.get(DISPATCH_TAG_KEY) if isinstance(ext, dict) else None
    return tag if isinstance(tag, str) else None
