"""Producer: publishing to many nsqd, pipelined, coalesced, with failover and retries.

The :class:`Producer` (``producer``) publishes through its connection pool (``pool``),
routes HA publishes to partition leaders (``routing``, on :mod:`fastnsq.topology` and
:mod:`fastnsq.sharding`) and checks what it sends (``messages``). ``RECALL`` and ``SLOW_HOLD``
(``suspects``): the re-send rule for a slow nsqd, which ``fastnsq to-nsq`` follows too.
"""

from ..sharding import murmur3_32
from .producer import NOT_RETRYABLE, PRODUCER_DEFAULTS, Producer
from .suspects import RECALL, SLOW_HOLD

__all__ = ["NOT_RETRYABLE", "PRODUCER_DEFAULTS", "RECALL", "SLOW_HOLD", "Producer", "murmur3_32"]
