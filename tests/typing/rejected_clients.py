"""Lines a type checker must reject: each with a ``rejected:`` comment (tests/test_typing.py checks
that mypy --strict and pyright report an error on every marked line, and on no other)."""

from __future__ import annotations

import fastnsq
import fastnsq.runner
import fastnsq.sync
from fastnsq import Message

NSQD = ["127.0.0.1:4150"]


def takes_text(text: str) -> None:
    print(text)


def returns_false(message: Message) -> bool:  # pynsq's style: return False to requeue
    return False


def two_arguments(message: Message, extra: int) -> None:
    print(message, extra)


async def wrong() -> None:
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, max_in_flight="10")  # rejected: a str for an int
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, msg_timeout="30s")  # rejected: Go's form as a keyword
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, max_tries=3)  # rejected: pynsq's name
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, pool_size=2)  # rejected: a Producer option
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, backoff_strategy="pynsq")  # rejected: no such strategy
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, handler=takes_text)  # rejected: not a Message
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, handler=two_arguments)  # rejected: two arguments
    fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD, handler=returns_false)  # rejected: return False finishes
    fastnsq.Producer(NSQD, max_in_flight=1)  # rejected: a Consumer option
    fastnsq.Producer(NSQD, reconnect_interval=15.0)  # rejected: pynsq's Writer name
    fastnsq.sync.Producer(NSQD, pool_size="2")  # rejected: a str for an int
    fastnsq.sync.Consumer("t", "c", nsqd_tcp_addresses=NSQD, handler=takes_text)  # rejected: not a Message
    async with fastnsq.Producer(NSQD) as producer:
        await producer.publish("t", 123)  # rejected: an int body
        answer: str = await producer.publish("t", b"x")  # rejected: the answer is bytes
        print(answer)
    async for message in fastnsq.Consumer("t", "c", nsqd_tcp_addresses=NSQD):
        takes_text(message)  # rejected: a Message, not a str


def misspelt_names() -> None:
    # The public names are imported on first use (a module __getattr__): a checker must still see
    # exactly these names, not "anything goes".
    fastnsq.Consumr("t", "c", nsqd_tcp_addresses=NSQD)  # rejected: no such name
    print(fastnsq.runner.Supervisr)  # rejected: no such name
