"""The blocking producer's deadlines on a hung or absent nsqd (issue 57): a thread's wait ends at
its deadline, and what fail_fast raises is NsqdDown whichever path raises it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fastnsq._thread_publish import _Line
from fastnsq.errors import NoConnectionError
from fastnsq.sync import Producer
from fastnsq.testing.process import free_port

from .helpers import Slack


def test_a_threads_wait_on_a_silent_nsqd_ends_at_its_deadline() -> None:
    """A thread's connection waits for nsqd's answer by the kernel's SO_RCVTIMEO, whose timer
    wheel rounds a wait of seconds up by as much as an eighth: calls on a hung nsqd with
    publish_timeout 10 s ended 0.1-0.25 s late, all at once. The kernel now has KERNEL_SHARE of
    the wait and select() the rest: never early, and late only by what the machine adds."""
    wait = 6.0
    with socket.socket() as silent:  # a hung nsqd: its kernel completes the connect, nobody answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        took: list[float] = []

        def one_call() -> None:
            line = _Line("silent", socket.create_connection(silent.getsockname()))
            line.set_timeout(wait)
            began = time.monotonic()
            with pytest.raises(BlockingIOError):
                line.round_trip(b"PUB t\n\x00\x00\x00\x01x", began + wait)
            took.append(time.monotonic() - began)
            line.close()

        with Slack() as slack:
            threads = [threading.Thread(target=one_call) for _ in range(4)]
            for thread in threads:
                thread.start()
                time.sleep(0.1)  # spread over the kernel's timer buckets
            for thread in threads:
                thread.join()
    assert min(took) >= wait, took
    assert max(took) < wait + slack.allowance(0.03), (took, slack)


def test_every_publish_while_nsqd_is_down_raises_nsqd_down() -> None:
    """fail_fast's error is NsqdDown (a NoConnectionError) whichever path raises it: the
    facade's hand-off raised a plain NoConnectionError for most calls, the docs name NsqdDown."""
    with Producer([f"127.0.0.1:{free_port()}"]) as producer:  # nothing listens there
        raised = []
        for _ in range(20):
            with pytest.raises(NoConnectionError) as caught:
                producer.publish("down", b"x")
            raised.append(type(caught.value).__name__)
    assert raised == ["NsqdDown"] * 20, raised
