"""One caller publishing in a loop, as scripts, migrations and backfills publish: msg/s and CPU a message.

Each face publishes ``--count`` bodies of each ``--sizes`` one after the other, awaiting each
answer before the next publish:

* ``async task``: ``for ...: await producer.publish(topic, body)`` in one task (the defaults);
* ``async task, coalesce=False``: the same on the pipelined path;
* ``async task busy_poll=0``: the defaults but ``busy_poll=0``: the loop sleeps while the answer comes
  (the async faces report how many answers came while the loop polled and how many asleep);
* ``sync thread``: ``fastnsq.sync.Producer.publish`` from one thread;
* ``go-nsq goroutine``: go-nsq v1.1.0's ``Producer.Publish`` from one goroutine
  (``gonsq_bench -mode=pub -concurrency=1``, built from bench/go/src/gonsq_bench by
  bench/go_build.py when missing or older than its source);
* ``async task mpublish``: ``for ...: await producer.mpublish(topic, batch)`` in one task, batches
  of ``--batch`` bodies, ``--mpub-count`` messages in all;
* ``go-nsq goroutine MultiPublish``: go-nsq's ``Producer.MultiPublish`` of the same batches from one
  goroutine (``gonsq_bench -mode=mpub -concurrency=1``), the mpublish row's peer.

Every measurement runs in a process of its own against one nsqd this script starts (a real one
with ``--nsqd-bin``, with ``--mem-queue-size=10000000`` unless ``--default-flags``), faces in
an order that alternates between rounds, each run's topic deleted after it; medians over
``--rounds`` and the median of each round's ratio to go-nsq::

    .venv/bin/python bench/single_publisher.py --nsqd-bin ~/nsq-real/bin/nsqd --gonsq ~/nsq-real/bin \\
        --rounds 5 --out bench/results/single-publisher-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import sync_publish  # bench/sync_publish.py: the nsqd, go-nsq's runs, the topic deletes

from fastnsq.benchmark import process_cpu_seconds
from fastnsq.testing.process import NSQDProcess

FACES = ("async task", "async task, coalesce=False", "async task busy_poll=0", "sync thread", "go-nsq goroutine", "async task mpublish",
         "go-nsq goroutine MultiPublish")
#: Each face's ratio is to this go-nsq face of the same round and size.
PEER = {face: "go-nsq goroutine MultiPublish" if "mpublish" in face.lower() or "multipublish" in face.lower()
        else "go-nsq goroutine" for face in FACES}
GO_FACES = ("go-nsq goroutine", "go-nsq goroutine MultiPublish")
WARM_UP = 2_000


def measure(address: str, face: str, count: int, size: int, batch: int) -> dict[str, Any]:
    """In this process: ``count`` messages of ``size`` bytes, one publish (or mpublish of ``batch``)
    after the other."""
    topic = f"single{uuid.uuid4().hex[:10]}"
    body = b"x" * size
    if face == "async task mpublish":
        import fastnsq

        bodies = [body] * batch

        async def mpublish_all() -> tuple[float, float]:
            async with fastnsq.Producer([address]) as producer:
                for _ in range(max(1, WARM_UP // batch)):
                    await producer.mpublish(topic, bodies)
                began, cpu = time.perf_counter(), time.process_time()
                for _ in range(count // batch):
                    await producer.mpublish(topic, bodies)
                return time.perf_counter() - began, time.process_time() - cpu

        elapsed, cpu = fastnsq.run(mpublish_all())
        count = count // batch * batch
    elif face == "sync thread":
        from fastnsq.sync import Producer as SyncProducer

        with SyncProducer([address]) as producer:
            for _ in range(WARM_UP):
                producer.publish(topic, body)
            began, cpu = time.perf_counter(), time.process_time()
            for _ in range(count):
                producer.publish(topic, body)
            elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    else:
        import fastnsq

        options: dict[str, Any] = {"coalesce": face != "async task, coalesce=False"}
        if face == "async task busy_poll=0":
            options["busy_poll"] = 0.0
        polls: dict[str, int] = {}

        async def publish_all() -> tuple[float, float]:
            async with fastnsq.Producer([address], **options) as producer:
                for _ in range(WARM_UP):
                    await producer.publish(topic, body)
                poll = producer._busy_poll
                before = poll.polled, poll.slept
                began, cpu = time.perf_counter(), time.process_time()
                for _ in range(count):
                    await producer.publish(topic, body)
                elapsed, used = time.perf_counter() - began, time.process_time() - cpu
                polls.update(polled=poll.polled - before[0], slept=poll.slept - before[1])
                return elapsed, used

        elapsed, cpu = fastnsq.run(publish_all())  # uvloop, as fastnsq runs by default
        return {"face": face, "size": size, "count": count, "topic": topic, "msg_per_s": count / elapsed,
                "cpu_us_per_msg": cpu / count * 1e6, "answers": polls}
    return {"face": face, "size": size, "count": count, "topic": topic, "msg_per_s": count / elapsed,
            "cpu_us_per_msg": cpu / count * 1e6}


def run_face(address: str, face: str, count: int, size: int, gonsq: str | None, batch: int) -> dict[str, Any]:
    if face == "go-nsq goroutine":
        assert gonsq is not None
        result = sync_publish.run_gonsq(gonsq, address, 1, count, size)
        raw = result["raw"]
        cpu = float(raw.get("cpu_user_s", 0.0)) + float(raw.get("cpu_sys_s", 0.0))
        return {"face": face, "size": size, "count": count, "topic": result["topic"],
                "msg_per_s": result["msg_per_s"], "cpu_us_per_msg": cpu / count * 1e6, "raw": raw}
    if face == "go-nsq goroutine MultiPublish":
        assert gonsq is not None
        return run_gonsq_mpub(gonsq, address, count, size, batch)
    command = [sys.executable, __file__, "--child", address, "--face", face, "--count", str(count),
               "--sizes", str(size), "--batch", str(batch)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_gonsq_mpub(gonsq: str, address: str, count: int, size: int, batch: int) -> dict[str, Any]:
    """go-nsq's MultiPublish of ``batch`` bodies from one goroutine, ``count`` messages in all."""
    topic = f"gonsqm{uuid.uuid4().hex[:10]}"
    command = [gonsq, "-mode=mpub", f"-nsqd-tcp-address={address}", f"-topic={topic}", f"-count={count}",
               f"-size={size}", f"-batch={batch}", "-concurrency=1", "-shared"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = float(raw.get("cpu_user_s", 0.0)) + float(raw.get("cpu_sys_s", 0.0))
    return {"face": "go-nsq goroutine MultiPublish", "size": size, "count": count, "topic": topic,
            "msg_per_s": float(raw["msgs_per_s"]), "cpu_us_per_msg": cpu / count * 1e6, "raw": raw}


def rounds(args: argparse.Namespace, address: str, server: NSQDProcess) -> dict[str, Any]:
    faces = [face for face in FACES if face not in GO_FACES or args.gonsq]
    if args.faces:
        wanted = re.split(r",(?! )", args.faces)  # "async task, coalesce=False" is one face
        faces = [face for face in faces if face in wanted]
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        for size in sizes:
            order = faces if round_no % 2 == 0 else list(reversed(faces))  # who goes first alternates
            for face in order:
                cpu0 = process_cpu_seconds(server.pid) if server.pid else None
                count = args.mpub_count if face in ("async task mpublish", "go-nsq goroutine MultiPublish") else args.count
                result = run_face(address, face, count, size, args.gonsq, args.batch)
                if cpu0 is not None and server.pid:
                    result["nsqd_cpu_us_per_msg"] = ((process_cpu_seconds(server.pid) or 0.0) - cpu0) / count * 1e6
                result.update(round=round_no, load1=os.getloadavg()[0])
                sync_publish.delete_topic(server.http_address, result["topic"])
                runs.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "server": server.argv(server.tcp_address, server.http_address), "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "count": args.count, "mpub_count": args.mpub_count, "batch": args.batch,
            "commit": sync_publish._commit(),
            "medians": medians(runs, faces, sizes), "runs": runs}


def medians(runs: list[dict[str, Any]], faces: list[str], sizes: list[int]) -> list[dict[str, Any]]:
    """Per face and size: median msg/s and CPU, and the median of same-round ratios to its go-nsq peer."""
    out = []
    for size in sizes:
        for face in faces:
            go = {r["round"]: r["msg_per_s"] for r in runs if r["face"] == PEER[face] and r["size"] == size}
            mine = [r for r in runs if r["face"] == face and r["size"] == size]
            row = {"face": face, "size": size, "rounds": len(mine),
                   "msg_per_s": round(statistics.median(r["msg_per_s"] for r in mine)),
                   "cpu_us_per_msg": round(statistics.median(r["cpu_us_per_msg"] for r in mine), 2)}
            ratios = [r["msg_per_s"] / go[r["round"]] for r in mine if r["round"] in go]
            if ratios and face not in GO_FACES:
                row["ratio_to_go_nsq"] = round(statistics.median(ratios), 3)
                row["round_ratios"] = [round(x, 3) for x in ratios]
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--face", choices=FACES, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--sizes", default="100,1024", help="body sizes in bytes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=200, help="bodies per mpublish / MultiPublish (200, as "
                        "bench/run_all.py's mpub row)")
    parser.add_argument("--mpub-count", type=int, default=400_000, help="messages of each mpublish face")
    parser.add_argument("--faces", help="comma-separated subset of the faces (default: all)")
    parser.add_argument("--nsqd-bin", metavar="PATH", help="start this real nsqd (else the embedded one)")
    parser.add_argument("--default-flags", action="store_true",
                        help="the real nsqd with its default flags (else --mem-queue-size=10000000)")
    parser.add_argument("--gonsq", metavar="PATH", help="gonsq_bench, or the folder for it (built there when "
                        "missing or older than its source)")
    parser.add_argument("--out", metavar="JSON", help="write every run and the medians here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.face, args.count, int(args.sizes), args.batch)))
        return
    if args.gonsq:
        args.gonsq = sync_publish.gonsq_binary(args.gonsq)
    flags = () if args.default_flags or not args.nsqd_bin else sync_publish.REAL_NSQD_FLAGS
    server = NSQDProcess(*flags, binary=args.nsqd_bin)
    server.start()
    try:
        report = rounds(args, server.tcp_address, server)
    finally:
        server.close()
    print(json.dumps({"server": report["server"], "medians": report["medians"]}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
