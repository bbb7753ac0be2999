"""``fastnsq to-postgres``: JSON messages into a real PostgreSQL (our own instance, tests/pgserver.py).

The app runs as a real process against nsqd (embedded, or real in the real pass) and a
PostgreSQL started for this module: the rows are exactly the messages published, a key sent
twice is absorbed and counted, bad bodies land on the dead-letter topic intact, a batch that
fails is not finished (its messages come back), and SIGTERM drains: every message is either a
row or back in nsqd, none in flight. Skipped, naming Debian's package, where PostgreSQL's
binaries are missing (.ci/run installs them).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fastnsq import Consumer, Producer
from fastnsq.apps.deadletter import dead_letter_topic_for
from fastnsq.apps.pgrows import BadBody, RowMaker
from fastnsq.testing.process import free_port

from .apps_support import Source, start
from .helpers import eventually, unique
from .pgserver import PostgresServer, missing_reason
from .test_consumer import channel_stats

pytest.importorskip("asyncpg", reason="the postgres extra (asyncpg) is not installed")

TABLE = """CREATE TABLE {name} (id bigint PRIMARY KEY, kind text NOT NULL, n integer, at timestamptz,
                                tags text[], extra jsonb)"""


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    server = PostgresServer(settings={"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"})
    try:
        server.start()
        yield server
    finally:
        server.remove()


def event(i: int, **more: Any) -> bytes:
    return json.dumps({"id": i, "kind": f"k{i % 7}", "n": i * 3, "at": "2026-11-29T10:00:00Z",
                       "source": "test", **more}).encode()


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer([address]) as producer:
        for begin in range(0, len(bodies), 500):
            await producer.mpublish(topic, bodies[begin:begin + 500])


async def metric(port: int, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for found in re.finditer(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, re.MULTILINE):
        if all(f'{key}="{value}"' in (found.group(1) or "") for key, value in labels.items()):
            total += float(found.group(2))
    return total


def app_args(topic: str, nsqd: Any, postgres: PostgresServer, table: str, *more: str) -> list[str]:
    return [f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--dsn={postgres.dsn}",
            f"--table={table}", "--key=id", *more]


# ---- pure pieces -------------------------------------------------------------------------------


def test_bodies_become_copy_lines_by_column_name() -> None:
    rows = RowMaker(["id", "kind", "n", "extra"], "id", rest_column="extra")
    assert rows.columns == ["id", "kind", "n", "extra"]
    key, line = rows.line(b'{"id": 7, "kind": "a\\tb\\\\c\\nd", "other": [1, true], "n": null}')
    assert key == 7
    assert line == '7\ta\\tb\\\\c\\nd\t\\N\t{"other":[1,true]}'
    assert rows.line(b'{"id": "x", "kind": true}')[1] == "x\tt\t\\N\t\\N"  # nothing left over: NULL
    refusing = RowMaker(["id", "kind"], "id", refuse_unknown=True)
    with pytest.raises(BadBody, match="field.s. without a column: other"):
        refusing.line(b'{"id": 1, "other": 2}')
    assert RowMaker(["id", "kind"], "id").line(b'{"id": 1, "other": 2}')[1] == "1\t\\N"  # left out
    for body, why in ((b"not json", "not JSON"), (b"[1]", "a JSON list, not an object"), (b'{"n": 1}', "no 'id'"),
                      (b"\xff", "not JSON")):
        with pytest.raises(BadBody, match=why):
            rows.line(body)
    assert dead_letter_topic_for("events") == "events.dead"
    assert dead_letter_topic_for("e#ephemeral") == "e.dead#ephemeral"


# ---- against PostgreSQL ------------------------------------------------------------------------


async def test_rows_exact_duplicates_counted_bad_bodies_dead_lettered(nsqd: Any, postgres: PostgresServer,
                                                                      tmp_path: Path) -> None:
    topic, table = unique("topg"), unique("events")
    postgres.psql(TABLE.format(name=table))
    good = [event(i, tags=["a", "b c"]) for i in range(3000)]
    bad = [b"not json", b"[1, 2]", b'{"kind": "no id"}', event(5000, n="not a number"), event(5001, kind=None)]
    bodies = good + good[:500] + bad  # 500 keys twice, 5 bodies that cannot be rows
    await publish(nsqd.tcp_address, topic, bodies)
    dead: list[bytes] = []
    checker = Consumer(dead_letter_topic_for(topic), "check", nsqd_tcp_addresses=[nsqd.tcp_address],
                       handler=lambda m: dead.append(m.body))
    await checker.start()
    port = free_port()
    app = await start("to-postgres", *app_args(topic, nsqd, postgres, table, "--rest-column=extra",
                                               "--batch-size=200", f"--metrics-port={port}"), log=tmp_path / "log")
    try:
        source = Source(nsqd.http_address, topic, "to-postgres")
        await eventually(lambda: source.drained(len(bodies)), 60, "the topic written", progress=source.done)
        await eventually(lambda: len(dead) >= len(bad), 30, "the dead letters")
        assert await metric(port, "fastnsq_to_postgres_rows_total", outcome="inserted") == 3000
        assert await metric(port, "fastnsq_to_postgres_rows_total", outcome="duplicate") == 500
        assert await metric(port, "fastnsq_to_postgres_rows_total", outcome="dead_lettered") == 5
    finally:
        await checker.stop()
        assert await app.stop() == 0, app.log()
    assert sorted(dead) == sorted(bad)  # bodies intact
    rows = postgres.psql(f"SELECT id, kind, n, at = '2026-11-29T10:00:00Z', tags, extra FROM {table} ORDER BY id")
    assert rows.splitlines() == [f'{i}|k{i % 7}|{i * 3}|t|{{a,"b c"}}|{{"source": "test"}}' for i in range(3000)]
    assert "3000 rows inserted, 500 duplicates absorbed, 5 dead-lettered" in app.log()
    [stats] = await channel_stats([nsqd.http_address], topic, "to-postgres")
    assert stats["in_flight_count"] == stats["depth"] == 0


async def test_a_failing_batch_is_not_finished(nsqd: Any, postgres: PostgresServer, tmp_path: Path) -> None:
    """A trigger that fails every insert (not a row's fault): nothing finished, every message
    requeued, no row; once the trigger is gone, every row arrives, each once."""
    topic, table = unique("topg"), unique("events")
    postgres.psql(TABLE.format(name=table))
    postgres.psql(f"CREATE FUNCTION {table}_no() RETURNS trigger LANGUAGE plpgsql AS "
                  f"$$ BEGIN RAISE EXCEPTION 'the database says no'; END $$")
    postgres.psql(f"CREATE TRIGGER no BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_no()")
    await publish(nsqd.tcp_address, topic, [event(i) for i in range(500)])
    port = free_port()
    app = await start("to-postgres", *app_args(topic, nsqd, postgres, table, "--batch-size=100",
                                               f"--metrics-port={port}", "--consumer-opt=default_requeue_delay,0.2",
                                               "--consumer-opt=max_backoff_duration,0.5",
                                               "--consumer-opt=max_attempts,0"), log=tmp_path / "log")
    try:
        await eventually(lambda: _at_least(metric(port, "nsq_consumer_messages_requeued_total"), 500), 60,
                         "the failing batches requeued")
        assert await metric(port, "nsq_consumer_messages_finished_total") == 0
        assert postgres.psql(f"SELECT count(*) FROM {table}") == "0"
        assert "the database says no" in app.log()
        postgres.psql(f"DROP TRIGGER no ON {table}")
        source = Source(nsqd.http_address, topic, "to-postgres")
        await eventually(lambda: source.drained(500), 60, "the topic written", progress=source.done)
    finally:
        assert await app.stop() == 0, app.log()
    assert postgres.psql(f"SELECT count(*), count(DISTINCT id) FROM {table}") == "500|500"


async def _at_least(value: Any, low: float) -> bool:
    try:
        return float(await value) >= low
    except aiohttp.ClientError:  # /metrics not served yet
        return False


async def topic_depth(http_address: str, topic: str, depth: int) -> bool:
    """The topic holds ``depth`` messages not yet copied into its channels (nsqd's /stats)."""
    query = {"format": "json", "topic": topic}
    async with aiohttp.ClientSession() as session, session.get(f"http://{http_address}/stats", params=query) as resp:
        data = await resp.json(content_type=None)
    return [t["depth"] for t in data.get("topics") or [] if t["topic_name"] == topic] == [depth]


@pytest.mark.slow
async def test_sigterm_drains_every_message_a_row_or_back_in_nsqd(nsqd: Any, postgres: PostgresServer,
                                                                   tmp_path: Path) -> None:
    topic, table, total = unique("topg"), unique("events"), 40_000
    postgres.psql(TABLE.format(name=table))
    await publish(nsqd.tcp_address, topic, [event(i) for i in range(total)])
    app = await start("to-postgres", *app_args(topic, nsqd, postgres, table, "--batch-size=400", "--processes=2"),
                      log=tmp_path / "log")
    await eventually(lambda: int(postgres.psql(f"SELECT count(*) FROM {table}")) >= 2000, 60, "some rows")
    assert await app.stop(60) == 0, app.log()
    # nsqd copies the topic's backlog into the channel on its own, consumers or not: on a busy
    # machine a real nsqd (default flags: 30,000 of these on the topic's disk queue) was still at
    # it after the stop, and 5,590 messages were in neither the channel nor the table yet.
    await eventually(lambda: topic_depth(nsqd.http_address, topic, 0), 60, "the topic copied into the channel")
    rows = int(postgres.psql(f"SELECT count(*) FROM {table}"))
    [stats] = await channel_stats([nsqd.http_address], topic, "to-postgres")
    assert stats["in_flight_count"] == 0
    assert rows + stats["depth"] + stats["deferred_count"] == total, (rows, stats)
    assert rows < total, "the drain came after the end: the test proves nothing"
    assert app.log().count("drained:") == 2


@pytest.mark.slow
async def test_postgres_restarted_mid_stream_loses_nothing(nsqd: Any, postgres: PostgresServer,
                                                           tmp_path: Path) -> None:
    topic, table, total = unique("topg"), unique("events"), 30_000
    postgres.psql(TABLE.format(name=table))
    bodies = [event(i) for i in range(total)]
    await publish(nsqd.tcp_address, topic, bodies[:10_000])
    app = await start("to-postgres", *app_args(topic, nsqd, postgres, table, "--batch-size=400",
                                               "--consumer-opt=default_requeue_delay,0.2",
                                               "--consumer-opt=max_backoff_duration,1",
                                               "--consumer-opt=max_attempts,0"), log=tmp_path / "log")
    try:
        await eventually(lambda: int(postgres.psql(f"SELECT count(*) FROM {table}")) >= 10_000, 60, "the first part")
        postgres.stop()
        await publish(nsqd.tcp_address, topic, bodies[10_000:])
        await asyncio.sleep(3)
        postgres.start()
        source = Source(nsqd.http_address, topic, "to-postgres")
        await eventually(lambda: source.drained(total), 120, "the topic written", progress=source.done)
    finally:
        assert await app.stop() == 0, app.log()
    assert postgres.psql(f"SELECT count(*), count(DISTINCT id) FROM {table}") == f"{total}|{total}"
