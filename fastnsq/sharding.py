"""Which partition of an HA topic a message goes to: by sharding key, or in turn.

One job: map a key to a partition (the same key always to the same partition, as
youzan's clients do) and take turns over the partitions otherwise. Where the
partitions are led is :mod:`fastnsq.topology`'s job.

>>> partition_for_key("user-42", 4)
0
>>> turns = RoundRobin()
>>> [turns.next_of((0, 1, 2)) for _ in range(4)]
[0, 1, 2, 0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mmh3

from .errors import InvalidValueError

__all__ = ["Hasher", "RoundRobin", "key_bytes", "murmur3_32", "partition_for_key"]

#: A sharding hash: key bytes to an unsigned int.
Hasher = Callable[[bytes], int]


def murmur3_32(key: bytes) -> int:
    """The default sharding hash: murmur3 32-bit, unsigned (as youzan's documentation uses)."""
    return int(mmh3.hash(key, signed=False))


def key_bytes(key: Any) -> bytes:
    """A sharding key as the bytes that are hashed: str as UTF-8, int as its decimal digits."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode()
    raise InvalidValueError(f"sharding_key must be str, bytes or int, not {type(key).__name__}")


def partition_for_key(key: Any, partition_count: int, hasher: Hasher = murmur3_32) -> int:
    """The partition of ``key`` among ``partition_count`` partitions."""
    return hasher(key_bytes(key)) % partition_count


class RoundRobin:
    """Takes turns over a sequence of partitions (or anything), one step per call."""

    __slots__ = ("_turn",)

    def __init__(self) -> None:
        self._turn = -1

    def next_of(self, choices: Sequence[Any]) -> Any:
        self._turn = (self._turn + 1) % len(choices)
        return choices[self._turn]
