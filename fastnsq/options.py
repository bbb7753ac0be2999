"""Consumer and producer options from strings: command-line flags, environment, config files.

One job: turn ``"name=value"`` (or go's ``"name,value"``) pairs into the typed keyword
options :class:`~fastnsq.Consumer` and :class:`~fastnsq.Producer` take, with go-nsq's
``Config.Set`` names (fastnsq's own names are go-nsq's where go-nsq has the option).
Durations take Go's forms (``"250ms"``, ``"1m30s"``) or seconds (``"0.25"``); booleans
``true``/``false`` (also ``1``/``0``, ``yes``/``no``); ``-1`` switches off what nsqd lets
a client switch off (``heartbeat_interval``, ``output_buffer_timeout``...). A bad name or
value raises :class:`~fastnsq.errors.InvalidValueError` naming the option, the value and
what it takes.

>>> parse_options(["max_in_flight=100", "msg_timeout=1m30s", "snappy,true"], for_="consumer")
{'max_in_flight': 100, 'msg_timeout': 90.0, 'snappy': True}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .errors import InvalidValueError
from .optionspec import check_options, options_of

__all__ = ["parse_duration", "parse_options"]

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_TRUE = {"true", "1", "yes", "on", "t"}
_FALSE = {"false", "0", "no", "off", "f"}


def parse_duration(text: str) -> float:
    """Seconds from Go's duration form (``"1m30s"``, ``"250ms"``) or a plain number of seconds.

    >>> parse_duration("1m30s"), parse_duration("250ms"), parse_duration("2.5")
    (90.0, 0.25, 2.5)
    """
    stripped = text.strip()
    try:
        return float(stripped)
    except ValueError:
        pass
    sign = -1.0 if stripped.startswith("-") else 1.0
    body = stripped.lstrip("+-")
    parts = _DURATION_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"{text!r} is not a duration (Go's form, like 250ms or 1m30s, or seconds)")
    return sign * sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def parse_options(
    pairs: Iterable[str] | Mapping[str, str], *, for_: Literal["consumer", "producer"]
) -> dict[str, Any]:
    """Typed keyword options for a Consumer (``for_="consumer"``) or Producer from strings.

    ``pairs``: ``"name=value"`` or ``"name,value"`` strings (go's ``--consumer-opt`` form), or a
    mapping of names to string values. A later pair overrides an earlier one.
    """
    items = pairs.items() if isinstance(pairs, Mapping) else (_split(pair) for pair in pairs)
    kinds = _kinds(for_)
    options: dict[str, Any] = {}
    for raw_name, text in items:
        name = raw_name.strip()
        if name not in kinds:
            check_options(for_.capitalize(), {name: None})  # raises, with the name to use where there is one
        if kinds[name] == "object":
            raise InvalidValueError(f"option {name!r} takes a Python object, not a string: pass it as a keyword")
        options[name] = _convert(name, text, kinds[name])
    return options


def _split(pair: str) -> tuple[str, str]:
    for separator in ("=", ","):
        name, found, value = pair.partition(separator)
        if found and name.strip():
            return name, value
    raise InvalidValueError(f"an option is 'name=value' (or go's 'name,value'), got {pair!r}")


def _kinds(for_: str) -> dict[str, str]:
    """Option name -> the kind its string is parsed as (the table: :mod:`fastnsq.optionspec`)."""
    if for_ not in ("consumer", "producer"):
        raise InvalidValueError(f"for_ must be 'consumer' or 'producer', got {for_!r}")
    return {name: option.kind for name, option in options_of(for_.capitalize()).items()}


def _convert(name: str, text: str, kind: str) -> Any:
    value = text.strip()
    try:
        if kind == "bool":
            lowered = value.lower()
            if lowered in _TRUE | _FALSE:
                return lowered in _TRUE
            raise ValueError("use true or false")
        if kind == "int":
            if not re.fullmatch(r"[+-]?\d+", value):
                raise ValueError("takes a whole number")
            return int(value)
        if kind == "seconds":
            return parse_duration(value)
        if kind == "number":
            return float(value)
    except ValueError as exc:
        raise InvalidValueError(f"option {name}={text!r}: {exc}") from None
    return value
