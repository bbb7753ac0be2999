"""nsqlookupd over HTTP: ask where a topic lives and turn the answers into nsqd endpoints.

One job: talk HTTP to nsqlookupd (upstream nsqio 1.x and youzan's HA lookupd) and
reduce its answers to the set of :class:`Endpoint` a consumer or producer should
connect to. Nothing here opens an NSQ TCP connection.

Three layers, each usable alone:

* pure parsers (:func:`parse_lookup`, :func:`parse_listlookup`, ...) that take
  the HTTP status, headers and body and return typed results; they know both
  answer forms (the bare v1 object and the legacy ``{"status_code", "status_txt",
  "data"}`` wrapper), the HA ``partitions``/``meta`` additions, ``null`` lists
  and empty bodies (upstream and youzan nsqlookupd's ``http.go``);
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


from fastnsq.config import Endpoint

from .answers import (
    ACCEPT_V1,
    Discovery,
    ListLookupResult,
    LookupdError,
    LookupdHTTPError,
    LookupdInfo,
    LookupdNode,
    LookupResult,
    NodeInfo,
    Producer,
    TopicMeta,
    decode_response,
    merge_meta,
    normalize_lookupd_address,
    parse_channels,
    parse_info,
    parse_listlookup,
    parse_lookup,
    parse_nodes,
    parse_topics,
)
from .client import Access, LookupdClient
from .poller import LookupdPoller

# quarter of a second (its connector builds an SSL context), which every `import fastnsq`,
# every `fastnsq pub` and every Spark worker would pay without ever asking a lookupd.

__all__ = [
    "ACCEPT_V1",
    "Access",
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
