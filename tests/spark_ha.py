"""An HA cluster the Spark tests can reach while they block: the real youzan one the environment
names (``dev.py test --real-ha``), else the embedded 3-node HA cluster on a loop of its own.

Used by the ``readMode=offsets`` tests (local Spark and the standalone cluster).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastnsq import Producer
from fastnsq.loop import new_event_loop
from fastnsq.testing.external import external_cluster_from_env, external_servers_configured, is_ha


class NotHACluster(RuntimeError):
    """The real servers the environment names are upstream nsqd, not youzan's HA cluster."""


class ThreadedHACluster:
    """``create_topic``, ``publish`` and the lookupd's address, from any thread."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-ha-cluster", daemon=True)
        self._thread.start()
        self.external = external_servers_configured()
        if self.external:
            cluster = external_cluster_from_env()
            if cluster is None or not self.run(is_ha(cluster)):
                self.loop.call_soon_threadsafe(self.loop.stop)
                raise NotHACluster("the configured real servers are not youzan's HA cluster with a lookupd")
            self.cluster: Any = cluster
        else:
            from fastnsq.testing import NSQCluster

            self.cluster = NSQCluster(nodes=3, ha=True)
            self.run(self.cluster.start())
        self._producer: Producer | None = None

    @property
    def lookupd_http(self) -> str:
        return str(self.cluster.lookupd_http_addresses[0])

    def run(self, coro: Any, timeout: float = 180) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def create_topic(self, topic: str, partitions: int) -> dict[int, str]:
        return dict(self.run(self.cluster.create_topic(topic, partitions=partitions, channels=["keep"])))

    def publish(self, topic: str, partition: int, bodies: list[bytes], chunk: int = 500) -> None:
        """MPUB ``bodies`` to one partition, in order."""

        async def publish() -> None:
            if self._producer is None:
                self._producer = Producer(lookupd_http_addresses=self.cluster.lookupd_http_addresses)
                await self._producer.start()
            for at in range(0, len(bodies), chunk):
                await self._producer.mpublish(topic, bodies[at:at + chunk], partition=partition)

        self.run(publish())

    def close(self) -> None:
        async def close() -> None:
            if self._producer is not None:
                await self._producer.close()
            if not self.external:
                await self.cluster.stop()

        self.run(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
