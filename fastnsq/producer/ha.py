"""What a producer does only for youzan's HA nsqd, in one place the Producer calls through a few hooks.

One job: the HA options of :class:`~fastnsq.Producer` (youzan/go-nsq's names, snake_case)
and what they change:

* ``topics_for_compress``, ``message_size_for_compress`` (20480),
  ``client_compress_decodec`` ("not_specified", "gzip", "snappy", "lz4"): client-side body
  compression of publishes that carry an ext header, as youzan/go-nsq compresses only its
  ``*WithJsonExt`` publishes (:mod:`fastnsq.bodies`);
* ``pub_strategy`` ("round_robin", or "dynamic_load": the less loaded of two partitions)
  and the per-node figures of :meth:`~fastnsq.Producer.node_stats` (:mod:`.load`);
* ``pub_max_background_retry`` (15), ``pub_background_buffer`` (1000),
  ``background_failure_handler``: :meth:`~fastnsq.Producer.publish_and_retry_background`
  (:mod:`.background`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..bodies import BodyCompressor
from .background import BackgroundRetry, Unsent
from .load import NodeLoads, NodeStats, pub_strategy
from .pool import ConnectionPool

__all__ = ["CloseReport", "HAProducer"]

@dataclass(frozen=True)
class CloseReport:
    """What ``Producer.close()`` left behind: background publishes never sent (they may be
    retried by the caller; one cut off mid-retry may have reached nsqd)."""

    unsent: tuple[Unsent, ...] = ()


class HAProducer:
    """The HA side of one producer: compression, the per-node figures, background retries."""

    def __init__(
        self,
        settings: dict[str, Any],
        pool: ConnectionPool,
        publish: Callable[..., Awaitable[Any]],
        retryable: Callable[[BaseException], bool],
    ) -> None:
        self.bodies = BodyCompressor(
            settings["topics_for_compress"], settings["message_size_for_compress"],
            settings["client_compress_decodec"],
        )
        self.compressing = self.bodies.active
        self.strategy = pub_strategy(settings["pub_strategy"])
        self._pool = pool
        self.loads = NodeLoads(pool.pending_of)
        self.background = BackgroundRetry(publish, settings, retryable)

    @property
    def load_aware(self) -> bool:
        return self.strategy == "dynamic_load"

    # ---- compression ---------------------------------------------------------------------

    def compress(self, topic: str, body: Any, ext: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
        """A publish with an ext header: its body and header as they go out."""
        return self.bodies.apply(topic, body, ext)

    def compress_batch(
        self, topic: str, bodies: list[Any], exts: Sequence[Mapping[str, Any]]
    ) -> tuple[list[Any], list[Mapping[str, Any]]]:
        """:meth:`compress` for each message of an ``mpublish`` with ``exts``."""
        pairs = [self.bodies.apply(topic, body, ext) for body, ext in zip(bodies, exts)]
        return [body for body, _ in pairs], [ext for _, ext in pairs]

    # ---- the per-node figures ------------------------------------------------------------

    def timer(self, address: str) -> Callable[[BaseException | None], None]:
        """:meth:`timed` for an answer that is not a future: call the result with the command's
        error (None: answered) when it is answered."""
        sent = time.perf_counter()
        loads = self.loads

        def answered(error: BaseException | None) -> None:
            if error is None:
                loads.record(address, time.perf_counter() - sent)

        return answered

    def timed(self, address: str, future: asyncio.Future[Any]) -> None:
        """Record the round trip of the command ``future`` answers, when it is answered."""
        sent = time.perf_counter()  # a real clock: uvloop's loop.time() is in ms, cached per pass
        future.add_done_callback(lambda done: self._answered(address, sent, done))

    def _answered(self, address: str, sent: float, done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.loads.record(address, time.perf_counter() - sent)

    def node_stats(self) -> dict[str, NodeStats]:
        """go-nsq's ``TopicProducerMgr.Stat()``: each nsqd's pending commands and average round trip."""
        loads = self.loads
        return {
            address: NodeStats(address, loads.pending(address), loads.avg_rt(address), loads.answered(address),
                               self._pool.open_count(address))
            for address in self._pool.addresses()
        }

    async def close(self) -> CloseReport:
        return CloseReport(tuple(await self.background.close()))
