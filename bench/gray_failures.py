"""Gray failures (issue 57): a hung nsqd, a black-holed port, a lossy link, on real nsqd, every face.

    python bench/gray_failures.py --real ~/nsq-real/bin                      # the five faults
    python bench/gray_failures.py --real ~/nsq-real/bin --faults stop:20,hole:30 --settle 10

Two real nsqd (A healthy, B faulted) registered with one nsqlookupd, their flags the defaults
(``--data-path``, addresses, ``--lookupd-tcp-address``). The faces, all at once, with their defaults:

* ``Producer([A, B])`` publishing every 5 ms (200 msg/s; each publish a task of its own),
  ``fastnsq.sync.Producer([A, B])`` every 10 ms from one thread, ``Producer([B])`` every 50 ms;
* fastnsq's ``Consumer`` through lookupd and direct (``[A, B]``), ``fastnsq.sync.Consumer``
  through lookupd, max_in_flight 100; ``fastnsq worker`` (one process, a handler that does
  nothing, ``--max-in-flight 100``) and ``fastnsq to-nsq`` (copying the topic to ``gray_out``
  on ``[A, B]``) through lookupd, each in a process of its own, watched through its /metrics;
* go-nsq v1.1.0 (bench/go/src/gonsq_recovery, ``recovery_bench``): a Consumer through lookupd
  (printing its open connections every 50 ms) and a Producer on B calling ``Publish`` every
  50 ms (go-nsq's Producer has one nsqd).

The faults on B, one after another, ``--settle`` s apart: ``stop:S`` SIGSTOP for S s;
``hole:S`` every packet to or from B's TCP port on loopback dropped by nftables for S s;
``loss:S`` 30 % of them dropped at random (``numgen random mod 100 < 30``) for S s
(``loss:S:P``: P %); ``lookupd:S`` nsqlookupd stopped for S s, B restarted (SIGTERM, started
again on its ports and data) 1 s into it: "back" counts from B's return, while nsqlookupd is
still down (a lookupd consumer must reconnect to the nsqd it knew). The rules
live in a table of this run's own (``gray57_<pid>``), deleted at the end even on an error.

Per fault and face: failed publishes (raised within the fault or the settle after it), p99 and
worst publish latency of the calls started during the fault or in flight when it began, ``rerouted`` (fastnsq: publishes
B held, sent again to A: each may be there twice), and ``back``: seconds from the fault's end until B
answered one of the face's publishes again (its ``node_stats()``); for consumers, seconds from the fault's
start until the face had no connection to B (``noticed``; go-nsq's: one connection fewer) and seconds from
the fault's end until B's /stats count a FIN on the face's channel again (``back``); per
channel, the most messages A held waiting (its depth) during the fault and its settle. At the
end, once the consumers have every acknowledged message or ``--drain`` s have passed (what a
dead connection held comes back after nsqd's msg_timeout), each fastnsq consumer's lost
(acknowledged by nsqd, never consumed) and duplicated
messages among those the fastnsq producers published. Writes bench/results/gray-<date>.json/.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import aiohttp

import fastnsq
import fastnsq.sync
from fastnsq import Consumer, Producer
from fastnsq.testing.process import NSQDProcess, NSQLookupdProcess

TOPIC = "gray"
#: The consumers' channels: Consumer via lookupd, direct, sync.Consumer, worker, to-nsq, go-nsq.
CHANNELS = ("fast", "fastd", "fasts", "worker", "tonsq", "go")
#: The producer faces whose "back after" is measured: B answered one of their publishes again.
PRODUCERS_BACK = ("Producer([A, B])", "Producer([B])", "sync.Producer([A, B])")


@dataclass
class Calls:
    """A producer face's publishes: (started, took, error or None), on time.monotonic()."""

    name: str
    calls: list[tuple[float, float, str | None]] = field(default_factory=list)
    acked: set[bytes] = field(default_factory=set)
    rerouted: Any = None  # a callable: the face's rerouted count now

    def add(self, started: float, took: float, error: BaseException | str | None, body: bytes = b"") -> None:
        if isinstance(error, BaseException):
            error = f"{type(error).__name__}: {error}"
        self.calls.append((started, took, error))
        if error is None and body:
            self.acked.add(body)


@dataclass
class Watch:
    """A consumer face: when it had a connection to B (sampled), what it consumed."""

    name: str
    channel: str
    samples: list[tuple[float, bool]] = field(default_factory=list)
    seen: Counter[bytes] = field(default_factory=Counter)
    counts_messages: bool = True  # False: a process of its own, whose messages this run does not see
    log: Path | None = None  # a process's output (to-nsq's lines about its batches)


def relayed(log: Path | None) -> dict[str, int]:
    """to-nsq's batches so far, from its log: messages sent again to another destination, requeued."""
    counts = {"rerouted": 0, "requeued": 0}
    if log is None or not log.exists():
        return counts
    for line in log.read_text(errors="replace").splitlines():
        if "sent to" in line and "instead" in line:
            counts["rerouted"] += int(line.split(" messages sent to")[0].rsplit(" ", 1)[1])
        elif "; requeueing them" in line and "publishing " in line:
            counts["requeued"] += int(line.split("publishing ", 1)[1].split(" ", 1)[0])
    return counts


def noop(message: Any) -> None:
    """The ``fastnsq worker`` face's handler (``gray_failures:noop``): each message is FINed."""


# ---- the fault ---------------------------------------------------------------------------------


class Nft:
    """This run's nftables table: drop (all, or a share) of B's port on loopback."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.table = f"gray57_{os.getpid()}"
        self.made = False

    def _nft(self, script: str) -> None:
        subprocess.run(["nft", "-f", "-"], input=script.encode(), check=True)

    def drop(self, percent: int | None) -> None:
        share = "" if percent is None else f"numgen random mod 100 < {percent} "
        self._nft(f"""table inet {self.table} {{
  chain input {{ type filter hook input priority -10; policy accept;
    iif lo tcp dport {self.port} {share}drop
    iif lo tcp sport {self.port} {share}drop
  }}
}}""")
        self.made = True

    def heal(self) -> None:
        if self.made:
            subprocess.run(["nft", "delete", "table", "inet", self.table], check=False)
            self.made = False


# ---- the faces ---------------------------------------------------------------------------------


async def async_producer(face: Calls, producer: Producer, every: float, stop: asyncio.Event) -> None:
    tasks: set[asyncio.Task[Any]] = set()
    n = 0
    while not stop.is_set():
        body = f"{face.name}-{n}".encode()
        n += 1
        task = asyncio.ensure_future(_timed_publish(face, producer, body))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        await asyncio.sleep(every)
    await asyncio.gather(*tasks, return_exceptions=True)


async def _timed_publish(face: Calls, producer: Producer, body: bytes) -> None:
    began = time.monotonic()
    try:
        await producer.publish(TOPIC, body)
    except Exception as exc:  # noqa: BLE001 - counted
        face.add(began, time.monotonic() - began, exc)
    else:
        face.add(began, time.monotonic() - began, None, body)


def sync_producer(face: Calls, producer: fastnsq.sync.Producer, every: float, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        body = f"{face.name}-{n}".encode()
        n += 1
        began = time.monotonic()
        try:
            producer.publish(TOPIC, body)
        except Exception as exc:  # noqa: BLE001 - counted
            face.add(began, time.monotonic() - began, exc)
        else:
            face.add(began, time.monotonic() - began, None, body)
        time.sleep(max(0.0, every - (time.monotonic() - began)))


async def watch_consumer(watch: Watch, consumer: Consumer, b_address: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        conns = consumer.snapshot().connections
        watch.samples.append((time.monotonic(), any(c.address == b_address for c in conns)))
        await asyncio.sleep(0.05)


async def watch_sync_consumer(watch: Watch, consumer: fastnsq.sync.Consumer, b_address: str,
                              stop: asyncio.Event) -> None:
    while not stop.is_set():
        conns = (await asyncio.to_thread(consumer.snapshot)).connections
        watch.samples.append((time.monotonic(), any(c.address == b_address for c in conns)))
        await asyncio.sleep(0.05)


async def watch_process(watch: Watch, session: aiohttp.ClientSession, metrics_url: str, b_address: str,
                        stop: asyncio.Event) -> None:
    """A face in a process of its own: its consumer's connections to B from its /metrics
    (``nsq_consumer_connections{nsqd="B"}``)."""
    while not stop.is_set():
        try:
            async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=0.5)) as response:
                text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            await asyncio.sleep(0.1)
            continue
        has_b = False
        for line in text.splitlines():
            if line.startswith("nsq_consumer_connections{") and f'nsqd="{b_address}"' in line:
                has_b = has_b or float(line.rsplit(" ", 1)[1]) > 0
        watch.samples.append((time.monotonic(), has_b))
        await asyncio.sleep(0.1)


async def fins_on_b(session: aiohttp.ClientSession, b_http: str, channels: list[str]) -> dict[str, dict[str, int]] | None:
    """Per channel of ``channels``: each client's FIN count on B (None: B did not answer)."""
    try:
        async with session.get(f"http://{b_http}/stats?format=json&topic={TOPIC}",
                               timeout=aiohttp.ClientTimeout(total=0.3)) as response:
            data = json.loads(await response.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    data = data.get("data", data)
    found: dict[str, dict[str, int]] = {}
    for topic in data.get("topics") or []:
        if topic["topic_name"] == TOPIC:
            for channel in topic.get("channels") or []:
                if channel["channel_name"] in channels:
                    found[channel["channel_name"]] = {
                        f"{c.get('client_id')}/{c.get('remote_address')}": int(c.get("finish_count", 0))
                        for c in channel.get("clients") or []}
    return found


async def watch_a_backlog(session: aiohttp.ClientSession, a_http: str, until: asyncio.Event) -> dict[str, int]:
    """Until ``until`` is set, every 0.25 s: per channel, the most messages A held waiting for it
    (depth, in memory and on disk; not those in flight). Consumption from A unaffected by B's
    fault keeps this near 0 while the producers send A everything."""
    most: Counter[str] = Counter()
    while not until.is_set():
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            async with session.get(f"http://{a_http}/stats?format=json&topic={TOPIC}",
                                   timeout=aiohttp.ClientTimeout(total=1.0)) as response:
                data = json.loads(await response.read())
            data = data.get("data", data)
            for topic in data.get("topics") or []:
                for channel in topic.get("channels") or [] if topic["topic_name"] == TOPIC else []:
                    name = channel["channel_name"]
                    most[name] = max(most[name], int(channel.get("depth", 0)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(until.wait(), 0.25)
    return dict(most)


async def left_in_nsqd(session: aiohttp.ClientSession, http_addresses: list[str]) -> dict[str, int]:
    """Per channel, messages nsqd still holds (depth, in flight, deferred) summed over the nsqd."""
    left: Counter[str] = Counter()
    for address in http_addresses:
        async with session.get(f"http://{address}/stats?format=json&topic={TOPIC}") as response:
            data = json.loads(await response.read())
        for topic in data.get("data", data).get("topics") or []:
            if topic["topic_name"] == TOPIC:
                for channel in topic.get("channels") or []:
                    left[channel["channel_name"]] += sum(int(channel.get(k, 0))
                                                         for k in ("depth", "in_flight_count", "deferred_count"))
    return dict(left)


async def track_back(session: aiohttp.ClientSession, b_http: str, back: dict[str, float | None],
                     fins_before: dict[str, Any], since: float, until: float) -> None:
    """Until ``until``: for each channel not back yet, seconds from ``since`` until B counted a
    FIN of it again (``fins_before``: B's counts to compare with, updated as it goes)."""
    while time.monotonic() < until and any(seen is None for seen in back.values()):
        fins = await fins_on_b(session, b_http, list(back))
        now = time.monotonic()
        if fins is not None:
            for channel, seen in list(back.items()):
                if seen is None and progressed(fins_before.get(channel, {}), fins.get(channel, {})):
                    back[channel] = now - since
                fins_before[channel] = fins.get(channel, {})
        await asyncio.sleep(0.05)
    await asyncio.sleep(max(0.0, until - time.monotonic()))


async def track_producers_back(answered_on_b: dict[str, Callable[[], Any]], since: float,
                               until: float) -> dict[str, float | None]:
    """For each producer face, seconds from ``since`` until B answered one of its publishes
    again (its ``node_stats()``: a face that routes around B must also come back to it)."""
    async def count(face: str) -> int:
        stats = await asyncio.to_thread(answered_on_b[face])
        return int(stats)

    before = {face: await count(face) for face in answered_on_b}
    back: dict[str, float | None] = dict.fromkeys(answered_on_b)
    while time.monotonic() < until and any(seen is None for seen in back.values()):
        for face in answered_on_b:
            if back[face] is None and await count(face) > before[face]:
                back[face] = time.monotonic() - since
        await asyncio.sleep(0.05)
    return back


def _answered_on(address: str, stats_of: Callable[[], dict[str, Any]]) -> Callable[[], int]:
    def answered() -> int:
        node = stats_of().get(address)
        return 0 if node is None else int(node.answered)
    return answered


def progressed(before: dict[str, int], now: dict[str, int]) -> bool:
    """A client FINed something since ``before`` (a new client counts from 0)."""
    return any(count > before.get(client, 0) for client, count in now.items())


# ---- the run -----------------------------------------------------------------------------------


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    real = args.real.expanduser()
    lookupd = NSQLookupdProcess(real / "nsqlookupd")
    lookupd.start()
    a = NSQDProcess(binary=real / "nsqd", lookupd_tcp_addresses=[lookupd.tcp_address])
    b = NSQDProcess(binary=real / "nsqd", lookupd_tcp_addresses=[lookupd.tcp_address])
    a.start()
    b.start()
    nft = Nft(b.tcp_port)
    go_procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {"faults": [], "server": "nsqd/nsqlookupd v1.3.0, default flags",
                               "fastnsq": fastnsq.__version__}
    try:
        async with aiohttp.ClientSession() as session:
            for server in (a, b):
                for path in (f"/topic/create?topic={TOPIC}",
                             *(f"/channel/create?topic={TOPIC}&channel={c}" for c in CHANNELS)):
                    async with session.post(f"http://{server.http_address}{path}") as response:
                        await response.read()
            await asyncio.sleep(1.0)  # registered with lookupd
            stop = asyncio.Event()
            thread_stop = threading.Event()
            faces = {"Producer([A, B])": Calls("ab"), "sync.Producer([A, B])": Calls("sab"),
                     "Producer([B])": Calls("b"), "go-nsq Producer(B)": Calls("go")}
            p_ab = Producer([a.tcp_address, b.tcp_address])
            p_b = Producer([b.tcp_address])
            await p_ab.start()
            await p_b.start()
            s_ab = fastnsq.sync.Producer([a.tcp_address, b.tcp_address])
            faces["Producer([A, B])"].rerouted = lambda: getattr(p_ab.snapshot(), "rerouted", 0)
            faces["sync.Producer([A, B])"].rerouted = lambda: getattr(s_ab.snapshot(), "rerouted", 0)
            answered_on_b = {"Producer([A, B])": _answered_on(b.tcp_address, p_ab.node_stats),
                             "Producer([B])": _answered_on(b.tcp_address, p_b.node_stats),
                             "sync.Producer([A, B])": _answered_on(b.tcp_address, s_ab.node_stats)}
            watches = [Watch("Consumer (lookupd)", "fast"), Watch("Consumer (direct)", "fastd")]
            consumers = []
            for watch, kwargs in zip(watches, ({"lookupd_http_addresses": [lookupd.http_address]},
                                               {"nsqd_tcp_addresses": [a.tcp_address, b.tcp_address]})):
                def handler(message: Any, watch: Watch = watch) -> None:
                    watch.seen[bytes(message.body)] += 1

                consumer = Consumer(TOPIC, watch.channel, handler=handler, max_in_flight=100, **kwargs)
                await consumer.start()
                consumers.append(consumer)
            sync_watch = Watch("sync.Consumer (lookupd)", "fasts")

            def sync_handler(message: Any) -> None:
                sync_watch.seen[bytes(message.body)] += 1

            sync_consumer = fastnsq.sync.Consumer(TOPIC, "fasts", handler=sync_handler, max_in_flight=100,
                                                  lookupd_http_addresses=[lookupd.http_address])
            sync_consumer.start()
            watches.append(sync_watch)
            process_watches = start_processes(args, lookupd.http_address, a.tcp_address, b.tcp_address, go_procs)
            watches.extend(w for w, _ in process_watches)
            go_bin = args.go_bin
            go_procs.extend(start_go(args, go_bin, lookupd.http_address, b.tcp_address))
            tasks = [asyncio.ensure_future(async_producer(faces["Producer([A, B])"], p_ab, 0.005, stop)),
                     asyncio.ensure_future(async_producer(faces["Producer([B])"], p_b, 0.05, stop)),
                     *(asyncio.ensure_future(watch_consumer(w, c, b.tcp_address, stop))
                       for w, c in zip(watches, consumers)),
                     asyncio.ensure_future(watch_sync_consumer(sync_watch, sync_consumer, b.tcp_address, stop)),
                     *(asyncio.ensure_future(watch_process(w, session, url, b.tcp_address, stop))
                       for w, url in process_watches)]
            sync_thread = threading.Thread(target=sync_producer, args=(faces["sync.Producer([A, B])"], s_ab, 0.01,
                                                                        thread_stop), daemon=True)
            sync_thread.start()
            await asyncio.sleep(args.settle)
            for spec in args.faults.split(","):
                kind, seconds_text, percent_text = (spec.split(":") + [""])[:3]
                seconds = float(seconds_text)
                percent = int(percent_text) if percent_text else args.loss
                label = f"{kind} {seconds:g} s" + (f" {percent}%" if kind == "loss" else "")
                rerouted_before = {n: f.rerouted() for n, f in faces.items() if f.rerouted}
                counters_before = {w.name: relayed(w.log) for w, _ in process_watches}
                fins_before = await fins_on_b(session, b.http_address, list(CHANNELS)) or {}
                fault_over = asyncio.Event()
                a_backlog = asyncio.ensure_future(watch_a_backlog(session, a.http_address, fault_over))
                t0 = time.monotonic()
                print(f"{label} on B ...", flush=True)
                back_since: float | None = None  # when "back" counts from: the fault's end by default
                producers_back: asyncio.Future[dict[str, float | None]] | None = None
                back: dict[str, float | None] = dict.fromkeys(CHANNELS)
                if kind == "stop":
                    b.pause()
                elif kind == "hole":
                    nft.drop(None)
                elif kind == "loss":
                    nft.drop(percent)
                elif kind == "lookupd":
                    await asyncio.to_thread(lookupd.stop)
                else:
                    raise SystemExit(f"unknown fault {kind!r}: stop, hole, loss or lookupd")
                try:
                    if kind == "lookupd":
                        await asyncio.sleep(1.0)
                        await asyncio.to_thread(b.restart)
                        back_since, fins_before = time.monotonic(), {}  # a new nsqd: its counts start at 0
                        producers_back = asyncio.ensure_future(track_producers_back(
                            answered_on_b, back_since, t0 + seconds + args.settle))
                        await track_back(session, b.http_address, back, fins_before, back_since, t0 + seconds)
                    await asyncio.sleep(max(0.0, t0 + seconds - time.monotonic()))
                    # What B's clients had FINed as the fault ends (B's HTTP port is not the one
                    # dropped; a stopped B does not answer, and FINed nothing since t0 anyway).
                    fins_before = await fins_on_b(session, b.http_address, list(CHANNELS)) or fins_before
                finally:
                    if kind == "stop":
                        b.resume()
                    elif kind == "lookupd":
                        await asyncio.to_thread(lookupd.start)
                    else:
                        nft.heal()
                t1 = time.monotonic()
                if producers_back is None:
                    producers_back = asyncio.ensure_future(track_producers_back(answered_on_b, t1, t1 + args.settle))
                await track_back(session, b.http_address, back, fins_before, back_since or t1, t1 + args.settle)
                row = summarise(label, t0, t1, args.settle, faces, watches, back, rerouted_before, args)
                for face, seconds_back in (await producers_back).items():
                    row["producers"][face]["back_s"] = seconds_back
                fault_over.set()
                row["a_depth_max"] = await a_backlog  # over the fault and its settle
                row["load_1m"] = os.getloadavg()[0]  # the machine's load average as the fault's settle ends
                for watch, _ in process_watches:  # to-nsq's batches: re-sent elsewhere, requeued, in this fault
                    if watch.channel == "tonsq":
                        before = counters_before.get(watch.name, {})
                        row["consumers"][watch.name]["producer"] = {
                            name: value - before.get(name, 0) for name, value in relayed(watch.log).items()}
                results["faults"].append(row)
                print(json.dumps(results["faults"][-1], indent=1), flush=True)
            stop.set()
            thread_stop.set()
            await asyncio.gather(*tasks)
            sync_thread.join()
            acked = set().union(*(f.acked for n, f in faces.items() if not n.startswith("go")))
            # The consumers drain: until each has every acknowledged message, at most --drain s (a
            # message in flight on a connection that died comes back after nsqd's msg_timeout, 60 s).
            drain_from = time.monotonic()
            while time.monotonic() < drain_from + max(args.settle, args.drain) and (
                    time.monotonic() < drain_from + args.settle
                    or any(acked - set(w.seen) for w in watches if w.counts_messages)):
                await asyncio.sleep(0.25)
            results["drained_s"] = round(time.monotonic() - drain_from, 2)
            await p_ab.close()
            await p_b.close()
            s_ab.close()
            left = await left_in_nsqd(session, [a.http_address, b.http_address])
            results["end"] = {w.name: {"acked": len(acked), "lost": len(acked - set(w.seen)),
                                       "duplicated": sum(1 for body, n in w.seen.items() if n > 1 and body in acked),
                                       "duplicated_by_producer": _duplicates_by_producer(w.seen, acked),
                                       "in_nsqd": left.get(w.channel)}
                              for w in watches if w.counts_messages}
            for consumer in consumers:
                await consumer.stop()
            await asyncio.to_thread(sync_consumer.stop, 5.0)
    finally:
        nft.heal()
        for proc in go_procs:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        b.resume()
        for server in (a, b, lookupd):
            server.close()
    return results


def start_processes(args: argparse.Namespace, lookupd_http: str, a_tcp: str, b_tcp: str,
                    procs: list[subprocess.Popen[bytes]]) -> list[tuple[Watch, str]]:
    """``fastnsq worker`` and ``fastnsq to-nsq`` through lookupd, each serving /metrics on a port
    of its own: their watches and /metrics addresses (the processes go into ``procs``)."""
    from fastnsq.testing.process import free_port

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    found = []
    for name, channel, argv in (
        ("fastnsq worker", "worker", ["worker", "gray_failures:noop", "--topic", TOPIC, "--channel", "worker",
                                       "--max-in-flight", "100"]),
        ("fastnsq to-nsq", "tonsq", ["to-nsq", "--topic", TOPIC, "--channel", "tonsq", "--max-in-flight", "100",
                                      "--destination-nsqd-tcp-address", a_tcp, "--destination-nsqd-tcp-address",
                                      b_tcp, "--destination-topic", f"{TOPIC}_out"]),
    ):
        port = free_port()
        log_path = args.out_dir / f"gray-{channel}-{os.getpid()}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - the child's output
        procs.append(subprocess.Popen([sys.executable, "-m", "fastnsq", *argv, "--lookupd-http-address",
                                       lookupd_http, "--metrics-port", str(port)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
        found.append((Watch(name, channel, counts_messages=False, log=log_path), f"http://127.0.0.1:{port}/metrics"))
    return found


def start_go(args: argparse.Namespace, go_bin: Path, lookupd_http: str, b_tcp: str) -> list[subprocess.Popen[bytes]]:
    """go-nsq's Consumer through lookupd (its open connections to a file) and its Producer on B
    (its publishes' outcomes to a file)."""
    out = open(args.out_dir / f"gray-go-pub-{os.getpid()}.jsonl", "wb")  # noqa: SIM115 - the child's stdout
    conns = open(args.out_dir / f"gray-go-sub-{os.getpid()}.jsonl", "wb")  # noqa: SIM115 - the child's stdout
    return [subprocess.Popen([str(go_bin), "-mode", "sub", "-lookupd-http-address", lookupd_http,
                              "-topic", TOPIC, "-channel", "go", "-max-in-flight", "100", "-stats-every", "50ms"],
                             stdout=conns),
            subprocess.Popen([str(go_bin), "-mode", "pub", "-nsqd-tcp-address", b_tcp, "-topic", TOPIC,
                              "-interval", "50ms"], stdout=out)]


def summarise(label: str, t0: float, t1: float, settle: float, faces: dict[str, Calls],
              watches: list[Watch], back: dict[str, float | None], rerouted_before: dict[str, int],
              args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"fault": label, "producers": {}, "consumers": {}}
    go_lines = (args.out_dir / f"gray-go-pub-{os.getpid()}.jsonl").read_text().splitlines()
    go_calls = []
    for line in go_lines:
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            took = item.get("took", 0) / 1e9
            go_calls.append((item["t"] / 1e9 - took, took, None if item["ok"] else item.get("err", "error")))
    faces["go-nsq Producer(B)"].calls = go_calls
    for name, face in faces.items():
        during = [c for c in face.calls if c[0] < t1 and c[0] + c[1] > t0]  # started, or in flight, during it
        window = [c for c in face.calls if t0 <= c[0] < t1 + settle]
        failed = [c for c in window if c[2] is not None]
        row["producers"][name] = {
            "calls": len(window), "failed": len(failed),
            "errors": dict(Counter(c[2].split(":")[0][:60] for c in failed)),
            "p99_s": p99([c[1] for c in during]), "worst_s": max((c[1] for c in during), default=None),
            "rerouted": None if face.rerouted is None else face.rerouted() - rerouted_before.get(name, 0),
            "nsqd_down_worst_s": _fail_fast_worst(window, t1),
        }
    for watch in watches:
        lost_at = next((t for t, has in watch.samples if t >= t0 and not has), None)
        row["consumers"][watch.name] = {"noticed_s": None if lost_at is None else lost_at - t0,
                                        "back_s": back.get(watch.channel)}
    row["consumers"]["go-nsq Consumer (lookupd)"] = {"noticed_s": go_noticed(args, t0, t1), "back_s": back.get("go")}
    return row


def _fail_fast_worst(window: list[tuple[float, float, str | None]], t1: float) -> float | None:
    """fail_fast: once a call has raised NsqdDown (the connection known dead, the attempts
    failing), the slowest failed call started after that until the fault ended (None: none raised)."""
    raised = [start + took for start, took, error in window if (error or "").startswith("NsqdDown")]
    if not raised:
        return None
    known_dead = min(raised)
    return max((took for start, took, error in window if known_dead <= start < t1 and error), default=None)


def go_noticed(args: argparse.Namespace, t0: float, t1: float) -> float | None:
    """Seconds from the fault's start until go-nsq's consumer had a connection fewer than before it
    (its lines' clock is CLOCK_MONOTONIC, as time.monotonic())."""
    samples = []
    for line in (args.out_dir / f"gray-go-sub-{os.getpid()}.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            item = json.loads(line)
            samples.append((item["t"] / 1e9, item["conns"]))
    before = [n for t, n in samples if t < t0]
    if not before:
        return None
    return next((t - t0 for t, n in samples if t0 <= t <= t1 and n < before[-1]), None)


def markdown(results: dict[str, Any]) -> str:
    head = (f"Real nsqd/nsqlookupd v1.3.0 (default flags), fastnsq {results['fastnsq']}, go-nsq v1.1.0; faults on B. "
            "Load average (1 min) after each fault: "
            + ", ".join(f"{row['fault']} {row.get('load_1m', 0):.1f}" for row in results["faults"])
            + ". noticed: 'not noticed' = the face kept its connection to B through the fault.")
    lines = [head, "",
             "| fault | face | failed | p99 during | worst | rerouted | noticed | back after |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.2f} s"
    for row in results["faults"]:
        for name, p in row["producers"].items():
            lines.append(f"| {row['fault']} | {name} | {p['failed']} of {p['calls']} | {fmt(p['p99_s'])} | "
                         f"{fmt(p['worst_s'])} | {'-' if p['rerouted'] is None else p['rerouted']} | | "
                         f"{fmt(p.get('back_s')) if name in PRODUCERS_BACK else ''} |")
        for name, c in row["consumers"].items():
            made = c.get("producer")
            produced = f"{made['requeued']} requeued | | | {made['rerouted']}" if made else "| | |"
            noticed = "not noticed" if c["noticed_s"] is None else fmt(c["noticed_s"])
            lines.append(f"| {row['fault']} | {name} | {produced} | {noticed} | {fmt(c['back_s'])} |")
    lines.append("\nMost messages waiting on A for each channel during the fault and its settle (A's depth, sampled "
                 "every 0.25 s; the producers sent A everything meanwhile):")
    for row in results["faults"]:
        depths = ", ".join(f"{name} {n}" for name, n in sorted(row.get("a_depth_max", {}).items()))
        lines.append(f"- {row['fault']}: {depths}")
    lines.append("\nfail_fast: once a call raised NsqdDown (B's connection known dead), the slowest failed call "
                 "started after it until the fault ended, per fault and face:")
    for row in results["faults"]:
        worst = {name: p["nsqd_down_worst_s"] for name, p in row["producers"].items() if p.get("nsqd_down_worst_s")}
        lines.append(f"- {row['fault']}: " + (", ".join(f"{name} {fmt(w)}" for name, w in worst.items()) or "none raised"))
    if "drained_s" in results:
        lines.append(f"\nAfter the last fault's settle the consumers drained for {results['drained_s']} s (at most --drain).")
    for name, end in results.get("end", {}).items():
        by_producer = ", ".join(f"{face} {n}" for face, n in end.get("duplicated_by_producer", {}).items())
        lines.append(f"\n{name}: {end['acked']} acknowledged, {end['lost']} never consumed "
                     f"({end.get('in_nsqd')} still in nsqd for its channel), {end['duplicated']} duplicated"
                     + (f" ({by_producer})" if by_producer else ""))
    return "\n".join(lines) + "\n"


def _duplicates_by_producer(seen: dict[bytes, int], acked: set[bytes]) -> dict[str, int]:
    """Acknowledged bodies seen more than once, by the face that published them (a body is
    ``face-n``): a rerouted publish and a retry after a lost connection are told apart."""
    counts: Counter[str] = Counter()
    for body, n in seen.items():
        if n > 1 and body in acked:
            counts[body.decode(errors="replace").rsplit("-", 1)[0]] += 1
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", type=Path, required=True, help="folder with real nsqd and nsqlookupd")
    parser.add_argument("--go-bin", type=Path, help="go-nsq's recovery_bench (default: built into --real's folder)")
    parser.add_argument("--faults", default="stop:20,stop:90,hole:30,hole:120,loss:60")
    parser.add_argument("--loss", type=int, default=30, help="loss:S drops this percent of B's packets (loss:S:P: P)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds between faults (and measured after each)")
    parser.add_argument("--drain", type=float, default=75.0,
                        help="at the end, seconds the consumers may take to get every acknowledged message "
                             "(nsqd's msg_timeout 60 s brings back what a dead connection held)")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if args.go_bin is None:
        import go_build

        args.go_bin = go_build.build(args.real.expanduser(), program="gonsq_recovery")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run(args))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    (args.out_dir / f"gray-{stamp}.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out_dir / f"gray-{stamp}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
