"""HA: the FINs of one loop pass go out newest first (``Consumer(fins_newest_first=True)``, the default).

A youzan leader moves its channel's confirmed offset, and tells every replica, with each FIN of
the oldest unconfirmed message; FINs above it are only recorded. Newest first, a pass's FINs move
it once. Which order nsqd read the FINs in is seen inside the embedded server; that every message
is still finished exactly once is checked on the real cluster too.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import pytest

from fastnsq import Consumer, Producer
from fastnsq.testing._nsqd_ha import HAChannel

from .helpers import eventually, skip_if_external, unique

pytestmark = pytest.mark.timeout(120)


def finish_order(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The internal ids the FIN commands name, grouped by the loop pass that read them."""
    passes: list[list[int]] = [[]]
    finish = HAChannel.finish

    def end_of_pass() -> None:
        if passes[-1]:
            passes.append([])

    def recording(self: HAChannel, client: Any, message_id: bytes) -> str | None:
        if not passes[-1]:
            self.server.loop.call_soon(end_of_pass)  # runs after this pass's commands
        passes[-1].append(int.from_bytes(message_id[:8], "big"))
        return finish(self, client, message_id)

    monkeypatch.setattr(HAChannel, "finish", recording)
    return passes


@pytest.mark.parametrize("newest_first", [True, False])
async def test_a_pass_of_fins_goes_out_newest_first(nsq_cluster_ha: Any, monkeypatch: pytest.MonkeyPatch,
                                                    newest_first: bool) -> None:
    skip_if_external(nsq_cluster_ha, "reads the order of FINs inside the server")
    topic = unique("fins")
    await nsq_cluster_ha.create_topic(topic, partitions=1, channels=["ch"])
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await producer.mpublish(topic, [b"m%d" % i for i in range(500)], partition=0)
    reads = finish_order(monkeypatch)
    got: list[bytes] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        handler=lambda m: got.append(m.body), max_in_flight=500, fins_newest_first=newest_first)
    await consumer.start()
    await eventually(lambda: len(got) == 500, timeout=20)
    await asyncio.sleep(0.2)
    await consumer.stop()
    order = [i for ids in reads for i in ids]
    assert sorted(order) == sorted(set(order)) and len(order) == 500  # each message finished once
    rises = sum(1 for a, b in itertools.pairwise(order) if b > a)
    if newest_first:
        # Descending within each write; it rises only where one write's FINs follow another's.
        assert rises < 50, order
    else:
        assert rises == len(order) - 1, order


async def test_newest_first_finishes_everything_once(nsq_cluster_ha: Any) -> None:
    topic = unique("fins")
    await nsq_cluster_ha.create_topic(topic, partitions=4, channels=["ch"])
    bodies = [b"n%05d" % i for i in range(5000)]
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        for p in range(4):
            await producer.mpublish(topic, bodies[p::4], partition=p)
    got: Counter[bytes] = Counter()
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        handler=lambda m: got.update([m.body]), max_in_flight=1000, lookupd_poll_interval=0.5)
    await consumer.start()
    await eventually(lambda: len(got) == len(bodies), timeout=30)
    await asyncio.sleep(1.0)  # nothing comes back: every FIN was taken
    await consumer.stop()
    assert got == Counter(bodies)
    assert consumer.snapshot().finished == len(bodies)
