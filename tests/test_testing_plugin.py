"""fastnsq.testing as users meet it: the pytest fixtures, the env-var switch, the auth server,
``python -m fastnsq.testing`` and the embedded nsqd registering with the embedded lookupd.

Fixture behaviour is checked in separate pytest runs (``pytester``), so that the
plugin loading, the asyncio mode and the event loop are those of a user's suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fastnsq.errors import InvalidValueError
from fastnsq.testing import (
    AuthServer,
    ExternalCluster,
    ExternalLookupd,
    ExternalNSQD,
    Grant,
    NSQCluster,
    NSQLookupd,
    authorization,
    external_cluster_from_env,
    external_lookupd_from_env,
    external_nsqd_from_env,
    external_servers_configured,
    is_external,
    is_ha,
)

pytest_plugins = ["pytester", "fastnsq.testing.pytest_plugin"]

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "fastnsq.testing.pytest_plugin"
ENV_NAMES = (
    "FASTNSQ_TEST_NSQD",
    "FASTNSQ_TEST_NSQD_HTTP",
    "FASTNSQ_TEST_LOOKUPD_HTTP",
    "FASTNSQ_TEST_LOOKUPD_TCP",
    "FASTNSQ_TEST_CLUSTER_NSQD",
    "FASTNSQ_TEST_CLUSTER_NSQD_HTTP",
)


def embedded_nsqd_class() -> Any:
    """The embedded NSQD, or a skip while fastnsq.testing.nsqd (another helper's work) is incomplete."""
    try:
        from fastnsq.testing.nsqd import NSQD
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("fastnsq.testing"):
            raise
        pytest.skip(f"the embedded nsqd is not built yet ({exc.name} missing)")
    return NSQD


async def started_nsqd(**options: Any) -> Any:
    """A started embedded NSQD, or a skip while its modules are still being written."""
    nsqd = embedded_nsqd_class()(**options)
    try:
        await nsqd.start()
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("fastnsq.testing"):
            raise
        pytest.skip(f"the embedded nsqd is not built yet ({exc.name} missing)")
    return nsqd


# ---- running pytest inside pytest -----------------------------------------------------------


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose subprocess runs see the repo and no real-server variables."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "asyncio_default_test_loop_scope = function\n"
    )
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "-s", *args, timeout=120)


LOOKUPD_TEST = """
    import aiohttp
    from fastnsq.testing import NSQLookupd

    async def test_lookupd(nsqlookupd):
        assert isinstance(nsqlookupd, NSQLookupd)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{nsqlookupd.http_address}/ping") as r:
                assert (r.status, await r.text()) == (200, "OK")
"""


def docs_block(language: str, index: int = 0) -> str:
    """The ``index``-th fenced ``language`` block of docs/testing.md."""
    text = (REPO / "docs" / "testing.md").read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)[index]


@pytest.mark.parametrize("config", ["pyproject.toml", "pytest.ini"])
def test_the_documented_setup_runs_without_a_warning(inner: pytest.Pytester, config: str) -> None:
    """Issue 36: docs/testing.md's set-up and first example, as a user copies them, pass under
    ``-W error`` (pytest-asyncio warned that asyncio_default_fixture_loop_scope was unset)."""
    (inner.path / "tox.ini").unlink()  # inner's own set-up: the page's only
    if config == "pyproject.toml":
        inner.makepyprojecttoml(docs_block("toml"))
    else:
        inner.makefile(".ini", pytest=docs_block("ini"))
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")  # what the pytest11 entry point does once installed
    inner.makepyfile(test_my_consumer=docs_block("python"))
    run(inner, "-W", "error").assert_outcomes(passed=1)


def test_fixture_from_a_conftest_in_auto_mode(inner: pytest.Pytester) -> None:
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(test_it=LOOKUPD_TEST)
    run(inner).assert_outcomes(passed=1)


def test_fixture_in_strict_mode(inner: pytest.Pytester) -> None:
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(
        test_it="""
        import pytest

        @pytest.mark.asyncio
        async def test_lookupd(nsqlookupd):
            assert nsqlookupd.running
        """
    )
    run(inner, "-o", "asyncio_mode=strict").assert_outcomes(passed=1)


def test_fixture_on_asyncio_and_uvloop(inner: pytest.Pytester) -> None:
    pytest.importorskip("uvloop")
    inner.makeconftest(
        f"""
        import asyncio
        import uvloop

        pytest_plugins = [{PLUGIN!r}]

        def pytest_asyncio_loop_factories(config, item):
            return {{"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}}
        """
    )
    inner.makepyfile(
        test_it=LOOKUPD_TEST
        + """
    async def test_which_loop(nsqlookupd):
        import asyncio
        print("LOOP", type(asyncio.get_running_loop()).__module__)
        """
    )
    result = run(inner)
    result.assert_outcomes(passed=4)
    loops = sorted(re.findall(r"LOOP (\S+)", result.stdout.str()))
    assert loops == ["asyncio.unix_events", "uvloop"]


def _fake_entry_point(where: Path) -> None:
    """An installed-looking distribution whose pytest11 entry point is the plugin, as pyproject.toml declares."""
    info = where / "fastnsq_entrypoint_probe-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fastnsq-entrypoint-probe\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[pytest11]\nfastnsq = {PLUGIN}\n")


@pytest.mark.parametrize("also_by_name", [False, True], ids=["entry-point", "entry-point+conftest"])
def test_loading_by_entry_point_and_by_name(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, also_by_name: bool
) -> None:
    site = inner.path / "site"
    _fake_entry_point(site)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
    if also_by_name:
        inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(test_it=LOOKUPD_TEST)
    result = run(inner, "--trace-config")
    result.assert_outcomes(passed=1)
    # Registered once: by the entry point, the conftest's request being a no-op.
    assert result.stdout.str().count(f"PLUGIN registered: <module '{PLUGIN}'") == 1
    assert "already registered" not in result.stdout.str() + result.stderr.str()


def test_ha_fixtures_hand_out_embedded_ha_servers(inner: pytest.Pytester) -> None:
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(
        test_it="""
        from fastnsq.testing import NSQCluster, is_ha

        async def test_nsqd_ha(nsqd_ha):
            assert nsqd_ha.ha and await is_ha(nsqd_ha)

        async def test_cluster_ha(nsq_cluster_ha):
            assert type(nsq_cluster_ha) is NSQCluster and await is_ha(nsq_cluster_ha)
            assert len(nsq_cluster_ha.nsqds) == 3 and nsq_cluster_ha.lookupd.ha
        """
    )
    result = run(inner)
    result.assert_outcomes(passed=2)


# ---- the env-var switch to real servers ---------------------------------------------------------


@contextlib.contextmanager
def servers_process(*args: str) -> Iterator[dict[str, dict[str, str]]]:
    """``python -m fastnsq.testing *args`` in another process: {"nsqd"|"nsqlookupd": {"tcp", "http"}}."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastnsq.testing", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        servers: dict[str, dict[str, str]] = {}
        while (line := proc.stdout.readline()).startswith("nsq"):
            words = line.split()
            servers[words[0]] = {"tcp": words[2], "http": words[4]}
        assert line.startswith("running"), line + (proc.stderr.read() if proc.stderr else "")
        yield servers
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def lookupd_process() -> Iterator[dict[str, str]]:
    """An nsqlookupd on free ports in another process."""
    with servers_process("--no-nsqd", "--lookupd-tcp-port", "0", "--lookupd-http-port", "0") as servers:
        yield servers["nsqlookupd"]


@pytest.fixture
def nsqd_process() -> Iterator[dict[str, str]]:
    """An (embedded, so upstream-dialect) nsqd on free ports in another process."""
    with servers_process("--tcp-port", "0", "--http-port", "0") as servers:
        yield servers["nsqd"]


def test_env_hands_out_real_servers(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, lookupd_process: dict[str, str]
) -> None:
    monkeypatch.setenv("FASTNSQ_TEST_LOOKUPD_HTTP", lookupd_process["http"])
    monkeypatch.setenv("FASTNSQ_TEST_LOOKUPD_TCP", lookupd_process["tcp"])
    # The fixture only hands the addresses out; nothing needs to listen there for this check.
    monkeypatch.setenv("FASTNSQ_TEST_NSQD", "127.0.0.1:1")
    monkeypatch.setenv("FASTNSQ_TEST_NSQD_HTTP", "127.0.0.1:2")
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(
        test_it=f"""
        import aiohttp
        from fastnsq.testing import ExternalLookupd, ExternalNSQD, is_external, is_ha

        async def test_lookupd(nsqlookupd):
            assert type(nsqlookupd) is ExternalLookupd and is_external(nsqlookupd)
            assert nsqlookupd.http_address == {lookupd_process["http"]!r}
            assert nsqlookupd.tcp_address == {lookupd_process["tcp"]!r}
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://{{nsqlookupd.http_address}}/ping") as r:
                    assert await r.text() == "OK"
            assert await is_ha(nsqlookupd) is False

        async def test_nsqd(nsqd):
            assert type(nsqd) is ExternalNSQD
            assert (nsqd.tcp_address, nsqd.tcp_port, nsqd.http_address, nsqd.http_port) == (
                "127.0.0.1:1", 1, "127.0.0.1:2", 2)

        async def test_cluster(nsq_cluster):
            raise AssertionError("no cluster is configured: must skip")
        """
    )
    result = run(inner)
    result.assert_outcomes(passed=2, skipped=1)
    assert "no cluster" in result.stdout.str()


def test_env_hands_out_a_real_cluster(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, lookupd_process: dict[str, str]
) -> None:
    monkeypatch.setenv("FASTNSQ_TEST_LOOKUPD_HTTP", lookupd_process["http"])
    monkeypatch.setenv("FASTNSQ_TEST_CLUSTER_NSQD", "127.0.0.1:11,127.0.0.1:21")
    monkeypatch.setenv("FASTNSQ_TEST_CLUSTER_NSQD_HTTP", "127.0.0.1:12,127.0.0.1:22")
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(
        test_it=f"""
        from fastnsq.testing import ExternalCluster

        async def test_cluster(nsq_cluster):
            assert type(nsq_cluster) is ExternalCluster
            assert nsq_cluster.tcp_addresses == ["127.0.0.1:11", "127.0.0.1:21"]
            assert nsq_cluster.http_addresses == ["127.0.0.1:12", "127.0.0.1:22"]
            assert nsq_cluster.lookupd_http_addresses == [{lookupd_process["http"]!r}]
        """
    )
    run(inner).assert_outcomes(passed=1)


def test_ha_fixture_skips_a_real_upstream_nsqd(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, nsqd_process: dict[str, str]
) -> None:
    monkeypatch.setenv("FASTNSQ_TEST_NSQD", nsqd_process["tcp"])
    monkeypatch.setenv("FASTNSQ_TEST_NSQD_HTTP", nsqd_process["http"])
    inner.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    inner.makepyfile(
        test_it="""
        from fastnsq.testing import is_ha

        async def test_upstream(nsqd):
            assert await is_ha(nsqd) is False

        async def test_ha_only(nsqd_ha):
            raise AssertionError("an upstream nsqd is not HA: must skip")
        """
    )
    result = run(inner)
    result.assert_outcomes(passed=1, skipped=1)
    assert "is not an HA nsqd" in result.stdout.str()


def test_env_parsing() -> None:
    assert not external_servers_configured({})
    assert external_nsqd_from_env({}) is None and external_lookupd_from_env({}) is None
    env = {
        "FASTNSQ_TEST_NSQD": "10.0.0.1:4150",
        "FASTNSQ_TEST_LOOKUPD_HTTP": " 10.0.0.9:4161 ",
        "FASTNSQ_TEST_CLUSTER_NSQD": "10.0.0.1:4150, 10.0.0.2:4150",
    }
    assert external_servers_configured(env)
    nsqd = external_nsqd_from_env(env)
    assert nsqd == ExternalNSQD("10.0.0.1:4150") and (nsqd.host, nsqd.tcp_port, nsqd.http_port) == (
        "10.0.0.1",
        4150,
        None,
    )
    assert external_lookupd_from_env(env) == ExternalLookupd("10.0.0.9:4161")
    cluster = external_cluster_from_env(env)
    assert isinstance(cluster, ExternalCluster)
    assert cluster.tcp_addresses == ["10.0.0.1:4150", "10.0.0.2:4150"] and cluster.lookupd_tcp_addresses == []
    with pytest.raises(ValueError, match="as many"):
        external_cluster_from_env({**env, "FASTNSQ_TEST_CLUSTER_NSQD_HTTP": "10.0.0.1:4151"})
    # A cluster needs its lookupd.
    assert external_cluster_from_env({"FASTNSQ_TEST_CLUSTER_NSQD": "10.0.0.1:4150"}) is None


# ---- the fixtures used directly, and is_ha ----------------------------------------------------


async def test_nsqlookupd_fixture_used_directly(nsqlookupd: Any) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"http://{nsqlookupd.http_address}/ping") as r:
        assert await r.text() == "OK"
    assert isinstance(nsqlookupd, ExternalLookupd if external_lookupd_from_env() else NSQLookupd)


async def test_is_ha_of_upstream_servers() -> None:
    async with NSQLookupd() as lookupd:
        assert await is_ha(lookupd) is False
        assert not is_external(lookupd)
        # Asked over HTTP, as a real lookupd is: /info says 1.3.0, not HA.
        probe = ExternalLookupd(lookupd.http_address)
        assert await is_ha(probe) is False
        assert probe._ha is False


async def test_is_ha_asks_an_nsqd_with_identify(nsqd: Any) -> None:
    # The probe a real nsqd gets: IDENTIFY with feature negotiation, "HA" in the version or not.
    probe = ExternalNSQD(nsqd.tcp_address, nsqd.http_address)
    assert await is_ha(probe) is False
    assert probe._ha is False


# ---- the auth server ---------------------------------------------------------------------------------

SECRET = "s3cret-token-value"


async def _auth_get(
    auth: AuthServer, query: str, *, method: str = "GET", data: str | None = None
) -> tuple[int, str, bytes]:
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if data else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"http://{auth.address}/auth{query}", data=data, headers=headers) as r,
    ):
        return r.status, r.headers.get("Content-Type", ""), await r.read()


async def test_auth_server_answers_known_secrets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="fastnsq")
    grants = {
        SECRET: ("alice", [authorization("events", permissions=["publish"])]),
        "other": Grant("bob", (authorization(),), identity_url="http://id/bob", ttl=5),
    }
    async with AuthServer(grants, ttl=60) as auth:
        status, ctype, body = await _auth_get(
            auth, f"?remote_ip=127.0.0.1&tls=false&secret={SECRET}&common_name="
        )
        assert (status, ctype) == (200, "application/json; charset=utf-8")
        assert body == (
            b'{"ttl":60,"identity":"alice","identity_url":"","authorizations":'
            b'[{"topic":"events","channels":[".*"],"permissions":["publish"]}]}'
        )
        # nsqd 1.3 --auth-http-request-method=post sends the same fields as a form.
        status, _, body = await _auth_get(
            auth, "", method="POST", data="remote_ip=10.0.0.1&tls=true&secret=other"
        )
        assert status == 200
        assert json.loads(body) == {
            "ttl": 5,
            "identity": "bob",
            "identity_url": "http://id/bob",
            "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}],
        }
        # Unknown secret: 403 with a body nsqd cannot read as {"https_port": N}, so it fails at once.
        status, ctype, body = await _auth_get(auth, "?remote_ip=127.0.0.1&tls=false&secret=wrong")
        assert (status, body) == (403, b"NOT_AUTHORIZED")
        with pytest.raises(ValueError):
            json.loads(body)
        auth.revoke(SECRET)
        assert (await _auth_get(auth, f"?secret={SECRET}"))[0] == 403
        auth.fail_status = 500
        assert (await _auth_get(auth, "?secret=other"))[0] == 500
        assert (await _auth_get(auth, "/x"))[0] == 404

        assert [(r.remote_ip, r.tls, r.method, r.identity) for r in auth.requests] == [
            ("127.0.0.1", "false", "GET", "alice"),
            ("10.0.0.1", "true", "POST", "bob"),
            ("127.0.0.1", "false", "GET", None),
            ("", "", "GET", None),
            ("", "", "GET", None),
        ]
    # Secrets are neither logged nor kept.
    assert "auth" in caplog.text
    assert SECRET not in caplog.text and "wrong" not in caplog.text
    assert SECRET not in repr(auth.requests)


def test_auth_server_rejects_bad_grants() -> None:
    with pytest.raises(InvalidValueError, match="Grant or to"):
        AuthServer({"s": "alice"})  # type: ignore[dict-item]
    with pytest.raises(InvalidValueError, match="topic"):
        AuthServer({"s": ("alice", [{"channels": [".*"]}])})
    with pytest.raises(InvalidValueError, match="ttl"):
        AuthServer(ttl=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="list of strings"):
        authorization("t", channels="c")


async def test_auth_server_with_the_embedded_nsqd() -> None:
    from fastnsq import codec

    async with AuthServer({SECRET: ("alice", [authorization("events")])}) as auth:
        nsqd = await started_nsqd(auth_http_addresses=[auth.address])
        try:
            host, _, port = nsqd.tcp_address.rpartition(":")
            answers = []
            for secret in (SECRET, "wrong"):
                reader, writer = await asyncio.open_connection(host, int(port))
                out = codec.WriteBuffer()
                out.magic()
                out.identify(json.dumps({"feature_negotiation": True}).encode())
                out.auth(secret)
                writer.write(out.take())
                frames = []
                for _ in range(2):
                    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 5), "big")
                    frames.append(await reader.readexactly(size))
                writer.close()
                assert json.loads(frames[0][4:])["auth_required"] is True
                answers.append(frames[1])
            assert json.loads(answers[0][4:])["identity"] == "alice"
            assert answers[1][4:].startswith(b"E_AUTH_FAILED")
            assert [r.identity for r in auth.requests] == ["alice", None]
        finally:
            await nsqd.stop()


# ---- the embedded nsqd with the embedded lookupd --------------------------------------------------


async def _post(address: str, path: str) -> int:
    async with aiohttp.ClientSession() as http, http.post(f"http://{address}{path}") as r:
        await r.read()
        return r.status


async def test_embedded_nsqd_registers_with_embedded_lookupd_over_tcp() -> None:
    async with NSQLookupd() as lookupd:
        nsqd = await started_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
        try:
            (node,) = await lookupd.wait_for_nodes(1)
            assert (node["tcp_port"], node["http_port"]) == (nsqd.tcp_port, nsqd.http_port)
            assert node["broadcast_address"] == "127.0.0.1" and node["topics"] == []

            # nsqd's /channel/create needs an existing topic (404 TOPIC_NOT_FOUND otherwise).
            assert await _post(nsqd.http_address, "/topic/create?topic=events") == 200
            assert await _post(nsqd.http_address, "/channel/create?topic=events&channel=archive") == 200
            (producer,) = await lookupd.wait_for_producers("events")
            assert producer["tcp_port"] == nsqd.tcp_port
            for _ in range(200):
                if lookupd.channels("events") == ["archive"]:
                    break
                await asyncio.sleep(0.01)
            assert lookupd.channels("events") == ["archive"]

            assert await _post(nsqd.http_address, "/topic/delete?topic=events") == 200
            for _ in range(200):
                if not lookupd.lookup("events")["producers"]:
                    break
                await asyncio.sleep(0.01)
            assert lookupd.lookup("events")["producers"] == []
        finally:
            await nsqd.stop()
        # A stopped nsqd closes its lookupd connection: the node is gone.
        for _ in range(200):
            if not lookupd.nodes():
                break
            await asyncio.sleep(0.01)
        assert lookupd.nodes() == []


async def test_cluster_add_stop_start_nodes() -> None:
    embedded_nsqd_class()
    cluster = NSQCluster(nodes=2)
    try:
        await cluster.start()
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("fastnsq.testing"):
            raise
        pytest.skip(f"the embedded nsqd is not built yet ({exc.name} missing)")
    try:
        assert len(cluster.lookupd.nodes()) == 2 and len(set(cluster.tcp_addresses)) == 2
        assert cluster.lookupd_http_addresses == [cluster.lookupd.http_address]
        third = await cluster.add_node()
        assert cluster.nsqds[2] is third and len(cluster.lookupd.nodes()) == 3

        await cluster.stop_node(0)
        assert not cluster.is_running(0) and len(cluster.running_nsqds) == 2
        assert nsqd_ports(cluster.lookupd) == sorted(n.tcp_port for n in cluster.nsqds[1:])
        await cluster.start_node(0)
        assert nsqd_ports(cluster.lookupd) == sorted(n.tcp_port for n in cluster.nsqds)

        assert await _post(cluster.http_addresses[1], "/topic/create?topic=spread") == 200
        (producer,) = await cluster.lookupd.wait_for_producers("spread")
        assert producer["tcp_port"] == cluster.nsqds[1].tcp_port
    finally:
        await cluster.stop()
    assert not cluster.lookupd.running


def nsqd_ports(lookupd: NSQLookupd) -> list[int]:
    return sorted(node["tcp_port"] for node in lookupd.nodes())


async def test_nsq_cluster_fixture(nsq_cluster: Any) -> None:
    cluster = nsq_cluster
    assert len(cluster.tcp_addresses) == 3
    assert len(cluster.lookupd_http_addresses) == 1
    if not is_external(cluster):
        assert len(cluster.lookupd.nodes()) == 3


async def test_nsqd_fixture(nsqd: Any) -> None:
    host, _, port = nsqd.tcp_address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        # IDENTIFY without feature negotiation answers a bare OK (captures/identify_plain.json).
        writer.write(b"  V2IDENTIFY\n" + len(b"{}").to_bytes(4, "big") + b"{}")
        assert await asyncio.wait_for(reader.readexactly(10), 5) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    finally:
        writer.close()
    assert int(port) == nsqd.tcp_port
    async with aiohttp.ClientSession() as http, http.get(f"http://{nsqd.http_address}/ping") as r:
        assert await r.text() == "OK"


# ---- python -m fastnsq.testing --------------------------------------------------------------


def test_main_runs_lookupd_until_sigterm(lookupd_process: dict[str, str]) -> None:
    import urllib.request

    with urllib.request.urlopen(f"http://{lookupd_process['http']}/ping", timeout=5) as r:
        assert r.read() == b"OK"


def test_main_stops_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fastnsq.testing",
            "--no-nsqd",
            "--lookupd-tcp-port",
            "0",
            "--lookupd-http-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("nsqlookupd  tcp 127.0.0.1:")
    assert proc.stdout.readline().startswith("running")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert proc.stdout.read() == "stopped\n"


def test_main_runs_the_ha_dialect() -> None:
    with servers_process("--ha", "--lookupd", "--tcp-port", "0", "--http-port", "0", "--lookupd-tcp-port", "0",
                         "--lookupd-http-port", "0") as servers:
        from fastnsq.testing import ExternalLookupd, ExternalNSQD, is_ha

        async def probe() -> tuple[bool, bool]:
            nsqd_is_ha = await is_ha(ExternalNSQD(servers["nsqd"]["tcp"]))
            return nsqd_is_ha, await is_ha(ExternalLookupd(servers["nsqlookupd"]["http"]))

        assert asyncio.run(probe()) == (True, True)
