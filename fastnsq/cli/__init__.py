"""The ``fastnsq`` command: run an embedded nsqd, publish, tail, show stats, benchmark.

One job: turn a command line into calls on fastnsq's public API and print the
outcome. The flags follow nsq's own tools (``nsq_tail``, ``to_nsq``, ``nsq_stat``):
``--nsqd-tcp-address`` / ``--lookupd-http-address`` (each may be repeated),
``--topic``, ``--channel``, ``-n``. Examples::

    fastnsq nsqd                                   # embedded nsqd on 127.0.0.1:4150/4151
    fastnsq pub events 'hello'                     # one message
    seq 1000 | fastnsq pub events - --rate 200     # stdin lines, 200 msg/s
    fastnsq tail events -n 10 --format json        # ephemeral channel, 10 messages, then exit
    fastnsq stats --lookupd-http-address 127.0.0.1:4161
    fastnsq bench

Errors are one line on stderr, ``fastnsq <command>: error: <what>``, with exit
status 1 (2 for bad usage, as argparse does); ``--debug`` adds the traceback.
"""

from __future__ import annotations

from typing import Any

from ._common import CommandError, UsageError, describe_error, subparser_of
from .bench import bench_table
from .console import ProgressLine, format_table, render_progress
from .main import build_parser, main
from .stats import stats_rows
from .tail import message_record

__all__ = [
    "CommandError", "ProgressLine", "UsageError", "bench_table", "build_parser", "describe_error", "format_table",
    "main", "message_record", "render_progress", "stats_rows", "subparser_of",
]


def __getattr__(name: str) -> Any:
    # cli.NSQDProcess lives in fastnsq.testing.process (imported on use: `fastnsq pub` stays light).
    if name == "NSQDProcess":
        from ..testing.process import NSQDProcess

        return NSQDProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
