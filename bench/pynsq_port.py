#!/usr/bin/env python3
"""A pynsq consumer ported to fastnsq, side by side on one real nsqd: the backoff difference.

The scenario of issue 47 and docs/migration.md: 500 messages, a handler that fails 10 % of its
first calls (2 % of the second, 1 % of the third: message i fails attempt 1 when i % 10 == 0,
attempt 2 when i % 50 == 0, attempt 3 when i % 100 == 0, so 5 messages are given up), max in
flight 20, 3 attempts, a requeue delay of 1 s x attempts, a longest backoff of 8 s. Each run
gets a topic of its own; the runs alternate between the clients (pynsq, fastnsq with its
defaults, fastnsq with each setting of --fastnsq), each client in a process of its own.

    .venv/bin/pip install pynsq==0.9.1        # into the bench's venv only; not a dependency
    .venv/bin/python bench/pynsq_port.py --nsqd ~/nsq-real/bin/nsqd --rounds 2

Per run: the wall time from the consumer's start until every message is finished or given up,
the handler calls, the finished and given-up counts, and the backoff waits the client logged
(pynsq's "backing off for X seconds", fastnsq's "backing off for X s").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = 500
MAX_IN_FLIGHT = 20
MAX_ATTEMPTS = 3
REQUEUE_DELAY = 1  # seconds x attempts (pynsq's requeue_delay takes an int)
MAX_BACKOFF = 8
#: fastnsq's settings compared: a name and its options (on top of the port's own).
SETTINGS: dict[str, dict[str, Any]] = {
    "fastnsq": {},
    "fastnsq-linear": {"backoff_strategy": "linear", "backoff_multiplier": 0.028 * MAX_BACKOFF},
    "fastnsq-linear-20ms": {"backoff_strategy": "linear", "backoff_multiplier": 0.02},
    "fastnsq-linear-5ms": {"backoff_strategy": "linear", "backoff_multiplier": 0.005},
    "fastnsq-no-backoff": {"max_backoff_duration": 0},
}
_BACKOFF_LINE = re.compile(r"backing off for ([0-9.]+) s")


def fails(body: bytes, attempts: int) -> bool:
    """The handler's verdict: 10 % of first attempts, 2 % of second ones, 1 % of third ones fail."""
    index = int(body)
    return index % {1: 10, 2: 50, 3: 100}.get(attempts, 1) == 0 if attempts <= 3 else False


class Tally(logging.Handler):
    """The run's figures, and the backoff waits read from the client's log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.calls = self.finished = self.given_up = 0
        self.backoffs: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = _BACKOFF_LINE.search(record.getMessage())
        if match:
            self.backoffs.append(float(match.group(1)))

    @property
    def done(self) -> bool:
        return self.finished + self.given_up >= MESSAGES

    def result(self, client: str, started: float) -> dict[str, Any]:
        return {"client": client, "seconds": round(time.perf_counter() - started, 2), "calls": self.calls,
                "finished": self.finished, "given_up": self.given_up, "backoffs": len(self.backoffs),
                "backoff_seconds": round(sum(self.backoffs), 2)}


def run_pynsq(nsqd_tcp: str, topic: str) -> dict[str, Any]:
    import nsq  # pynsq 0.9.1
    import tornado.ioloop

    tally = Tally()
    logging.getLogger("nsq").addHandler(tally)
    logging.getLogger("nsq").setLevel(logging.INFO)
    _BACKOFF_PYNSQ = re.compile(r"backing off for ([0-9.]+) seconds")
    tally.emit = lambda record: (  # type: ignore[method-assign]
        tally.backoffs.append(float(m.group(1))) if (m := _BACKOFF_PYNSQ.search(record.getMessage())) else None)
    loop = tornado.ioloop.IOLoop.current()

    class Port(nsq.Reader):  # type: ignore[misc]
        def giving_up(self, message: Any) -> None:
            tally.given_up += 1
            if tally.done:
                loop.stop()

    def handle(message: Any) -> bool:
        tally.calls += 1
        if fails(message.body, message.attempts):
            return False  # requeue, with backoff
        tally.finished += 1
        if tally.done:
            loop.add_callback(loop.stop)
        return True

    started = time.perf_counter()
    Port(topic=topic, channel="port", nsqd_tcp_addresses=[nsqd_tcp], message_handler=handle,
         max_in_flight=MAX_IN_FLIGHT, max_tries=MAX_ATTEMPTS, max_backoff_duration=MAX_BACKOFF,
         requeue_delay=REQUEUE_DELAY)
    loop.start()
    return tally.result("pynsq", started)


def run_fastnsq(nsqd_tcp: str, topic: str, name: str) -> dict[str, Any]:
    import asyncio

    import fastnsq

    tally = Tally()
    logging.getLogger("fastnsq").addHandler(tally)
    logging.getLogger("fastnsq").setLevel(logging.INFO)
    logging.getLogger("fastnsq").propagate = False
    result: dict[str, Any] = {}

    async def main() -> None:
        done = asyncio.Event()

        def handle(message: fastnsq.Message) -> None:
            tally.calls += 1
            if fails(message.body, message.attempts):
                message.requeue()  # the quiet way: no traceback (raising works too, with one WARNING line)
                return
            tally.finished += 1
            if tally.done:
                done.set()

        def gave_up(message: fastnsq.Message) -> None:
            tally.given_up += 1
            if tally.done:
                done.set()

        started = time.perf_counter()
        consumer = fastnsq.Consumer(topic, "port", nsqd_tcp_addresses=[nsqd_tcp], handler=handle,
                                    give_up_handler=gave_up, max_in_flight=MAX_IN_FLIGHT, max_attempts=MAX_ATTEMPTS,
                                    default_requeue_delay=REQUEUE_DELAY,
                                    **{"max_backoff_duration": MAX_BACKOFF, **SETTINGS[name]})
        await consumer.start()
        await asyncio.wait_for(done.wait(), 600)
        result.update(tally.result(name, started))
        await consumer.stop()

    fastnsq.run(main())
    return result


def publish(nsqd_tcp: str, topic: str) -> None:
    import fastnsq.sync

    with fastnsq.sync.Producer([nsqd_tcp], lazy_connect=False) as producer:
        producer.mpublish(topic, [b"%d" % i for i in range(MESSAGES)])


def one_run(args: argparse.Namespace, client: str, topic: str) -> dict[str, Any]:
    """A run in a process of its own (pynsq's Tornado loop and fastnsq's never meet)."""
    python = args.pynsq_python if client == "pynsq" else sys.executable
    done = subprocess.run([python, __file__, "--child", client, "--nsqd-tcp", args.nsqd_tcp, "--topic", topic],
                          capture_output=True, text=True, timeout=900, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode != 0:
        raise SystemExit(f"{client} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nsqd", help="a real nsqd binary (started on free ports); else --nsqd-tcp")
    parser.add_argument("--nsqd-tcp", help="an nsqd already running")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="pynsq,fastnsq,fastnsq-linear-20ms")
    parser.add_argument("--pynsq-python", default=sys.executable, help="a Python with pynsq 0.9.1")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the runs to this file")
    args = parser.parse_args(argv)
    if args.child:
        run = run_pynsq if args.child == "pynsq" else lambda tcp, topic: run_fastnsq(tcp, topic, args.child)
        print(json.dumps(run(args.nsqd_tcp, args.topic)))
        return
    from fastnsq.testing.process import NSQDProcess

    server = NSQDProcess(binary=args.nsqd) if args.nsqd else None
    if server is not None:
        server.start()
        args.nsqd_tcp = server.tcp_address
    if not args.nsqd_tcp:
        parser.error("give --nsqd (a binary) or --nsqd-tcp")
    runs = []
    try:
        load = os.getloadavg()
        print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
        for round_number in range(args.rounds):
            for client in args.clients.split(","):  # alternated: one run of each per round
                topic = f"port_{client.replace('-', '_')}_{round_number}_{int(time.time() * 1000)}"
                publish(args.nsqd_tcp, topic)
                run = one_run(args, client, topic)
                run["round"] = round_number
                runs.append(run)
                print(json.dumps(run), flush=True)
        load = os.getloadavg()
        print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        if server is not None:
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
