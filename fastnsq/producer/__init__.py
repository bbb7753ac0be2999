"""Producer: publishing to many nsqd, pipelined, coalesced, with failover and retries.

The :class:`Producer` (``producer``) publishes through its connection pool (``pool``),
routes HA publishes to partition leaders (``routing``, on :mod:`fastnsq.topology` and
:mod:`fastnsq.sharding`) and checks what it sends (``messages``).
"""

from ..sharding import murmur3_32
from .producer import NOT_RETRYABLE, PRODUCER_DEFAULTS, Producer

__all__ = ["NOT_RETRYABLE", "PRODUCER_DEFAULTS", "Producer", "murmur3_32"]
