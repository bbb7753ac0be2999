"""The few calls to an HA nsqd's HTTP API that the clients need: a channel's state and its start.

One job: one HTTP request per call to one nsqd (aiohttp, imported on first use), for what
the NSQ TCP protocol cannot say: how many clients a channel of one partition has (a start
position only takes on the channel's first client), where the partition ends, and
``POST /channel/setoffset``, the only way to start one partition of a node that leads
several (``SUB_ADVANCED`` with a start position ignores the partition it names on such a
node). youzan/nsq ``nsqdserver/http.go`` doSetChannelOffset.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import NsqdHTTPError

if TYPE_CHECKING:
    import aiohttp

__all__ = ["ChannelState", "NsqdHTTP", "NsqdHTTPError", "PartitionEnds"]

_ACCEPT_V1 = "application/vnd.nsq; version=1.0"


@dataclass(frozen=True)
class ChannelState:
    """One channel of one partition as nsqd's ``/stats`` shows it.

    ``exists``: the channel is there; ``clients``: its subscribed clients;
    ``end_offset``: the partition's end (disk-queue offset: the next message is written there).
    """

    exists: bool
    clients: int
    end_offset: int | None


@dataclass(frozen=True)
class PartitionEnds:
    """One partition of an HA topic as one node's ``/stats`` shows it (youzan's fields).

    ``start``: the first offset still on disk (``backend_start``: retention cleans before it);
    ``end``: where the next message will be written (``backend_depth``); ``count``: messages
    written since the partition began (``message_count``), the count at ``end``; ``leader``:
    this node leads the partition (``is_leader``); ``ext``: an ext topic (``is_ext``).
    """

    partition: int
    start: int
    end: int
    count: int
    leader: bool
    ext: bool


class NsqdHTTP:
    """Asks one HA nsqd per call; ``address`` is its ``host:port`` HTTP address.

    Example::

        http = NsqdHTTP(timeout=5.0)
        state = await http.channel_state("127.0.0.1:4151", "events", 2, "archive")
        if not state.clients:
            await http.set_channel_offset("127.0.0.1:4151", "events", 2, "archive", "virtual_queue:4096")
        await http.close()
    """

    def __init__(self, *, timeout: float = 10.0) -> None:
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def channel_state(self, address: str, topic: str, partition: int, channel: str) -> ChannelState:
        """``GET /stats?format=json&topic=T``, read for ``partition`` and ``channel``."""
        answer = await self._request("GET", address, "stats", {"format": "json", "topic": topic})
        return parse_channel_state(answer, topic, partition, channel)

    async def stats(self, address: str, topic: str, channel: str | None = None) -> Any:
        """``GET /stats?format=json&topic=T[&channel=C]`` without the clients lists, as nsqd answers it."""
        query = {"format": "json", "topic": topic, "needClients": "false"}
        if channel is not None:
            query["channel"] = channel
        return await self._request("GET", address, "stats", query)

    async def create_channel(self, address: str, topic: str, partition: int, channel: str) -> None:
        """``POST /channel/create`` on the partition's leader (nothing happens if it exists)."""
        await self._request("POST", address, "channel/create", _where(topic, partition, channel))

    async def set_channel_offset(self, address: str, topic: str, partition: int, channel: str, position: str) -> None:
        """``POST /channel/setoffset`` with ``position`` (``type:value``) as the body.

        nsqd moves the channel there whatever clients it has (the first-client rule is the
        caller's to check, with :meth:`channel_state`).
        """
        await self._request("POST", address, "channel/setoffset", _where(topic, partition, channel), position.encode())

    async def delete_channel(self, address: str, topic: str, partition: int, channel: str) -> None:
        """``POST /channel/delete`` on the partition's leader."""
        await self._request("POST", address, "channel/delete", _where(topic, partition, channel))

    async def partition_ends(self, address: str, topic: str) -> dict[int, PartitionEnds]:
        """``GET /stats?format=json&topic=T``: every partition of ``topic`` the node holds."""
        answer = await self._request("GET", address, "stats", {"format": "json", "topic": topic})
        return parse_partition_ends(answer, topic)

    async def message_at(
        self, address: str, topic: str, partition: int, *, count: int = 0, offset: int | None = None
    ) -> tuple[int, int]:
        """``GET /message/get``: where the ``count``-th message (from 1) begins, or with ``offset``
        the first message at or after it (``search_mode=count`` / ``virtual_offset``).

        Returns ``(offset, messages before it)``; the offset is a message boundary, which a
        channel can be moved to. nsqd answers 500 past the partition's end.
        """
        found, before, _ = await self.message_record(address, topic, partition, count=count, offset=offset)
        return found, before

    async def message_record(
        self, address: str, topic: str, partition: int, *, count: int = 0, offset: int | None = None
    ) -> tuple[int, int, int]:
        """As :meth:`message_at`, with the message's ``timestamp`` (nanoseconds: when nsqd wrote it):
        ``(offset, messages before it, timestamp)``."""
        mode, position = ("count", count) if offset is None else ("virtual_offset", offset)
        query = {"topic": topic, "partition": str(partition), "search_mode": mode, "search_pos": str(position)}
        answer = await self._request("GET", address, "message/get", query)
        try:
            return int(answer["offset"]), int(answer["queue_cnt_index"]) - 1, int(answer.get("timestamp", 0))
        except (TypeError, KeyError, ValueError, AttributeError):
            raise NsqdHTTPError(f"nsqd {address} /message/get?{query} answered without offset and "
                                f"queue_cnt_index: {answer!r:.200}") from None

    async def _request(
        self, method: str, address: str, path: str, query: dict[str, str], body: bytes | None = None
    ) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"http://{address}/{path}"
        try:
            async with self._session.request(
                method, url, params=query, data=body, headers={"Accept": _ACCEPT_V1},
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            ) as response:
                data = await response.read()
                status = response.status
        except asyncio.TimeoutError:
            raise NsqdHTTPError(f"nsqd {url} did not answer within {self._timeout} s") from None
        except aiohttp.ClientError as exc:
            raise NsqdHTTPError(f"nsqd {url} unreachable: {exc}") from exc
        answer = _json_or_none(data)
        if status != 200:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise NsqdHTTPError(f"nsqd {url}?{query} answered {status}: {message or data[:200]!r}")
        # youzan's v1-only routes answer bare; NegotiateVersion ones may still wrap in "data".
        if isinstance(answer, dict) and "status_code" in answer and "data" in answer:
            answer = answer["data"]
        return answer


def parse_channel_state(stats: Any, topic: str, partition: int, channel: str) -> ChannelState:
    """Read one channel of one partition from a ``/stats`` answer (youzan's fields, and upstream's).

    >>> stats = {"topics": [{"topic_name": "t", "topic_partition": "1", "backend_depth": 96,
    ...           "channels": [{"channel_name": "c", "client_num": 2}]}]}
    >>> parse_channel_state(stats, "t", 1, "c")
    ChannelState(exists=True, clients=2, end_offset=96)
    """
    topics = stats.get("topics") if isinstance(stats, dict) else None
    for entry in topics or ():
        if entry.get("topic_name") != topic or str(entry.get("topic_partition", "")) != str(partition):
            continue
        end = entry.get("backend_depth")
        end_offset = int(end) if isinstance(end, int) else None
        for found in entry.get("channels") or ():
            if found.get("channel_name") == channel:
                return ChannelState(True, _client_count(found), end_offset)
        return ChannelState(False, 0, end_offset)
    return ChannelState(False, 0, None)


def parse_partition_ends(stats: Any, topic: str) -> dict[int, PartitionEnds]:
    """Every partition of ``topic`` in a ``/stats`` answer that has youzan's queue fields.

    >>> stats = {"topics": [{"topic_name": "t", "topic_partition": "1", "backend_start": 40,
    ...           "backend_depth": 96, "message_count": 2, "is_leader": True, "is_ext": False}]}
    >>> parse_partition_ends(stats, "t")[1]
    PartitionEnds(partition=1, start=40, end=96, count=2, leader=True, ext=False)
    """
    found: dict[int, PartitionEnds] = {}
    topics = stats.get("topics") if isinstance(stats, dict) else None
    for entry in topics or ():
        if entry.get("topic_name") != topic:
            continue
        try:
            partition = int(entry["topic_partition"])
            ends = PartitionEnds(partition, int(entry.get("backend_start", 0)), int(entry["backend_depth"]),
                                 int(entry["message_count"]), bool(entry.get("is_leader", True)),
                                 bool(entry.get("is_ext", False)))
        except (KeyError, TypeError, ValueError):
            continue  # not youzan's HA nsqd (upstream has no partitions or queue offsets)
        found[partition] = ends
    return found


def _client_count(channel: dict[str, Any]) -> int:
    for key in ("client_num", "client_count"):  # youzan's name, then upstream's
        if isinstance(channel.get(key), int):
            return int(channel[key])
    return len(channel.get("clients") or ())


def _where(topic: str, partition: int, channel: str) -> dict[str, str]:
    return {"topic": topic, "partition": str(partition), "channel": channel}


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None
