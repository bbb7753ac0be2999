"""Coalescing of concurrent publishes (C ``_coalesce`` and its twin ``_coalesce_py``)."""

import asyncio
from collections.abc import Callable
from typing import Any

IMPLEMENTATION: str

def body_size(body: Any) -> int: ...

class Batch:
    bodies: list[Any]
    futures: list[asyncio.Future[Any]]
    nbytes: int
    on_settled: Callable[[BaseException | None], object] | None
    def __len__(self) -> int: ...
    def done(self) -> bool: ...
    def set_result(self, result: Any) -> None: ...
    def set_exception(self, error: BaseException) -> None: ...
    def resolve(self, sent: asyncio.Future[Any]) -> None: ...
    def fail(self, error: BaseException) -> None: ...
    def split(self, max_bytes: int, max_count: int) -> list[Batch]: ...

class Coalescer:
    max_msg_size: int
    pending: int
    published: int
    flush_at: int
    flush_bytes: int
    lone_at_once: bool
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        flush: Callable[[dict[Any, Batch]], Any],
        max_msg_size: int,
        flush_at: int = 0,
        flush_bytes: int = 0,
        lone_at_once: bool = False,
    ) -> None: ...
    def add(self, key: Any, body: Any) -> asyncio.Future[Any]: ...
