"""Which destination gets the next batch: ``--mode round-robin`` or ``hostpool`` (bitly's go-hostpool).

round-robin: each destination in turn, whatever happened. hostpool: in turn among the live
ones; a destination that failed is skipped for 30 s, then tried once, its wait doubling after
each further failure up to 900 s; success makes it live again; when every one is down, all are
taken back (go-hostpool's standard pool, which nsq_to_nsq and nsq_to_http use). Pure, with an
injectable clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

INITIAL_RETRY_DELAY = 30.0
MAX_RETRY_DELAY = 900.0
MODES = ("round-robin", "hostpool", "epsilon-greedy")


@dataclass
class _Host:
    address: str
    dead: bool = False
    retry_delay: float = INITIAL_RETRY_DELAY
    next_retry: float = 0.0


class HostPool:
    """``get()`` the next destination; ``mark(address, ok)`` after trying it."""

    def __init__(self, addresses: Sequence[str], mode: str = "hostpool",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not addresses:
            raise ValueError("no destination")
        if mode not in MODES:
            raise ValueError(f"--mode {mode!r}: takes round-robin or hostpool")
        self.hosts = [_Host(address) for address in addresses]
        self.pooled = mode != "round-robin"  # epsilon-greedy: hostpool, as nsq_to_nsq maps it
        self.clock = clock
        self.next_index = 0

    def get(self) -> str:
        count = len(self.hosts)
        if not self.pooled:
            host = self.hosts[self.next_index % count]
            self.next_index += 1
            return host.address
        now = self.clock()
        for step in range(count):
            index = (self.next_index + step) % count
            host = self.hosts[index]
            if not host.dead or host.next_retry < now:
                if host.dead:  # one more try; the next wait doubles
                    host.retry_delay = min(host.retry_delay * 2, MAX_RETRY_DELAY)
                    host.next_retry = now + host.retry_delay
                self.next_index = index + 1
                return host.address
        for host in self.hosts:  # all down: take them all back
            host.dead = False
        self.next_index = 1
        return self.hosts[0].address

    def mark(self, address: str, ok: bool) -> None:
        if not self.pooled:
            return
        for host in self.hosts:
            if host.address == address:
                if ok:
                    host.dead = False
                elif not host.dead:
                    host.dead = True
                    host.retry_delay = INITIAL_RETRY_DELAY
                    host.next_retry = self.clock() + INITIAL_RETRY_DELAY
