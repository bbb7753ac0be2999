"""What backoff costs a consumer group: 1% of the messages always fail (issue 49 item 5).

Each run pre-fills a new topic with ``--count`` messages (1 in ``--poison-every``, 100, a
poison message whose handler raises at every attempt), consumes them with one ``Consumer`` (a sync handler that
does nothing else, ``--max-in-flight`` 100), and samples the consumer every 50 ms for
``--window`` seconds, or until every good message is finished. It reports the good messages
finished after 5 s and at the end, when the last good one was (if within the window), the
poison attempts, the REQs and the highest backoff level.

The configurations: the defaults (exponential backoff to 120 s, requeue delay 90 s);
``max_backoff_duration`` 2 s, exponential and full jitter; backoff off; and two handlers that
catch the poison message's error themselves: one finishes it (as a dead-letter publish
would), one requeues it with ``backoff=False``.

    python bench/backoff_cost.py [--bin ~/nsq-real/bin] [--rounds 3] [--window 25] [--poison-every 100]
                                 [--only backoff_off]

Without ``--bin`` the server is fastnsq's embedded nsqd (its own process). Writes
``bench/results/backoff-cost-<date>.json`` and prints a table of medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import fastnsq  # after the checkout is on sys.path
from fastnsq.testing.process import NSQDProcess

#: consumer options, and what the handler does with a poison message ("raise", "finish", "requeue").
CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "defaults": ({}, "raise"),
    "max_backoff_2s": ({"max_backoff_duration": 2}, "raise"),
    "full_jitter_2s": ({"max_backoff_duration": 2, "backoff_strategy": "full_jitter"}, "raise"),
    "backoff_off": ({"max_backoff_duration": 0}, "raise"),
    "handler_finishes_poison": ({}, "finish"),
    "handler_requeues_without_backoff": ({}, "requeue"),
}


class Poisoned(Exception):
    """The poison message's failure (a body that never parses, say)."""


def handler_for(on_poison: str, attempts: list[int]) -> Any:
    def handle(message: fastnsq.Message) -> None:
        if not message.body.startswith(b"poison"):
            return
        attempts.append(1)
        if on_poison == "finish":
            return  # a real handler would publish it to a dead-letter topic first
        if on_poison == "requeue":
            message.requeue(90.0, backoff=False)
            return
        raise Poisoned(message.body.decode())

    return handle


def bodies(count: int, poison_every: int) -> list[bytes]:
    return [(b"poison-%06d" if i % poison_every == poison_every // 2 else b"good-%06d") % i for i in range(count)]


async def one_run(nsqd: NSQDProcess, name: str, args: argparse.Namespace) -> dict[str, Any]:
    options, on_poison = CONFIGS[name]
    count, window, max_in_flight = args.count, args.window, args.max_in_flight
    topic = f"backoff_{name}_{time.monotonic_ns()}"
    messages = bodies(count, args.poison_every)
    good = sum(1 for body in messages if body.startswith(b"good"))
    async with fastnsq.Producer([nsqd.tcp_address]) as producer:
        for start in range(0, count, 1000):
            await producer.mpublish(topic, messages[start:start + 1000])
    attempts: list[int] = []
    consumer = fastnsq.Consumer(topic, "work", nsqd_tcp_addresses=[nsqd.tcp_address],
                                handler=handler_for(on_poison, attempts), max_in_flight=max_in_flight, **options)
    at_5s, all_good_at, highest = None, None, 0
    await consumer.start()
    began = time.monotonic()
    try:
        while (elapsed := time.monotonic() - began) < window:
            stats = consumer.snapshot()
            done = stats.finished - (len(attempts) if on_poison == "finish" else 0)
            highest = max(highest, stats.backoff_level)
            if at_5s is None and elapsed >= 5.0:
                at_5s = done
            if done >= good:
                all_good_at = elapsed
                break
            await asyncio.sleep(0.05)
        stats = consumer.snapshot()
    finally:
        await consumer.stop(5.0)
    done = stats.finished - (len(attempts) if on_poison == "finish" else 0)
    return {"config": name, "good": good, "good_finished_at_5s": at_5s if at_5s is not None else done,
            "good_finished": done, "all_good_after_s": all_good_at, "window_s": window,
            "poison_attempts": len(attempts), "requeued": stats.requeued, "highest_backoff_level": highest}


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    row = dict(runs[0])
    for key in ("good_finished_at_5s", "good_finished", "poison_attempts", "requeued", "highest_backoff_level"):
        row[key] = statistics.median(run[key] for run in runs)
    times = [run["all_good_after_s"] for run in runs]
    row["all_good_after_s"] = statistics.median(times) if all(t is not None for t in times) else None
    return row


def describe(row: dict[str, Any]) -> str:
    after = f"{row['all_good_after_s']:.1f} s" if row["all_good_after_s"] is not None else f"> {row['window_s']:.0f} s"
    return (f"{row['config']:34} {row['good_finished_at_5s']:>8.0f} {row['good_finished']:>8.0f} / {row['good']}"
            f" {after:>9} {row['poison_attempts']:>7.0f} {row['highest_backoff_level']:>6.0f}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", help="a folder with a real nsqd (default: fastnsq's embedded nsqd)")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--window", type=float, default=25.0, help="seconds each run may take")
    parser.add_argument("--max-in-flight", type=int, default=100)
    parser.add_argument("--poison-every", type=int, default=100, help="1 message in N always fails (default 100: 1%%)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", action="append", choices=sorted(CONFIGS), help="these configurations only")
    parser.add_argument("--out", type=Path, default=HERE / "results" / f"backoff-cost-{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args()
    logging.getLogger("fastnsq").setLevel(logging.CRITICAL)  # not a traceback per poison attempt
    nsqd = NSQDProcess(binary=Path(args.bin).expanduser() / "nsqd" if args.bin else None)
    nsqd.start()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.only or CONFIGS}
    try:
        for _ in range(args.rounds):
            for name, done in runs.items():
                done.append(await one_run(nsqd, name, args))
                print(describe(done[-1]), flush=True)
    finally:
        nsqd.close()
    rows = [median_row(found) for found in runs.values()]
    print(f"\nmedians of {args.rounds} round(s), {nsqd.describe()}, max_in_flight {args.max_in_flight}, "
          f"1 message in {args.poison_every} always fails")
    print(f"{'configuration':34} {'at 5 s':>8} {'at end':>8}   good {'all good':>9} {'poison':>7} {'level':>6}")
    for row in rows:
        print(describe(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": sys.argv, "server": nsqd.describe(), "host": platform.node(), "python": platform.python_version(),
        "count": args.count, "window_s": args.window, "max_in_flight": args.max_in_flight, "rounds": args.rounds,
        "poison_every": args.poison_every,
        "medians": rows, "runs": runs,
    }, indent=2))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
