"""``fastnsq to-http``: nsq_to_http's command line on fastnsq, run as a real process into a real HTTP sink.

The sink is an aiohttp server in the test (it records every request): every message arrives,
POST and GET requests carry what nsq_to_http's carry (side by side with nsq's own binary in the
real pass), ``--batch`` sends newline-delimited bodies, a sink failing for a while loses
nothing, and a SIGKILL loses nothing.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from fastnsq.cli._common import UsageError
from fastnsq.cli.to_http import parse_headers

from .apps_support import Sink, create_channels, go_app, run_to_exit, start, start_go
from .helpers import eventually, unique
from .test_consumer import channel_stats, publish_spread


async def drained(nsqd, topic: str, channel: str = "nsq_to_http") -> bool:
    stats = await channel_stats([nsqd.http_address], topic, channel)
    return bool(stats) and stats[0]["depth"] == 0 and stats[0]["in_flight_count"] == 0 and stats[0][
        "deferred_count"] == 0


def test_headers_as_nsq_to_http_parses_them() -> None:
    assert parse_headers(["X-A: 1", " X-B :two words "]) == {"X-A": "1", "X-B": "two words"}
    for bad in ("X-A", "X-A:", ": 1"):
        with pytest.raises(UsageError, match="invalid header"):
            parse_headers([bad])


async def test_bad_usage_is_named() -> None:
    nsqd = "-nsqd-tcp-address=127.0.0.1:4150"
    for args, said in ((["-topic=t", nsqd], "--get or --post required"),
                       (["-topic=t", nsqd, "-get=http://x/?a=1"], "exactly one %s"),
                       (["-topic=t", nsqd, "-get=http://x/%s", "-post=http://x/"], "not both"),
                       (["-topic=t", nsqd, "-post=http://x/", "-sample=2"], "--sample 2.0"),
                       (["-topic=t", nsqd, "-get=http://x/%s", "-batch=10"], "--batch 10: only with --post")):
        status, out = await run_to_exit("to-http", *args)
        assert status == 2 and said in out, (args, out)


async def test_post_a_request_per_message(nsqd, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 1000)
    sink = await Sink().start()
    try:
        app = await start("to-http", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-post={sink.url('/in?x=1')}", "-header=X-Team: data", "-content-type=text/plain",
                          "-n=20", "-status-every=500", log=tmp_path / "log")
        await eventually(lambda: drained(nsqd, topic), 30, "the channel drained")
        assert await app.stop() == 0, app.log()
    finally:
        await sink.close()
    assert len(sink.requests) == 1000 and sorted(sink.bodies()) == sorted(bodies)
    first = sink.requests[0]
    assert first["method"] == "POST" and first["path"] == "/in?x=1"
    assert first["headers"]["Content-Type"] == "text/plain" and first["headers"]["X-Team"] == "data"
    assert "[aggregate]: finished 500" in app.log()


async def test_get_escapes_the_body_and_fan_out_reaches_every_address(nsqd, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = [f"a b&c=d/é {i}".encode() for i in range(50)]
    from fastnsq import Producer

    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, bodies)
    one, two = await Sink().start(), await Sink().start()
    try:
        app = await start("to-http", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", "-mode=fan-out",
                          f"-get={one.url('/q?d=%s&k=1')}", f"-get={two.url('/q?d=%s')}", log=tmp_path / "log")
        await eventually(lambda: drained(nsqd, topic), 30, "the channel drained")
        assert await app.stop() == 0, app.log()
    finally:
        await one.close()
        await two.close()
    for sink in (one, two):
        assert len(sink.requests) == 50 and {r["method"] for r in sink.requests} == {"GET"}
        got = sorted(parse_qs(urlsplit(r["path"]).query)["d"][0].encode() for r in sink.requests)
        assert got == sorted(bodies)
    assert "+" in one.requests[0]["path"] and "%26c%3Dd%2F%C3%A9" in one.requests[0]["path"]  # url.QueryEscape


async def test_batch_sends_up_to_n_bodies_a_request(nsqd, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 3000)
    sink = await Sink().start()
    try:
        app = await start("to-http", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-post={sink.url()}", "-batch=100", "-max-in-flight=1000", log=tmp_path / "log")
        await eventually(lambda: drained(nsqd, topic), 30, "the channel drained")
        assert await app.stop() == 0, app.log()
    finally:
        await sink.close()
    sizes = [len(r["body"].split(b"\n")) for r in sink.requests]
    assert max(sizes) == 100 and len(sink.requests) < 100, sizes
    assert sorted(sink.bodies()) == sorted(bodies)


@pytest.mark.slow
async def test_a_sink_failing_for_10_s_loses_nothing(nsqd, tmp_path: Path) -> None:
    """500 for 10 s, then 200: every message delivered, none given up (max attempts not reached)."""
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 2000)
    sink = await Sink().start()
    sink.fail_for(10.0)
    try:
        app = await start("to-http", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-post={sink.url()}", "-max-in-flight=200",
                          "-consumer-opt=default_requeue_delay,1s", "-consumer-opt=max_attempts,20",
                          "-consumer-opt=max_backoff_duration,2s", log=tmp_path / "log")
        await eventually(lambda: drained(nsqd, topic), 90, "the channel drained")
        assert await app.stop() == 0, app.log()
    finally:
        await sink.close()
    assert any(r["failed"] for r in sink.requests) and "got status code 500" in app.log()
    assert sorted(set(sink.bodies())) == sorted(bodies)  # 0 lost
    assert "giving up" not in app.log().lower()


@pytest.mark.slow
async def test_sigkill_mid_stream_loses_nothing(nsqd, tmp_path: Path) -> None:
    topic = unique("tohttp")
    bodies = await publish_spread([nsqd.tcp_address], topic, 30_000)
    sink = await Sink().start()
    args = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-post={sink.url()}",
            "-max-in-flight=500", "-batch=50", "-status-every=0", "-consumer-opt=msg_timeout,3s"]
    try:
        app = await start("to-http", *args, log=tmp_path / "log")
        await eventually(lambda: len(sink.requests) > 50, 30, "a part sent")
        await app.kill()
        app = await start("to-http", *args, log=tmp_path / "log")
        await eventually(lambda: drained(nsqd, topic), 60, "the channel drained")
        assert await app.stop() == 0, app.log()
    finally:
        await sink.close()
    counts = Counter(sink.bodies())
    assert set(counts) == set(bodies)
    assert sum(counts.values()) - len(bodies) <= 500


@pytest.mark.skipif(not go_app("nsq_to_http"), reason="nsq's nsq_to_http is run beside ours in the real pass")
@pytest.mark.parametrize("method", ["post", "get"])
async def test_same_requests_as_nsq_to_http(nsqd, tmp_path: Path, method: str) -> None:
    """The same flags to nsq_to_http and to ours: the same requests (method, path and query,
    body, Content-Type, custom headers); the User-Agent says which client it is."""
    topic = unique("tohttp")
    await create_channels(nsqd.http_address, topic, "go", "ours")
    from fastnsq import Producer

    bodies = [f"x {i} &é".encode() for i in range(100)]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, bodies)
    seen = {}
    for name, starter in (("go", start_go), ("ours", start)):
        sink = await Sink().start()
        target = sink.url("/in?d=%s") if method == "get" else sink.url("/in?a=1")
        extra = ["-content-type=application/json"] if method == "post" else []
        try:
            app = await starter("nsq_to_http" if name == "go" else "to-http", f"-topic={topic}", f"-channel={name}",
                                f"-nsqd-tcp-address={nsqd.tcp_address}", f"-{method}={target}",
                                "-header=X-Team: data", *extra, log=tmp_path / f"{name}.log")
            await eventually(lambda name=name: drained(nsqd, topic, name), 30, f"{name} drained")
            assert await app.stop() == 0, app.log()
        finally:
            await sink.close()
        seen[name] = sorted((r["method"], r["path"], r["body"], r["headers"].get("Content-Type"),
                             r["headers"].get("X-Team")) for r in sink.requests)
    assert seen["ours"] == seen["go"] and len(seen["go"]) == 100
