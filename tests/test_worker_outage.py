"""``fastnsq worker`` and a dependency that goes away (issue 58): the handler's ``ready()`` (or
``--ready-check``) holds the group while it fails, ``/readyz`` follows it, nothing is given up;
``--dead-letter-topic`` and ``--give-up-handler`` from the command line and the settings file.

The dependency is a real TCP listener in the test process, closed (refused) and opened again on
the same port; the worker is the real command in subprocesses, against a real nsqd.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from fastnsq import Consumer, Producer
from fastnsq.runner.settings import SettingsError, merge, read_config_file

from .helpers import eventually, unique
from .test_consumer import channel_stats
from .test_worker import Worker, _consume_args, _is, _until_not_ready_because, cleanup, start_worker

__all__ = ["cleanup"]  # the fixture, used by name

OUTAGE = r'''
import os, socket

OUT = os.environ["WK_OUT"]
PORT = int(os.environ["WK_DEP_PORT"])

def _call():
    with socket.create_connection(("127.0.0.1", PORT), timeout=1) as sock:
        assert sock.recv(3) == b"ok\n"

class Ingest:
    def ready(self):
        _call()

    def handle(self, batch):
        _call()
        with open(os.path.join(OUT, "rows-%d" % os.getpid()), "a") as out:
            out.write("".join(m.body.decode() + "\n" for m in batch))

def ready():
    _call()

def ingest(batch):
    """A batch handler without ready(): the worker holds its failed batches and retries them."""
    Ingest().handle(batch)

def strict(batch):
    """Fails the whole batch when one body is poison (as a COPY of a bad row does)."""
    if any(m.body.startswith(b"poison") for m in batch):
        raise ValueError("cannot parse a row of the batch")
    with open(os.path.join(OUT, "rows-%d" % os.getpid()), "a") as out:
        out.write("".join(m.body.decode() + "\n" for m in batch))

def poison(message):
    if message.body.startswith(b"poison"):
        raise ValueError("cannot parse this body")

def gave_up(message):
    with open(os.path.join(OUT, "gave-up-%d" % os.getpid()), "a") as out:
        out.write(message.body.decode() + "\n")
'''


class Dependency:
    """A TCP listener that answers ``ok``; ``down()`` closes it (connections refused)."""

    def __init__(self) -> None:
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def up(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    @staticmethod
    async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def _start(folder: Path, port: int, *args: str) -> Worker:
    (folder / "wk_outage.py").write_text(OUTAGE)
    return await start_worker(folder, *args)


async def test_the_worker_holds_while_ready_fails_readyz_follows_and_nothing_is_given_up(
        nsqd: Any, tmp_path: Path, cleanup: list[Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the failed batches spent attempts (given up after 5 with the defaults) and came back
    through backoff's levels, /readyz 503 "stuck in backoff" long after the dependency was back."""
    topic = unique("wk")
    dependency = Dependency()
    await dependency.up()
    monkeypatch.setenv("WK_DEP_PORT", str(dependency.port))
    await dependency.down()
    bodies = [f"event-{i:05d}" for i in range(600)]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b.encode() for b in bodies])
    worker = await _start(tmp_path, dependency.port, "wk_outage:Ingest", *_consume_args(topic, nsqd.tcp_address),
                          "--processes", "2", "--batch", "50,0.05", "--max-in-flight", "200")
    cleanup.append(worker)
    await _until_not_ready_because(worker, "the ready check fails", 20)
    await eventually(lambda: _holding(worker, 2), 20, "both processes holding")
    assert worker.log().count("not ready (ready_check: ConnectionRefusedError") == 2  # a failed check each
    await dependency.up()
    await eventually(lambda: _is(worker, "/readyz", 200), 20, "/readyz 200 after the return")
    await eventually(lambda: len(worker.lines("rows")) >= len(bodies), 30, "every row after the return")
    assert sorted(worker.lines("rows")) == bodies
    assert await worker.metric("nsq_consumer_messages_given_up_total") == 0
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    # One failed batch per process (50 each), then held: the other batches were not tried while down.
    assert 1 <= stats["requeue_count"] <= 2 * 50
    assert await worker.stop() == 0
    log = worker.log()
    assert log.count("not ready (ready_check: ConnectionRefusedError") == 2  # one line per process
    assert log.count("ready again after") == 2 and "Traceback" not in log
    await dependency.down()


async def test_without_ready_the_failed_batches_are_held_and_retried_not_requeued(
        nsqd: Any, tmp_path: Path, cleanup: list[Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults, no ready(): a failed batch is held in the worker (RDY 0, TOUCHed) and retried
    in-process, so the outage adds no delivery in nsqd and the retry that succeeds ends the hold.
    Before: the failed batches were requeued (90 s x attempts) and spent attempts towards give-up."""
    topic = unique("wk")
    dependency = Dependency()
    await dependency.up()
    monkeypatch.setenv("WK_DEP_PORT", str(dependency.port))
    await dependency.down()
    bodies = [f"event-{i:05d}" for i in range(600)]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b.encode() for b in bodies])
    worker = await _start(tmp_path, dependency.port, "wk_outage:ingest", *_consume_args(topic, nsqd.tcp_address),
                          "--processes", "2", "--batch", "50,0.05", "--max-in-flight", "200")
    cleanup.append(worker)
    await _until_not_ready_because(worker, "the ready check fails", 20)
    await eventually(lambda: _holding(worker, 2), 20, "both processes holding")
    await dependency.up()
    await eventually(lambda: _is(worker, "/readyz", 200), 20, "/readyz 200 after the return")
    await eventually(lambda: len(worker.lines("rows")) >= len(bodies), 30, "every row after the return")
    assert sorted(worker.lines("rows")) == bodies
    assert await worker.metric("nsq_consumer_messages_given_up_total") == 0
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    # Nothing went back to nsqd: each message was delivered once.
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"], stats["timeout_count"]) == (0, 0, 0, 0)
    assert await worker.stop() == 0
    log = worker.log()
    # One line in per process, naming what was retried (it said "ready_check": there is none).
    assert log.count("not ready (the failed batch's handler again: ConnectionRefusedError") == 2, log
    assert log.count("ready again after") == 2 and "Traceback" not in log  # one line out
    await dependency.down()


async def test_a_poison_message_in_a_held_batch_is_found_by_halving_and_dead_lettered(
        nsqd: Any, tmp_path: Path, cleanup: list[Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every try of a batch with a poison message fails; its halves do not all fail, so the poison
    message's failures are its own (max_attempts, the dead letter) and the others are written once."""
    topic, dead = unique("wk"), unique("dead")
    monkeypatch.setenv("WK_DEP_PORT", "1")
    poison = "poison {not json"
    bodies = [f"event-{i:05d}" for i in range(99)]
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [b.encode() for b in bodies[:40]] + [poison.encode()]
                                + [b.encode() for b in bodies[40:]])
    worker = await _start(tmp_path, 1, "wk_outage:strict", *_consume_args(topic, nsqd.tcp_address),
                          "--batch", "100,0.2", "--dead-letter-topic", dead)
    cleanup.append(worker)
    await eventually(lambda: len(worker.lines("rows")) >= len(bodies), 20, "every other row")
    # Back alone (a batch of one), the poison message is held beside the traffic: each batch that
    # succeeds meanwhile charges its failure (an attempt), until max_attempts: the dead letter.
    async with Producer([nsqd.tcp_address]) as producer:
        more = 0

        async def dead_lettered() -> bool:
            nonlocal more
            await producer.publish(topic, f"more-{more:05d}".encode())
            more += 1
            return await worker.metric("nsq_consumer_messages_dead_lettered_total") == 1

        await eventually(dead_lettered, 30, "the poison message dead-lettered")
    await eventually(lambda: len(worker.lines("rows")) == len(bodies) + more, 10, "the traffic beside it")
    assert sorted(worker.lines("rows")) == bodies + [f"more-{i:05d}" for i in range(more)]  # each once
    assert await worker.stop() == 0
    letters: list[bytes] = []
    async with Consumer(dead, "replay", nsqd_tcp_addresses=[nsqd.tcp_address],
                        handler=lambda m: letters.append(bytes(m.body))):
        await eventually(lambda: letters, 10, "the dead letter")
    assert letters == [poison.encode()]
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    # The poison message's five failures, each charged (a 6th delivery is past max_attempts=5).
    assert stats["requeue_count"] == 5


async def _holding(worker: Worker, processes: int) -> bool:
    return await worker.metric("nsq_consumer_holding") == processes


async def test_a_poison_message_reaches_the_dead_letter_topic_and_the_give_up_handler(
        nsqd: Any, tmp_path: Path, cleanup: list[Worker], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: --consumer-opt give_up_handler=mod:fn was refused and the message dropped (one WARNING)."""
    topic, dead = unique("wk"), unique("dead")
    monkeypatch.setenv("WK_DEP_PORT", "1")
    poison = "poison {not json"
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [poison.encode(), b"fine-1", b"fine-2"])
    worker = await _start(tmp_path, 1, "wk_outage:poison", *_consume_args(topic, nsqd.tcp_address),
                          "--dead-letter-topic", dead, "--give-up-handler", "wk_outage:gave_up",
                          "--consumer-opt", "max_attempts=2", "--consumer-opt", "default_requeue_delay=0",
                          "--consumer-opt", "max_backoff_duration=0")
    cleanup.append(worker)
    await eventually(lambda: worker.lines("gave-up") == [poison], 20, "the give-up handler")
    assert await worker.metric("nsq_consumer_messages_dead_lettered_total") == 1
    assert await worker.stop() == 0
    letters: list[bytes] = []
    async with Consumer(dead, "replay", nsqd_tcp_addresses=[nsqd.tcp_address],
                        handler=lambda m: letters.append(bytes(m.body))):
        await eventually(lambda: letters, 10, "the dead letter")
    assert letters == [poison.encode()]
    [stats] = await channel_stats([nsqd.http_address], topic, "work")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0


def test_the_hooks_and_the_dead_letter_topic_from_flags_environment_and_file(tmp_path: Path) -> None:
    base = {"target": "m:f", "topic": "t", "channel": "c", "nsqd_tcp_address": ["127.0.0.1:1"]}
    settings = merge({**base, "ready_check": "db:ready", "give_up_handler": "db:keep",
                      "dead_letter_topic": "t_dead"}, {}, {})
    assert (settings.ready_check, settings.give_up_handler) == ("db:ready", "db:keep")
    assert settings.consumer_options["dead_letter_topic"] == "t_dead"
    config = tmp_path / "worker.toml"
    config.write_text('ready_check = "db:ready"\ngive_up_handler = "db:keep"\ndead_letter_topic = "t_dead"\n')
    from_file = merge(base, {}, read_config_file(str(config)))
    assert (from_file.ready_check, from_file.give_up_handler) == ("db:ready", "db:keep")
    assert from_file.consumer_options["dead_letter_topic"] == "t_dead"
    environ = {"FASTNSQ_WORKER_DEAD_LETTER_TOPIC": "env_dead"}
    assert merge(base, environ, {}).consumer_options["dead_letter_topic"] == "env_dead"
    with pytest.raises(SettingsError, match=r"give_up_handler 'keep'.*MODULE:FUNCTION"):
        merge(base, {}, {"give_up_handler": "keep"})
    with pytest.raises(SettingsError, match=r"dead_letter_topic 'no way'.*topic name"):
        merge({**base, "dead_letter_topic": "no way"}, {}, {})


def test_the_apps_take_a_dead_letter_topic() -> None:
    from fastnsq.cli._apps import consumer_options
    from fastnsq.cli.main import build_parser

    for app in ("to-file", "to-nsq", "to-http"):
        args = build_parser().parse_args([app, "--topic", "t", "--dead-letter-topic", "t_dead"])
        assert consumer_options(args)["dead_letter_topic"] == "t_dead", app
        assert "dead_letter_topic" not in consumer_options(build_parser().parse_args([app, "--topic", "t"]))
