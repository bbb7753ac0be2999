"""Loading the conversations recorded from real nsqd servers (ground truth).

Two recordings of the same conversations, one per upstream version:

* ``master``: nsq master 3103474b (reports 1.3.0, adds the topology fields), in
  ``tests/captures/nsqd-master``;
* ``v1.3.0``: the released nsqd v1.3.0 (tag v1.3.0), in ``tests/captures/nsqd-v1.3.0``.

Both are made by ``tests/captures/record.py`` (``python3 dev.py captures --real BIN_DIR``,
which tells the two servers apart and writes the matching folder): it replays the client
side of the master recording against the server. ``tests/captures/README.md`` says which
server, commit and command made each folder.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from fastnsq.testing.nsqd import MASTER, RELEASED

HERE = Path(__file__).resolve().parent
#: Where each version's recording lives.
DIRECTORIES = {
    MASTER: HERE / "nsqd-master",
    RELEASED: HERE / "nsqd-v1.3.0",
}
#: The recording that the client side of every conversation comes from.
CAPTURES = DIRECTORIES[MASTER]
VERSIONS = (RELEASED, MASTER)
COMPRESSED = {"deflate_publish", "snappy_publish", "identify_deflate", "identify_snappy"}


def scenario_names(version: str = MASTER) -> list[str]:
    return sorted(p.stem for p in DIRECTORIES[version].glob("*.json") if p.stem != "http")


@cache
def load(name: str, version: str = MASTER) -> dict[str, Any]:
    return json.loads((DIRECTORIES[version] / f"{name}.json").read_text())


def http_answers(version: str = MASTER) -> dict[str, Any]:
    return load("http", version)
