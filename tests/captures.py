"""Loading the real nsqd 1.3.0 conversations in ../shared/captures (ground truth)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

CAPTURES = Path(__file__).resolve().parents[1].parent / "shared" / "captures" / "nsqd-1.3.0"
COMPRESSED = {"deflate_publish", "snappy_publish", "identify_deflate", "identify_snappy"}


def scenario_names() -> list[str]:
    return sorted(p.stem for p in CAPTURES.glob("*.json") if p.stem != "http")


@cache
def load(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / f"{name}.json").read_text())


def http_answers() -> dict[str, Any]:
    return load("http")
