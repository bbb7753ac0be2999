"""``fastnsq worker MODULE:FUNCTION``: run a handler as a service, on every core (:mod:`fastnsq.runner`)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from ._common import UsageError, channel_arg, client_settings, int_at_least, topic_arg

_EPILOG = """\
Settings come from the flags, then FASTNSQ_WORKER_<SETTING> environment variables
(FASTNSQ_WORKER_TOPIC, FASTNSQ_WORKER_PROCESSES, FASTNSQ_WORKER_LOOKUPD_HTTP_ADDRESSES=a,b...)
and FASTNSQ_CONSUMER_<OPTION> (FASTNSQ_CONSUMER_MAX_ATTEMPTS=10), then --config FILE (TOML:
settings at the top level, Consumer options in a [consumer] table), then the defaults;
the first that gives a value wins. Exit status: 0 after a drain, 1 on an error (or a worker
killed past the drain deadline), 2 on bad usage or a handler that does not load, 3 when a
worker crashed more than --max-restarts times within --restart-window.
"""


def _build_worker(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = commands.add_parser(
        "worker", parents=[common, client], help="run a handler as a service, in N processes",
        usage="fastnsq worker [options] MODULE:FUNCTION --topic TOPIC --channel CHANNEL",
        description="Consume TOPIC/CHANNEL with MODULE:FUNCTION (a function or coroutine function taking a\n"
        "message, or a batch with --batch) or MODULE:OBJECT (a class or object with handle() and\n"
        "optional setup()/teardown(), run once per process, and setup_thread()/teardown_thread(), run\n"
        "in each handler thread), in a supervisor and N worker processes.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument("target", nargs="?", metavar="MODULE:FUNCTION", help="the handler (or MODULE:OBJECT)")
    what = sub.add_argument_group("what to consume")
    what.add_argument("--topic", type=topic_arg, help="the topic")
    what.add_argument("--channel", type=channel_arg, help="the channel")
    what.add_argument("--max-in-flight", type=int_at_least(1), metavar="N",
                      help="messages in flight for the whole group, split across the processes "
                           "(default: 100 per process)")
    what.add_argument("--consumer-opt", action="append", metavar="NAME=VALUE",
                      help="any Consumer option, go-nsq's names (max_attempts=10, msg_timeout=2m...; repeatable)")
    what.add_argument("--batch", metavar="MAX_SIZE,MAX_WAIT", type=_typed("batch"),
                      help="hand the handler batches (Consumer.batches(): full, starved, or MAX_WAIT s old); "
                           "a batch that raises is requeued, each message after default_requeue_delay x its "
                           "attempts (90 s, 180 s...; --consumer-opt default_requeue_delay=5), or at once "
                           "with a ready check (below)")
    failing = sub.add_argument_group("when the handler fails")
    failing.add_argument("--ready-check", type=_typed("ready_check"), metavar="MODULE:FUNCTION",
                         help="a function (sync or async, no argument; raising or False: not ready) asked every "
                              "ready_check_interval (0.25 s) while the handler fails: the process holds its "
                              "messages at RDY 0 until it passes, then resumes at full rate (default: the "
                              "handler object's ready() if it has one, else backoff)")
    failing.add_argument("--dead-letter-topic", type=_typed("dead_letter_topic"), metavar="TOPIC",
                         help="messages past max_attempts are published to TOPIC (the body as it came), then "
                              "finished (default: finished with a WARNING line naming the message, and counted)")
    failing.add_argument("--give-up-handler", type=_typed("give_up_handler"), metavar="MODULE:FUNCTION",
                         help="called with each message past max_attempts (after the dead-letter publish)")
    group = sub.add_argument_group("processes")
    group.add_argument("--processes", type=_typed("processes"), metavar="N|auto",
                       help="worker processes (default 1; auto: one per core this process may use)")
    group.add_argument("--threads", type=int_at_least(0), metavar="M",
                       help="run a blocking (sync) handler in M threads per process (default 0: on the "
                            "process's event loop, best for CPU-bound handlers)")
    group.add_argument("--split-nsqd", action="store_const", const=True,
                       help="give each nsqd to one process (found through nsqlookupd), so the group holds one "
                            "connection per nsqd, rebalanced as nsqd come and go; default: every process "
                            "connects to every nsqd")
    group.add_argument("--drain-timeout", type=_typed("drain_timeout"), metavar="SECONDS",
                       help="on SIGTERM/SIGINT, how long handlers may finish before the rest is requeued (default 30)")
    group.add_argument("--max-restarts", type=int_at_least(0), metavar="N",
                       help="a process that dies is restarted with backoff; more than N deaths within "
                            "--restart-window end the group with status 3 (default 5)")
    group.add_argument("--restart-window", type=_typed("restart_window"), metavar="SECONDS", help="(default 60)")
    http = sub.add_argument_group("metrics and health")
    http.add_argument("--metrics-port", type=int_at_least(0), metavar="PORT",
                      help="serve /metrics, /healthz and /readyz on this port (0: any free one; default: none)")
    http.add_argument("--http-host", metavar="HOST", help="the address they bind to (default 127.0.0.1)")
    http.add_argument("--backoff-grace", type=_typed("backoff_grace"), metavar="SECONDS",
                      help="/readyz fails once every consuming process has been in backoff, or has failed every "
                           "message it answered, this long (default 60)")
    sub.add_argument("--config", metavar="FILE", help="a TOML file of settings (and a [consumer] table)")
    sub.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                     help="the group's log level: DEBUG, INFO, WARNING or ERROR, any case (default INFO; "
                          "--debug: DEBUG)")
    sub.set_defaults(run=_run_worker)


def _log_level(text: str) -> str:
    from ..runner.settings import log_level

    try:
        return log_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _typed(name: str) -> Any:
    def parse(text: str) -> Any:
        from ..runner import (
            settings as runner_settings,  # only when the flag is given: `fastnsq pub` starts fast
        )

        try:
            return runner_settings.parse_value(name, text)
        except (ValueError, runner_settings.SettingsError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _run_worker(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..runner import SettingsError, run_group
    from ..runner.loading import LoadError, load, load_function
    from ..runner.settings import merge, read_config_file

    flags = vars(args).copy()
    if args.debug:
        flags["log_level"] = "DEBUG"
    connection = {name: value for name, value in client_settings(args).items()
                  if value not in (None, False) and name != "user_agent"}
    try:
        file_values = read_config_file(args.config) if args.config else {}
        settings = merge(flags, os.environ, file_values, connection=connection)
        handler = load(settings.target)  # here, once: a module that does not import is exit status 2
        for hook, flag in ((settings.ready_check, "--ready-check"), (settings.give_up_handler, "--give-up-handler")):
            if hook:
                load_function(hook, flag)
    except (SettingsError, LoadError) as exc:
        raise UsageError(str(exc)) from None
    if settings.threads and handler.is_async:
        raise UsageError(f"--threads {settings.threads}: {settings.target} is a coroutine function; "
                         "threads are for a blocking handler")
    logging.basicConfig(
        level=settings.log_level, force=True,
        format="%(asctime)s fastnsq worker supervisor [pid %(process)d] %(levelname)s %(name)s: %(message)s",
    )
    return run_group(settings)
