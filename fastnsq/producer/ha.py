"""What a producer does only for youzan's HA nsqd, in one place the Producer calls through a few hooks.

One job: the HA options of :class:`~fastnsq.Producer` (youzan/go-nsq's names, snake_case)
and what they change:

* ``topics_for_compress``, ``message_size_for_compress`` (20480),
  ``client_compress_decodec`` ("not_specified", "gzip", "snappy", "lz4"): client-side body
  compression of publishes that carry an ext header, as youzan/go-nsq compresses only its
  ``*WithJsonExt`` publishes (:mod:`fastnsq.bodies`);
* ``pub_strategy`` and the per-node figures: :mod:`.load`;
* ``pub_max_background_retry``, ``pub_background_buffer``: :mod:`.background`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..bodies import DEFAULT_MESSAGE_SIZE_FOR_COMPRESS, BodyCompressor

__all__ = ["HA_PRODUCER_DEFAULTS", "HAProducer"]

#: youzan/go-nsq's producer options (snake_case), with their defaults.
HA_PRODUCER_DEFAULTS: dict[str, Any] = {
    "topics_for_compress": (),
    "message_size_for_compress": DEFAULT_MESSAGE_SIZE_FOR_COMPRESS,
    "client_compress_decodec": "not_specified",
}


class HAProducer:
    """The HA side of one producer: compression of ext publishes."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.bodies = BodyCompressor(
            settings["topics_for_compress"], settings["message_size_for_compress"],
            settings["client_compress_decodec"],
        )
        self.compressing = self.bodies.active

    def compress(self, topic: str, body: Any, ext: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
        """A publish with an ext header: its body and header as they go out."""
        return self.bodies.apply(topic, body, ext)

    def compress_batch(
        self, topic: str, bodies: list[Any], exts: Sequence[Mapping[str, Any]]
    ) -> tuple[list[Any], list[Mapping[str, Any]]]:
        """:meth:`compress` for each message of an ``mpublish`` with ``exts``."""
        pairs = [self.bodies.apply(topic, body, ext) for body, ext in zip(bodies, exts)]
        return [body for body, _ in pairs], [ext for _, ext in pairs]
