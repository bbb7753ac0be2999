"""The embedded nsqlookupd: one public class for both dialects.

:class:`NSQLookupd` is an nsqlookupd 1.3 in this process, memory only (the
upstream dialect is ``_lookupd_core.LookupdServer``); ``NSQLookupd(ha=True)``
builds a :class:`HANSQLookupd`, youzan's partitioned lookupd
(``_lookupd_ha.HALookupd``), which is an ``NSQLookupd`` too.

Example::

    async with NSQLookupd() as lookupd:
        node = lookupd.register_node(tcp_port=4150, http_port=4151)
        node.register("events", "archive")
        # GET http://{lookupd.http_address}/lookup?topic=events now lists the node
"""

from __future__ import annotations

from typing import Any

from ._http import JSON_CONTENT_TYPE, HTTPSite, go_json, join_host_port, parse_go_query
from ._lookupd_core import (
    LOOKUPD_VERSION,
    LookupdServer,
    PeerInfo,
    RegisteredNode,
    Registration,
    RegistrationDB,
    decode_identify,
)
from ._lookupd_ha import OLD_VERSION_PID, HALookupd, TopicMetaInfo

__all__ = [
    "JSON_CONTENT_TYPE",
    "LOOKUPD_VERSION",
    "OLD_VERSION_PID",
    "HANSQLookupd",
    "HTTPSite",
    "NSQLookupd",
    "PeerInfo",
    "RegisteredNode",
    "Registration",
    "RegistrationDB",
    "TopicMetaInfo",
    "decode_identify",
    "go_json",
    "join_host_port",
    "parse_go_query",
]


class NSQLookupd(LookupdServer):
    """An in-process nsqlookupd 1.3 (TCP registration + HTTP API), memory only.

    ``ha=True`` gives youzan's HA lookupd (a :class:`HANSQLookupd`), which also takes
    ``ha_cluster`` (emulate a cluster lookupd, with a coordinator: ``meta``,
    ``/listlookup`` nodes, ``ha_support``; default True) and
    ``allow_write_with_nochannels`` (``--allow-write-with-nochannels``, default False).

    ``tcp_port``/``http_port`` 0 pick free ports; after :meth:`start` the chosen
    ports stay fixed, so :meth:`stop` then :meth:`start` comes back on the same
    addresses (with an empty database, like a restarted nsqlookupd: nsqds
    register again when they reconnect).

    Example::

        async with NSQLookupd(inactive_producer_timeout=1.0) as lookupd:
            nsqd = NSQD(lookupd_tcp_addresses=[lookupd.tcp_address])
            ...
            await lookupd.wait_for_producers("events")
    """

    def __new__(cls, *args: Any, ha: bool = False, **kwargs: Any) -> NSQLookupd:  # noqa: PYI034
        if ha and cls is NSQLookupd:
            return super().__new__(HANSQLookupd)
        return super().__new__(cls)


class HANSQLookupd(HALookupd, NSQLookupd):
    """youzan's HA nsqlookupd (``NSQLookupd(ha=True)``); see ``_lookupd_ha``."""
