"""A batch of messages from ``Consumer.batches()``, answered together."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .. import codec

__all__ = ["Batch"]


class Batch(Sequence[Any]):
    """Messages yielded together by ``Consumer.batches()``; answer them in one write."""

    __slots__ = ("messages",)

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: Any) -> Any:
        return self.messages[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.messages)

    def finish(self) -> None:
        """FIN every message not answered yet."""
        codec.finish_all(self.messages)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ every message not answered yet (backoff counts once per batch)."""
        first = True
        for message in self.messages:
            if not message.has_responded:
                message.requeue(delay, backoff=backoff and first)
                first = False
