"""to-postgres's rows: a JSON body made into one line of PostgreSQL's COPY text format.

One job: the mapping from a message body to a table's columns, by name. A field with a
column of its own goes there; the other fields go to the ``rest`` column (a ``jsonb``) as one
object, or make the body bad when unknown fields are refused, or are left out. Values are
written as text and PostgreSQL parses them by the column's type (a timestamp given as an ISO
string, a number into ``numeric``), so no type is guessed here; a value PostgreSQL refuses
fails the COPY, and :mod:`.to_postgres` then finds the row. A body that is not a JSON object,
or lacks the key, is :class:`BadBody` (for the dead-letter topic).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["BadBody", "RowMaker"]

#: COPY text format's escapes (backslash first: the others add backslashes).
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NULL = "\\N"


class BadBody(ValueError):
    """A body that cannot be a row: not JSON, not an object, no key, or an unknown field refused."""


class RowMaker:
    """Bodies to COPY lines for ``columns`` (the table's, in the COPY's order)."""

    def __init__(self, table_columns: Sequence[str], key: str, rest_column: str = "",
                 refuse_unknown: bool = False, arrays: Collection[str] = ()) -> None:
        self.key = key
        self.rest_column = rest_column
        self.refuse_unknown = refuse_unknown
        #: The columns a body fills, by name (the rest column is filled by the leftovers).
        self.fields = [name for name in table_columns if name != rest_column]
        self.known = frozenset(self.fields)
        self.columns = [*self.fields, *([rest_column] if rest_column else [])]
        #: Per field, how a value is written: a JSON list into an array column as an array literal.
        self.writers = [_array_text if name in arrays else _text for name in self.fields]
        self.no_arrays = not any(name in arrays for name in self.fields)

    def line(self, body: bytes) -> tuple[Any, str]:
        """``(key value, COPY line without its newline)``; :class:`BadBody` names what is wrong."""
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadBody(f"not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise BadBody(f"a JSON {type(document).__name__}, not an object")
        key = document.get(self.key)
        if key is None:
            raise BadBody(f"no {self.key!r} (the key column)")
        if self.no_arrays and b"\\" not in body:
            # No backslash in the JSON text: no string in it holds one, nor a tab or a line break
            # (JSON escapes them), so strings need no COPY escapes (profiled: translate() was a
            # fifth of a row's time).
            values = [value if value.__class__ is str else _text(value) for value in map(document.get, self.fields)]
        else:
            get = document.get
            values = [write(get(name)) for name, write in zip(self.fields, self.writers)]
        if self.rest_column or self.refuse_unknown:
            rest = {name: value for name, value in document.items() if name not in self.known}
            if rest and self.refuse_unknown:
                raise BadBody(f"field(s) without a column: {', '.join(sorted(rest)[:5])}")
            if self.rest_column:
                values.append(_text(rest) if rest else _NULL)
        return key, "\t".join(values)


def _array_text(value: Any) -> str:
    """A JSON list as an array literal (``{a,"b c",NULL}``); anything else as :func:`_text` would."""
    if isinstance(value, list):
        return _array(value).translate(_ESCAPES)
    return _text(value)


def _array(values: list[Any]) -> str:
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
        elif isinstance(value, list):
            items.append(_array(value))
        elif isinstance(value, bool):
            items.append("t" if value else "f")
        elif isinstance(value, (int, float)):
            items.append(repr(value))
        else:
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            items.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(items) + "}"


def _text(value: Any) -> str:
    """One value in COPY's text format: NULL, t/f, a number, a string or JSON (escaped)."""
    if value is None:
        return _NULL
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, str):
        return value.translate(_ESCAPES)
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).translate(_ESCAPES)
