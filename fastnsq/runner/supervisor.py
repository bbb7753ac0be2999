"""The supervisor: starts the children, forwards a stop, restarts a child that dies, and says why.

One job: the group's lifecycle. It spawns ``processes`` children (``python -m
fastnsq.runner.child``, each in a session of its own so that a terminal's Ctrl-C reaches
the supervisor only, which then forwards one stop to each child), sends each its settings,
share of max_in_flight and, with ``--split-nsqd``, its nsqd (changed while the group runs
by :mod:`.shares`, which also moves an nsqd to an idle child). A child that dies while the
group runs is restarted after a backoff (0.5 s doubling, at most 30 s); one that died more
than ``max_restarts`` times within ``restart_window`` seconds ends the group with exit
status 3. The first SIGTERM or SIGINT drains every child (``Consumer.stop`` within
``drain_timeout``); a second one is logged and changes nothing; a child still alive
``KILL_GRACE`` seconds past the deadline is killed and the group exits 1. A SIGHUP is never
fatal: it is logged and forwarded to every child, whose handler's ``hup()`` runs if it has one
(to-file closes its file, as nsq_to_file does; logrotate and operators send it by habit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ..recovery import KEEP_MISSING_POLLS, PollCadence, Recall
from .channel import Channel
from .gather import Family, Gatherer, group_family
from .settings import WorkerSettings
from .shares import Shares
from .spawning import ChildProcess, adopt_first_child, spawn_child

logger = logging.getLogger("fastnsq.worker")

#: Seconds past the drain deadline before a child that has not exited is killed.
KILL_GRACE = 10.0
#: Exit status when a child crashed too often.
EXIT_CRASH_LOOP = 3
#: How long /metrics waits for the children's fresh reports before using their last ones.
REPORT_WAIT = 2.0


@dataclass
class Slot:
    """Child ``index``: its current process (if any) and what it last said."""

    index: int
    process: ChildProcess | None = None
    channel: Channel | None = None
    health: dict[str, Any] = field(default_factory=dict)
    metrics: str = ""
    reported: asyncio.Event = field(default_factory=asyncio.Event)
    fatal: str = ""
    wanted_report: int = 0  # the id of the report /metrics is waiting for
    crashes: list[float] = field(default_factory=list)
    restarts: int = 0
    started_at: float = 0.0
    activity: dict[str, Any] = field(default_factory=dict)  # --split-nsqd: its busy nsqd, idle or not
    applied: int = 0  # --split-nsqd: the last assignment it said it applied
    sent: int = 0  # --split-nsqd: the last assignment sent to it
    acknowledged: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None


class Supervisor:
    """Run the group until it is told to stop (or a child crash-loops); :meth:`run` returns the exit status."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.slots = [Slot(index) for index in range(settings.processes)]
        self.shares = Shares(self.slots, settings.drain_timeout, self._spawn_task)
        self.gatherer = Gatherer()
        self.stopping = False
        self.exit_status = 0
        self.restarts = 0
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- the group ------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_signal, signal.Signals(sig).name)
        loop.add_signal_handler(signal.SIGHUP, self.on_hup)
        if self.settings.split_nsqd:
            self.shares.start(self.settings.nsqd_tcp_addresses)
            self._spawn_task(self._watch_nsqd())
        if self.settings.topic_pattern:
            self._spawn_task(self._watch_topics())
        per_topic = bool(self.settings.topics or self.settings.topic_pattern)
        connections = self.settings.consumer_options.get("connections_per_nsqd", 1)
        logger.info("starting %d worker process(es) for %s on %s, channel %s, max_in_flight %d %s%s",
                    self.settings.processes, self.settings.target, self._topics_named(), self.settings.channel,
                    self.settings.max_in_flight, "each" if per_topic else "in all",
                    f", {connections} connections to each nsqd" if connections != 1 else "")
        for slot in self.slots:
            await self._start(slot)
        await self._done.wait()
        self._ignore_late_signals(loop)
        for task in list(self._tasks):
            task.cancel()
        return self.exit_status

    def _topics_named(self) -> str:
        """The start line's topics: one, a process per topic, or those a pattern will find."""
        settings = self.settings
        if settings.topics:
            named = f"topic {settings.topics[0]}" if len(settings.topics) == 1 else \
                f"topics {', '.join(settings.topics)}"
            return named + (f" (and those matching {settings.topic_pattern!r})" if settings.topic_pattern else "")
        if settings.topic_pattern:
            return f"the topics matching {settings.topic_pattern!r}"
        return f"topic {settings.topic}"

    def _ignore_late_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """The group has stopped; a stop signal between here and the process's exit changes
        nothing, as during the drain. The loop's handlers go with the loop, and Python resets its
        own handlers to the default while it finalizes (a second SIGTERM just after a quick drain
        killed the supervisor: status 143); an ignored signal stays ignored until the exit."""
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)

    def on_signal(self, name: str) -> None:
        if self.stopping:
            logger.warning("%s: already draining (each worker has at most %.0f s); not killing anything",
                           name, self.settings.drain_timeout)
            return
        logger.info("%s: draining every worker (at most %.0f s)", name, self.settings.drain_timeout)
        self.begin_stop()

    def on_hup(self) -> None:
        """SIGHUP's default would end the supervisor (and systemd's ``Restart=on-failure`` takes a
        death by SIGHUP as clean): each child runs its handler's ``hup()``, or logs that it has none."""
        logger.info("SIGHUP: passed to every worker (the handler's hup() runs where it has one)")
        for slot in self.slots:
            if slot.alive and slot.channel is not None:
                slot.channel.send({"type": "hup"})

    def begin_stop(self) -> None:
        self.stopping = self.shares.stopping = True
        for slot in self.slots:
            if slot.alive and slot.channel is not None:
                slot.channel.send({"type": "stop"})
        self._spawn_task(self._kill_after_deadline())
        self._check_done()

    async def _kill_after_deadline(self) -> None:
        await asyncio.sleep(self.settings.drain_timeout + KILL_GRACE)
        for slot in self.slots:
            if slot.alive and slot.process is not None:
                logger.error("worker %d (pid %d) did not exit %.0f s after the drain deadline: killing it",
                             slot.index, slot.process.pid, KILL_GRACE)
                slot.process.kill()
                self.exit_status = self.exit_status or 1

    def _check_done(self) -> None:
        if self.stopping and not any(slot.alive for slot in self.slots):
            self._done.set()

    # ---- one child ------------------------------------------------------------------------

    async def _start(self, slot: Slot) -> None:
        if self.stopping:
            return
        # A new process starts from its settings' share: no assignment sent or applied yet.
        slot.channel, slot.sent, slot.applied = None, 0, 0
        # Worker 0's first process may have been started by the entry point already (spawning).
        early = adopt_first_child() if slot.index == 0 else None
        slot.process = early or spawn_child()
        slot.channel = await Channel.open(slot.process.sock)
        slot.fatal, slot.health, slot.started_at = "", {}, time.monotonic()
        first: dict[str, Any] = {"type": "settings", "settings": self.settings.as_json(), "index": slot.index}
        if self.settings.split_nsqd:
            first["nsqd"] = self.shares.assignments.get(slot.index, [])
        slot.channel.send(first)
        logger.info("worker %d started (pid %d%s)", slot.index, slot.process.pid,
                    ", at the command's start" if early else "")
        self._spawn_task(self._listen(slot, slot.channel))
        self._spawn_task(self._wait(slot, slot.process))

    async def _listen(self, slot: Slot, channel: Channel) -> None:
        while (message := await channel.receive()) is not None:
            kind = message.get("type")
            if "health" in message:
                slot.health = message["health"]
            if "metrics" in message:
                slot.metrics = message["metrics"]
                if message.get("id") == slot.wanted_report:
                    slot.reported.set()
            if "activity" in message:
                self.shares.reported(slot, message["activity"], int(message.get("applied") or 0))
            if kind == "assigned":
                self.shares.acknowledged(slot, int(message.get("seq") or 0))
            elif kind == "fatal":
                slot.fatal = str(message.get("error", ""))
            elif kind == "started" and self.stopping:
                channel.send({"type": "stop"})  # started while the group was being stopped

    async def _wait(self, slot: Slot, process: ChildProcess) -> None:
        status = await process.wait()
        # A /metrics scrape waiting for this child's report waits no more: the report will not come
        # (its counters are retired below). Else a scrape in flight during the drain went on for
        # REPORT_WAIT after the children had exited, and the group's exit waited for it.
        slot.reported.set()
        if slot.channel is not None:
            slot.channel.close()
        if slot.metrics:
            self.gatherer.retire(slot.metrics)  # its counters stay in the group's totals
            slot.metrics = ""
        slot.health = {}
        self.shares.exited(slot)
        if self.stopping:
            level = logging.INFO if status == 0 else logging.WARNING
            logger.log(level, "worker %d (pid %d) %s", slot.index, process.pid, describe_exit(status, slot.fatal))
            self._check_done()
            return
        self._crashed(slot, process.pid, status)

    def _crashed(self, slot: Slot, pid: int, status: int) -> None:
        now = time.monotonic()
        slot.crashes = [t for t in slot.crashes if now - t < self.settings.restart_window] + [now]
        why = describe_exit(status, slot.fatal)
        if len(slot.crashes) > self.settings.max_restarts:
            logger.error("worker %d (pid %d) %s: it died %d times within %.0f s, giving up (exit status %d)",
                         slot.index, pid, why, len(slot.crashes), self.settings.restart_window, EXIT_CRASH_LOOP)
            self.exit_status = EXIT_CRASH_LOOP
            self.begin_stop()
            return
        delay = min(30.0, 0.5 * 2 ** (len(slot.crashes) - 1))
        logger.warning("worker %d (pid %d) %s; restarting it in %.1f s", slot.index, pid, why, delay)
        self._spawn_task(self._restart(slot, delay))

    async def _restart(self, slot: Slot, delay: float) -> None:
        await asyncio.sleep(delay)
        if not self.stopping:
            slot.restarts += 1
            self.restarts += 1
            await self._start(slot)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- --split-nsqd -----------------------------------------------------------------------

    async def _watch_nsqd(self) -> None:
        """Poll nsqlookupd for the topic's nsqd; on a change, give each child its new share.

        The recovery rule (:mod:`fastnsq.recovery`): an nsqd lookupd stops listing (a restart
        unregisters it) stays with its child for ``KEEP_MISSING_POLLS`` poll intervals, whose consumer tries it
        every 0.2-0.4 s; while a child holds no nsqd or one is unlisted, lookupd is asked
        again every 0.5-0.75 s, backing off to ``lookupd_poll_interval`` (to ``EMPTY_POLL`` while
        lookupd lists none at all); every wait is jittered.
        """
        from ..lookupd import LookupdClient

        options = self.settings.consumer_options
        interval = float(options.get("lookupd_poll_interval", 60.0))
        cadence = PollCadence(interval, float(options.get("lookupd_poll_jitter", 0.3)))
        recall: Recall[str] = Recall(KEEP_MISSING_POLLS * interval)
        secret = options.get("auth_secret")
        async with LookupdClient(timeout=float(options.get("lookupd_poll_timeout", 10.0)),
                                 auth_secret=secret if isinstance(secret, str) else None) as client:
            while not self.stopping:
                found = await self._discover(client)
                if found is not None:
                    wanted = recall.wanted(found)
                    await self.shares.found(wanted)
                    # Nothing found at all (every nsqd down, or none has the topic yet): short for as
                    # long as that lasts, lookupd being the only way to learn of one.
                    cadence.set_short(wanted != found or any(not held for held in self.shares.assignments.values()),
                                      empty=not wanted)
                await asyncio.sleep(cadence.next_wait())

    async def _discover(self, client: Any) -> set[str] | None:
        if not self.settings.lookupd_http_addresses:
            return None  # only --nsqd-tcp-address: assigned once at start
        found, answered = set(self.settings.nsqd_tcp_addresses), False
        for address in self.settings.lookupd_http_addresses:
            try:
                result = await client.lookup(address, self.settings.topic)
            except Exception as exc:  # noqa: BLE001 - a lookupd down is logged, the others still count
                logger.warning("nsqlookupd %s: %s", address, exc)
                continue
            answered = True
            found.update(node.address for node in result.producers)
        return found if answered else None  # every lookupd failed: keep the assignment as it is

    # ---- a topic per process, found by a pattern ---------------------------------------------

    async def _watch_topics(self) -> None:
        """Every ``topic_refresh`` s (and at once), a child for each new topic nsqlookupd lists
        that matches ``topic_pattern`` (searched, as Go's regexp.MatchString does)."""
        import re

        from ..lookupd import LookupdClient

        pattern = re.compile(self.settings.topic_pattern)
        async with LookupdClient(timeout=10.0) as client:
            while not self.stopping:
                for address in self.settings.lookupd_http_addresses:
                    try:
                        listed = await client.topics(address)
                    except Exception as exc:  # noqa: BLE001 - logged; the next refresh tries again
                        logger.error("could not retrieve topic list from %s: %s", address, exc)
                        continue
                    for topic in sorted(listed):
                        if topic not in self.settings.topics and pattern.search(topic):
                            await self._add_topic(topic)
                await asyncio.sleep(self.settings.topic_refresh)

    async def _add_topic(self, topic: str) -> None:
        if self.stopping:
            return
        self.settings.topics.append(topic)
        self.settings.processes = len(self.settings.topics)
        slot = Slot(len(self.slots))
        self.slots.append(slot)
        logger.info("new topic %s: worker %d consumes it", topic, slot.index)
        await self._start(slot)

    # ---- what the HTTP endpoints show -------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The group's health, as /healthz and /readyz show it."""
        live = [slot for slot in self.slots if slot.alive]
        connections = sum(int(slot.health.get("connections", 0)) for slot in live)
        grace = self.settings.backoff_grace
        consuming = [s for s in live if s.health.get("connections")]
        def every_consuming(longer_than_grace: str) -> bool:
            return bool(consuming) and all(float(s.health.get(longer_than_grace, 0.0)) > grace for s in consuming)

        return {
            "connected": connections > 0,
            "connections": connections,
            "draining": self.stopping,
            "stuck_in_backoff": every_consuming("backoff_for"),
            "failing_every_message": every_consuming("failing_for"),
            "not_ready": any(s.health.get("holding") for s in consuming),
            **({"nsqd_moves": self.shares.moves} if self.settings.split_nsqd else {}),
            "workers": [
                {"index": s.index, "pid": s.process.pid if s.process else None, "alive": s.alive,
                 "restarts": s.restarts, **s.health,
                 **({"assigned": self.shares.assignments.get(s.index, [])} if self.settings.split_nsqd else {})}
                for s in self.slots
            ],
        }

    async def metrics_families(self) -> list[Family]:
        """Ask every live child for a fresh report, then add them up: until each has reported or
        exited (an exited child's last figures are the retired ones), at most REPORT_WAIT s."""
        live = [slot for slot in self.slots if slot.alive and slot.channel is not None]
        for slot in live:
            slot.reported.clear()
            slot.wanted_report += 1
            assert slot.channel is not None
            slot.channel.send({"type": "report", "id": slot.wanted_report})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(slot.reported.wait() for slot in live)), REPORT_WAIT)
        families = self.gatherer.merge(slot.metrics for slot in live if slot.metrics)
        families += [
            group_family("nsq_worker_processes", "gauge", "worker processes configured", self.settings.processes),
            group_family("nsq_worker_processes_running", "gauge", "worker processes running",
                         sum(slot.alive for slot in self.slots)),
            group_family("nsq_worker_restarts", "counter", "worker processes restarted after dying", self.restarts),
            group_family("nsq_worker_draining", "gauge", "1 while the group drains", int(self.stopping)),
            group_family("nsq_worker_nsqd_moves", "counter", "nsqd moved to an idle worker (--split-nsqd)",
                         self.shares.moves),
        ]
        return families


def describe_exit(status: int, fatal: str) -> str:
    """``exited with status 1: ValueError: ...`` or ``was killed by SIGKILL``."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        text = f"was killed by {name}"
    else:
        text = f"exited with status {status}"
    return f"{text}: {fatal}" if fatal else text
