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

from typing import TYPE_CHECKING

from .._lazy import attribute_loader

if TYPE_CHECKING:  # imported on first use: the entry point starts a child before paying for these
    from .group import run_group
    from .settings import SettingsError, WorkerSettings
    from .supervisor import EXIT_CRASH_LOOP, Supervisor

__all__ = ["EXIT_CRASH_LOOP", "SettingsError", "Supervisor", "WorkerSettings", "run_group"]

_HOMES = {name: (home, name) for name, home in (
    ("EXIT_CRASH_LOOP", "supervisor"), ("Supervisor", "supervisor"), ("run_group", "group"),
    ("SettingsError", "settings"), ("WorkerSettings", "settings"),
)}

if not TYPE_CHECKING:  # checkers see the imports above: a misspelt name stays an error, not Any
    __getattr__ = attribute_loader(__name__, _HOMES)
