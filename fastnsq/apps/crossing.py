"""``fastnsq to-nsq`` across dialects: how a batch goes out to a destination topic of either kind.

One job: split a batch into the MPUBs it goes out as, and say what each carries, from the
destination topic's route (:class:`~fastnsq.topology.TopicRoute`, None when the destination
nsqd are given by address):

* **sharding key** (``--sharding-key-json-field``): on a partitioned (youzan HA) topic, the
  messages are grouped by the partition their key hashes to (the Producer's hash and the
  topic's partition count), a group published with one of its keys, so that every message of
  a key lands on that key's partition, in the order the batch had them. A message without the
  field (or not a JSON object) has no key: the Producer takes turns over the partitions.
* **ext header and trace id**, which only youzan's nsqd speak: a message read from an HA
  topic keeps its JSON ext header on an ext destination topic (MPUB_EXT, a trace id as
  ``##trace_id``) and its trace id on any HA topic (MPUB_TRACE). An upstream nsqd takes
  neither: its messages go out as plain MPUB, bodies only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..sharding import Hasher, key_bytes
from ..topology import TopicRoute
from .jsonfilter import json_key

logger = logging.getLogger("fastnsq.apps.to_nsq")

@dataclass
class Part:
    """One MPUB of a batch: its messages (answered by its outcome) and what it carries."""

    messages: list[Any]
    bodies: list[bytes]
    sharding_key: Any = None
    exts: list[dict[str, Any]] | None = None
    trace_ids: list[int] | None = None

    def publish_options(self) -> dict[str, Any]:
        """The keyword arguments of ``Producer.mpublish`` for this part."""
        options: dict[str, Any] = {}
        if self.sharding_key is not None:
            options["sharding_key"] = self.sharding_key
        if self.exts is not None:
            options["exts"] = self.exts
        if self.trace_ids is not None:
            options["trace_ids"] = self.trace_ids
        return options


class NoPartitionsError(Exception):
    """Keys to route and no partitions to route them to: the batch is requeued."""


class Crossing:
    """Splits batches for one destination topic (``key_field`` empty: no sharding key)."""

    def __init__(self, key_field: str, hasher: Hasher) -> None:
        self.key_field = key_field
        self.hasher = hasher
        self._warned = False

    def split(self, route: TopicRoute | None, messages: Sequence[Any], bodies: Sequence[bytes]) -> list[Part]:
        if self.key_field and route is not None and not (route.endpoints or route.partitions):
            # Not round robin meanwhile: a key's messages would land on other partitions.
            raise NoPartitionsError(f"the lookupds list no nsqd for topic {route.topic} (not created yet?): "
                                    "--sharding-key-json-field waits for its partitions")
        if route is None or not route.is_ha:
            if self.key_field and route is not None and not self._warned:
                self._warned = True
                logger.warning("--sharding-key-json-field %s is not used: the destination topic %s is not "
                               "partitioned (an upstream nsqd)", self.key_field, route.topic)
            return [Part(list(messages), list(bodies))]
        if not self.key_field:
            return [self._carried(route, list(messages), list(bodies))]
        count = route.partition_num or len(route.partitions)
        if not count:
            raise NoPartitionsError(f"the lookupds list no partition of topic {route.topic} yet")
        groups: dict[int | None, tuple[list[Any], list[bytes], list[Any]]] = {}
        for message, body in zip(messages, bodies):
            key = json_key(message.body, self.key_field)  # the source's body: a whitelist may drop the field
            pid = None if key is None else self.hasher(key_bytes(key)) % count
            group = groups.setdefault(pid, ([], [], []))
            group[0].append(message)
            group[1].append(body)
            group[2].append(key)
        parts = []
        for group_messages, group_bodies, keys in groups.values():
            part = self._carried(route, group_messages, group_bodies)
            part.sharding_key = keys[0]
            parts.append(part)
        return parts

    @staticmethod
    def _carried(route: TopicRoute, messages: list[Any], bodies: list[bytes]) -> Part:
        """A part for an HA topic, with the source's ext headers and trace ids where it had any."""
        traces = [getattr(message, "trace_id", None) or 0 for message in messages]
        traced = any(traces)
        if route.extend_support:
            exts = [getattr(message, "ext", None) for message in messages]
            if any(ext is not None for ext in exts) or traced:
                return Part(messages, bodies, exts=[_with_trace(ext, trace) for ext, trace in zip(exts, traces)])
        if traced:
            return Part(messages, bodies, trace_ids=traces)
        return Part(messages, bodies)


def _with_trace(ext: Any, trace_id: int) -> dict[str, Any]:
    header = dict(ext) if isinstance(ext, dict) else {}
    if trace_id and "##trace_id" not in header:
        header["##trace_id"] = str(trace_id)  # PUB_EXT's way to carry a trace id
    return header
