"""The coalescer's flush: once per loop pass, one PUB or MPUB per batch of concurrent publishes.

Each connection's commands of the pass go out in one write at the end of the flush, not in a loop
pass of their own (a pass per message at 10,000 msg/s of lone publishes). A batch is the command's
answer (no future): nsqd's answer resolves its publishes in the read that brings it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import NoConnectionError
from .ha import HAProducer
from .messages import MPUB_FRAMING
from .pool import ConnectionPool
from .routing import Router

if TYPE_CHECKING:
    from ..conn import Connection

__all__ = ["FLUSH_AT", "FLUSH_BYTES", "BatchWriter"]

#: A batch this full (messages, or MPUB bytes) is sent at once rather than at the end of the
#: loop pass: nsqd starts on it while the pass goes on. With 1,000 concurrent publishers on
#: this project's 2-core machine, 512 took throughput from ~630k to ~1.05M msg/s.
FLUSH_AT = 512
FLUSH_BYTES = 64 * 1024


class BatchWriter:
    """Writes the coalescer's batches on the pool's connections (the producer's ``_flush_batches``)."""

    def __init__(self, pool: ConnectionPool, router: Router, ha: HAProducer, max_body_size: int) -> None:
        self._pool = pool
        self._router = router
        self._ha = ha
        self._mpub_limit = max_body_size - MPUB_FRAMING
        self._mpub_max_count = (max_body_size - 4) // 5

    def flush(self, batches: dict[Any, Any]) -> None:
        """Called by the coalescer once per pass: ``batches`` by key, a topic or (topic, nsqd, partition)."""
        self._router.new_pass()  # the next pass takes the next partition
        held: list[Connection] = []
        try:
            for key, batch in batches.items():
                if type(key) is str:
                    topic, address, pid = key, None, None
                else:
                    topic, address, pid = key
                conn = self._pool.pick(address)
                if conn is None:
                    batch.fail(NoConnectionError(f"no open connection to {address or 'any nsqd'}"))
                    continue
                if conn not in held and conn.hold_writes():
                    held.append(conn)
                self._write(conn, topic, pid, batch)
                if len(batch) >= FLUSH_AT or batch.nbytes >= FLUSH_BYTES:
                    conn.flush()  # a full batch: let nsqd start on it while this pass goes on
        finally:
            for conn in held:
                conn.release_writes()

    def _write(self, conn: Connection, topic: str, pid: int | None, batch: Any) -> None:
        """One PUB, or MPUBs under nsqd's limits; a part that cannot be sent fails with the rest."""
        if len(batch) == 1 or batch.nbytes <= self._mpub_limit and len(batch) <= self._mpub_max_count:
            parts = [batch]
        else:
            parts = batch.split(self._mpub_limit, self._mpub_max_count)
        for index, part in enumerate(parts):
            part.on_settled = self._ha.timer(conn.address)
            try:
                if len(part) == 1:
                    conn.publish(topic, part.bodies[0], partition=pid, answer=part)
                else:
                    conn.mpublish(topic, part.bodies, partition=pid, answer=part)
            except Exception as exc:  # noqa: BLE001 - e.g. the connection closed during this pass: every part fails with it
                for unsent in parts[index:]:
                    unsent.fail(exc)
                return
