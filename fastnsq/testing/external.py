"""Real servers the tests use instead of the embedded ones, named by the environment.

``FASTNSQ_TEST_NSQD`` (+ ``_HTTP``), ``FASTNSQ_TEST_LOOKUPD_HTTP`` (+ ``_TCP``) and
``FASTNSQ_TEST_CLUSTER_NSQD`` (+ ``_HTTP``) name them; ``FASTNSQ_TEST_NSQD_EMULATES``
says which upstream version they are when it matters (``v1.3.0`` or ``master``: both
report 1.3.0). :func:`is_ha` tells the dialect of any server, real or embedded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "ENV_CLUSTER_NSQD",
    "ENV_CLUSTER_NSQD_HTTP",
    "ENV_LOOKUPD_HTTP",
    "ENV_LOOKUPD_TCP",
    "ENV_NSQD",
    "ENV_NSQD_HTTP",
    "ExternalCluster",
    "ExternalLookupd",
    "ExternalNSQD",
    "external_cluster_from_env",
    "external_lookupd_from_env",
    "external_nsqd_from_env",
    "external_servers_configured",
    "is_external",
    "is_ha",
]

#: Real servers to test against instead of the embedded ones (``host:port`` each).
ENV_NSQD = "FASTNSQ_TEST_NSQD"  # nsqd TCP
ENV_NSQD_HTTP = "FASTNSQ_TEST_NSQD_HTTP"  # nsqd HTTP
ENV_LOOKUPD_HTTP = "FASTNSQ_TEST_LOOKUPD_HTTP"  # nsqlookupd HTTP
ENV_LOOKUPD_TCP = "FASTNSQ_TEST_LOOKUPD_TCP"  # nsqlookupd TCP (optional)
#: A real cluster: comma-separated nsqd TCP and HTTP addresses, in the same order,
#: all registered with the lookupd of FASTNSQ_TEST_LOOKUPD_HTTP.
ENV_CLUSTER_NSQD = "FASTNSQ_TEST_CLUSTER_NSQD"
ENV_CLUSTER_NSQD_HTTP = "FASTNSQ_TEST_CLUSTER_NSQD_HTTP"


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


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

    _added: list[Any] = field(default_factory=list, repr=False)

    async def add_node(self, **options: Any) -> Any:
        """One more nsqd, registered with the lookupd: a real one from the binaries of
        ``FASTNSQ_TEST_REAL_BIN`` (``python -m fastnsq.testing.real`` sets it), with the
        embedded NSQD's options as its flags; :meth:`close` stops it."""
        from .real import RealNSQDServer, real_bin_dir

        folder = real_bin_dir()
        if folder is None or not self.lookupd.tcp_address:
            raise RuntimeError("adding an nsqd to a real cluster needs the real binaries (FASTNSQ_TEST_REAL_BIN) "
                               "and the lookupd's TCP address (FASTNSQ_TEST_LOOKUPD_TCP)")
        node = RealNSQDServer(folder, lookupd_tcp_addresses=[self.lookupd.tcp_address], **options)
        self._added.append(node)
        await node.start()
        return node

    @property
    def can_add_nodes(self) -> bool:
        from .real import real_bin_dir

        return real_bin_dir() is not None and bool(self.lookupd.tcp_address)

    async def close(self) -> None:
        """Stop the nsqds :meth:`add_node` started (the others are not the tests' to stop)."""
        while self._added:
            await self._added.pop().close()

    async def create_topic(
        self,
        topic: str,
        partitions: int = 4,
        *,
        ext: bool = False,
        ordered: bool = False,
        replicas: int | None = None,
        channels: Sequence[str] = (),
        disable_channel_auto_create: bool = False,
        timeout: float = 120.0,
    ) -> dict[int, str]:
        """HA: create a topic through the lookupd (``POST /topic/create``), as on the embedded cluster.

        Waits until the write lookup (``access=w``: it names each partition's leader;
        ``access=r`` may name a replica) lists every partition, then creates
        ``channels`` on every partition (on each leader's ``POST /channel/create``, or
        registered with the lookupd's ``POST /channel/create`` when channel auto-create
        is disabled) and waits until the lookupd lists them. Returns {partition: leader
        nsqd TCP address}.

        youzan's lookupd enables writes on a new topic in a topic check it runs at
        most once per 6 s (else once a minute); creating the same topic again with the
        same settings asks for that check again, so the wait re-posts the create every
        few seconds instead of waiting up to a minute. The lookupd must run with
        ``--allow-write-with-nochannels=true`` (as run-youzan-cluster.sh and
        :mod:`fastnsq.testing.real` start it): otherwise it lists no leader of a topic
        that has no channel yet.
        """
        import aiohttp

        nodes = max(1, len(self.nsqds))
        if replicas is None:
            replicas = min(2, nodes)
        query = {"topic": topic, "partition_num": str(partitions), "replicator": str(replicas)}
        if ordered:
            query["orderedmulti"] = "true"  # the only ordered kind; it also allows several partitions per node
        elif partitions * replicas > nodes:
            # Without it the lookupd puts at most one replica of the topic on a node and
            # refuses the rest ("No node is available for topic").
            query["multipart"] = "true"
        if ext:
            query["extend"] = "true"
        if disable_channel_auto_create:
            query["disable_channel_auto_create"] = "true"
        lookupd = f"http://{self.lookupd.http_address}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def check_deadline(what: str) -> None:
            if loop.time() > deadline:
                raise TimeoutError(f"{what} after {timeout} s (topic {topic!r}, lookupd {lookupd})")

        async with aiohttp.ClientSession(headers={"Accept": "application/vnd.nsq; version=1.0"}) as http:

            async def create() -> None:
                while True:
                    async with http.post(f"{lookupd}/topic/create", params=query) as response:
                        if response.status == 200:
                            return
                        refusal = f"lookupd refused /topic/create?{query}: {response.status} {await response.text()}"
                    # A node that just started may not be placeable yet; anything else is final.
                    if "No node is available" not in refusal:
                        raise RuntimeError(refusal)
                    check_deadline(refusal)
                    await asyncio.sleep(1.0)

            async def lookup(access: str) -> dict[str, Any]:
                async with http.get(f"{lookupd}/lookup", params={"topic": topic, "access": access}) as response:
                    body = await response.read()
                    if response.status == 404 and b"has no channel" in body:
                        raise RuntimeError(
                            f"the lookupd {lookupd} hides partitions without channels from writers: "
                            "run it with --allow-write-with-nochannels=true (as run-youzan-cluster.sh does) "
                            "so that the leaders of a new topic can be found"
                        )
                    answer = json.loads(body or b"{}") if response.status == 200 else {}
                return answer if isinstance(answer, dict) else {}

            await create()
            asked = loop.time()
            while True:
                listed = (await lookup("w")).get("partitions") or {}
                if len(listed) >= partitions:
                    break
                check_deadline(f"the lookupd lists {len(listed)} of {partitions} partitions for writing")
                if loop.time() - asked > 3.0:
                    await create()
                    asked = loop.time()
                await asyncio.sleep(0.2)
            leaders = {int(pid): peer for pid, peer in listed.items()}
            for channel in channels:
                if disable_channel_auto_create:
                    await self._register_channel(http, lookupd, topic, channel)
                else:
                    for pid, peer in leaders.items():
                        url = f"http://{peer['broadcast_address']}:{peer['http_port']}/channel/create"
                        params = {"topic": topic, "partition": str(pid), "channel": channel}
                        async with http.post(url, params=params) as response:
                            if response.status != 200:
                                raise RuntimeError(f"nsqd {url} refused the channel: {await response.text()}")
            while channels and not set(channels) <= set((await lookup("r")).get("channels") or ()):
                check_deadline(f"the lookupd does not list the channels {list(channels)}")
                await asyncio.sleep(0.2)
        return {pid: f"{peer['broadcast_address']}:{peer['tcp_port']}" for pid, peer in leaders.items()}

    @staticmethod
    async def _register_channel(http: Any, lookupd: str, topic: str, channel: str) -> None:
        """With channel auto-create disabled, only the lookupd's registry makes a channel."""
        async with http.post(f"{lookupd}/channel/create", params={"topic": topic, "channel": channel}) as response:
            if response.status != 200:
                raise RuntimeError(f"lookupd refused /channel/create of {channel!r}: {await response.text()}")

    async def partition_leaders(self, topic: str) -> dict[int, str]:
        """HA: {partition: TCP address of its leader}, from the write lookup (it lists leaders only)."""
        import aiohttp

        async with (
            aiohttp.ClientSession(headers={"Accept": "application/vnd.nsq; version=1.0"}) as http,
            http.get(f"http://{self.lookupd.http_address}/lookup", params={"topic": topic, "access": "w"}) as r,
        ):
            answer = json.loads(await r.read() or b"{}") if r.status == 200 else {}
        listed = (answer.get("partitions") if isinstance(answer, dict) else None) or {}
        return {int(pid): f"{peer['broadcast_address']}:{peer['tcp_port']}" for pid, peer in listed.items()}

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


_HA_BY_ADDRESS: dict[str, bool] = {}


async def is_ha(server: object, *, timeout: float = 5.0) -> bool:
    """Whether ``server`` speaks the HA (youzan) dialect.

    Embedded servers and clusters say so (``.ha``); a real nsqd is asked with an
    IDENTIFY (HA when its ``version`` contains ``"HA"``, youzan/nsq's ``nsqd/protocol_v2.go``),
    a real lookupd with ``/info``. The answer is cached on the object.
    """
    if isinstance(server, (ExternalNSQD, ExternalLookupd)):
        if server._ha is None:
            # One probe per address and process: the fixtures build a new object per test,
            # and a probe connection would show in what a test reads of the server.
            key = server.tcp_address if isinstance(server, ExternalNSQD) else server.http_address
            known = _HA_BY_ADDRESS.get(key)
            if known is None:
                probe = _probe_nsqd_version if isinstance(server, ExternalNSQD) else _probe_lookupd_version
                version = await asyncio.wait_for(probe(server), timeout)  # type: ignore[arg-type]
                known = _HA_BY_ADDRESS[key] = "HA" in version
            server._ha = known
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
