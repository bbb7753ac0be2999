"""The endpoints a consumer wants and has no connection to, under the recovery rule.

One job: for each endpoint (an nsqd, or an HA partition on one) the consumer wants and lacks,
:class:`fastnsq.recovery.Redial` tries it again quickly; while one that lookupd found is
missing, or while the consumer holds no connection at all, the topology is told the consumer
is short (lookupd is then polled often);
one lookupd found stays wanted while lookupd lists it and for ``KEEP_MISSING_POLLS`` polls
after (a restarted nsqd unregisters until it is back), unless its partition is led elsewhere
now. An HA node that answers "not the leader here" is left to lookupd's routes (a refresh
about once a second), not tried again directly. How a connection is opened is the
consumer's (``fill``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from ..config import Endpoint, LoggerLike
from ..errors import NotLeaderError, NotWritableError, TopicNotExistError
from ..recovery import KEEP_MISSING_POLLS, Recall, Redial
from ..topology import TopicRoute, Topology

__all__ = ["REFRESH_ERRORS", "Missing"]

logger = logging.getLogger(__name__)

#: HA errors after which the connection is dropped and lookup refreshed (protocol.md §9.14).
REFRESH_ERRORS = (NotLeaderError, NotWritableError, TopicNotExistError)


class Missing:
    """What the consumer lacks; ``fill(endpoint)`` opens its connections or raises."""

    def __init__(
        self,
        topic: str,
        fill: Callable[[Endpoint], Awaitable[None]],
        direct: Sequence[Endpoint],
        *,
        delay: float,
        max_delay: float,
        lookupd_poll_interval: float,
        holds_none: Callable[[], bool] = lambda: False,
        log: LoggerLike = logger,
    ) -> None:
        self.topic = topic
        self._fill = fill
        self._holds_none = holds_none  # the consumer has no connection at all
        self._direct = direct  # the consumer's own list: given endpoints are wanted for as long as given
        self._log = log
        self.topology: Topology | None = None  # set once the consumer asks lookupd
        self.active = True
        self._redial = Redial(delay=delay, max_delay=max_delay, on_round=lambda _address: self.tell(), log=log)
        self._recall: Recall[Endpoint] = Recall(KEEP_MISSING_POLLS * lookupd_poll_interval)

    def add(self, endpoint: Endpoint, error: BaseException | None = None) -> None:
        """``endpoint`` lacks connections (``error``: why the attempt just made failed)."""
        if not self.active:
            return
        if isinstance(error, REFRESH_ERRORS) and self.topology is not None:
            self._redial.drop(endpoint)
            self.topology.refresh_soon(self.topic)
        else:
            self._redial.missing(endpoint.address, endpoint, lambda: self._attempt(endpoint), error)
        self.tell()

    def has(self, endpoint: Endpoint) -> bool:
        return self._redial.has(endpoint)

    def routed(self, route: TopicRoute) -> None:
        """A new route: stop trying what lookupd no longer wants the consumer to have."""
        self._recall.wanted(route.endpoints)
        found = [key for key in self._redial.pending() if key not in self._direct]
        for key in self._recall.gone(found, route.endpoints, route.moved_away(found)):  # type: ignore[arg-type]
            self._log.info("no longer trying %s: led elsewhere, or not listed by lookupd for %.0f s", key,
                           self._recall.keep)
            self._redial.drop(key)
        self.tell()

    def drop_address(self, address: str) -> None:
        """Nothing at ``address`` is wanted any more (``disconnect_from_nsqd``)."""
        self._redial.drop_address(address)
        self.tell()

    async def close(self) -> None:
        self.active = False
        await self._redial.close()

    async def _attempt(self, endpoint: Endpoint) -> None:
        try:
            await self._fill(endpoint)
        except REFRESH_ERRORS as exc:
            self.add(endpoint, exc)
            raise

    def tell(self) -> None:
        """The topology polls often while an endpoint lookupd found is missing, or while the
        consumer holds no connection at all (started while every nsqd was down, or before any
        had the topic: only lookupd can say where to go, and it is asked every few seconds)."""
        if self.topology is not None and self.active:
            empty = self._holds_none()
            lacking = any(key not in self._direct for key in self._redial.pending())
            self.topology.set_short(self.topic, lacking or empty, empty=empty)

