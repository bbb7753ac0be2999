"""The runtime of ``fastnsq worker``: a user's handler run as a service, on every core.

A supervisor process (:mod:`.supervisor`) and N children (:mod:`.child`), each a
:class:`~fastnsq.Consumer` running the handler :mod:`.loading` found, with its share of
max_in_flight and, with ``--split-nsqd``, its share of the nsqd (:mod:`.assign`, changed
while the group runs by :mod:`.shares` from the children's :mod:`.activity`); the
pipe between them (:mod:`.channel`); the group's ``/metrics``, ``/healthz`` and
``/readyz`` (:mod:`.endpoints`, :mod:`.gather`); settings from flags, environment and a
config file (:mod:`.settings`). It sits above the public Consumer, which never imports it.
"""

from __future__ import annotations

import asyncio
import logging

from .settings import SettingsError, WorkerSettings
from .supervisor import EXIT_CRASH_LOOP, Supervisor

__all__ = ["EXIT_CRASH_LOOP", "SettingsError", "Supervisor", "WorkerSettings", "run_group"]

logger = logging.getLogger("fastnsq.worker")


async def _run(settings: WorkerSettings) -> int:
    supervisor = Supervisor(settings)
    runner = None
    if settings.metrics_port is not None:
        from .endpoints import serve

        runner, port = await serve(supervisor, settings.http_host, settings.metrics_port)
        logger.info("serving /metrics, /healthz and /readyz on http://%s:%d", settings.http_host, port)
    try:
        return await supervisor.run()
    finally:
        if runner is not None:
            await runner.cleanup()


def run_group(settings: WorkerSettings) -> int:
    """Run the supervisor until the group stops; its exit status (0, 1, or 3 after a crash loop)."""
    return asyncio.run(_run(settings))
