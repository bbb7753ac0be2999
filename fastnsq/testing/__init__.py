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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .auth import Authorization, AuthRequest, AuthServer, Grant, authorization
from .lookupd import NSQLookupd, RegisteredNode

if TYPE_CHECKING:
    from typing_extensions import Self

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
    "RegisteredNode",
    "authorization",
    "external_cluster_from_env",
    "external_lookupd_from_env",
    "external_nsqd_from_env",
    "external_servers_configured",
    "is_external",
    "is_ha",
]

logger = logging.getLogger(__name__)

#: Whether the embedded servers speak the HA (youzan) dialect yet; the HA phase turns it on.
EMBEDDED_HA_AVAILABLE = False

#: Real servers to test against instead of the embedded ones (``host:port`` each).
ENV_NSQD = "FASTNSQ_TEST_NSQD"  # nsqd TCP
ENV_NSQD_HTTP = "FASTNSQ_TEST_NSQD_HTTP"  # nsqd HTTP
ENV_LOOKUPD_HTTP = "FASTNSQ_TEST_LOOKUPD_HTTP"  # nsqlookupd HTTP
ENV_LOOKUPD_TCP = "FASTNSQ_TEST_LOOKUPD_TCP"  # nsqlookupd TCP (optional)
#: A real cluster: comma-separated nsqd TCP and HTTP addresses, in the same order,
#: all registered with the lookupd of FASTNSQ_TEST_LOOKUPD_HTTP.
ENV_CLUSTER_NSQD = "FASTNSQ_TEST_CLUSTER_NSQD"
ENV_CLUSTER_NSQD_HTTP = "FASTNSQ_TEST_CLUSTER_NSQD_HTTP"


def __getattr__(name: str) -> Any:
    # NSQD is imported on first use: ``import fastnsq.testing`` (and the pytest plugin,
    # auto-loaded in every pytest run once fastnsq is installed) stays light.
    if name == "NSQD":
        from .nsqd import NSQD

        return NSQD
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


# ---- real servers --------------------------------------------------------------------


@dataclass
class ExternalNSQD:
    """A real nsqd the tests use instead of an embedded :class:`NSQD` (same address attributes).

    It cannot be started or stopped from the tests; check :func:`is_external`
    (or use the plugin's ``require_embedded``) in tests that need to.
    """

    tcp_address: str
    http_address: str | None = None
    external: ClassVar[bool] = True
    _ha: bool | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return _split_host_port(self.tcp_address)[0]

    @property
    def tcp_port(self) -> int:
        return _split_host_port(self.tcp_address)[1]

    @property
    def http_port(self) -> int | None:
        return _split_host_port(self.http_address)[1] if self.http_address else None

    async def start(self) -> None:
        raise RuntimeError(f"the external nsqd {self.tcp_address} cannot be started from the tests")

    async def stop(self, **kwargs: Any) -> None:
        raise RuntimeError(f"the external nsqd {self.tcp_address} cannot be stopped from the tests")


@dataclass
class ExternalLookupd:
    """A real nsqlookupd the tests use instead of an embedded :class:`NSQLookupd`."""

    http_address: str
    tcp_address: str | None = None
    external: ClassVar[bool] = True
    _ha: bool | None = field(default=None, repr=False)

    @property
    def http_port(self) -> int:
        return _split_host_port(self.http_address)[1]

    @property
    def tcp_port(self) -> int | None:
        return _split_host_port(self.tcp_address)[1] if self.tcp_address else None

    @property
    def url(self) -> str:
        return f"http://{self.http_address}"


@dataclass
class ExternalCluster:
    """Real nsqds registered with a real lookupd, with :class:`NSQCluster`'s attributes."""

    nsqds: list[ExternalNSQD]
    lookupd: ExternalLookupd
    external: ClassVar[bool] = True

    @property
    def tcp_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.nsqds]

    @property
    def http_addresses(self) -> list[str | None]:
        return [n.http_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [self.lookupd.http_address]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [self.lookupd.tcp_address] if self.lookupd.tcp_address else []

    async def add_node(self, **options: Any) -> ExternalNSQD:
        raise RuntimeError("nodes of an external cluster cannot be added from the tests")

    async def stop_node(self, index: int) -> None:
        raise RuntimeError("nodes of an external cluster cannot be stopped from the tests")


def _env(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None


def external_servers_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names real servers (so nothing embedded should stand in)."""
    return any(_env(n, environ) for n in (ENV_NSQD, ENV_NSQD_HTTP, ENV_LOOKUPD_HTTP, ENV_CLUSTER_NSQD))


def external_nsqd_from_env(environ: Mapping[str, str] | None = None) -> ExternalNSQD | None:
    """The nsqd of ``FASTNSQ_TEST_NSQD`` (+ ``FASTNSQ_TEST_NSQD_HTTP``), or ``None``."""
    tcp = _env(ENV_NSQD, environ)
    return ExternalNSQD(tcp, _env(ENV_NSQD_HTTP, environ)) if tcp else None


def external_lookupd_from_env(environ: Mapping[str, str] | None = None) -> ExternalLookupd | None:
    """The lookupd of ``FASTNSQ_TEST_LOOKUPD_HTTP`` (+ ``FASTNSQ_TEST_LOOKUPD_TCP``), or ``None``."""
    http = _env(ENV_LOOKUPD_HTTP, environ)
    return ExternalLookupd(http, _env(ENV_LOOKUPD_TCP, environ)) if http else None


def external_cluster_from_env(environ: Mapping[str, str] | None = None) -> ExternalCluster | None:
    """The cluster of ``FASTNSQ_TEST_CLUSTER_NSQD`` (+ ``_HTTP``) and the lookupd, or ``None``."""
    tcp = _env(ENV_CLUSTER_NSQD, environ)
    lookupd = external_lookupd_from_env(environ)
    if not tcp or lookupd is None:
        return None
    tcp_list = [a.strip() for a in tcp.split(",") if a.strip()]
    http_list = [a.strip() for a in (_env(ENV_CLUSTER_NSQD_HTTP, environ) or "").split(",") if a.strip()]
    if http_list and len(http_list) != len(tcp_list):
        raise ValueError(f"{ENV_CLUSTER_NSQD} and {ENV_CLUSTER_NSQD_HTTP} must list as many addresses")
    nodes = [ExternalNSQD(t, http_list[i] if http_list else None) for i, t in enumerate(tcp_list)]
    return ExternalCluster(nodes, lookupd)


def is_external(server: object) -> bool:
    """Whether ``server`` is a real server named by the environment (not embedded)."""
    return bool(getattr(server, "external", False))


async def is_ha(server: object, *, timeout: float = 5.0) -> bool:
    """Whether ``server`` speaks the HA (youzan) dialect.

    Embedded servers and clusters say so (``.ha``); a real nsqd is asked with an
    IDENTIFY (HA when its ``version`` contains ``"HA"``, shared/protocol.md §11.6),
    a real lookupd with ``/info``. The answer is cached on the object.
    """
    if isinstance(server, (ExternalNSQD, ExternalLookupd)):
        if server._ha is None:
            probe = _probe_nsqd_version if isinstance(server, ExternalNSQD) else _probe_lookupd_version
            version = await asyncio.wait_for(probe(server), timeout)  # type: ignore[arg-type]
            server._ha = "HA" in version
        return server._ha
    if isinstance(server, ExternalCluster):
        return await is_ha(server.nsqds[0] if server.nsqds else server.lookupd, timeout=timeout)
    return bool(getattr(server, "ha", False))


async def _probe_nsqd_version(server: ExternalNSQD) -> str:
    from fastnsq import codec

    host, port = _split_host_port(server.tcp_address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        out = codec.WriteBuffer()
        out.magic()
        out.identify(json.dumps({"client_id": "fastnsq-ha-probe", "feature_negotiation": True}).encode())
        writer.write(out.take())
        size = int.from_bytes(await reader.readexactly(4), "big")
        frame = await reader.readexactly(size)
        if int.from_bytes(frame[:4], "big") != codec.FRAME_RESPONSE:
            raise ConnectionError(f"nsqd {server.tcp_address} refused IDENTIFY: {frame[4:]!r}")
        answer = json.loads(frame[4:])
        return str(answer.get("version", "")) if isinstance(answer, dict) else ""
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _probe_lookupd_version(server: ExternalLookupd) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://{server.http_address}/info", headers={"Accept": "application/vnd.nsq; version=1.0"}
        ) as response,
    ):
        data = json.loads(await response.read() or b"{}")
    if isinstance(data, dict) and isinstance(data.get("data"), dict):
        data = data["data"]  # the legacy wrapped form
    if not isinstance(data, dict):
        return ""
    return str(data.get("version", "")) + (" HA" if data.get("ha_support") else "")


# ---- an embedded cluster ---------------------------------------------------------------


class NSQCluster:
    """``nodes`` embedded nsqds registered with one embedded nsqlookupd.

    :meth:`start` returns once every nsqd has registered (IDENTIFY) with the
    lookupd. Node indices are stable: :meth:`stop_node` keeps the stopped nsqd in
    :attr:`nsqds` (and its addresses in the lists) so it can come back with
    :meth:`start_node` on the same ports. ``nsqd_options`` go to every
    :class:`NSQD`, ``lookupd_options`` to the :class:`NSQLookupd`.

    Example::

        async with NSQCluster(nodes=3) as cluster:
            consumer = Consumer("events", "ch", lookupd_http_addresses=cluster.lookupd_http_addresses)
            await cluster.stop_node(0)
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        ha: bool = False,
        host: str = "127.0.0.1",
        lookupd_options: Mapping[str, Any] | None = None,
        register_timeout: float = 5.0,
        **nsqd_options: Any,
    ) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
            raise ValueError(f"nodes must be an int >= 0, got {nodes!r}")
        self.ha = ha
        self.host = host
        self._initial_nodes = nodes
        self._lookupd_options = dict(lookupd_options or {})
        self._nsqd_options = nsqd_options
        self.register_timeout = register_timeout
        self.lookupd: NSQLookupd = NSQLookupd(host=host, ha=ha, **self._lookupd_options)
        self.nsqds: list[NSQD] = []
        self._stopped: set[int] = set()

    async def start(self) -> None:
        await self.lookupd.start()
        try:
            for _ in range(self._initial_nodes):
                await self.add_node()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every nsqd, then the lookupd."""
        for index, nsqd in enumerate(self.nsqds):
            if index not in self._stopped:
                self._stopped.add(index)
                try:
                    await nsqd.stop()
                except Exception:
                    # Keep stopping the others; the failure is still visible in the log.
                    logger.exception("NSQCluster: stopping nsqd %s failed", nsqd.tcp_address)
        await self.lookupd.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def add_node(self, **options: Any) -> NSQD:
        """Start one more nsqd (``options`` override the cluster's) and wait until it registered."""
        from .nsqd import NSQD

        settings = {"host": self.host, "broadcast_address": self.host, **self._nsqd_options, **options}
        addresses: Sequence[str] = settings.pop("lookupd_tcp_addresses", ())
        nsqd = NSQD(lookupd_tcp_addresses=[self.lookupd.tcp_address, *addresses], ha=self.ha, **settings)
        await nsqd.start()
        self.nsqds.append(nsqd)
        await self._wait_registered(nsqd, present=True)
        return nsqd

    async def stop_node(self, index: int, **stop_options: Any) -> None:
        """Stop nsqd ``index`` and wait until the lookupd has dropped it."""
        nsqd = self.nsqds[index]
        if index in self._stopped:
            return
        self._stopped.add(index)
        await nsqd.stop(**stop_options)
        await self._wait_registered(nsqd, present=False)

    async def start_node(self, index: int) -> None:
        """Start a stopped nsqd again (same ports) and wait until it registered."""
        if index not in self._stopped:
            return
        await self.nsqds[index].start()
        self._stopped.discard(index)
        await self._wait_registered(self.nsqds[index], present=True)

    def is_running(self, index: int) -> bool:
        return 0 <= index < len(self.nsqds) and index not in self._stopped

    @property
    def running_nsqds(self) -> list[NSQD]:
        return [n for i, n in enumerate(self.nsqds) if i not in self._stopped]

    @property
    def tcp_addresses(self) -> list[str]:
        """TCP addresses of every nsqd, stopped ones included (indices match :attr:`nsqds`)."""
        return [n.tcp_address for n in self.nsqds]

    @property
    def http_addresses(self) -> list[str]:
        return [n.http_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [self.lookupd.http_address]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [self.lookupd.tcp_address]

    async def _wait_registered(self, nsqd: NSQD, *, present: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.register_timeout
        while self._registered(nsqd) != present:
            if loop.time() >= deadline:
                state = "registered with" if present else "dropped by"
                raise TimeoutError(
                    f"nsqd {nsqd.tcp_address} not {state} nsqlookupd {self.lookupd.tcp_address} "
                    f"after {self.register_timeout} s"
                )
            await asyncio.sleep(0.01)

    def _registered(self, nsqd: NSQD) -> bool:
        return any(
            node["tcp_port"] == nsqd.tcp_port and node["http_port"] == nsqd.http_port
            for node in self.lookupd.nodes()
        )

    def __repr__(self) -> str:
        return f"<NSQCluster nodes={len(self.nsqds)} stopped={sorted(self._stopped)} lookupd={self.lookupd.http_address}>"
