"""A worker child: one process, one Consumer running the user's handler, told what to do over a pipe.

Started by the supervisor as ``python -m fastnsq.runner.child`` with its end of the pipe
inherited (:mod:`.channel`). It loads the handler, runs ``setup()``, consumes with its share
of max_in_flight (and, with ``--split-nsqd``, only from the nsqd assigned to it), reports
its health and metrics every second and when asked, and on ``stop``, SIGTERM, SIGINT or the
supervisor's end of the pipe closing, drains with ``Consumer.stop(drain_timeout)``, runs
``teardown()`` and exits 0. A second stop request changes nothing: the drain goes on. A
SIGHUP (forwarded by the supervisor, or sent to the child itself) runs the handler's ``hup()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from .._version import __version__
from ..consumer import Consumer
from ..loop import run
from .activity import Activity
from .channel import Channel
from .held import HeldBatches
from .loading import Handler, LoadError, load, load_function, run_hook
from .settings import WorkerSettings, batches_at_once
from .spawning import FD_ENV
from .threads import HandlerThreads

logger = logging.getLogger("fastnsq.worker")

#: Seconds between the reports (health and metrics) a child sends on its own.
HEALTH_INTERVAL = 1.0
#: How often a child looks whether its consumer began or ended a hold (its ready_check): a change
#: is reported at once, so that /readyz follows the dependency within this, not HEALTH_INTERVAL.
HOLD_WATCH_INTERVAL = 0.05


class Child:
    """The child's state: its settings, handler, consumer and the stop request."""

    def __init__(self, settings: WorkerSettings, index: int, handler: Handler, channel: Channel,
                 assignment: list[str] | None) -> None:
        self.settings = settings
        self.index = index
        self.handler = handler
        self.channel = channel
        self.assignment = assignment  # None: every nsqd (no --split-nsqd)
        self.consumer: Consumer | None = None
        self.stop_requested = asyncio.Event()
        self.draining = False
        self.backoff_since: float | None = None
        self.threads = (HandlerThreads(settings.threads, handler.setup_thread, handler.teardown_thread)
                        if settings.threads else None)
        self.successes = self.requeues = 0  # the consumer's counts at the last health report
        self.failing_since: float | None = None  # since when it has requeued and finished nothing
        self.tasks: list[asyncio.Task[Any]] = []  # the child's own loops, cancelled at the end
        self._batches: set[asyncio.Task[Any]] = set()  # batches in threads, assignments (done ones leave)
        self._assigning = asyncio.Lock()
        self.activity: Activity | None = None  # --split-nsqd: what the supervisor hears to move work
        self.applied = 0  # --split-nsqd: the last assignment applied (the activity is about it)
        #: Failed batches retried in-process (--batch without a ready check): see held.py for the rule.
        self.held: HeldBatches | None = None

    # ---- the life of a child --------------------------------------------------------------

    async def run(self) -> int:
        await run_hook(self.handler.setup)
        await self._setup_threads()
        self._install_signals()
        self.tasks.append(asyncio.create_task(self._listen()))
        self.tasks.append(asyncio.create_task(self._report_health()))
        # With --split-nsqd and no nsqd yet, the consumer runs with none: the supervisor may give it one.
        await self._start_consumer(self.assignment)
        self.tasks.append(asyncio.create_task(self._watch_hold()))
        if self.assignment is not None and self.consumer is not None:
            self.activity = Activity(self.consumer)
            self.tasks.append(asyncio.create_task(self.activity.watch(self._activity_changed)))
        self.channel.send({"type": "started", "pid": os.getpid()})
        await self.stop_requested.wait()
        report = await self._drain()
        await self._teardown_threads()
        await run_hook(self.handler.teardown)
        self.channel.send({"type": "stopped", "report": report, **self._report()})
        await self.channel.flush()
        for task in self.tasks:
            task.cancel()
        return 0

    def request_stop(self, why: str) -> None:
        if self.stop_requested.is_set():
            logger.info("%s: already draining (deadline %.0f s after the first request)", why,
                        self.settings.drain_timeout)
            return
        logger.info("%s: draining (at most %.0f s)", why, self.settings.drain_timeout)
        self.draining = True
        self.stop_requested.set()

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, signal.Signals(sig).name)
        loop.add_signal_handler(signal.SIGHUP, self.on_hup)

    def on_hup(self) -> None:
        """The handler's ``hup()`` (to-file: sync and close the file); without one, a log line."""
        if self.handler.hup is None:
            logger.info("SIGHUP: %s has no hup(); nothing to do", self.settings.target)
            return
        logger.info("SIGHUP: running %s's hup()", self.settings.target)
        self.tasks.append(asyncio.create_task(run_hook(self.handler.hup)))

    async def _drain(self) -> dict[str, Any]:
        if self.consumer is None:
            return {"finished": 0, "requeued": 0, "abandoned": 0, "timed_out": False}
        # A built-in app first answers what it holds (to-file: fsync, then FIN), so the drain
        # does not wait out a sync interval for messages it already has.
        await run_hook(self.handler.drain)
        if self.held is not None and (count := self.held.requeue_all()):
            logger.info("requeued the %d held message%s (their dependency still failing)", count,
                        "" if count == 1 else "s")
        report = await self.consumer.stop(self.settings.drain_timeout)
        for task in self.tasks:
            if task.get_name() == "batches":
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(task, 5.0)
        logger.info("drained: %d finished, %d requeued, %d abandoned%s", report.finished, report.requeued,
                    report.abandoned, " (deadline passed)" if report.timed_out else "")
        return {"finished": report.finished, "requeued": report.requeued, "abandoned": report.abandoned,
                "timed_out": report.timed_out}

    async def _setup_threads(self) -> None:
        """``setup_thread()`` in each thread that will run the handler: each of ``--threads``, or
        this one (the event loop's) without them, so that the same handler runs both ways."""
        if self.threads is not None:
            await self.threads.start()
        elif self.handler.setup_thread is not None:
            self.handler.setup_thread()

    async def _teardown_threads(self) -> None:
        if self.threads is not None:
            await self.threads.close()
        elif self.handler.teardown_thread is not None:
            self.handler.teardown_thread()

    # ---- the consumer ---------------------------------------------------------------------

    async def _start_consumer(self, nsqd: list[str] | None) -> None:
        settings = self.settings
        options = {"user_agent": f"fastnsq-worker/{__version__} worker={self.index}",
                   **settings.consumer_options, **self._consumer_hooks(),
                   "max_in_flight": settings.share_of(self.index)}
        self.consumer = Consumer(
            settings.topic_of(self.index), settings.channel,
            nsqd_tcp_addresses=nsqd if nsqd is not None else settings.nsqd_tcp_addresses,
            lookupd_http_addresses=None if nsqd is not None else settings.lookupd_http_addresses,
            handler=None if settings.batch else self._message_handler(), **options,
        )
        await self.consumer.start()
        # After the start: prometheus_client's import (~50 ms) no longer delays the subscription.
        # It reads the consumer's snapshots when scraped, so nothing is missed.
        _track(self.consumer)
        if self.handler.attach is not None:
            self.handler.attach(self.consumer)
        if settings.batch:
            self.tasks.append(asyncio.create_task(self._consume_batches(self.consumer), name="batches"))

    def _consumer_hooks(self) -> dict[str, Any]:
        """--ready-check (else the handler object's ``ready()``) and --give-up-handler, imported here."""
        settings, hooks = self.settings, {}
        ready = load_function(settings.ready_check, "--ready-check") if settings.ready_check else self.handler.ready
        if ready is None and settings.batch and not self.handler.answers_batches:
            # No check given: the failed batches are their own (held and retried in-process).
            interval = float(settings.consumer_options.get("ready_check_interval", 0.25))
            self.held = HeldBatches(self._call_batch, self._msg_timeout, interval, logger)
            ready = self.held.retry
        if ready is not None:
            hooks["ready_check"] = ready
        if settings.give_up_handler:
            hooks["give_up_handler"] = load_function(settings.give_up_handler, "--give-up-handler")
        return hooks

    async def _watch_hold(self) -> None:
        """A report as soon as the consumer begins or ends a hold (/readyz follows it)."""
        holding = False
        while True:
            await asyncio.sleep(HOLD_WATCH_INTERVAL)
            now = self.consumer is not None and self.consumer.holding
            if now != holding:
                holding = now
                self.channel.send({"type": "report", **self._report()})

    def _message_handler(self) -> Any:
        call, threads = self.handler.call, self.threads
        if threads is None or self.handler.is_async:
            return call  # a sync function runs inline, a coroutine function as the Consumer runs it

        async def in_thread(message: Any) -> None:
            await threads.run(call, message)

        return in_thread

    async def _consume_batches(self, consumer: Consumer) -> None:
        """Batches to the handler, at most batches_at_once() of them at a time: a slot is taken
        before the next batch is, so a batch forms while the others are handled (and comes full
        if max_in_flight holds it). A sync handler on the loop is awaited inline, one at a time."""
        assert self.settings.batch is not None
        max_size, max_wait = self.settings.batch
        at_once = batches_at_once(self.settings, self.handler.is_async)
        running = asyncio.Semaphore(at_once)
        batches = consumer.batches(max_size, max_wait)
        while True:
            await running.acquire()
            try:
                batch = await batches.__anext__()
            except StopAsyncIteration:
                running.release()
                return
            if at_once == 1:
                await self._answer_batch(batch, running)
            else:
                task = asyncio.create_task(self._answer_batch(batch, running))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    def _msg_timeout(self) -> float:
        return self.consumer.msg_timeout if self.consumer is not None else 60.0

    async def _call_batch(self, batch: Any) -> None:
        if self.handler.is_async:
            await self.handler.call(batch)
        elif self.threads is not None:
            await self.threads.run(self.handler.call, batch)
        else:
            self.handler.call(batch)

    async def _answer_batch(self, batch: Any, running: asyncio.Semaphore) -> None:
        try:
            await self._call_batch(batch)
        except Exception as error:
            if self.held is not None and self.consumer is not None:
                # Not requeued: held and retried in-process; the hold's one WARNING names the error
                # if the first retry fails too.
                logger.debug("batch handler raised %s: %s; holding its %d message%s, retried in-process",
                             type(error).__name__, error, len(batch), "" if len(batch) == 1 else "s",
                             exc_info=error)
                if self.held.add(batch, error):
                    self.consumer.hold()
                return
            # One line with the error, as a failing message handler's; the traceback at DEBUG
            # (docs/operating.md: a batch failing ten times was 586 lines).
            logger.warning("batch handler raised %s: %s; requeueing %d message%s", type(error).__name__, error,
                           len(batch), "" if len(batch) == 1 else "s")
            logger.debug("the batch handler's traceback", exc_info=error)
            batch.requeue()
        else:
            if not self.handler.answers_batches:
                batch.finish()
            if self.held is not None:
                self.held.succeeded()
        finally:
            running.release()

    async def assign(self, nsqd: list[str], seq: int | None = None) -> None:
        """--split-nsqd: consume from exactly these nsqd from now on, then tell the supervisor
        (which waits for a release before it lets another child take that nsqd)."""
        async with self._assigning:
            try:
                if not self.stop_requested.is_set() and self.consumer is not None:
                    await self._apply_assignment(self.consumer, nsqd)
            except Exception:  # logged; the supervisor still hears where this child stands
                logger.exception("could not apply the nsqd assignment %s", nsqd)
            finally:
                self.applied = max(self.applied, seq or 0)
                self.channel.send({"type": "assigned", "seq": seq, "nsqd": self.assignment})

    async def _apply_assignment(self, consumer: Consumer, nsqd: list[str]) -> None:
        held = list(self.assignment or ())
        leaving, coming = sorted(set(held) - set(nsqd)), sorted(set(nsqd) - set(held))
        for address in leaving:
            logger.info("nsqd %s moved to another worker (or left): disconnecting", address)
        # Let go first (one connection per nsqd), all at once; then connect to the new ones at
        # once too (in turn, each connect would wait for a busy handler's turns of the loop).
        if leaving:
            await self._let_go(consumer, leaving)
        self.assignment = [a for a in held if a not in leaving]
        for address in coming:
            logger.info("assigned nsqd %s", address)
        await asyncio.gather(*(consumer.connect_to_nsqd(a) for a in coming))
        self.assignment = [*self.assignment, *coming]

    async def _let_go(self, consumer: Consumer, leaving: list[str]) -> None:
        """Disconnect from ``leaving`` with every connection paused meanwhile (RDY 0): each step of
        a disconnect (CLS, its answer, the close) waits a turn of the loop, and a turn spent on a
        full read of a busy nsqd is tens of ms of handler: 0.2 s for a release against 0.03 s
        paused, measured with a 50 us handler. The other child waits for the release."""
        share = consumer.max_in_flight
        consumer.set_max_in_flight(0)
        try:
            await asyncio.gather(*(consumer.disconnect_from_nsqd(a, self.settings.drain_timeout) for a in leaving))
        finally:
            if not self.stop_requested.is_set():  # a drain keeps RDY 0
                consumer.set_max_in_flight(share)

    # ---- the pipe -------------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            message = await self.channel.receive()
            if message is None:
                self.request_stop("the supervisor is gone")
                return
            kind = message.get("type")
            if kind == "stop":
                self.request_stop("asked by the supervisor")
            elif kind == "hup":
                self.on_hup()
            elif kind == "report":
                self.channel.send({"type": "report", "id": message.get("id"), **self._report()})
            elif kind == "assign":
                # A task, so that a stop or a report is not held up by a drain; the lock keeps them in order.
                task = asyncio.create_task(self.assign(list(message["nsqd"]), message.get("seq")))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _report_health(self) -> None:
        """Health and metrics every second: the supervisor keeps the last ones of a child that
        dies, so that a SIGKILL loses at most a second of its counts from the group's counters."""
        while True:
            self.channel.send({"type": "report", **self._report()})
            await asyncio.sleep(HEALTH_INTERVAL)

    def _health(self) -> dict[str, Any]:
        """``in_flight``: the messages this process holds (received, not answered yet); ``rdy``:
        the most nsqd may have in flight to it, its ``in_flight_count`` also counting the
        messages on their way (docs/worker.md, Health and metrics)."""
        consumer = self.consumer
        snapshot = consumer.snapshot() if consumer is not None else None
        level = consumer.backoff_level if consumer is not None else 0
        now = time.monotonic()
        if level and self.backoff_since is None:
            self.backoff_since = now
        elif not level:
            self.backoff_since = None
        return {
            "connections": len(consumer.connections) if consumer is not None else 0,
            "nsqd": sorted({c.address for c in consumer.connections}) if consumer is not None else [],
            "backoff_level": level,
            "backoff_for": 0.0 if self.backoff_since is None else now - self.backoff_since,
            "draining": self.draining,
            "holding": consumer is not None and consumer.holding,
            "in_flight": snapshot.in_flight if snapshot is not None else 0,
            "rdy": sum(c.rdy for c in snapshot.connections) if snapshot is not None else 0,
            "failing_for": self._failing_for(snapshot, now),
        }

    def _failing_for(self, snapshot: Any, now: float) -> float:
        """Seconds since the handler last succeeded, while every message answered since has been
        requeued (0 once one finishes). A finish after max_attempts (a give-up) is no success."""
        if snapshot is None:
            return 0.0
        successes, requeues = snapshot.finished - snapshot.given_up, snapshot.requeued
        if successes > self.successes:
            self.failing_since = None
        elif requeues > self.requeues and self.failing_since is None:
            self.failing_since = now
        self.successes, self.requeues = successes, requeues
        return 0.0 if self.failing_since is None else now - self.failing_since

    def _report(self) -> dict[str, Any]:
        report: dict[str, Any] = {"metrics": _exposition(), "health": self._health()}
        if self.activity is not None:
            report.update(activity=self.activity.state, applied=self.applied)
        return report

    def _activity_changed(self) -> None:
        assert self.activity is not None
        self.channel.send({"type": "activity", "activity": self.activity.state, "applied": self.applied})


# ---- metrics: the child's whole Prometheus registry, sent as text --------------------------------

_metrics: Any = None


def _track(consumer: Consumer) -> None:
    """Report the consumer in the child's default registry (with the user's own metrics)."""
    global _metrics
    try:
        from ..metrics import NSQMetrics
    except ImportError:  # prometheus_client is an extra: no /metrics without it
        return
    if _metrics is None:
        _metrics = NSQMetrics()
    _metrics.track(consumer)


def _exposition() -> str:
    if _metrics is None:
        return ""
    import prometheus_client

    return prometheus_client.generate_latest().decode()


# ---- the process ----------------------------------------------------------------------------


def configure_logging(index: int, level: str) -> None:
    """Every line of this child carries its index and pid, so the group's stderr reads apart."""
    logging.basicConfig(
        level=level, force=True,
        format=f"%(asctime)s fastnsq worker {index} [pid %(process)d] %(levelname)s %(name)s: %(message)s",
    )


async def _main(sock: socket.socket) -> int:
    channel = await Channel.open(sock)
    first = await channel.receive()
    if first is None or first.get("type") != "settings":
        return 1
    settings, index = WorkerSettings.from_json(first["settings"]), int(first["index"])
    configure_logging(index, settings.log_level)
    try:
        child = Child(settings, index, load(settings.target, settings.handler_options), channel, first.get("nsqd"))
        return await child.run()
    except (LoadError, Exception) as exc:
        logger.exception("worker %d failed", index)
        channel.send({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        await channel.flush()
        return 1


def main() -> int:
    sock = socket.socket(fileno=int(os.environ[FD_ENV]))
    return run(_main(sock))


if __name__ == "__main__":
    sys.exit(main())
