"""How the embedded nsqd reads what clients send, and quotes it back, as nsqd 1.3 does.

Go-isms the protocol exposes: the IDENTIFY body decoded the way ``json.Unmarshal``
fills nsqd's struct, integers parsed by nsqd's ``ByteToBase10``, and names quoted
in error texts by Go's ``%q``. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["as_int64", "base10", "go_quote", "parse_identify", "text"]


def text(raw: bytes) -> str:
    """Parameter bytes as text for error messages (byte for byte, like Go's %s)."""
    return raw.decode("latin-1")


def go_quote(raw: bytes) -> str:
    """Go's ``%q`` of a string, as latin-1 text of the output bytes.

    Printable characters stay (UTF-8 bytes as they are), quotes and backslashes are
    escaped, control characters and invalid UTF-8 bytes become escapes.

    >>> go_quote(b'bad*topic')
    '"bad*topic"'
    """
    out = ['"']
    text = raw.decode("utf-8", "surrogateescape")
    for ch in text:
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0xDC80 <= code <= 0xDCFF:  # an invalid UTF-8 byte
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch.encode("utf-8").decode("latin-1"))
        elif ch in "\a\b\f\n\r\t\v":
            out.append(
                {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}[
                    ch
                ]
            )
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: ASCII digits only, empty is 0, wraps like a uint64."""
    if raw and not raw.isdigit():
        return None
    if raw and not raw.isascii():
        return None
    return int(raw) % (1 << 64) if raw else 0


def as_int64(value: int) -> int:
    """A uint64 read as Go's int64 (what ``int64(b10)`` does)."""
    return value - (1 << 64) if value >= 1 << 63 else value


# IDENTIFY fields nsqd 1.3 reads, with their Go types (others are ignored).
_IDENTIFY_FIELDS: dict[str, str] = {
    "client_id": "string",
    "hostname": "string",
    "heartbeat_interval": "int",
    "output_buffer_size": "int",
    "output_buffer_timeout": "int",
    "feature_negotiation": "bool",
    "tls_v1": "bool",
    "deflate": "bool",
    "deflate_level": "int",
    "snappy": "bool",
    "sample_rate": "int32",
    "user_agent": "string",
    "msg_timeout": "int",
    "topology_region": "string",
    "topology_zone": "string",
}
_ZERO = {"string": "", "int": 0, "int32": 0, "bool": False}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def parse_identify(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's json.Unmarshal fills nsqd's struct.

    Keys match case-insensitively, unknown keys are ignored, ``null`` leaves the
    zero value, and a value of the wrong type is an error (ValueError).
    """
    data = json.loads(body, parse_constant=_reject_constant)
    out = {key: _ZERO[kind] for key, kind in _IDENTIFY_FIELDS.items()}
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ValueError("IDENTIFY body is not a JSON object")  # noqa: TRY004 - a decoding error
    for key, value in data.items():
        name = key.lower()
        kind = _IDENTIFY_FIELDS.get(name)
        if kind is None or value is None:
            continue
        if kind == "string":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            bits = 31 if kind == "int32" else 63
            ok = type(value) is int and -(1 << bits) <= value < (1 << bits)
        if not ok:
            raise ValueError(f"IDENTIFY field {name} has the wrong type")
        out[name] = value
    return out
