"""nsqlookupd over HTTP: ask where a topic lives and turn the answers into nsqd endpoints.

One job: talk HTTP to nsqlookupd (upstream nsqio 1.x and youzan's HA lookupd) and
reduce its answers to the set of :class:`Endpoint` a consumer or producer should
connect to. Nothing here opens an NSQ TCP connection.

Three layers, each usable alone:

* pure parsers (:func:`parse_lookup`, :func:`parse_listlookup`, ...) that take
  the HTTP status, headers and body and return typed results; they know both
  answer forms (the bare v1 object and the legacy ``{"status_code", "status_txt",
  "data"}`` wrapper), the HA ``partitions``/``meta`` additions, ``null`` lists
  and empty bodies (shared/protocol.md §8, §9.12, §11.6 item 17);
* :class:`LookupdClient`, one aiohttp request per call, always with
  ``Accept: application/vnd.nsq; version=1.0``;
* :class:`LookupdPoller`, which polls every lookupd concurrently, keeps the last
  answer of a lookupd that fails, asks a lookupd that keeps failing less often,
  and on HA first discovers the cluster's lookupd nodes with ``/listlookup``.

Example::

    async with LookupdPoller(["127.0.0.1:4161"], "events", access="r", metainfo=True) as poller:
        found = await poller.poll_once()
        for endpoint, node in found.endpoints.items():
            print(endpoint.address, endpoint.partition, node.version)
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from fastnsq.config import Endpoint
from fastnsq.errors import InvalidValueError, NSQError

if TYPE_CHECKING:
    import aiohttp
    from typing_extensions import Self

# aiohttp and yarl are imported on first use, not here: importing aiohttp takes about a
# quarter of a second (its connector builds an SSL context), which every `import fastnsq`,
# every `fastnsq pub` and every Spark worker would pay without ever asking a lookupd.

__all__ = [
    "ACCEPT_V1",
    "Discovery",
    "Endpoint",
    "ListLookupResult",
    "LookupResult",
    "LookupdClient",
    "LookupdError",
    "LookupdHTTPError",
    "LookupdInfo",
    "LookupdNode",
    "LookupdPoller",
    "NodeInfo",
    "Producer",
    "TopicMeta",
    "decode_response",
    "merge_meta",
    "normalize_lookupd_address",
    "parse_channels",
    "parse_info",
    "parse_listlookup",
    "parse_lookup",
    "parse_nodes",
    "parse_topics",
]

logger = logging.getLogger(__name__)

#: The Accept header go-nsq sends; with it both lookupds answer the bare v1 object.
ACCEPT_V1 = "application/vnd.nsq; version=1.0"

# The response header that marks a bare v1 body (Go canonicalises it to X-Nsq-Content-Type).
_V1_HEADER = "x-nsq-content-type"

# Texts of lookup errors that only mean "nobody has this topic (for this access mode)":
# upstream's unknown topic, HA's etcd ErrKeyNotFound with access=w, and HA's
# no-channel filter with access=w (shared/protocol.md §8, §9.12).
_NO_PRODUCER_MESSAGES = ("TOPIC_NOT_FOUND", "Key not found")
_NO_PRODUCER_PREFIX = "Topic has no channel"
_HA_ONLY_MESSAGES = ("Key not found",)

_DECIMAL = re.compile(r"-?[0-9]{1,20}")

# How much of a junk body an error message quotes.
_QUOTE_LIMIT = 200


class LookupdError(NSQError):
    """nsqlookupd could not be reached, or answered something that is not a lookupd answer."""


class LookupdHTTPError(LookupdError):
    """nsqlookupd answered with an error: ``status`` is the HTTP (or wrapped) status code,
    ``message`` the server's error text (``{"message": ...}`` or the wrapper's ``status_txt``)."""

    def __init__(self, status: int, message: str, url: str = "") -> None:
        self.status = status
        self.message = message
        self.url = url
        where = f" from {url}" if url else ""
        super().__init__(f"nsqlookupd error{where}: HTTP {status} {message}".rstrip())


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One nsqd as nsqlookupd describes it (a "producer" of the topic).

    ``address`` is where to open the NSQ TCP connection: ``broadcast_address:tcp_port``.

    >>> NodeInfo("10.0.0.5", 4150, 4151, "1.3.0").address
    '10.0.0.5:4150'
    >>> NodeInfo("::1", 4150).address
    '[::1]:4150'
    """

    broadcast_address: str
    tcp_port: int
    http_port: int = 0
    version: str = ""
    hostname: str = ""
    remote_address: str = ""

    @property
    def address(self) -> str:
        """``host:port`` of the TCP port, with IPv6 hosts in brackets."""
        return _join_host_port(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``host:port`` of nsqd's HTTP port."""
        return _join_host_port(self.broadcast_address, self.http_port)


#: go-nsq's name for the same thing.
Producer = NodeInfo


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """The HA topic meta an HA lookupd adds with ``metainfo=true`` (cluster mode only).

    ``extend_support`` says whether connections to this topic must set
    ``extend_support`` in IDENTIFY (shared/protocol.md §11.6 item 15).
    ``partition_num == 0`` means the lookupd did not find the meta.
    """

    partition_num: int = 0
    replica: int = 0
    extend_support: bool = False
    ordered: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False


@dataclass(frozen=True, slots=True)
class LookupResult:
    """A parsed ``/lookup`` answer.

    ``partitions`` maps a partition id to the nsqd that leads it (HA only).
    ``is_ha`` is true when the answer had ``partitions`` or ``meta``, which
    only the HA lookupd sends. Treat the mappings as read-only.
    """

    channels: tuple[str, ...] = ()
    producers: tuple[NodeInfo, ...] = ()
    partitions: dict[int, NodeInfo] = field(default_factory=dict)
    meta: TopicMeta | None = None
    is_ha: bool = False

    def endpoints(self) -> dict[Endpoint, NodeInfo]:
        """The endpoints to connect to, each with its node.

        One endpoint per partition a node leads; a producer that leads no listed
        partition (upstream nsqd, old HA node) gets one partition-less endpoint.

        >>> node, old = NodeInfo("10.0.0.5", 4150), NodeInfo("10.0.0.9", 4150)
        >>> for endpoint in LookupResult(producers=(node, old), partitions={0: node, 1: node}).endpoints():
        ...     print(endpoint)
        Endpoint(address='10.0.0.5:4150', partition=0)
        Endpoint(address='10.0.0.5:4150', partition=1)
        Endpoint(address='10.0.0.9:4150', partition=None)
        """
        found: dict[Endpoint, NodeInfo] = {}
        partitioned: set[str] = set()
        for pid in sorted(self.partitions):
            node = self.partitions[pid]
            found[Endpoint(node.address, pid)] = node
            partitioned.add(node.address)
        for node in self.producers:
            if node.address not in partitioned:
                found.setdefault(Endpoint(node.address, None), node)
        return found


@dataclass(frozen=True, slots=True)
class LookupdNode:
    """One lookupd of an HA cluster, from ``/listlookup``.

    >>> LookupdNode("10.0.0.1", http_port=4161).http_address
    'http://10.0.0.1:4161'
    """

    node_ip: str
    http_port: int
    tcp_port: int = 0
    rpc_port: int = 0
    id: str = ""
    epoch: int = 0

    @property
    def http_address(self) -> str:
        """The base URL further lookups go to: ``http://NodeIP:HttpPort``."""
        return "http://" + _join_host_port(self.node_ip, self.http_port)


class ListLookupResult(NamedTuple):
    """A parsed ``/listlookup`` answer.

    ``supported`` is false when the lookupd does not have the endpoint (upstream
    answers ``404 NOT_FOUND``); ``nodes`` is empty on a standalone HA lookupd.
    """

    nodes: tuple[LookupdNode, ...] = ()
    leader: LookupdNode | None = None
    supported: bool = True


class LookupdInfo(NamedTuple):
    """``/info``: the lookupd version, and whether it is an HA lookupd."""

    version: str
    ha_support: bool = False


@dataclass(frozen=True, slots=True)
class Discovery:
    """What one poll of all lookupds found: the union of their answers.

    ``endpoints`` is keyed by ``broadcast_address:tcp_port`` (plus the partition on
    HA); ``meta`` is the merge of every ``meta`` seen (:func:`merge_meta`), ``None``
    when no lookupd sent one; ``lookupds`` are the lookupd base URLs in use.
    """

    endpoints: dict[Endpoint, NodeInfo] = field(default_factory=dict)
    meta: TopicMeta | None = None
    is_ha: bool = False
    channels: frozenset[str] = frozenset()
    lookupds: tuple[str, ...] = ()


# --------------------------------------------------------------------------- pure parsing


def decode_response(status: int, headers: Mapping[str, str], body: bytes | str) -> Any:
    """Decode one lookupd HTTP answer into its payload, or raise.

    A body is the bare object when the response carries ``X-NSQ-Content-Type:
    nsq; version=1.0``; otherwise it is the legacy wrapper
    ``{"status_code", "status_txt", "data"}`` and ``data`` is returned. A body
    without the header and without the wrapper keys is taken as bare, since a
    proxy may drop the header. An empty body gives ``None``.

    Raises :class:`LookupdHTTPError` for an error answer (HTTP status >= 400, or a
    wrapped ``status_code`` other than 200) and :class:`LookupdError` for a body
    that is not JSON.

    >>> decode_response(200, {"X-Nsq-Content-Type": "nsq; version=1.0"}, b'{"topics":["a"]}')
    {'topics': ['a']}
    >>> decode_response(200, {}, b'{"status_code":200,"status_txt":"OK","data":{"topics":[]}}')
    {'topics': []}
    """
    text = _body_text(body)
    if status >= 400:
        raise LookupdHTTPError(status, _error_message(text))
    if not text.strip():
        # HA /listlookup on a standalone lookupd answers 200 with nothing at all.
        return None
    payload = _load_json(text)
    if not _is_v1(headers) and isinstance(payload, dict) and "status_code" in payload:
        return _unwrap(payload)
    return payload


def parse_lookup(status: int, headers: Mapping[str, str], body: bytes | str) -> LookupResult:
    """Parse a ``/lookup`` answer of either lookupd, in either form.

    An unknown topic is not an error: upstream's ``404 TOPIC_NOT_FOUND``, HA's
    ``404 Topic has no channel...`` and ``404 Key not found`` (``access=w``)
    all give a result with no producers.

    >>> v1 = {"X-Nsq-Content-Type": "nsq; version=1.0"}
    >>> parse_lookup(404, v1, b'{"message":"TOPIC_NOT_FOUND"}').producers
    ()
    >>> r = parse_lookup(200, v1, b'{"channels":[],"producers":[{"broadcast_address":"h",'
    ...                           b'"tcp_port":4150}],"partitions":{}}')
    >>> r.producers[0].address, r.is_ha
    ('h:4150', True)
    """
    try:
        payload = decode_response(status, headers, body)
    except LookupdHTTPError as exc:
        if _means_no_producers(exc.message):
            ha = exc.message in _HA_ONLY_MESSAGES or exc.message.startswith(_NO_PRODUCER_PREFIX)
            return LookupResult(is_ha=ha)
        raise
    return lookup_result_from_json(payload)


def lookup_result_from_json(payload: Any) -> LookupResult:
    """Build a :class:`LookupResult` from an already-unwrapped ``/lookup`` object.

    ``None`` (empty body or ``data: null``) is an empty result.
    """
    if payload is None:
        return LookupResult()
    obj = _require_object(payload, "lookup answer")
    partitions = _parse_partitions(obj.get("partitions"))
    raw_meta = obj.get("meta")
    return LookupResult(
        channels=_string_list(obj.get("channels"), "channels"),
        producers=tuple(_parse_node(p, "producers[]") for p in _list(obj.get("producers"), "producers")),
        partitions=partitions,
        meta=None if raw_meta is None else _parse_meta(raw_meta),
        is_ha="partitions" in obj or "meta" in obj,
    )


def parse_listlookup(status: int, headers: Mapping[str, str], body: bytes | str) -> ListLookupResult:
    """Parse an HA ``/listlookup`` answer.

    Keys are Go field names (``NodeIP``, ``HttpPort``), matched case-insensitively;
    ports may be strings. Upstream has no such endpoint and answers ``404
    NOT_FOUND``: that gives ``supported=False``, not an error.

    >>> r = parse_listlookup(200, {"X-Nsq-Content-Type": "nsq; version=1.0"},
    ...     b'{"lookupdnodes":[{"ID":"a","NodeIP":"10.0.0.1","TcpPort":"4160","HttpPort":"4161"}]}')
    >>> r.nodes[0].http_address
    'http://10.0.0.1:4161'
    """
    try:
        payload = decode_response(status, headers, body)
    except LookupdHTTPError as exc:
        if exc.status == 404:
            return ListLookupResult(supported=False)
        raise
    if payload is None:
        return ListLookupResult()
    obj = _lower_keys(_require_object(payload, "listlookup answer"))
    nodes = tuple(_parse_lookupd_node(n) for n in _list(obj.get("lookupdnodes"), "lookupdnodes"))
    leader = obj.get("lookupdleader")
    return ListLookupResult(nodes=nodes, leader=None if leader is None else _parse_lookupd_node(leader))


def parse_topics(status: int, headers: Mapping[str, str], body: bytes | str) -> tuple[str, ...]:
    """Parse ``/topics``: ``{"topics": [...]}``.

    >>> parse_topics(200, {"X-Nsq-Content-Type": "nsq; version=1.0"}, b'{"topics":["a","b"]}')
    ('a', 'b')
    """
    return _string_list(_field(decode_response(status, headers, body), "topics"), "topics")


def parse_channels(status: int, headers: Mapping[str, str], body: bytes | str) -> tuple[str, ...]:
    """Parse ``/channels?topic=T``: ``{"channels": [...]}``."""
    return _string_list(_field(decode_response(status, headers, body), "channels"), "channels")


def parse_nodes(status: int, headers: Mapping[str, str], body: bytes | str) -> tuple[NodeInfo, ...]:
    """Parse ``/nodes``: every nsqd registered with the lookupd."""
    raw = _field(decode_response(status, headers, body), "producers")
    return tuple(_parse_node(p, "producers[]") for p in _list(raw, "producers"))


def parse_info(status: int, headers: Mapping[str, str], body: bytes | str) -> LookupdInfo:
    """Parse ``/info``: ``{"version": ..}`` upstream, plus ``"ha_support"`` on HA."""
    payload = decode_response(status, headers, body)
    obj = _require_object(payload, "info answer")
    return LookupdInfo(
        version=_opt_str(obj.get("version"), "version"),
        ha_support=_opt_bool(obj.get("ha_support"), "ha_support"),
    )


def merge_meta(metas: Iterable[TopicMeta | None]) -> TopicMeta | None:
    """Merge the topic meta of several answers: the largest counts and any flag set.

    Lookupds of one cluster agree; when they do not (one is stale), the larger
    partition count is the newer one, since partitions are only ever added.

    >>> merged = merge_meta([TopicMeta(2, 1), None, TopicMeta(4, 2, extend_support=True)])
    >>> merged.partition_num, merged.replica, merged.extend_support
    (4, 2, True)
    >>> merge_meta([None]) is None
    True
    """
    seen = [m for m in metas if m is not None]
    if not seen:
        return None
    return TopicMeta(
        partition_num=max(m.partition_num for m in seen),
        replica=max(m.replica for m in seen),
        extend_support=any(m.extend_support for m in seen),
        ordered=any(m.ordered for m in seen),
        multi_part=any(m.multi_part for m in seen),
        disable_channel_auto_create=any(m.disable_channel_auto_create for m in seen),
    )


def normalize_lookupd_address(address: str) -> str:
    """The base URL of a lookupd given as ``host:port`` or ``http(s)://host:port[/prefix]``.

    >>> normalize_lookupd_address("127.0.0.1:4161")
    'http://127.0.0.1:4161'
    >>> normalize_lookupd_address("https://lookupd.example:4161/")
    'https://lookupd.example:4161'
    """
    if not isinstance(address, str) or not address.strip():
        raise InvalidValueError(f"lookupd address must be a non-empty 'host:port' string, got {address!r}")
    text = address.strip()
    if "://" not in text:
        text = "http://" + text
    from yarl import URL

    try:
        url = URL(text)
        host = url.host
    except ValueError as exc:
        raise InvalidValueError(
            f"lookupd address {address!r} is not a valid 'host:port' or URL: {exc}"
        ) from None
    if url.scheme not in ("http", "https") or not host:
        raise InvalidValueError(f"lookupd address {address!r}: expected 'host:port' or 'http(s)://host:port'")
    return str(url.with_query(None).with_fragment(None)).rstrip("/")


# --------------------------------------------------------------------------- parsing helpers


def _join_host_port(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTE_LIMIT else text[:_QUOTE_LIMIT] + "...")


def _body_text(body: bytes | str) -> str:
    if isinstance(body, str):
        return body
    try:
        return bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise LookupdError(f"nsqlookupd answer is not UTF-8: {_quote(repr(bytes(body)))}") from None


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise LookupdError(f"nsqlookupd answer is not JSON: {_quote(text)}") from None


def _is_v1(headers: Mapping[str, str]) -> bool:
    value = headers.get(_V1_HEADER)
    if value is None:
        # A plain dict is case-sensitive; aiohttp's CIMultiDict is not.
        value = next((v for k, v in headers.items() if k.lower() == _V1_HEADER), None)
    return value is not None and value.replace(" ", "").lower().startswith("nsq;version=1")


def _unwrap(wrapper: dict[str, Any]) -> Any:
    code = wrapper.get("status_code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise LookupdError(f"nsqlookupd wrapper has a bad status_code: {code!r}")
    if code != 200:
        raise LookupdHTTPError(code, str(wrapper.get("status_txt") or ""))
    return wrapper.get("data")


def _error_message(text: str) -> str:
    """The error text of an error answer: v1 ``message``, wrapped ``status_txt``, or the raw body."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:_QUOTE_LIMIT]
    if isinstance(obj, dict):
        for key in ("message", "status_txt"):
            if isinstance(obj.get(key), str):
                return obj[key]
    return text.strip()[:_QUOTE_LIMIT]


def _means_no_producers(message: str) -> bool:
    return message in _NO_PRODUCER_MESSAGES or message.startswith(_NO_PRODUCER_PREFIX)


def _require_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LookupdError(f"nsqlookupd {what} must be a JSON object, got {_quote(json.dumps(value))}")
    return value


def _field(payload: Any, key: str) -> Any:
    if payload is None:
        return None
    return _require_object(payload, f"answer with {key!r}").get(key)


def _list(value: Any, what: str) -> list[Any]:
    if value is None:  # HA sends null for empty lists and maps
        return []
    if not isinstance(value, list):
        raise LookupdError(f"nsqlookupd {what} must be a list, got {_quote(json.dumps(value))}")
    return value


def _string_list(value: Any, what: str) -> tuple[str, ...]:
    items = _list(value, what)
    if not all(isinstance(item, str) for item in items):
        raise LookupdError(f"nsqlookupd {what} must be a list of strings, got {_quote(json.dumps(items))}")
    return tuple(items)


def _opt_str(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise LookupdError(f"nsqlookupd field {what} must be a string, got {value!r}")
    return value


def _opt_bool(value: Any, what: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise LookupdError(f"nsqlookupd field {what} must be true or false, got {value!r}")
    return value


def _int(value: Any, what: str, *, low: int, high: int, default: int | None = None) -> int:
    """An integer field that may arrive as a JSON number or a decimal string."""
    if value is None or value == "":
        if default is not None:
            return default
        raise LookupdError(f"nsqlookupd field {what} is missing")
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = int(value)
    else:
        number = None
    if number is None or not low <= number <= high:
        raise LookupdError(f"nsqlookupd field {what} must be an integer in {low}..{high}, got {value!r}")
    return number


def _parse_node(raw: Any, what: str) -> NodeInfo:
    obj = _require_object(raw, what)
    host = obj.get("broadcast_address")
    if not isinstance(host, str) or not host:
        raise LookupdError(f"nsqlookupd {what} has no broadcast_address: {_quote(json.dumps(obj))}")
    return NodeInfo(
        broadcast_address=host,
        tcp_port=_int(obj.get("tcp_port"), "tcp_port", low=1, high=65535),
        http_port=_int(obj.get("http_port"), "http_port", low=0, high=65535, default=0),
        version=_opt_str(obj.get("version"), "version"),
        hostname=_opt_str(obj.get("hostname"), "hostname"),
        remote_address=_opt_str(obj.get("remote_address"), "remote_address"),
    )


def _parse_partitions(raw: Any) -> dict[int, NodeInfo]:
    if raw is None:
        return {}
    obj = _require_object(raw, "partitions")
    partitions: dict[int, NodeInfo] = {}
    for key, peer in obj.items():
        # Keys are decimal strings ("0", "1").
        pid = _int(key, "partition id", low=-(2**31), high=2**31 - 1)
        node = _parse_node(peer, f"partitions[{key!r}]")
        if pid < 0:
            # Old (non-HA) nodes have pid -11 and the server never lists them here;
            # if one shows up anyway it is partition-less, like in `producers`.
            logger.debug("lookupd listed negative partition %d for %s; ignoring it", pid, node.address)
            continue
        partitions[pid] = node
    return partitions


def _parse_meta(raw: Any) -> TopicMeta:
    obj = _require_object(raw, "meta")
    return TopicMeta(
        partition_num=_int(obj.get("partition_num"), "meta.partition_num", low=0, high=2**31 - 1, default=0),
        replica=_int(obj.get("replica"), "meta.replica", low=0, high=2**31 - 1, default=0),
        extend_support=_opt_bool(obj.get("extend_support"), "meta.extend_support"),
        ordered=_opt_bool(obj.get("ordered"), "meta.ordered"),
        multi_part=_opt_bool(obj.get("multi_part"), "meta.multi_part"),
        disable_channel_auto_create=_opt_bool(
            obj.get("disable_channel_auto_create"), "meta.disable_channel_auto_create"
        ),
    )


def _lower_keys(obj: dict[str, Any]) -> dict[str, Any]:
    # Go's encoding/json matches keys case-insensitively; /listlookup relies on it.
    return {str(k).lower(): v for k, v in obj.items()}


def _parse_lookupd_node(raw: Any) -> LookupdNode:
    obj = _lower_keys(_require_object(raw, "lookupd node"))
    ip = obj.get("nodeip")
    if not isinstance(ip, str) or not ip:
        raise LookupdError(f"nsqlookupd listlookup node has no NodeIP: {_quote(json.dumps(raw))}")
    return LookupdNode(
        node_ip=ip,
        http_port=_int(obj.get("httpport"), "HttpPort", low=1, high=65535),
        tcp_port=_int(obj.get("tcpport"), "TcpPort", low=0, high=65535, default=0),
        rpc_port=_int(obj.get("rpcport"), "RpcPort", low=0, high=65535, default=0),
        id=_opt_str(obj.get("id"), "ID"),
        epoch=_int(obj.get("epoch"), "Epoch", low=-(2**63), high=2**63 - 1, default=0),
    )


# --------------------------------------------------------------------------- HTTP client


Access = Literal["r", "w"]


class LookupdClient:
    """Asks one lookupd per call over HTTP (aiohttp).

    Every request sends ``Accept: application/vnd.nsq; version=1.0``; with
    ``auth_secret`` it also sends ``Authorization: Bearer <secret>``, as go-nsq
    does for lookupd. ``address`` is ``host:port`` or ``http(s)://host:port``.
    A session passed in is used and left open; without one the client makes its
    own and :meth:`close` closes it.

    Example::

        async with LookupdClient(timeout=5.0) as client:
            result = await client.lookup("127.0.0.1:4161", "events", access="r")
            print([node.address for node in result.producers])
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        *,
        timeout: float = 60.0,
        auth_secret: str | None = None,
    ) -> None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise InvalidValueError(f"lookupd timeout must be a number of seconds > 0, got {timeout!r}")
        if auth_secret is not None and not isinstance(auth_secret, str):
            raise InvalidValueError("auth_secret must be a string or None")
        import aiohttp

        self._session = session
        self._owns_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=float(timeout))
        self._headers = {"Accept": ACCEPT_V1}
        if auth_secret:
            self._headers["Authorization"] = f"Bearer {auth_secret}"

    def __repr__(self) -> str:
        # Never show the secret; only whether one is set.
        auth = "set" if "Authorization" in self._headers else "none"
        return f"<LookupdClient timeout={self._timeout.total}s auth={auth}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session if this client created it."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def lookup(
        self,
        address: str,
        topic: str,
        *,
        access: Access | None = None,
        metainfo: bool = False,
        partition: int | None = None,
    ) -> LookupResult:
        """``GET /lookup?topic=T[&access=r|w][&metainfo=true][&partition=P]``.

        ``access``, ``metainfo`` and ``partition`` are HA parameters; upstream
        ignores them, so sending them to either lookupd is safe. An unknown topic
        gives a result with no producers.
        """
        if not isinstance(topic, str) or not topic:
            raise InvalidValueError(f"topic must be a non-empty string, got {topic!r}")
        query: dict[str, str] = {"topic": topic}
        if access is not None:
            if access not in ("r", "w"):
                raise InvalidValueError(f"access must be 'r', 'w' or None, got {access!r}")
            query["access"] = access
        if metainfo:
            query["metainfo"] = "true"
        if partition is not None:
            if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
                raise InvalidValueError(f"partition must be an integer >= 0 or None, got {partition!r}")
            query["partition"] = str(partition)
        return await self._get(address, "lookup", query, parse_lookup)

    async def listlookup(self, address: str) -> ListLookupResult:
        """``GET /listlookup``: the lookupd nodes of an HA cluster (``supported=False`` upstream)."""
        return await self._get(address, "listlookup", {}, parse_listlookup)

    async def topics(self, address: str) -> tuple[str, ...]:
        """``GET /topics``: every topic the lookupd knows."""
        return await self._get(address, "topics", {}, parse_topics)

    async def channels(self, address: str, topic: str) -> tuple[str, ...]:
        """``GET /channels?topic=T``: the channels registered for a topic."""
        if not isinstance(topic, str) or not topic:
            raise InvalidValueError(f"topic must be a non-empty string, got {topic!r}")
        return await self._get(address, "channels", {"topic": topic}, parse_channels)

    async def nodes(self, address: str) -> tuple[NodeInfo, ...]:
        """``GET /nodes``: every nsqd registered with the lookupd."""
        return await self._get(address, "nodes", {}, parse_nodes)

    async def info(self, address: str) -> LookupdInfo:
        """``GET /info``: version, and ``ha_support`` on an HA lookupd."""
        return await self._get(address, "info", {}, parse_info)

    async def _get(
        self,
        address: str,
        path: str,
        query: Mapping[str, str],
        parse: Callable[[int, Mapping[str, str], bytes], Any],
    ) -> Any:
        import aiohttp
        from yarl import URL

        url = URL(normalize_lookupd_address(address)) / path
        if query:
            url = url.with_query(query)
        session = self._ensure_session()
        try:
            async with session.get(url, headers=self._headers, timeout=self._timeout) as response:
                body = await response.read()
                status, headers = response.status, response.headers
        except asyncio.TimeoutError:  # aiohttp raises it; an alias of TimeoutError only from 3.11
            raise LookupdError(f"nsqlookupd {url} did not answer within {self._timeout.total}s") from None
        except aiohttp.ClientError as exc:
            raise LookupdError(f"nsqlookupd {url} unreachable: {exc}") from exc
        try:
            return parse(status, headers, body)
        except LookupdHTTPError as exc:
            raise LookupdHTTPError(exc.status, exc.message, str(url)) from None
        except LookupdError as exc:
            raise LookupdError(f"{exc} (from {url})") from None

    def _ensure_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop, which aiohttp wants.
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession()
        return self._session


# --------------------------------------------------------------------------- poller


class _Health:
    """Failure count of one lookupd and how many polls it still sits out."""

    __slots__ = ("failures", "skip")

    def __init__(self) -> None:
        self.failures = 0
        self.skip = 0

    def take_turn(self) -> bool:
        """Whether to ask this lookupd in this poll (consumes one skipped poll if not)."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def record(self, ok: bool, max_skip: int) -> None:
        if ok:
            self.failures = 0
            self.skip = 0
            return
        self.failures += 1
        # A first failure may be a blip: retry next poll. Then sit out 1, 3, 7, ... polls.
        self.skip = min(2 ** (self.failures - 1) - 1, max_skip)


class LookupdPoller:
    """Polls every configured lookupd for one topic and keeps the union of the answers.

    * All lookupds are asked concurrently; :meth:`poll_once` returns a
      :class:`Discovery` whose endpoints are the union of every answer, keyed by
      ``broadcast_address:tcp_port`` and, on HA, the partition.
    * A lookupd that fails keeps its last answer: a failure never drops endpoints.
    * A lookupd that keeps failing sits out polls: after ``n`` failures in a row it
      is skipped for ``min(2**(n-1) - 1, max_skip_polls)`` polls; one good answer
      resets it.
    * With ``discover_lookupds`` (default) every configured lookupd is first asked
      ``/listlookup``; an HA cluster answers with all its lookupd nodes, which
      are then asked instead. A lookupd that answers nothing (standalone HA) or
      does not know the endpoint (upstream: ``404``) is asked itself.
    * :meth:`run` polls forever: a first random delay of up to
      ``poll_jitter * poll_interval`` (so many clients started together spread
      out, as go-nsq), then one poll every ``poll_interval`` seconds, or sooner
      after :meth:`trigger`.

    ``rng`` and ``sleep`` can be replaced, e.g. in tests.

    Example::

        async with LookupdPoller(["10.0.0.1:4161", "10.0.0.2:4161"], "events",
                                 access="r", metainfo=True) as poller:
            await poller.run(on_discovery)   # called with each Discovery
    """

    def __init__(
        self,
        lookupd_http_addresses: Sequence[str] | str,
        topic: str,
        *,
        client: LookupdClient | None = None,
        access: Access | None = None,
        metainfo: bool = False,
        partition: int | None = None,
        poll_interval: float = 60.0,
        poll_jitter: float = 0.3,
        discover_lookupds: bool = True,
        max_skip_polls: int = 8,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        addresses = (
            [lookupd_http_addresses]
            if isinstance(lookupd_http_addresses, str)
            else list(lookupd_http_addresses)
        )
        if not addresses:
            raise InvalidValueError("lookupd_http_addresses must name at least one lookupd")
        _check_number("poll_interval", poll_interval, 0.01, 300.0, "a number of seconds")
        _check_number("poll_jitter", poll_jitter, 0.0, 1.0, "a fraction of poll_interval")
        if not isinstance(max_skip_polls, int) or isinstance(max_skip_polls, bool) or max_skip_polls < 0:
            raise InvalidValueError(f"max_skip_polls must be an integer >= 0, got {max_skip_polls!r}")
        if not isinstance(topic, str) or not topic:
            raise InvalidValueError(f"topic must be a non-empty string, got {topic!r}")
        # dict.fromkeys: de-duplicate, keep the user's order.
        self._configured = tuple(dict.fromkeys(normalize_lookupd_address(a) for a in addresses))
        self._topic = topic
        self._client = client if client is not None else LookupdClient()
        self._owns_client = client is None
        self._access: Access | None = access
        self._metainfo = metainfo
        self._partition = partition
        self.poll_interval = float(poll_interval)
        self.poll_jitter = float(poll_jitter)
        self._discover = discover_lookupds
        self._max_skip = max_skip_polls
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._health: dict[str, _Health] = {}
        self._answers: dict[str, LookupResult] = {}
        # configured lookupd -> base URLs of its cluster's lookupds (absent: ask it directly)
        self._cluster: dict[str, tuple[str, ...]] = {}
        self._no_listlookup: set[str] = set()
        self._lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._last = Discovery()

    def __repr__(self) -> str:
        return f"<LookupdPoller topic={self._topic!r} lookupds={list(self._configured)}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP client if this poller created it."""
        if self._owns_client:
            await self._client.close()

    @property
    def last(self) -> Discovery:
        """The result of the latest poll (empty before the first)."""
        return self._last

    @property
    def endpoints(self) -> dict[Endpoint, NodeInfo]:
        """The endpoints found by the latest poll."""
        return self._last.endpoints

    @property
    def meta(self) -> TopicMeta | None:
        """The merged HA topic meta of the latest poll (``extend_support`` etc.)."""
        return self._last.meta

    def failures(self, address: str) -> int:
        """How many polls in a row the lookupd at ``address`` has failed."""
        health = self._health.get(normalize_lookupd_address(address))
        return 0 if health is None else health.failures

    def trigger(self) -> None:
        """Make :meth:`run` poll now instead of waiting out the interval (e.g. after a lost connection)."""
        self._wakeup.set()

    async def poll_once(self) -> Discovery:
        """Ask the lookupds once and return the union of what every lookupd last said."""
        async with self._lock:
            self._last = await self._poll()
            return self._last

    async def run(self, callback: Callable[[Discovery], Awaitable[None] | None]) -> None:
        """Poll until cancelled, calling ``callback`` with each :class:`Discovery`.

        An exception from ``callback`` is logged and polling goes on.
        """
        await self._pause(self._rng.random() * self.poll_jitter * self.poll_interval)
        while True:
            found = await self.poll_once()
            try:
                outcome = callback(found)
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("lookupd discovery callback failed for topic %r", self._topic)
            await self._pause(self.poll_interval)

    async def _pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or less if :meth:`trigger` is called."""
        if self._wakeup.is_set():
            self._wakeup.clear()
            return
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(self._wakeup.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
            self._wakeup.clear()

    # -- one poll

    async def _poll(self) -> Discovery:
        turns: dict[str, bool] = {}
        failed: set[str] = set()
        await self._discover_clusters(turns, failed)
        targets = self._targets()
        due = [t for t in targets if t not in failed and self._turn(t, turns)]
        outcomes = await asyncio.gather(*(self._lookup(t) for t in due), return_exceptions=True)
        for target, outcome in zip(due, outcomes):
            if isinstance(outcome, LookupResult):
                self._answers[target] = outcome
            else:
                failed.add(target)
                self._log_failure(target, "lookup", outcome)
        for address, asked in turns.items():
            if asked:
                self._record(address, ok=address not in failed)
        # Answers of lookupds that left the cluster no longer count.
        for gone in set(self._answers) - set(targets):
            del self._answers[gone]
        for gone in set(self._health) - set(targets) - set(self._configured):
            del self._health[gone]
        return self._union(targets)

    async def _discover_clusters(self, turns: dict[str, bool], failed: set[str]) -> None:
        if not self._discover:
            return
        asked = [c for c in self._configured if c not in self._no_listlookup and self._turn(c, turns)]
        outcomes = await asyncio.gather(*(self._client.listlookup(c) for c in asked), return_exceptions=True)
        for address, outcome in zip(asked, outcomes):
            if not isinstance(outcome, ListLookupResult):
                # Keep whatever this lookupd said before; it counts as failed for this poll.
                failed.add(address)
                self._log_failure(address, "listlookup", outcome)
            elif not outcome.supported:
                logger.debug("nsqlookupd %s has no /listlookup (upstream); asking it directly", address)
                self._no_listlookup.add(address)
                self._cluster.pop(address, None)
            elif outcome.nodes:
                cluster = tuple(dict.fromkeys(n.http_address for n in outcome.nodes))
                if cluster != self._cluster.get(address):
                    logger.info("nsqlookupd %s: cluster lookupds %s", address, list(cluster))
                self._cluster[address] = cluster
            else:
                self._cluster.pop(address, None)

    def _targets(self) -> list[str]:
        targets: dict[str, None] = {}
        for address in self._configured:
            for target in self._cluster.get(address, (address,)):
                targets[target] = None
        return list(targets)

    def _turn(self, address: str, turns: dict[str, bool]) -> bool:
        # One turn per lookupd per poll, however many requests it gets in that poll.
        if address not in turns:
            turns[address] = self._health.setdefault(address, _Health()).take_turn()
        return turns[address]

    def _record(self, address: str, *, ok: bool) -> None:
        health = self._health.setdefault(address, _Health())
        if ok and health.failures:
            logger.info("nsqlookupd %s answers again after %d failed polls", address, health.failures)
        health.record(ok, self._max_skip)

    def _log_failure(self, address: str, what: str, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        count = self._health.setdefault(address, _Health()).failures + 1
        level = logging.WARNING if isinstance(exc, LookupdError) else logging.ERROR
        logger.log(
            level,
            "nsqlookupd %s: %s for topic %r failed (%d in a row), keeping its last answer: %s",
            address,
            what,
            self._topic,
            count,
            exc,
            exc_info=None if isinstance(exc, LookupdError) else exc,
        )

    async def _lookup(self, address: str) -> LookupResult:
        return await self._client.lookup(
            address, self._topic, access=self._access, metainfo=self._metainfo, partition=self._partition
        )

    def _union(self, targets: Sequence[str]) -> Discovery:
        endpoints: dict[Endpoint, NodeInfo] = {}
        channels: set[str] = set()
        answers = [self._answers[t] for t in targets if t in self._answers]
        for answer in answers:
            for endpoint, node in answer.endpoints().items():
                endpoints.setdefault(endpoint, node)
            channels.update(answer.channels)
        return Discovery(
            endpoints=endpoints,
            meta=merge_meta(a.meta for a in answers),
            is_ha=any(a.is_ha for a in answers),
            channels=frozenset(channels),
            lookupds=tuple(targets),
        )


def _check_number(name: str, value: float, low: float, high: float, unit: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidValueError(f"{name} must be {unit} in {low}..{high}, got {value!r}")
