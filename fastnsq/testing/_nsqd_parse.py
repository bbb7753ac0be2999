"""How the embedded nsqd reads what clients send, and quotes it back, as nsqd 1.3 does.

Go-isms the protocol exposes: the IDENTIFY body decoded the way ``json.Unmarshal``
fills nsqd's struct, integers parsed by nsqd's ``ByteToBase10``, and names quoted
in error texts by Go's ``%q``. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "HA_IDENTIFY_FIELDS",
    "as_int64",
    "base10",
    "go_atoi",
    "go_bytes",
    "go_parse_bool",
    "go_parse_int",
    "go_parse_uint",
    "go_quote",
    "parse_identify",
    "text",
]


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
#: The HA (youzan) nsqd's IdentifyDataV2: no topology, plus its own fields.
HA_IDENTIFY_FIELDS: dict[str, str] = {
    **{k: v for k, v in _IDENTIFY_FIELDS.items() if not k.startswith("topology_")},
    "short_id": "string",
    "long_id": "string",
    "desired_tag": "string",
    "extend_support": "bool",
    "ext_filter": "object",
}
_ZERO: dict[str, Any] = {"string": "", "int": 0, "int32": 0, "bool": False, "object": None}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def parse_identify(body: bytes, fields: dict[str, str] = _IDENTIFY_FIELDS) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's json.Unmarshal fills nsqd's struct.

    Keys match case-insensitively, unknown keys are ignored, ``null`` leaves the
    zero value, and a value of the wrong type is an error (ValueError). ``fields``
    is the struct (upstream's by default, :data:`HA_IDENTIFY_FIELDS` for the HA nsqd).
    """
    data = json.loads(body, parse_constant=_reject_constant)
    out = {key: _ZERO[kind] for key, kind in fields.items()}
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ValueError("IDENTIFY body is not a JSON object")  # noqa: TRY004 - a decoding error
    for key, value in data.items():
        name = key.lower()
        kind = fields.get(name)
        if kind is None or value is None:
            continue
        if kind == "string":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "object":
            ok = isinstance(value, dict)
        else:
            bits = 31 if kind == "int32" else 63
            ok = type(value) is int and -(1 << bits) <= value < (1 << bits)
        if not ok:
            raise ValueError(f"IDENTIFY field {name} has the wrong type")
        out[name] = value
    return out


# ---- Go's strconv and fmt, as the HA nsqd's error texts show them ----------------------


def go_bytes(raw: bytes | bytearray) -> str:
    """Go's ``%v`` of a byte slice or array: ``[1 2 3]``."""
    return "[" + " ".join(str(b) for b in raw) + "]"


def _strconv_error(func: str, raw: bytes, why: str) -> ValueError:
    return ValueError(f"strconv.{func}: parsing {go_quote(raw)}: {why}")


def go_parse_int(raw: bytes, func: str = "ParseInt", bits: int = 64) -> int:
    """strconv.ParseInt(s, 10, 64) (``func`` names it in the error): an optional sign, then digits.

    >>> go_parse_int(b"-12")
    -12
    """
    digits = raw[1:] if raw[:1] in (b"+", b"-") else raw
    if not digits or not digits.isdigit() or not digits.isascii():
        raise _strconv_error(func, raw, "invalid syntax")
    value = int(raw)
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise _strconv_error(func, raw, "value out of range")
    return value


def go_atoi(raw: bytes) -> int:
    """strconv.Atoi (64-bit int): ValueError with Go's message on failure.

    >>> go_atoi(b"x")
    Traceback (most recent call last):
    ValueError: strconv.Atoi: parsing "x": invalid syntax
    """
    return go_parse_int(raw, "Atoi")


def go_parse_uint(raw: bytes) -> int:
    """strconv.ParseUint(s, 10, 64): digits only, at most 2**64 - 1."""
    if not raw or not raw.isdigit() or not raw.isascii():
        raise _strconv_error("ParseUint", raw, "invalid syntax")
    value = int(raw)
    if value >= 1 << 64:
        raise _strconv_error("ParseUint", raw, "value out of range")
    return value


_GO_BOOLS = {
    **dict.fromkeys((b"1", b"t", b"T", b"TRUE", b"true", b"True"), True),
    **dict.fromkeys((b"0", b"f", b"F", b"FALSE", b"false", b"False"), False),
}


def go_parse_bool(raw: bytes) -> bool:
    """strconv.ParseBool: 1/t/T/TRUE/true/True or 0/f/F/FALSE/false/False."""
    value = _GO_BOOLS.get(bytes(raw))
    if value is None:
        raise _strconv_error("ParseBool", raw, "invalid syntax")
    return value
