"""``--partition-by``: the Hive-style folder (``dt=2026-11-28/hr=07``) each archived message goes to.

A spec is ``KEY=VALUE`` parts joined by ``/``. A VALUE holds strftime codes, formatted from
the message's timestamp (when nsqd took it, in UTC: a redelivered message keeps its
timestamp, so it lands in the same folder), and ``{FIELD}``, the top-level field of the body
as a JSON object (:func:`~.jsonfilter.json_key`: a string or an integer as it is, other values
as compact JSON). ``hourly`` and ``daily`` stand for ``dt=%Y-%m-%d/hr=%H`` and
``dt=%Y-%m-%d``. A value is escaped as Hive and Spark escape partition values (``%2F`` for
``/``...), and a missing or empty one is ``__HIVE_DEFAULT_PARTITION__`` (Spark reads a null).
Readers find the keys in the folder names: Spark's partition discovery and DuckDB's
``hive_partitioning`` turn them into columns and skip the folders a filter on them excludes.
"""

from __future__ import annotations

import re
import time
from typing import Any

from .jsonfilter import json_key

SHORTHANDS = {"hourly": "dt=%Y-%m-%d/hr=%H", "daily": "dt=%Y-%m-%d"}
#: The Parquet columns: a partition key of the same name would hide one of them from readers.
COLUMNS = frozenset({"body", "id", "timestamp", "attempts", "partition", "offset"})
#: What Hive and Spark read back as a null partition value.
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD = re.compile(r"\{([^{}]+)\}")
# Hive's FileUtils.escapePathName set (Spark's ExternalCatalogUtils has the same): these
# characters are written %XX, and readers unescape them.
_ESCAPED = frozenset('"#%\'*/:=?\\\x7f{[]^') | frozenset(chr(c) for c in range(1, 32))


class PartitionSpecError(ValueError):
    """A --partition-by that cannot be used."""


def escape_value(value: str) -> str:
    """``value`` as a Hive partition folder writes it."""
    if not value:
        return DEFAULT_PARTITION
    return "".join(f"%{ord(char):02X}" if char in _ESCAPED else char for char in value)


class Partitioning:
    """The folder of each record, by a spec (:data:`SHORTHANDS` or ``KEY=VALUE/...``)."""

    def __init__(self, spec: str) -> None:
        self.spec = SHORTHANDS.get(spec, spec)
        self.parts = self._parse(spec, self.spec)
        self.fields = sorted({name for _, value in self.parts for name in _FIELD.findall(value)})
        self._by_second: dict[int, list[str]] = {}  # the time-formatted values of one second

    @staticmethod
    def _parse(given: str, spec: str) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        for part in spec.split("/"):
            key, equals, value = part.partition("=")
            if not equals or not _KEY.fullmatch(key) or not value:
                raise PartitionSpecError(
                    f"--partition-by {given!r}: {part!r} is not KEY=VALUE (a key of letters, digits and _, "
                    "a value of strftime codes and {FIELD}s), e.g. dt=%Y-%m-%d/hr=%H")
            if key in COLUMNS:
                raise PartitionSpecError(f"--partition-by {given!r}: the key {key!r} is a column of the archive "
                                         f"({', '.join(sorted(COLUMNS))}); name it otherwise")
            if key in (k for k, _ in parts):
                raise PartitionSpecError(f"--partition-by {given!r}: the key {key!r} is given twice")
            parts.append((key, value))
        return parts

    def folder(self, record: Any) -> str:
        """The folder (``k=v/k=v``) ``record`` goes to."""
        second = record.timestamp // 1_000_000_000
        timed = self._by_second.get(second)
        if timed is None:
            if len(self._by_second) > 4096:
                self._by_second.clear()
            moment = time.gmtime(second)
            timed = self._by_second[second] = [time.strftime(value, moment) for _, value in self.parts]
        if not self.fields:
            return "/".join(f"{key}={escape_value(value)}" for (key, _), value in zip(self.parts, timed))
        found = {name: json_key(record.body, name) for name in self.fields}
        return "/".join(f"{key}={escape_value(_FIELD.sub(lambda m: _text(found[m.group(1)]), value))}"
                        for (key, _), value in zip(self.parts, timed))

    def split(self, records: list[Any]) -> dict[str, list[Any]]:
        """``records`` by folder, in their order."""
        by_folder: dict[str, list[Any]] = {}
        for record in records:
            folder = self.folder(record)
            chosen = by_folder.get(folder)
            if chosen is None:
                chosen = by_folder[folder] = []
            chosen.append(record)
        return by_folder


def _text(value: Any) -> str:
    return "" if value is None else str(value)
