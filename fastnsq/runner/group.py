"""The group run: the supervisor and, with ``--metrics-port``, its HTTP endpoints, on one event loop.

One job: :func:`run_group`, the call the command line and the apps make. The endpoints
(aiohttp) are imported only when a port is asked for.
"""

from __future__ import annotations

import asyncio
import logging

from .settings import WorkerSettings
from .supervisor import Supervisor

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
