"""JSON fields of a body: nsq_to_nsq's filter (``--require-json-field``, ``--require-json-value``,
``--whitelist-json-field``) and the one value a key is taken from (:func:`json_key`: to-nsq's sharding
key, to-file's partition folders).

The filter is used only when one of its flags is given (a body is then parsed as a JSON object). A body that is
not a JSON object is dropped (FINed, logged). Without the required field it is dropped; if a
value was also required, it is requeued instead (nsq_to_nsq's "backoff"). With a required
value, a string field must equal it, a number field must equal it as a number (when the value
parses as one); other types never match. A whitelist keeps only those fields, re-encoded
(integral numbers written as integers, as nsq_to_nsq does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from enum import Enum
from typing import Any

logger = logging.getLogger("fastnsq.apps.to_nsq")

#: json.loads without its per-call work (finding the encoding of bytes): a third of its cost
#: on a 90-byte body, and a keyed batch parses every body.
_decode = json.JSONDecoder().decode


def json_key(body: bytes, field: str) -> Any:
    """The key in ``body``'s JSON ``field`` (a sharding key, a partition value): a string or an
    integer as it is, any other value as its compact JSON text (equal values, equal keys); None
    without one (no field, a null, a body that is not a JSON object)."""
    try:
        document = _decode(body.decode("utf-8") if isinstance(body, bytes) else bytes(body).decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        return None
    if not isinstance(document, dict):
        return None
    value = document.get(field)
    if value is None:
        return None
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class Verdict(Enum):
    PASS = "pass"
    DROP = "drop"  # FIN without passing it on
    REQUEUE = "requeue"


class JsonFilter:
    """What to do with a body, and the body to pass on."""

    def __init__(self, require_field: str = "", require_value: str = "", whitelist: Sequence[str] = ()) -> None:
        self.require_field, self.require_value = require_field, require_value
        self.whitelist = list(whitelist)
        self.active = bool(require_field or whitelist)
        self.number: float | None = None
        if require_value:
            try:
                self.number = float(require_value)
            except ValueError:
                self.number = None

    def apply(self, body: bytes) -> tuple[Verdict, bytes]:
        if not self.active:
            return Verdict.PASS, body
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            logger.error("Unable to decode json: %r", body[:200])
            return Verdict.DROP, body
        verdict = self._check(document)
        if verdict is not Verdict.PASS or not self.whitelist:
            return verdict, body
        return Verdict.PASS, self._keep(document)

    def _check(self, document: dict[str, Any]) -> Verdict:
        if not self.require_field:
            return Verdict.PASS
        if self.require_field not in document:
            if self.require_value:
                logger.error("missing field to check required value")
                return Verdict.REQUEUE
            return Verdict.DROP
        if not self.require_value:
            return Verdict.PASS
        value = document[self.require_field]
        if isinstance(value, str):
            return Verdict.PASS if value == self.require_value else Verdict.DROP
        if self.number is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            return Verdict.PASS if float(value) == self.number else Verdict.DROP
        return Verdict.DROP

    def _keep(self, document: dict[str, Any]) -> bytes:
        kept: dict[str, Any] = {}
        for key in self.whitelist:
            if key in document:
                value = document[key]
                if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
                    value = int(value)
                kept[key] = value
        text = json.dumps(kept, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        for char, escaped in _GO_ESCAPES.items():  # Go's json.Marshal escapes these in strings
            text = text.replace(char, escaped)
        return text.encode()


_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
