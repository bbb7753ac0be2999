"""nsqlookupd's answers: the types they become and the pure parsers that make them.

The parsers take the HTTP status, headers and body and return typed results; they know
both answer forms (the bare v1 object and the legacy ``{"status_code", "status_txt",
"data"}`` wrapper), the HA ``partitions``/``meta`` additions, ``null`` lists and empty
bodies (upstream and youzan nsqlookupd's ``http.go``). No I/O here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fastnsq.config import Endpoint
from fastnsq.errors import InvalidValueError, LookupdError, LookupdHTTPError

logger = logging.getLogger(__name__)
#: The Accept header go-nsq sends; with it both lookupds answer the bare v1 object.
ACCEPT_V1 = "application/vnd.nsq; version=1.0"

# The response header that marks a bare v1 body (Go canonicalises it to X-Nsq-Content-Type).
_V1_HEADER = "x-nsq-content-type"

# Texts of lookup errors that only mean "nobody has this topic (for this access mode)":
# upstream's unknown topic, HA's etcd ErrKeyNotFound with access=w, and HA's
# no-channel filter with access=w (upstream and youzan nsqlookupd's ``http.go``).
_NO_PRODUCER_MESSAGES = ("TOPIC_NOT_FOUND", "Key not found")
_NO_PRODUCER_PREFIX = "Topic has no channel"
_HA_ONLY_MESSAGES = ("Key not found",)

_DECIMAL = re.compile(r"-?[0-9]{1,20}")

# How much of a junk body an error message quotes.
_QUOTE_LIMIT = 200


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
    ``extend_support`` in IDENTIFY (youzan/nsq's ``nsqd/protocol_v2.go``).
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
