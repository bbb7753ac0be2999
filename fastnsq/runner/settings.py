"""A worker group's settings: one place that merges flags, environment, a config file and defaults.

Precedence, highest first: command-line flags, then environment variables
(``FASTNSQ_WORKER_<SETTING>``, and ``FASTNSQ_CONSUMER_<OPTION>`` for a Consumer option),
then the config file (TOML: the settings at the top level, Consumer options in a
``[consumer]`` table), then the defaults below. Every value is checked here, before a
process starts, and a bad one raises :class:`SettingsError` naming the setting, the value
and what it takes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InvalidValueError
from ..extras import MissingExtra, require
from ..options import parse_duration, parse_options

ENV_PREFIX = "FASTNSQ_WORKER_"
CONSUMER_ENV_PREFIX = "FASTNSQ_CONSUMER_"

#: Where the group consumes when neither nsqd nor nsqlookupd is given.
DEFAULT_NSQD = "127.0.0.1:4150"
#: Without --max-in-flight the group holds this many messages per process.
MAX_IN_FLIGHT_PER_PROCESS = 100
#: An async batch handler's batches handled at once per process (--concurrency). Measured with
#: bench/sink_postgres.py (COPY into PostgreSQL 15, batches of 400, 300,000 events, 1 and 2
#: processes, rows/s): 1: 16,264 / 30,959; 2: 21,769 / 28,603; 4: 41,599 / 50,122; 8: 18,449 /
#: 29,401 (one round each on a loaded 2-core machine: docs/worker.md).
DEFAULT_CONCURRENCY = 4
#: nsqd's default ``--max-rdy-count``: the most one connection may have in flight. A process whose
#: share of max_in_flight is above it opens more connections to each nsqd (``connections_per_nsqd``)
#: unless told how many: batches of 1,000 at 4 at once need 5,000 in flight, and one connection
#: held 2,500 (bench/sink_postgres.py, 1 process: 0.41-0.58 of the database's rate).
NSQD_MAX_RDY_COUNT = 2500
#: The most connections per nsqd the Consumer takes (its ``connections_per_nsqd`` range).
MAX_CONNECTIONS_PER_NSQD = 64


class SettingsError(ValueError):
    """A setting that cannot be used: the command reports it as a usage error (exit status 2)."""


@dataclass
class WorkerSettings:
    """Everything a supervisor and its children need; sent to each child as JSON."""

    target: str = ""
    topic: str = ""
    channel: str = ""
    nsqd_tcp_addresses: list[str] = field(default_factory=list)
    lookupd_http_addresses: list[str] = field(default_factory=list)
    max_in_flight: int = 0  # the group's total; 0 = MAX_IN_FLIGHT_PER_PROCESS x processes
    consumer_options: dict[str, Any] = field(default_factory=dict)
    processes: int = 1
    threads: int = 0  # 0: a sync handler runs on the child's event loop
    #: An async batch handler's batches in flight per process (a sync one: 1, or --threads).
    concurrency: int = DEFAULT_CONCURRENCY
    batch: tuple[int, float] | None = None
    drain_timeout: float = 30.0
    split_nsqd: bool = False
    http_host: str = "127.0.0.1"
    metrics_port: int | None = None
    max_restarts: int = 5
    restart_window: float = 60.0
    backoff_grace: float = 60.0
    log_level: str = "INFO"
    #: ``MODULE:FUNCTION`` (sync or async, no argument) polled while the handler fails: the
    #: Consumer's ``ready_check`` (""; a handler object's ``ready()`` is taken when it has one).
    ready_check: str = ""
    #: ``MODULE:FUNCTION`` called with each message past max_attempts (the Consumer's ``give_up_handler``).
    give_up_handler: str = ""
    #: Messages past max_attempts are published there, then finished (the Consumer option).
    dead_letter_topic: str = ""
    #: A built-in app's own settings, the keyword arguments of its handler class (not a flag).
    handler_options: dict[str, Any] | None = None
    #: A topic per process (nsq_to_file's several --topic): child i consumes topics[i] with the
    #: whole max_in_flight, as each of nsq_to_file's consumers does. With ``topic_pattern`` the
    #: supervisor adds the matching topics nsqlookupd lists, every ``topic_refresh`` seconds.
    topics: list[str] = field(default_factory=list)
    topic_pattern: str = ""
    topic_refresh: float = 60.0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerSettings:
        values = dict(data)
        if values.get("batch") is not None:
            values["batch"] = tuple(values["batch"])
        return cls(**values)

    def share_of(self, index: int) -> int:
        """Child ``index``'s part of max_in_flight: equal parts, the remainder to the first ones,
        so that the parts add up to the group's total."""
        if self.topics or self.topic_pattern:
            return self.max_in_flight  # a topic per process: each its own max_in_flight
        whole, rest = divmod(self.max_in_flight, self.processes)
        return whole + (1 if index < rest else 0)

    def topic_of(self, index: int) -> str:
        """The topic child ``index`` consumes."""
        return self.topics[index] if self.topics else self.topic


#: Settings read from flags, environment and file, with the parser of a string value.
_SCALARS: dict[str, Any] = {
    "target": str, "topic": str, "channel": str,
    "processes": lambda text: _processes(text), "threads": int, "concurrency": int,
    "max_in_flight": int, "drain_timeout": parse_duration, "split_nsqd": lambda t: _boolean("split_nsqd", t),
    "http_host": str, "metrics_port": int, "max_restarts": int, "restart_window": parse_duration,
    "backoff_grace": parse_duration, "log_level": lambda text: log_level(text), "batch": lambda text: _batch(text),
    "ready_check": lambda text: _import_path("ready_check", text),
    "give_up_handler": lambda text: _import_path("give_up_handler", text),
    "dead_letter_topic": lambda text: _topic("dead_letter_topic", text),
}
_LISTS = {"nsqd_tcp_addresses": "nsqd_tcp_address", "lookupd_http_addresses": "lookupd_http_address"}


def merge(
    flags: Mapping[str, Any], environ: Mapping[str, str], file_values: Mapping[str, Any], *,
    connection: Mapping[str, Any] | None = None,
) -> WorkerSettings:
    """The settings from the four sources (flags > environment > file > defaults), checked.

    ``flags``: the values given on the command line (None or absent: not given), with
    ``consumer_opt`` the list of ``NAME=VALUE`` strings. ``connection``: TLS/AUTH/compression
    options from the command's client flags.
    """
    file_consumer = file_values.get("consumer", {})
    layers = [_from_file(file_values), _from_environ(environ), _from_flags(flags)]
    values: dict[str, Any] = {}
    for layer in layers:
        values.update({name: value for name, value in layer.items() if value is not None})
    consumer: dict[str, Any] = {}
    for source, where in ((_stringify(file_consumer), "the config file's [consumer]"),
                          (_consumer_environ(environ), "the environment"),
                          (flags.get("consumer_opt") or [], "--consumer-opt")):
        try:
            consumer.update(parse_options(source, for_="consumer"))
        except InvalidValueError as exc:
            raise SettingsError(f"{where}: {exc}") from None
    settings = WorkerSettings(**values)
    settings.consumer_options = {**dict(connection or {}), **consumer}
    return check(settings)


def check(settings: WorkerSettings) -> WorkerSettings:
    """Reject what cannot run, naming the setting, its value and the limit."""
    if not settings.target:
        raise SettingsError("a handler is required: MODULE:FUNCTION or MODULE:OBJECT")
    per_topic = bool(settings.topics or settings.topic_pattern)
    if per_topic:
        settings.processes = len(settings.topics)
    if not (settings.topic or per_topic) or not settings.channel:
        raise SettingsError("--topic and --channel are required")
    if not settings.nsqd_tcp_addresses and not settings.lookupd_http_addresses:
        settings.nsqd_tcp_addresses = [DEFAULT_NSQD]  # as every fastnsq command (and nsqd's own default)
    if settings.processes < 1 and not settings.topic_pattern:
        raise SettingsError(f"--processes {settings.processes}: must be at least 1 (or auto)")
    if settings.threads < 0:
        raise SettingsError(f"--threads {settings.threads}: must be 0 (the handler runs on the loop) or more")
    if settings.concurrency < 1:
        raise SettingsError(f"--concurrency {settings.concurrency}: must be at least 1 (batches handled at once "
                            "per process)")
    option_mif = settings.consumer_options.pop("max_in_flight", None)
    if not settings.max_in_flight:
        settings.max_in_flight = option_mif or default_max_in_flight(settings)
    if settings.max_in_flight < settings.processes and not per_topic:
        raise SettingsError(
            f"max_in_flight {settings.max_in_flight} is below --processes {settings.processes}: max_in_flight is "
            f"the group's total, split across the processes, and each needs at least 1 "
            f"(give --max-in-flight {settings.processes} or more, or fewer processes)")
    if settings.drain_timeout <= 0:
        raise SettingsError(f"--drain-timeout {settings.drain_timeout}: must be more than 0 seconds")
    if settings.metrics_port is not None and not 0 <= settings.metrics_port <= 65535:
        raise SettingsError(f"--metrics-port {settings.metrics_port}: must be 0-65535 (0: any free port)")
    if settings.metrics_port is not None:
        try:  # /metrics would answer nothing useful: say so now, not at the first scrape
            require("metrics", f"--metrics-port {settings.metrics_port} (its /metrics)")
        except MissingExtra as exc:
            raise SettingsError(str(exc)) from None
    if settings.max_restarts < 0:
        raise SettingsError(f"--max-restarts {settings.max_restarts}: must be 0 or more")
    for name in ("ready_check", "give_up_handler"):
        if callable(settings.consumer_options.get(name)):  # a Python object cannot cross to the children
            raise SettingsError(f"{name}: give MODULE:FUNCTION as --{name.replace('_', '-')} or in the settings file")
    if settings.dead_letter_topic:
        settings.consumer_options["dead_letter_topic"] = _topic("dead_letter_topic", settings.dead_letter_topic)
    default_connections_per_nsqd(settings)
    if settings.split_nsqd and "express_lane" not in settings.consumer_options:
        # --split-nsqd promises one connection per nsqd for the group; the express lane would
        # add a second one to each. Asking for it explicitly still works.
        settings.consumer_options["express_lane"] = False
    return settings


def default_max_in_flight(settings: WorkerSettings) -> int:
    """Without --max-in-flight: 100 per process; with --batch, room for the batches handled at
    once plus one filling meanwhile (a batch's messages stay in flight while it is handled)."""
    if settings.batch is None:
        return MAX_IN_FLIGHT_PER_PROCESS * settings.processes
    return max(MAX_IN_FLIGHT_PER_PROCESS, (settings.concurrency + 1) * settings.batch[0]) * settings.processes


def default_connections_per_nsqd(settings: WorkerSettings) -> None:
    """Without ``connections_per_nsqd`` given: enough connections to each nsqd that a process's
    share of max_in_flight fits under nsqd's default ``--max-rdy-count`` on each (one connection
    per nsqd with ``--split-nsqd``, which promises exactly that)."""
    if "connections_per_nsqd" in settings.consumer_options or settings.split_nsqd:
        return
    share = settings.share_of(0)  # the largest part
    needed = min(MAX_CONNECTIONS_PER_NSQD, -(-share // NSQD_MAX_RDY_COUNT))
    if needed > 1:
        settings.consumer_options["connections_per_nsqd"] = needed


def batches_at_once(settings: WorkerSettings, is_async: bool) -> int:
    """How many batches a process hands its handler at once: --threads for a sync handler in
    threads, --concurrency for a coroutine function, else 1 (a sync handler on the event loop)."""
    if settings.threads:
        return settings.threads
    return settings.concurrency if is_async else 1


def in_flight_note(settings: WorkerSettings, is_async: bool) -> str | None:
    """One line when each process's max_in_flight cannot hold the batches it may handle at once
    plus one filling: they then come smaller than --batch's MAX_SIZE (or fewer run at once)."""
    if settings.batch is None or settings.topics or settings.topic_pattern:
        return None
    at_once, size = batches_at_once(settings, is_async), settings.batch[0]
    share = settings.max_in_flight // settings.processes
    if at_once < 2 or share >= (at_once + 1) * size:
        return None
    return (f"max_in_flight {settings.max_in_flight} ({share} per process) holds fewer than {at_once} batches of "
            f"{size} handled at once plus one filling: batches will come smaller than {size} (give --max-in-flight "
            f"{(at_once + 1) * size * settings.processes}, or a smaller --concurrency or --batch)")


def read_config_file(path: str) -> dict[str, Any]:
    """A TOML config file's values (``tomllib``, or ``tomli`` before Python 3.11)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise SettingsError("--config needs Python 3.11+ or the tomli package on 3.10") from None
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise SettingsError(f"--config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"--config {path}: not TOML: {exc}") from None
    unknown = set(data) - set(_SCALARS) - set(_LISTS) - set(_LISTS.values()) - {"consumer"}
    if unknown:
        raise SettingsError(f"--config {path}: unknown setting(s) {', '.join(sorted(unknown))} "
                            f"(known: {', '.join(sorted([*_SCALARS, *_LISTS]))}, and a [consumer] table)")
    return data


def _from_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    values = {name: flags.get(name) for name in _SCALARS}
    for name, flag in _LISTS.items():
        values[name] = flags.get(flag) or None
    return values


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, parse in _SCALARS.items():
        text = environ.get(ENV_PREFIX + name.upper())
        if text is not None and text.strip():
            values[name] = _parsed(ENV_PREFIX + name.upper(), text, parse)
    for name in _LISTS:
        text = environ.get(ENV_PREFIX + name.upper())
        if text:
            values[name] = [part.strip() for part in text.split(",") if part.strip()]
    return values


def _from_file(data: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, parse in _SCALARS.items():
        if name in data:
            value = data[name]
            values[name] = _parsed(f"config {name}", str(value), parse) if isinstance(value, str) else value
    if isinstance(values.get("batch"), list):
        values["batch"] = tuple(values["batch"])
    for name, alias in _LISTS.items():
        value = data.get(name, data.get(alias))
        if value is not None:
            values[name] = [value] if isinstance(value, str) else list(value)
    return values


def _consumer_environ(environ: Mapping[str, str]) -> dict[str, str]:
    return {name[len(CONSUMER_ENV_PREFIX):].lower(): value
            for name, value in environ.items() if name.startswith(CONSUMER_ENV_PREFIX)}


def _stringify(table: Any) -> dict[str, str]:
    if not isinstance(table, Mapping):
        raise SettingsError("the config file's consumer must be a table ([consumer])")
    return {name: str(value).lower() if isinstance(value, bool) else str(value) for name, value in table.items()}


def parse_value(name: str, text: str) -> Any:
    """A setting's value from a string (the command's flags use the same parsers)."""
    return _SCALARS[name](text)


def _parsed(where: str, text: str, parse: Any) -> Any:
    try:
        return parse(text)
    except (ValueError, SettingsError) as exc:
        raise SettingsError(f"{where}={text!r}: {exc}") from None


def _processes(text: str) -> int:
    """A count, or ``auto``: the cores this process may run on (its CPU affinity)."""
    if text.strip().lower() == "auto":
        return available_cores()
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1, or auto")
    return value


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - platforms without affinity


#: The group's log levels, as the flag, the environment and the file may spell them (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(text: str) -> str:
    """``text`` as a logging level name: any case, ``warn`` for WARNING (nsq's apps spell it so)."""
    name = text.strip().upper()
    name = "WARNING" if name == "WARN" else name
    if name not in LOG_LEVELS:
        raise ValueError(f"log_level takes one of {', '.join(LOG_LEVELS)} (any case), not {text!r}")
    return name


def _boolean(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} takes true or false")


def _import_path(name: str, text: str) -> str:
    """``MODULE:FUNCTION``, imported in each child (the supervisor imports it first, to fail early)."""
    module, sep, function = text.strip().partition(":")
    if not (sep and module and function):
        raise SettingsError(f"{name} {text!r}: is MODULE:FUNCTION (e.g. myapp.db:ready)")
    return text.strip()


def _topic(name: str, text: str) -> str:
    from ..codec import valid_topic_name

    if not valid_topic_name(text):
        raise SettingsError(f"{name} {text!r}: a topic name is 1-64 characters of [.a-zA-Z0-9_-]")
    return text


def _batch(text: str) -> tuple[int, float]:
    """``max_size,max_wait`` (``100,0.5`` or ``100,500ms``)."""
    size, sep, wait = text.partition(",")
    if not sep:
        raise ValueError("is max_size,max_wait (e.g. 100,0.5)")
    max_size, max_wait = int(size), parse_duration(wait)
    if max_size < 1 or max_wait < 0:
        raise ValueError("max_size must be at least 1 and max_wait 0 or more seconds")
    return max_size, max_wait
