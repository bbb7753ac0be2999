"""What a publish carries, checked before a byte is sent: bodies, ext headers, MPUB chunks."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from .. import codec
from ..config import check_range
from ..errors import InvalidValueError

__all__ = ["MPUB_FRAMING", "body_size", "check_message_size", "ext_json", "fits_one_mpub", "mpub_chunks", "second"]

MPUB_FRAMING = 4 + 4  # u32 body length + u32 message count


def body_size(body: Any) -> int:
    """The bytes ``body`` takes on the wire; InvalidValueError for a type nsqd cannot carry."""
    if type(body) is bytes:
        return len(body)
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, str):
        return len(body.encode("utf-8")) if not body.isascii() else len(body)
    if isinstance(body, memoryview):
        return body.nbytes
    raise InvalidValueError(f"message body must be bytes, bytearray, memoryview or str, not {type(body).__name__}")


def check_message_size(size: int, max_msg_size: int, header: int) -> None:
    """Raise, naming the limit, for an empty body or one over ``max_msg_size`` with its header."""
    if size == 0:
        raise InvalidValueError("empty message body: nsqd rejects empty messages")
    if header + size > max_msg_size:
        raise InvalidValueError(f"message of {header + size} bytes exceeds max_msg_size {max_msg_size}")


def ext_json(ext: Mapping[str, Any], trace_id: int | None) -> bytes:
    """PUB_EXT's JSON header; a trace id goes in as ``"##trace_id"``, a decimal string (§9.6)."""
    if not isinstance(ext, Mapping):
        raise InvalidValueError(f"ext must be a mapping (a JSON object), not {type(ext).__name__}")
    header = dict(ext)
    if trace_id is not None:
        check_range("trace_id", trace_id, 0, 2**64 - 1, integer=True)
        header["##trace_id"] = str(trace_id)
    try:
        data = json.dumps(header, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(f"ext is not JSON-serialisable: {exc}") from None
    if len(data) > 65535:
        raise InvalidValueError(f"ext header of {len(data)} bytes exceeds 65535")
    return data


def mpub_chunks(
    items: list[Any],
    max_body_size: int,
    max_msg_size: int,
    header: Callable[[Any], int] | None = None,
    body_of: Callable[[Any], Any] | None = None,
) -> list[list[Any]]:
    """Split a batch so each MPUB stays under ``max_body_size`` and nsqd's count limit.

    ``header(item)``: bytes each message carries before its body (trace id, ext);
    ``body_of(item)``: the body, when items are not bodies themselves.
    """
    if header is None and body_of is None and fits_one_mpub(items, max_body_size, max_msg_size):
        return [items]
    limit = max_body_size - MPUB_FRAMING
    max_count = (max_body_size - 4) // 5
    chunks: list[list[Any]] = [[]]
    used = 0
    for item in items:
        extra = 0 if header is None else header(item)
        size = body_size(item if body_of is None else body_of(item))
        check_message_size(size, max_msg_size, extra)
        if chunks[-1] and (used + 4 + extra + size > limit or len(chunks[-1]) >= max_count):
            chunks.append([])
            used = 0
        chunks[-1].append(item)
        used += 4 + extra + size
    return chunks


def fits_one_mpub(bodies: list[Any], max_body_size: int, max_msg_size: int) -> bool:
    """Whether ``bodies`` is the common batch: bytes, none empty or too big, all in one MPUB."""
    return codec.fits_one_mpub(bodies, max_body_size - MPUB_FRAMING, (max_body_size - 4) // 5, max_msg_size)


def second(pair: tuple[Any, Any]) -> Any:
    return pair[1]
