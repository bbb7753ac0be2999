"""The group's HTTP endpoints: ``/metrics``, ``/healthz`` and ``/readyz`` (aiohttp), served by the supervisor.

One job: answering them from :meth:`Supervisor.status` and :meth:`Supervisor.metrics_families`.

* ``/healthz``: 200 while at least one worker holds a connection to an nsqd, 503 while
  none does (no nsqd reachable, or every worker down); a JSON body says which.
* ``/readyz``: 200 when healthy, not draining, not stuck in backoff (every consuming
  worker in backoff for more than ``--backoff-grace`` seconds) and not failing every
  message (every consuming worker has requeued each message it answered, and finished none,
  for more than ``--backoff-grace`` seconds) and no worker holding because its ready check
  fails (``--ready-check``, the handler's ``ready()``, or the retry of the messages a failing
  handler left held: reported the moment it changes); 503
  otherwise, with why.
* ``/metrics``: the group's Prometheus text (:mod:`.gather`); prometheus_client is there, as
  the settings check refuses ``--metrics-port`` without the extra ``metrics``.

Bound to 127.0.0.1 unless ``--http-host`` says otherwise: metrics and health are for the
machine's own agent or a probe, not for the internet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .gather import render

if TYPE_CHECKING:
    from .supervisor import Supervisor


#: /readyz's reason while a worker holds (the consumer's ``ready_check`` fails).
_HOLDING = ("the ready check fails (the handler's dependency is down; or its failed messages, held and retried, "
            "still fail)")


def build_app(supervisor: Supervisor) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        status = supervisor.status()
        ok = status["connected"]
        return web.json_response({"ok": ok, **status}, status=200 if ok else 503)

    async def readyz(request: web.Request) -> web.Response:
        status = supervisor.status()
        reasons = [reason for reason, failed in (
            ("no nsqd connection", not status["connected"]),
            ("draining", status["draining"]),
            ("stuck in backoff", status["stuck_in_backoff"]),
            ("the handler failed every message", status["failing_every_message"]),
            (_HOLDING, status["not_ready"]),
        ) if failed]
        return web.json_response({"ready": not reasons, "reasons": reasons, **status},
                                 status=503 if reasons else 200)

    async def metrics(request: web.Request) -> web.Response:
        body = render(await supervisor.metrics_families())
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(supervisor: Supervisor, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (to clean up) and the port bound (port 0: a free one)."""
    runner = web.AppRunner(build_app(supervisor), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port  # (host, port[, ...]) of each socket
    return runner, int(bound)
