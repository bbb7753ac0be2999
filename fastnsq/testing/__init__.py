"""Embedded NSQ servers for tests: nsqd, nsqlookupd, an auth server and clusters of them.

Everything runs in the test's own asyncio loop (asyncio or uvloop), in memory, on
free ports. To test your own consumer::

    from fastnsq.testing import NSQD

    async def test_my_consumer():
        async with NSQD() as nsqd:
            # publish with POST http://{nsqd.http_address}/pub?topic=events, point
            # your consumer at nsqd.tcp_address, assert on what it handled
            ...

For lookupd discovery use :class:`NSQCluster` (N nsqds registered with one
:class:`NSQLookupd`; give your consumer ``cluster.lookupd_http_addresses``). With
pytest the fixtures ``nsqd``, ``nsqlookupd`` and ``nsq_cluster`` do this for you
(the plugin loads itself when fastnsq is installed); set ``FASTNSQ_TEST_NSQD``,
``FASTNSQ_TEST_NSQD_HTTP`` and ``FASTNSQ_TEST_LOOKUPD_HTTP`` to run the same tests
against real servers. ``python -m fastnsq.testing`` runs the servers from a shell.

The HA (youzan) dialect: ``NSQD(ha=True)``, ``NSQLookupd(ha=True)`` and
``NSQCluster(ha=True)``, whose :meth:`NSQCluster.create_topic` spreads a topic's
partitions and their leaders over the nodes and :meth:`NSQCluster.move_leader`
moves one at run time; the fixtures ``nsqd_ha`` and ``nsq_cluster_ha``. Faults:
``nsqd.faults`` (cut, stall, malformed frames, injected errors) and
``nsqd.refuse_connections``.

The embedded nsqd answers like the released nsqd v1.3.0 by default;
``NSQD(emulate="master")`` (and ``NSQLookupd``/``NSQCluster`` likewise) answers like
nsq master 3103474b, which adds the topology fields.

How the package is built (imports go downward only; ``tests/test_layering.py``
checks that no module imports one above it):

* shared pieces: ``_http`` (Go's JSON, nsq's v1 answers), ``_nsqd_base`` (options,
  versions), ``_nsqd_parse``, ``_nsqd_queue`` (topics, channels), ``_nsqd_faults``,
  ``_nsqd_auth``, ``_lookupd_core`` (registrations, the upstream lookupd);
* the upstream nsqd's parts: ``_nsqd_client`` (a TCP connection), ``_nsqd_http``,
  ``_nsqd_lookup`` (registration with lookupd); the HA dialect's on top of them:
  ``_nsqd_ha``, ``_nsqd_http_ha``, ``_lookupd_ha``;
* the servers: ``nsqd`` (:class:`NSQD`), ``lookupd`` (:class:`NSQLookupd`),
  ``auth`` (:class:`AuthServer`), ``cluster`` (:class:`NSQCluster`), and real ones:
  ``external`` (named by the environment), ``real`` (started from binaries);
* ``drain``: whether a channel has consumed what was published, from any nsqd's ``/stats``
  (what a test waits for before it stops a consumer);
* this module, the one entry: import from ``fastnsq.testing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .auth import Authorization, AuthRequest, AuthServer, Grant, authorization
from .external import (
    ENV_CLUSTER_NSQD,
    ENV_CLUSTER_NSQD_HTTP,
    ENV_LOOKUPD_HTTP,
    ENV_LOOKUPD_TCP,
    ENV_NSQD,
    ENV_NSQD_HTTP,
    ExternalCluster,
    ExternalLookupd,
    ExternalNSQD,
    external_cluster_from_env,
    external_lookupd_from_env,
    external_nsqd_from_env,
    external_servers_configured,
    is_external,
    is_ha,
)
from .lookupd import NSQLookupd, RegisteredNode

if TYPE_CHECKING:
    from .cluster import NSQCluster, PartitionPlacement
    from .nsqd import NSQD

__all__ = [
    "EMBEDDED_HA_AVAILABLE",
    "ENV_CLUSTER_NSQD",
    "ENV_CLUSTER_NSQD_HTTP",
    "ENV_LOOKUPD_HTTP",
    "ENV_LOOKUPD_TCP",
    "ENV_NSQD",
    "ENV_NSQD_HTTP",
    "NSQD",
    "AuthRequest",
    "AuthServer",
    "Authorization",
    "ExternalCluster",
    "ExternalLookupd",
    "ExternalNSQD",
    "Grant",
    "NSQCluster",
    "NSQLookupd",
    "PartitionPlacement",
    "RegisteredNode",
    "authorization",
    "external_cluster_from_env",
    "external_lookupd_from_env",
    "external_nsqd_from_env",
    "external_servers_configured",
    "is_external",
    "is_ha",
]

#: Whether the embedded servers speak the HA (youzan) dialect (``ha=True``).
EMBEDDED_HA_AVAILABLE = True


def __getattr__(name: str) -> Any:
    # The nsqd (and the cluster built on it) is imported on first use: ``import
    # fastnsq.testing`` (and the pytest plugin, auto-loaded in every pytest run once
    # fastnsq is installed) stays light.
    if name == "NSQD":
        from .nsqd import NSQD

        return NSQD
    if name in ("NSQCluster", "PartitionPlacement"):
        from . import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
