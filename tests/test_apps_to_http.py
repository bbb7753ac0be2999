"""``fastnsq to-http``: nsq_to_http's command line on fastnsq, run as a real process into a real HTTP sink.

The sink is an aiohttp server in the test (it records every request): every message arrives,
POST and GET requests carry what nsq_to_http's carry (side by side with nsq's own binary in the
real pass), ``--batch`` sends newline-delimited bodies, a sink failing for a while loses
nothing, and a SIGKILL loses nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from fastnsq.apps.to_http import canonical_key, go_host, go_sprintf, request_headers
from fastnsq.cli._common import UsageError
from fastnsq.cli.to_http import parse_headers

from .apps_support import App, Sink, channel_drained, create_channels, go_app, run_to_exit, start, start_go
from .helpers import eventually, unique
from .test_consumer import publish_spread


async def drained(nsqd, topic: str, channel: str = "nsq_to_http", *, published: int) -> bool:
    return await channel_drained(nsqd.http_address, topic, channel, published=published)


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    """An HTTP sink recording every request, closed when the test ends."""
    started = await Sink().start()
    yield started
    await started.close()


@pytest.fixture
async def sink2() -> AsyncIterator[Sink]:
    started = await Sink().start()
    yield started
    await started.close()


async def run_until_drained(nsqd, topic: str, *flags: str, published: int, log: Path, timeout: float = 30,
                            channel: str = "nsq_to_http", starter=start) -> App:
    """The app (ours, or nsq's with ``starter=start_go``) on ``topic`` until its channel has taken
    the ``published`` messages and holds none, then stopped with SIGTERM (exit status 0)."""
    command = "nsq_to_http" if starter is start_go else "to-http"
    app = await starter(command, f"-topic={topic}", f"-channel={channel}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                        *flags, log=log)
    await eventually(lambda: drained(nsqd, topic, channel, published=published), timeout, f"{channel} drained")
    assert await app.stop() == 0, app.log()
    return app


def test_headers_as_nsq_to_http_parses_them() -> None:
    assert parse_headers(["X-A: 1", " X-B :two words "]) == {"X-A": "1", "X-B": "two words"}
    for bad in ("X-A", "X-A:", ": 1"):
        with pytest.raises(UsageError, match="invalid header"):
            parse_headers([bad])


def test_request_headers_in_go_clients_order_and_case() -> None:
    """What Go's net/http writes for nsq_to_http: User-Agent, (Content-Length), the rest sorted
    with canonical names, then its transport's Accept-Encoding; a custom header replaces ours."""
    before, after = request_headers("POST", "text/plain", {"x-team": "data", "accept": "*/*"})
    assert list(before.items()) == [("User-Agent", "nsq_to_http v1.3.0")]
    assert list(after.items()) == [("Accept", "*/*"), ("Content-Type", "text/plain"), ("X-Team", "data"),
                                   ("Accept-Encoding", "gzip")]
    before, after = request_headers("GET", "text/plain", {"user-agent": "mine", "Accept-Encoding": "br"})
    assert before == {"User-Agent": "mine"} and list(after.items()) == [("Accept-Encoding", "br")]
    assert [canonical_key(k) for k in ("x-team-ID", "content-type", "x y")] == ["X-Team-Id", "Content-Type", "x y"]
    assert go_sprintf("http://h/%%7E?d=%s", "a+b") == "http://h/%7E?d=a+b"


def test_host_as_go_writes_it() -> None:
    """Go's client writes the URL's host as written, an explicit default port included."""
    assert go_host("http://h:80/in") == "h:80" and go_host("https://h:443/") == "h:443"
    assert go_host("http://Example.COM:8080/x?y=1") == "Example.COM:8080"
    assert go_host("http://user:pw@h/x") == "h" and go_host("http://[::1]:80/") == "[::1]:80"
    assert go_host("http://bücher.example/") is None  # not ASCII: both clients write its IDNA form


async def test_an_explicit_default_port_stays_in_host(nsqd, tmp_path: Path) -> None:
    """``-post=http://127.0.0.1:80/...``: Host 127.0.0.1:80 as nsq_to_http sends it (aiohttp
    alone drops the :80), for POST and GET."""
    try:
        port80 = await Sink().start(80)
    except OSError as exc:
        pytest.skip(f"port 80 cannot be had here: {exc}")
    starters = [start, start_go] if go_app("nsq_to_http") else [start]  # nsq's own beside ours in the real pass
    try:
        for starter in starters:
            for flag in ("-post=http://127.0.0.1:80/in", "-get=http://127.0.0.1:80/q?d=%s"):
                topic = unique("tohttp")
                await publish_spread([nsqd.tcp_address], topic, 3)
                await run_until_drained(nsqd, topic, flag, published=3, log=tmp_path / "log", starter=starter)
        assert [r["headers"]["Host"] for r in port80.requests] == ["127.0.0.1:80"] * 6 * len(starters)
    finally:
        await port80.close()


async def test_bad_usage_is_named() -> None:
    nsqd = "-nsqd-tcp-address=127.0.0.1:4150"
    for args, said in ((["-topic=t", nsqd], "--get or --post required"),
                       (["-topic=t", nsqd, "-get=http://x/?a=1"], "exactly one %s"),
                       (["-topic=t", nsqd, "-get=http://x/%s", "-post=http://x/"], "not both"),
                       (["-topic=t", nsqd, "-post=http://x/", "-sample=2"], "--sample 2.0"),
                       (["-topic=t", nsqd, "-get=http://x/%s", "-batch=10"], "--batch 10: only with --post")):
        status, out = await run_to_exit("to-http", *args)
        assert status == 2 and said in out, (args, out)


async def test_post_a_request_per_message(nsqd, sink: Sink, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 1000)
    app = await run_until_drained(nsqd, topic, f"-post={sink.url('/in?x=1')}", "-header=x-team: data",
                                  "-content-type=text/plain", "-n=20", "-status-every=500", published=1000,
                                  log=tmp_path / "log")
    assert len(sink.requests) == 1000 and sorted(sink.bodies()) == sorted(bodies)
    first = sink.requests[0]
    assert first["method"] == "POST" and first["path"] == "/in?x=1"
    # nsq_to_http's request, header for header (names, case, order) as Go's client writes it.
    assert first["raw_headers"] == [("Host", f"127.0.0.1:{sink.port}"), ("User-Agent", "nsq_to_http v1.3.0"),
                                    ("Content-Length", str(len(first["body"]))), ("Content-Type", "text/plain"),
                                    ("X-Team", "data"), ("Accept-Encoding", "gzip")]
    assert "[aggregate]: finished 500" in app.log()


async def test_get_escapes_the_body_and_fan_out_reaches_every_address(nsqd, sink: Sink, sink2: Sink,
                                                                        tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = [f"a b&c=d/é {i}".encode() for i in range(50)]
    from fastnsq import Producer

    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, bodies)
    await run_until_drained(nsqd, topic, "-mode=fan-out", f"-get={sink.url('/q?d=%s&k=1')}",
                            f"-get={sink2.url('/q?d=%s')}", published=50, log=tmp_path / "log")
    for one in (sink, sink2):
        assert len(one.requests) == 50 and {r["method"] for r in one.requests} == {"GET"}
        got = sorted(parse_qs(urlsplit(r["path"]).query)["d"][0].encode() for r in one.requests)
        assert got == sorted(bodies)
    assert "+" in sink.requests[0]["path"] and "%26c%3Dd%2F%C3%A9" in sink.requests[0]["path"]  # url.QueryEscape
    assert [name for name, _ in sink.requests[0]["raw_headers"]] == ["Host", "User-Agent", "Accept-Encoding"]


async def test_batch_sends_up_to_n_bodies_a_request(nsqd, sink: Sink, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 3000)
    await run_until_drained(nsqd, topic, f"-post={sink.url()}", "-batch=100", "-max-in-flight=1000",
                            published=3000, log=tmp_path / "log")
    sizes = [len(r["body"].split(b"\n")) for r in sink.requests]
    assert max(sizes) == 100 and len(sink.requests) < 100, sizes
    assert sorted(sink.bodies()) == sorted(bodies)


@pytest.mark.slow
async def test_a_sink_failing_for_10_s_loses_nothing(nsqd, sink: Sink, tmp_path: Path) -> None:
    """500 for 10 s, then 200: every message delivered, none given up (max attempts not reached)."""
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 2000)
    sink.fail_for(10.0)
    app = await run_until_drained(nsqd, topic, f"-post={sink.url()}", "-max-in-flight=200",
                                  "-consumer-opt=default_requeue_delay,1s", "-consumer-opt=max_attempts,20",
                                  "-consumer-opt=max_backoff_duration,2s", published=2000, log=tmp_path / "log",
                                  timeout=90)
    assert any(r["failed"] for r in sink.requests) and "got status code 500" in app.log()
    assert sorted(set(sink.bodies())) == sorted(bodies)  # 0 lost
    assert "giving up" not in app.log().lower()


@pytest.mark.slow
async def test_sigkill_mid_stream_loses_nothing(nsqd, sink: Sink, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 30_000)
    args = [f"-post={sink.url()}", "-max-in-flight=500", "-batch=50", "-status-every=0",
            "-consumer-opt=msg_timeout,3s"]
    app = await start("to-http", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", *args,
                      log=tmp_path / "log")
    await eventually(lambda: len(sink.requests) > 50, 30, "a part sent")
    await app.kill()
    await run_until_drained(nsqd, topic, *args, published=30_000, log=tmp_path / "log", timeout=60)
    counts = Counter(sink.bodies())
    assert set(counts) == set(bodies)
    assert sum(counts.values()) - len(bodies) <= 500


@pytest.mark.skipif(not go_app("nsq_to_http"), reason="nsq's nsq_to_http is run beside ours in the real pass")
@pytest.mark.parametrize("method", ["post", "get"])
async def test_same_requests_as_nsq_to_http(nsqd, sink: Sink, tmp_path: Path, method: str) -> None:
    """The same flags to nsq_to_http and to ours, into the same sink: the same requests, byte for
    byte as the sink reads them (method, path and query, every header with its name's case, in
    order, User-Agent included, and the body)."""
    topic = unique("tohttp")
    await create_channels(nsqd.http_address, topic, "go", "ours")
    from fastnsq import Producer

    bodies = [f"x {i} &é/~*'+%".encode() for i in range(100)]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, bodies)
    target = sink.url("/in?d=%s") if method == "get" else sink.url("/in?a=1")
    extra = ["-content-type=application/json"] if method == "post" else []
    seen = {}
    for name, starter in (("go", start_go), ("ours", start)):
        sink.requests.clear()
        await run_until_drained(nsqd, topic, f"-{method}={target}", "-header=x-team: data", "-header=Accept: */*",
                                *extra, published=100, channel=name, starter=starter, log=tmp_path / f"{name}.log")
        seen[name] = sorted((r["method"], r["path"], r["raw_headers"], r["body"]) for r in sink.requests)
    assert seen["ours"] == seen["go"] and len(seen["go"]) == 100, (seen["ours"][:2], seen["go"][:2])
