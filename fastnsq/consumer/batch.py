"""A batch of messages from ``Consumer.batches()``, answered together."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from .. import codec
from ..codec import Message

__all__ = ["Batch"]


class Batch(Sequence[Message]):
    """Messages yielded together by ``Consumer.batches()``; answer them in one write."""

    __slots__ = ("messages",)

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        return self.messages[index]

    def __iter__(self) -> Iterator[Message]:
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
