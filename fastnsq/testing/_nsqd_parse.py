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
    "fastjson_error",
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


# ---- youzan's JSON header parser (valyala/fastjson) ----------------------------------------

_JSON_WS = b" \n\t\r"
_NUMBER_BYTES = frozenset(b"0123456789.-eE+")
_MAX_DEPTH = 300


class _FastJSONError(Exception):
    """A fastjson error: its text and where the unparsed tail starts."""

    def __init__(self, message: str, tail: int) -> None:
        super().__init__(message, tail)
        self.message = message
        self.tail = tail


def fastjson_error(raw: bytes) -> str | None:
    """What valyala/fastjson's ``ParseBytes`` says of ``raw`` (``None``: it parses).

    youzan nsqd checks PUB_EXT/MPUB_EXT JSON headers with fastjson and puts its error
    text in ``E_INVALID_JSON_HEADER``. fastjson is more lenient than a strict JSON
    parser (``NaN``, ``inf``, numbers such as ``1.2.3``, strings are not unescaped
    while checking) and its texts say where it stopped.

    >>> fastjson_error(b'{not json')
    'cannot parse JSON: cannot parse object: cannot find opening \'"" for object key; unparsed tail: "not json"'
    >>> fastjson_error(b'{"k":"v"}') is None
    True
    """
    start = _skip_json_ws(raw, 0)
    try:
        end = _parse_json_value(raw, start, 0)
    except _FastJSONError as exc:
        return f"cannot parse JSON: {exc.message}; unparsed tail: {go_quote(_start_end(raw[exc.tail:]))}"
    end = _skip_json_ws(raw, end)
    if end < len(raw):
        return f"unexpected tail: {go_quote(_start_end(raw[end:]))}"
    return None


def _start_end(tail: bytes) -> bytes:
    return tail if len(tail) <= 80 else tail[:40] + b"..." + tail[-40:]


def _skip_json_ws(s: bytes, i: int) -> int:
    while i < len(s) and s[i] in _JSON_WS:
        i += 1
    return i


def _parse_json_value(s: bytes, i: int, depth: int) -> int:
    if i >= len(s):
        raise _FastJSONError("cannot parse empty string", i)
    depth += 1
    if depth > _MAX_DEPTH:
        raise _FastJSONError(f"too big depth for the nested JSON; it exceeds {_MAX_DEPTH}", i)
    first = s[i]
    if first == 0x7B:  # {
        return _nested(_parse_json_object, "cannot parse object", s, i + 1, depth)
    if first == 0x5B:  # [
        return _nested(_parse_json_array, "cannot parse array", s, i + 1, depth)
    if first == 0x22:  # "
        try:
            return _parse_json_string(s, i + 1)
        except _FastJSONError as exc:
            raise _FastJSONError(f"cannot parse string: {exc.message}", exc.tail) from None
    for word in (b"true", b"false", b"null"):
        if first == word[0]:
            if s.startswith(word, i):
                return i + len(word)
            if word == b"null" and s[i : i + 3].lower() == b"nan":
                return i + 3
            raise _FastJSONError(f"unexpected value found: {go_quote(s[i:])}", i)
    j = i
    while j < len(s) and s[j] in _NUMBER_BYTES:
        j += 1
    if j < len(s) and (j == i or (j == i + 1 and s[i] in b"-+")):
        if s[j : j + 3].lower() in (b"inf", b"nan"):
            return j + 3
        raise _FastJSONError(f"cannot parse number: unexpected char: {go_quote(s[i : i + 1])}", i)
    return j


def _nested(parse: Any, what: str, s: bytes, i: int, depth: int) -> int:
    try:
        return int(parse(s, i, depth))
    except _FastJSONError as exc:
        raise _FastJSONError(f"{what}: {exc.message}", exc.tail) from None


def _parse_json_array(s: bytes, i: int, depth: int) -> int:
    i = _skip_json_ws(s, i)
    if i >= len(s):
        raise _FastJSONError("missing ']'", i)
    if s[i] == 0x5D:
        return i + 1
    while True:
        i = _nested(_parse_json_value, "cannot parse array value", s, _skip_json_ws(s, i), depth)
        i = _skip_json_ws(s, i)
        if i >= len(s):
            raise _FastJSONError("unexpected end of array", i)
        if s[i] == 0x2C:
            i += 1
            continue
        if s[i] == 0x5D:
            return i + 1
        raise _FastJSONError("missing ',' after array value", i)


def _parse_json_object(s: bytes, i: int, depth: int) -> int:
    i = _skip_json_ws(s, i)
    if i >= len(s):
        raise _FastJSONError("missing '}'", i)
    if s[i] == 0x7D:
        return i + 1
    while True:
        i = _skip_json_ws(s, i)
        if i >= len(s) or s[i] != 0x22:
            raise _FastJSONError("cannot find opening '\"\" for object key", i)
        try:
            i = _parse_json_key(s, i + 1)
        except _FastJSONError as exc:
            raise _FastJSONError(f"cannot parse object key: {exc.message}", exc.tail) from None
        i = _skip_json_ws(s, i)
        if i >= len(s) or s[i] != 0x3A:
            raise _FastJSONError("missing ':' after object key", i)
        i = _nested(_parse_json_value, "cannot parse object value", s, _skip_json_ws(s, i + 1), depth)
        i = _skip_json_ws(s, i)
        if i >= len(s):
            raise _FastJSONError("unexpected end of object", i)
        if s[i] == 0x2C:
            i += 1
            continue
        if s[i] == 0x7D:
            return i + 1
        raise _FastJSONError("missing ',' after object value", i)


def _parse_json_key(s: bytes, i: int) -> int:
    for j in range(i, len(s)):
        if s[j] == 0x22:
            return j + 1
        if s[j] == 0x5C:
            return _parse_json_string(s, i)
    raise _FastJSONError("missing closing '\"'", len(s))


def _parse_json_string(s: bytes, i: int) -> int:
    """The end of a string whose opening quote is before ``i``: the first quote not escaped."""
    base = i
    n = s.find(b'"', base)
    while True:
        if n < 0:
            raise _FastJSONError("missing closing '\"'", len(s))
        if n == base or s[n - 1] != 0x5C:
            return n + 1
        k = n - 1
        while k > base and s[k - 1] == 0x5C:
            k -= 1
        if (n - k) % 2 == 0:  # an even run of backslashes: the quote is not escaped
            return n + 1
        base = n + 1
        n = s.find(b'"', base)
