"""Consumer: discovery, reconnects, RDY, backoff, handlers, batches and graceful stop.

The rules are the NSQ client guide's (the peers' sources show where they break
them). The :class:`Consumer` (``consumer``) owns the connections; what happens to each
message is its dispatcher's (``dispatch``); what it knows of each partition is in
``partitions``; ``batch`` is what ``Consumer.batches()`` yields. The RDY and backoff
decisions live in :mod:`fastnsq.rdy` and :mod:`fastnsq.backoff`, pure state machines.
"""

from ..stats import ConnectionStats, ConsumerStats
from .batch import Batch
from .consumer import CONSUMER_DEFAULTS, Consumer, StopReport
from .partitions import PartitionState
from .positions import ConsumeOffset

__all__ = [
    "CONSUMER_DEFAULTS", "Batch", "ConnectionStats", "ConsumeOffset", "Consumer", "ConsumerStats", "PartitionState",
    "StopReport",
]
