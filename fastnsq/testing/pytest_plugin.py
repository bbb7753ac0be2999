"""pytest fixtures for NSQ servers: embedded by default, real ones when the environment names them.

One job: hand tests a running nsqd, nsqlookupd or cluster, and take it down after.

Fixtures (async, function-scoped, for pytest-asyncio in auto or strict mode, on
whatever loop the test runs: asyncio or uvloop):

* ``nsqd``: an embedded :class:`~fastnsq.testing.NSQD`, or the real nsqd of
  ``FASTNSQ_TEST_NSQD`` (TCP) / ``FASTNSQ_TEST_NSQD_HTTP`` as an
  :class:`~fastnsq.testing.ExternalNSQD` (same ``tcp_address``, ``http_address``,
  ``tcp_port``, ``http_port`` attributes); a skip when that real nsqd is HA (the
  upstream fixtures and the HA ones below never stand in for each other);
* ``nsqlookupd``: an embedded :class:`~fastnsq.testing.NSQLookupd`, or the real one of
  ``FASTNSQ_TEST_LOOKUPD_HTTP`` (and ``FASTNSQ_TEST_LOOKUPD_TCP``);
* ``nsq_cluster``: an embedded :class:`~fastnsq.testing.NSQCluster` of 3 nsqds and a
  lookupd; when real servers are configured, the real cluster of
  ``FASTNSQ_TEST_CLUSTER_NSQD`` / ``FASTNSQ_TEST_CLUSTER_NSQD_HTTP`` with
  ``FASTNSQ_TEST_LOOKUPD_HTTP``, and a skip if there is none;
* ``nsqd_ha``, ``nsq_cluster_ha``: the same in the HA dialect: an embedded
  ``NSQD(ha=True)`` (standalone: create topics with ``INTERNAL_CREATE_TOPIC`` or
  ``nsqd.create_topic``) and an ``NSQCluster(nodes=3, ha=True)`` (``create_topic``,
  ``move_leader``), or the configured real servers, and a skip when those are not HA.

Helpers: :func:`fastnsq.testing.is_ha` (await it) and :func:`require_embedded`
(skip a test that must stop or configure its server when the server is real).

The plugin registers itself through the ``pytest11`` entry point ``fastnsq`` when
fastnsq is installed; without installing, add
``pytest_plugins = ["fastnsq.testing.pytest_plugin"]`` to the root conftest. Both
at once are fine.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import fastnsq.testing as _testing

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - depends on the environment
    pytest_asyncio = None  # type: ignore[assignment]

from fastnsq.testing import (
    ExternalCluster,
    ExternalLookupd,
    NSQCluster,
    NSQLookupd,
    external_cluster_from_env,
    external_lookupd_from_env,
    external_nsqd_from_env,
    external_servers_configured,
    is_external,
    is_ha,
)

__all__ = [
    "is_ha",
    "nsq_cluster",
    "nsq_cluster_ha",
    "nsqd",
    "nsqd_ha",
    "nsqlookupd",
    "require_embedded",
]

#: The name of the ``pytest11`` entry point in pyproject.toml.
ENTRY_POINT_NAME = "fastnsq"

_HA_NOT_BUILT = "the embedded HA mode is not available"


def pytest_plugin_registered(plugin: object, plugin_name: str, manager: Any) -> None:
    """Make a second load of this plugin, under its other name, a no-op.

    Installed, the plugin is registered as ``fastnsq`` (entry point); a conftest's
    ``pytest_plugins = ["fastnsq.testing.pytest_plugin"]`` registers it under its
    module name, and pluggy refuses one module under two names. Blocking the
    other name makes pytest skip the second registration.
    """
    if plugin is not sys.modules[__name__]:
        return
    for alias in (ENTRY_POINT_NAME, __name__):
        if alias != plugin_name and manager.get_plugin(alias) is None and not manager.is_blocked(alias):
            manager.set_blocked(alias)


def require_embedded(server: object) -> None:
    """Skip the calling test when ``server`` is a real server (it cannot be stopped or reconfigured)."""
    if is_external(server):
        pytest.skip(f"needs an embedded server; {server!r} comes from the environment")


def _async_fixture(func: Callable[..., Any]) -> Any:
    """An async fixture under pytest-asyncio (strict or auto mode); a skip without it."""
    if pytest_asyncio is not None:
        return pytest_asyncio.fixture(func)

    def missing() -> None:  # pragma: no cover - depends on the environment
        pytest.skip("fastnsq's NSQ fixtures need pytest-asyncio")

    return pytest.fixture(name=func.__name__)(missing)


def _embedded_nsqd_class() -> Any:
    try:
        from fastnsq.testing.nsqd import NSQD
    except ModuleNotFoundError as exc:
        if exc.name != "fastnsq.testing.nsqd":
            raise
        pytest.skip("the embedded nsqd (fastnsq.testing.nsqd) is not built yet")
    return NSQD


async def _answers_as_ha(server: object) -> bool:
    """Whether a configured server says it is HA; one that does not answer is left to the test."""
    try:
        return await is_ha(server)
    except (OSError, asyncio.TimeoutError):  # refused, reset, or silent
        return False


@_async_fixture
async def nsqd() -> AsyncIterator[Any]:
    """A running nsqd: embedded, or the real one of ``FASTNSQ_TEST_NSQD`` (a skip when that is HA)."""
    external = external_nsqd_from_env()
    if external is not None:
        if await _answers_as_ha(external):
            pytest.skip(f"needs an upstream nsqd; the nsqd of FASTNSQ_TEST_NSQD ({external.tcp_address}) is HA")
        yield external
        return
    async with _embedded_nsqd_class()() as server:
        yield server


@_async_fixture
async def nsqlookupd() -> AsyncIterator[NSQLookupd | ExternalLookupd]:
    """A running nsqlookupd: embedded, or the real one of ``FASTNSQ_TEST_LOOKUPD_HTTP``."""
    external = external_lookupd_from_env()
    if external is not None:
        yield external
        return
    async with NSQLookupd() as server:
        yield server


def _configured_cluster() -> ExternalCluster | None:
    """The real cluster when real servers are configured; skip when they are but no cluster is."""
    if not external_servers_configured():
        return None
    cluster = external_cluster_from_env()
    if cluster is None:
        pytest.skip(
            "real servers are configured but no cluster: set FASTNSQ_TEST_CLUSTER_NSQD "
            "(and FASTNSQ_TEST_CLUSTER_NSQD_HTTP) with FASTNSQ_TEST_LOOKUPD_HTTP"
        )
    return cluster


@_async_fixture
async def nsq_cluster() -> AsyncIterator[NSQCluster | ExternalCluster]:
    """3 nsqds registered with one nsqlookupd (embedded), or the configured real cluster (a skip when HA)."""
    external = _configured_cluster()
    if external is not None:
        if await _answers_as_ha(external):
            pytest.skip("needs an upstream cluster; the configured cluster is HA (youzan)")
        try:
            yield external
        finally:
            await external.close()  # the nsqds a test added
        return
    _embedded_nsqd_class()
    async with NSQCluster(nodes=3) as cluster:
        yield cluster


@_async_fixture
async def nsqd_ha() -> AsyncIterator[Any]:
    """An HA (youzan) nsqd: the real one of ``FASTNSQ_TEST_NSQD`` if it is HA, else an embedded one."""
    external = external_nsqd_from_env()
    if external is not None:
        if not await is_ha(external):
            pytest.skip(f"the nsqd of FASTNSQ_TEST_NSQD ({external.tcp_address}) is not an HA nsqd")
        yield external
        return
    if not _testing.EMBEDDED_HA_AVAILABLE:  # pragma: no cover - a build without it
        pytest.skip(_HA_NOT_BUILT)
    async with _embedded_nsqd_class()(ha=True) as server:
        yield server


@_async_fixture
async def nsq_cluster_ha() -> AsyncIterator[NSQCluster | ExternalCluster]:
    """An HA cluster: the configured real one if it is HA, else an embedded one of 3 nodes."""
    external = _configured_cluster()
    if external is not None:
        if not await is_ha(external):
            pytest.skip("the configured cluster is not HA")
        yield external
        return
    if not _testing.EMBEDDED_HA_AVAILABLE:  # pragma: no cover - a build without it
        pytest.skip(_HA_NOT_BUILT)
    _embedded_nsqd_class()
    async with NSQCluster(nodes=3, ha=True) as cluster:
        yield cluster
