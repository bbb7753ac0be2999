"""What a consumer does only on youzan's HA nsqd, in one place the Consumer calls through a few hooks.

One job: the HA options of :class:`~fastnsq.Consumer` and what they change
(youzan/go-nsq's names, snake_case):

* ``partition`` (``NewPartitionConsumer``): consume one partition only; with
  ``nsqd_tcp_addresses`` it is the partition each address is subscribed to. An address
  may also be given as ``(address, partition)`` (``ConnectToNSQD(addr, part)``).
* ``consume_ext`` (``SetConsumeExt``): identify with ``extend_support`` where no lookupd
  says whether the topic is an ext topic (direct endpoints, a lookupd without meta).
* ``enable_trace`` (``EnableTrace``): subscribe with ``SUB_ADVANCED``, so that every message
  carries its queue offset and raw size (``message.offset`` / ``message.raw_size``)
  without the one-at-a-time delivery of ordered consumption.
* ``consume_offset`` (``SetConsumeOffset``): where each partition starts
  (:mod:`.positions`).
* ``disable_message_decompress`` (``DisableMessageDecompress``): hand over bodies that a
  youzan/go-nsq producer compressed (:mod:`fastnsq.bodies`) as they arrived; by default
  they are decompressed before the handler sees them.
* ``fins_newest_first`` (fastnsq's; True): on an HA nsqd, the FINs of one loop pass go out
  newest first, so the leader moves its channel's confirmed offset (and tells its replicas)
  once per pass instead of once per message (``Connection.batch_fins``).

The consumer asks :meth:`HAConsumer.plan` how to subscribe each connection, tells
:meth:`HAConsumer.subscribed` when it did, and the dispatcher calls
:meth:`HAConsumer.inspect` for each message that may need it (an ext header, a start
still being checked) before the handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import bodies
from ..config import Endpoint, address_list, parse_address
from ..errors import InvalidValueError
from .positions import StartPositions, SubscribePlan, parse_consume_offset

if TYPE_CHECKING:
    from ..topology import TopicRoute
    from .dispatch import Link
    from .partitions import Partitions

__all__ = ["HAConsumer", "direct_endpoints"]

logger = logging.getLogger(__name__)

def direct_endpoints(addresses: str | Sequence[Any] | None, partition: int | None) -> list[Endpoint]:
    """``nsqd_tcp_addresses`` as endpoints: ``"host:port"`` (with ``partition``, if given) or
    ``(address, partition)``."""
    found = []
    for item in address_list(addresses):
        if isinstance(item, str):
            parse_address(item)
            found.append(Endpoint(item, partition))
            continue
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise InvalidValueError(f"an nsqd address is 'host:port' or ('host:port', partition), got {item!r}")
        parse_address(item[0])
        _check_partition(f"the partition of {item[0]}", item[1])
        if partition is not None and item[1] != partition:
            raise InvalidValueError(f"{item!r} names partition {item[1]} but the consumer reads partition {partition}")
        found.append(Endpoint(item[0], item[1]))
    return found


def _check_partition(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31):
        raise InvalidValueError(f"{name} must be an int in 0..{2**31 - 1}, got {value!r}")


class HAConsumer:
    """The HA side of one consumer: its options, the subscribe plans, the messages it checks."""

    def __init__(
        self,
        topic: str,
        channel: str,
        settings: dict[str, Any],
        *,
        ordered: bool,
        has_lookupd: bool,
        max_attempts: int,
        partitions: Partitions,
        fast_allowed: Callable[[], bool],
    ) -> None:
        self.partition: int | None = settings["partition"]
        _check_partition("partition", self.partition)
        consume_ext = settings["consume_ext"]
        if consume_ext is not None and not isinstance(consume_ext, bool):
            raise InvalidValueError(f"consume_ext must be True, False or None, got {consume_ext!r}")
        self.consume_ext: bool | None = consume_ext
        self.enable_trace = bool(settings["enable_trace"])
        self.decompress = not settings["disable_message_decompress"]
        self.max_attempts = max_attempts
        self.ordered = ordered
        self.fins_newest_first = bool(settings["fins_newest_first"])
        starts = parse_consume_offset(settings["consume_offset"])
        if starts and ordered and not has_lookupd:
            raise InvalidValueError(
                "consume_offset with ordered=True needs lookupd_http_addresses: SUB_ORDERED takes no start, "
                "so the start goes through the partition leader's HTTP API, which lookupd names")
        self.positions = StartPositions(starts, topic, channel, ordered=ordered, trace=self.enable_trace)
        self._partitions = partitions
        self._fast_allowed = fast_allowed
        self.route: TopicRoute | None = None

    # ---- connections ---------------------------------------------------------------------

    def wants(self, endpoint: Endpoint) -> bool:
        """Whether to consume from ``endpoint`` (a single-partition consumer takes only its own)."""
        return self.partition is None or endpoint.partition == self.partition

    def extend_support(self, route_ext: bool) -> bool:
        """IDENTIFY's ``extend_support``: what lookupd's meta says, else ``consume_ext``."""
        route = self.route
        if route is not None and route.partition_num:  # a lookupd with meta knows
            return route_ext
        return bool(self.consume_ext) if self.consume_ext is not None else route_ext

    async def plan(self, endpoint: Endpoint, is_ha: bool) -> SubscribePlan:
        """How to subscribe a new connection to ``endpoint`` (and its start, applied once)."""
        if not is_ha:
            if self.positions.start_of(endpoint.partition) is not None:
                raise InvalidValueError(f"consume_offset needs an HA nsqd; {endpoint.address} is not one")
            return SubscribePlan()
        node = self.route.endpoints.get(endpoint) if self.route is not None else None
        node_http = node.http_address if node is not None and node.http_port else None
        state = self._partitions.state(endpoint.partition)
        return await self.positions.plan(endpoint.partition, node_http, self.route, state)

    def subscribed(self, link: Link) -> None:
        """The SUB of ``link`` went through: its start is done, its messages may take the fast lane."""
        partition = link.endpoint.partition
        self.positions.subscribed(partition)
        if self.fins_newest_first and link.conn.is_ha and not self.ordered:
            link.conn.batch_fins()  # (ordered: one message in flight per partition, nothing to batch)
            link.attach(link.conn)
        link.inspect_ext = self.decompress and bool(link.conn.extend_support)
        link.fast = self._fast_allowed() and partition not in self.positions.checking

    def starting(self, partition: int | None) -> bool:
        """Whether ``partition``'s start is still checked: its connection takes its whole RDY at once.
        Raised from RDY 1 while the first message was in flight, youzan's nsqd (b16e68eb) sent the
        message at the start twice (SUB with a start, then the reset of the channel's reader)."""
        return partition in self.positions.checking

    def subscribe_failed(self, endpoint: Endpoint) -> None:
        self.positions.failed(endpoint.partition)

    # ---- messages --------------------------------------------------------------------------

    def inspect(self, link: Link, message: Any) -> bool:
        """Before the handler: False when the message was answered here (a held message from
        before the start is finished; a body that cannot be decompressed is requeued)."""
        partition = link.endpoint.partition
        if self.positions.checking:
            if self.positions.held_before_start(partition, message):
                self._partitions.state(partition).start_skipped += 1
                logger.info("%s partition %s: finishing the message held from before the start (offset %s)",
                            link.endpoint.address, partition, message.offset)
                message.finish()
                return False
            if partition not in self.positions.checking and self._fast_allowed() and not link.closed:
                link.fast = True  # the start is reached: back to the fast lane
        if self.decompress and message.ext_bytes is not None:
            try:
                bodies.decompress_message(message)
            except bodies.BodyDecompressError as exc:
                self._partitions.state(partition).decompress_errors += 1
                if self.max_attempts and message.attempts > self.max_attempts:
                    return True  # given up on next, as it arrived (the give-up hook sees it)
                logger.error("%s: %s; requeueing message %r", link.endpoint.address, exc, message)
                message.requeue()
                return False
        return True

    async def close(self) -> None:
        await self.positions.close()
