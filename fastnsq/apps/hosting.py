"""An app run on the worker runtime: its settings made into a :class:`WorkerSettings` and started.

One job: the bridge from an app's parsed flags to :func:`fastnsq.runner.run_group`. The app's
handler class is named by its import path and gets its own options as keyword arguments in
the child (``handler_options``, sent as JSON); it takes batches (``Consumer.batches()``) and
answers them itself. One process per topic (nsq's apps run a consumer per topic, each with
the whole max in flight); the supervisor gives them signals, the drain, restarts, topics found
by a pattern and ``/metrics``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..runner import SettingsError, WorkerSettings, run_group
from ..runner.settings import check

__all__ = ["AppRun", "SettingsError", "run_app"]


@dataclass
class AppRun:
    """What an app asks of the runtime."""

    name: str  # "to-file": for the log lines
    target: str  # "fastnsq.apps.to_file:ToFile"
    topic: str
    channel: str
    nsqd_tcp_addresses: list[str]
    lookupd_http_addresses: list[str]
    max_in_flight: int
    consumer_options: dict[str, Any] = field(default_factory=dict)
    handler_options: dict[str, Any] = field(default_factory=dict)
    batch_wait: float = 0.1
    batch_size: int = 0  # 0: max_in_flight (a batch per sync); smaller: several batches on the wire at once
    processes: int = 1  # per topic: several only with one topic (to-postgres)
    concurrency: int = 1  # batches handed to the handler at once (1: the app runs its own tasks)
    dead_letter_topic: str = ""  # messages past max_attempts are published there (the Consumer option)
    metrics_port: int | None = None
    http_host: str = "127.0.0.1"
    drain_timeout: float = 30.0
    log_level: str = "INFO"
    topics: list[str] = field(default_factory=list)  # several: a process per topic
    topic_pattern: str = ""  # with nsqlookupd: a process per matching topic, found as they come
    topic_refresh: float = 60.0

    def settings(self) -> WorkerSettings:
        """The runtime's settings, checked (a bad one raises SettingsError naming it)."""
        settings = WorkerSettings(
            target=self.target, topic=self.topic, channel=self.channel,
            nsqd_tcp_addresses=list(self.nsqd_tcp_addresses),
            lookupd_http_addresses=list(self.lookupd_http_addresses),
            max_in_flight=self.max_in_flight, consumer_options=dict(self.consumer_options),
            processes=self.processes, concurrency=self.concurrency, dead_letter_topic=self.dead_letter_topic,
            batch=(self.batch_size or self.max_in_flight, self.batch_wait), drain_timeout=self.drain_timeout,
            metrics_port=self.metrics_port, http_host=self.http_host, log_level=self.log_level,
            handler_options=dict(self.handler_options), topics=list(self.topics),
            topic_pattern=self.topic_pattern, topic_refresh=self.topic_refresh,
        )
        return check(settings)


def run_app(app: AppRun) -> int:
    """Run the app until SIGTERM/SIGINT drains it; the runtime's exit status."""
    settings = app.settings()
    logging.basicConfig(
        level=settings.log_level, force=True,
        format=f"%(asctime)s fastnsq {app.name} [pid %(process)d] %(levelname)s: %(message)s",
    )
    return run_group(settings)
