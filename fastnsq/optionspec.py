"""Every option of the Consumer and the Producer, declared once.

One job: each option's name, type, default, unit, accepted values, go-nsq and pynsq names and
doc, in one table, and what is read from it: the run-time check of a keyword option
(:func:`check_options`: an unknown name is refused with the name to use, a wrong type or value
with the option, the value and what it takes), the kind a string value is parsed as
(:mod:`fastnsq.options`, the worker's TOML and environment), the TypedDicts that type
checkers and editors read (:mod:`fastnsq.typed_options`) and the documentation's option
tables (``docs/options.md``), both written out by ``python -m fastnsq.optionfiles --write``. ``tests/test_optionspec.py`` fails when a written-out
file no longer matches this table.

Durations are seconds (``float``) as keyword options; from strings they also take Go's form
(``"250ms"``, ``"1m30s"``), as go-nsq's ``Config.Set`` does.

>>> check_options("Consumer", {"max_tries": 3})
Traceback (most recent call last):
...
fastnsq.errors.InvalidValueError: unknown Consumer option max_tries: pynsq's name; fastnsq calls it max_attempts
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._protocol import DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_MSG_SIZE
from .backoff import STRATEGIES
from .bodies import DEFAULT_MESSAGE_SIZE_FOR_COMPRESS
from .errors import InvalidValueError

__all__ = ["CLIENTS", "OPTIONS", "SYNC_PRODUCER_PARAMETERS", "Kind", "Option", "check_options", "options_docstring", "options_of"]

#: How a value is checked and parsed from a string: "int", "seconds" (a duration: seconds, or
#: Go's form from strings), "number", "bool", "str", or "object" (a Python object: only as a
#: keyword, never from a string).
Kind = Literal["int", "seconds", "number", "bool", "str", "object"]
#: The clients: "connection" options are taken by both.
Client = Literal["consumer", "producer", "connection"]
CLIENTS: dict[str, tuple[Client, ...]] = {"Consumer": ("consumer", "connection"),
                                          "Producer": ("producer", "connection")}
#: Options ``fastnsq.sync.Producer`` takes as parameters of its own (with their own defaults).
SYNC_PRODUCER_PARAMETERS = ("lazy_connect",)


@dataclass(frozen=True)
class Option:
    """One option: what the TypedDict, the check, the string parser and the docs say of it."""

    name: str
    client: Client
    annotation: str  # the type as the TypedDict writes it
    default: Any
    doc: str
    kind: Kind = "object"
    unit: str = ""  # "s" for durations; "messages", "bytes", ...
    low: float | None = None  # accepted range (inclusive), for int / seconds / number
    high: float | None = None
    choices: tuple[Any, ...] = ()  # accepted values (a str kind), or also a callable when callable_ok
    callable_ok: bool = False
    checked: bool = True  # False: the type check is the client's own (the value takes several types)
    off: tuple[Any, ...] = ()  # values taken as they are: None, -1 ("switched off")
    gonsq: str = ""  # go-nsq's (or youzan/go-nsq's) Config name; "" where go-nsq has none
    pynsq: tuple[str, ...] = ()  # pynsq's names for it (Reader, Writer or AsyncConn keyword)
    default_doc: str = ""  # the default as the docs say it, where it is not a plain value

    @property
    def shown_default(self) -> str:
        if self.default_doc:
            return self.default_doc
        if self.default is None:
            return "None"
        if isinstance(self.default, str):
            return repr(self.default)
        return repr(self.default)

    def check(self, value: Any) -> Any:
        """``value`` if this option takes it; otherwise an error naming the option, the value and what it takes."""
        if any(value is off or (off is not None and value == off and not isinstance(value, bool)) for off in self.off):
            return value
        if self.callable_ok and callable(value):
            return value
        kind = self.kind if self.checked else "object"
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidValueError(f"{self.name} must be an int, got {value!r}")
        elif kind in ("seconds", "number"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                what = "seconds (a number)" if kind == "seconds" else "a number"
                raise InvalidValueError(f"{self.name} must be {what}, got {value!r}")
        elif kind == "bool":
            if not isinstance(value, bool):
                also = ", or None" if None in self.off else ""
                raise InvalidValueError(f"{self.name} must be True or False{also}, got {value!r}")
        elif kind == "str" and not self.choices and not isinstance(value, str):
            raise InvalidValueError(f"{self.name} must be a string, got {value!r}")
        if self.choices and value not in self.choices:
            also = " or a callable" if self.callable_ok else ""
            raise InvalidValueError(f"{self.name} must be one of {self.choices}{also}, got {value!r}")
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            raise InvalidValueError(f"{self.name}={value!r} is outside the accepted range {self.low}..{self.high}")
        return value


def _o(name: str, client: Client, annotation: str, default: Any, doc: str, **facts: Any) -> Option:
    facts.setdefault("gonsq", name)
    return Option(name, client, annotation, default, doc, **facts)


def _fastnsq(name: str, client: Client, annotation: str, default: Any, doc: str, **facts: Any) -> Option:
    """An option go-nsq does not have."""
    return Option(name, client, annotation, default, doc, **{"gonsq": "", **facts})


_SECONDS = {"kind": "seconds", "unit": "s"}

# ---- the table ------------------------------------------------------------------------------

_CONNECTION = [
    _fastnsq("client_id", "connection", "str", None, "The client's id in nsqd's /stats (IDENTIFY).",
             kind="str", default_doc="the short host name", pynsq=("client_id",)),
    _o("hostname", "connection", "str", None, "The host name sent in IDENTIFY.", kind="str",
       default_doc="socket.gethostname()", pynsq=("hostname",)),
    _o("user_agent", "connection", "str", None, "The user agent sent in IDENTIFY.", kind="str",
       default_doc="'fastnsq/<version>'", pynsq=("user_agent",)),
    _o("dial_timeout", "connection", "float", 1.0, "How long a TCP connect may take.", low=0.001, high=3600,
       pynsq=("timeout",), **_SECONDS),
    _o("read_timeout", "connection", "float | None", None,
       "A connection silent this long is dead (None: two heartbeat intervals; above heartbeat_interval).",
       low=0.1, high=3600, off=(None,), default_doc="None (10 with the default heartbeat)", **_SECONDS),
    _o("write_timeout", "connection", "float | None", 1.0,
       "Buffered writes nsqd takes none of for this long close the connection (None: wait for ever).",
       low=0.001, high=3600, off=(None,), **_SECONDS),
    _o("local_addr", "connection", "str | None", None, "The local 'host' or 'host:port' to connect from.",
       kind="str", off=(None,)),
    _o("heartbeat_interval", "connection", "float | None", 5.0,
       "nsqd's heartbeat interval; None or -1 switches heartbeats off (a producer only).",
       low=1.0, high=60.0, off=(None, -1), pynsq=("heartbeat_interval",), **_SECONDS),
    _o("output_buffer_size", "connection", "int", 16384, "nsqd's output buffer for this client; -1 switches it off.",
       kind="int", unit="bytes", low=64, high=65536, off=(-1,), pynsq=("output_buffer_size",)),
    _o("output_buffer_timeout", "connection", "float", 0.25,
       "How long nsqd buffers output for this client; -1 switches it off (pynsq: milliseconds).",
       low=0.025, high=30.0, off=(-1,), pynsq=("output_buffer_timeout",), **_SECONDS),
    _o("msg_timeout", "connection", "float | None", None,
       "How long nsqd waits for an answer to a message before it gives it out again (None: nsqd's, 60 s).",
       low=1.0, high=900.0, off=(None,), pynsq=("msg_timeout",), **_SECONDS),
    _o("sample_rate", "connection", "int", 0, "Percent of the channel's messages nsqd sends this client (0: all).",
       kind="int", unit="%", low=0, high=99, pynsq=("sample_rate",)),
    _o("tls_v1", "connection", "bool", False, "Upgrade the connection to TLS.", kind="bool", pynsq=("tls_v1",)),
    _o("tls_context", "connection", "ssl.SSLContext | None", None, "Your own TLS context (else one is built).",
       gonsq="tls_config", pynsq=("tls_options",), off=(None,)),
    _o("tls_root_ca_file", "connection", "str | None", None, "The CA bundle that verifies nsqd's certificate.",
       kind="str", off=(None,)),
    _o("tls_cert", "connection", "str | None", None, "The client certificate file (with tls_key).", kind="str",
       off=(None,)),
    _o("tls_key", "connection", "str | None", None, "The client key file (with tls_cert).", kind="str", off=(None,)),
    _fastnsq("tls_server_hostname", "connection", "str | None", None,
             "The name nsqd's certificate is checked against (default: the address's host).", kind="str",
             off=(None,)),
    _o("tls_insecure_skip_verify", "connection", "bool", False, "Do not verify nsqd's certificate.", kind="bool"),
    _o("tls_min_version", "connection", "Literal['1.2', '1.3']", "1.2", "The lowest TLS version accepted.",
       kind="str", choices=("1.2", "1.3")),
    _o("snappy", "connection", "bool", False, "Snappy-compress the connection.", kind="bool", pynsq=("snappy",)),
    _o("deflate", "connection", "bool", False, "Deflate-compress the connection.", kind="bool", pynsq=("deflate",)),
    _o("deflate_level", "connection", "int", 6, "The deflate level (1-9).", kind="int", low=1, high=9,
       pynsq=("deflate_level",)),
    _o("auth_secret", "connection", "str | bytes | None", None,
       "The AUTH secret (also sent to nsqlookupd as a Bearer token).", kind="str", off=(None,), checked=False,
       pynsq=("auth_secret",)),
    _o("topology_region", "connection", "str", "", "The region nsqd's topology-aware delivery sees.", kind="str"),
    _o("topology_zone", "connection", "str", "", "The zone nsqd's topology-aware delivery sees.", kind="str"),
    _o("max_msg_size", "connection", "int", DEFAULT_MAX_MSG_SIZE, "The largest message body taken or sent.",
       kind="int", unit="bytes", low=1, high=2**31 - 1),
    _fastnsq("max_body_size", "connection", "int", DEFAULT_MAX_BODY_SIZE,
             "The largest MPUB body; mpublish splits under it.", kind="int", unit="bytes", low=1, high=2**31 - 1),
    _o("desired_tag", "connection", "str | None", None, "HA: the tag of the messages to receive.", kind="str",
       off=(None,), gonsq="DesiredTag"),
    _o("ext_filter", "connection", "Mapping[str, Any] | None", None,
       "HA: nsqd's filter on the messages' ext headers (a JSON object).", off=(None,), gonsq="ExtFilter"),
]

_CONSUMER = [
    _o("max_in_flight", "consumer", "int", 1, "Messages held unanswered at most, over all connections.",
       kind="int", unit="messages", low=0, high=10**9, pynsq=("max_in_flight",)),
    _o("max_attempts", "consumer", "int", 5, "Deliveries after which a message is given up (0: never).",
       kind="int", low=0, high=65535, pynsq=("max_tries",)),
    _o("default_requeue_delay", "consumer", "float", 90.0,
       "A requeue's delay, times the message's attempts (capped by max_requeue_delay).", low=0, high=3600,
       pynsq=("requeue_delay",), **_SECONDS),
    _o("max_requeue_delay", "consumer", "float", 900.0,
       "The longest automatic requeue delay (go-nsq's 15 min; both at most 3600, go-nsq's limit and nsqd's "
       "default --max-req-timeout).", low=0, high=3600, **_SECONDS),
    _o("backoff_strategy", "consumer", "BackoffStrategy", "exponential",
       "How long a backoff level waits: 'exponential' (go-nsq: multiplier x 2^level), 'full_jitter' "
       "(a random part of that), 'linear' (multiplier x level: pynsq-like small steps) or a callable "
       "level -> seconds.", kind="str", choices=STRATEGIES, callable_ok=True),
    _o("max_backoff_duration", "consumer", "float", 120.0, "The longest backoff wait (0: no backoff).",
       low=0, high=3600, pynsq=("max_backoff_duration",), **_SECONDS),
    _o("backoff_multiplier", "consumer", "float", 1.0, "The backoff strategy's unit.", low=0, high=3600,
       **_SECONDS),
    _fastnsq("backoff_scope", "consumer", "Literal['consumer', 'partition']", "consumer",
             "'consumer': a failure slows every connection (go-nsq); 'partition': only its partition's "
             "(youzan's RequeueBackoffSingleConn).", kind="str", choices=("consumer", "partition")),
    _o("lookupd_poll_interval", "consumer", "float", 60.0, "How often nsqlookupd is asked where the topic is.",
       low=0.01, high=300, pynsq=("lookupd_poll_interval",), **_SECONDS),
    _o("lookupd_poll_jitter", "consumer", "float", 0.3, "Each poll interval is shortened by up to this fraction.",
       kind="number", low=0, high=1, pynsq=("lookupd_poll_jitter",)),
    _o("lookupd_poll_timeout", "consumer", "float", 60.0, "How long one nsqlookupd request may take.",
       low=0.001, high=3600, pynsq=("lookupd_request_timeout", "lookupd_connect_timeout"), **_SECONDS),
    _o("low_rdy_idle_timeout", "consumer", "float", 10.0,
       "A connection idle this long gives its RDY to the others (when max_in_flight < connections).",
       low=1.0, high=300.0, pynsq=("low_rdy_idle_timeout",), **_SECONDS),
    _o("low_rdy_timeout", "consumer", "float", 30.0, "How long a low RDY may stay unused.", low=1.0, high=300.0,
       **_SECONDS),
    _o("rdy_redistribute_interval", "consumer", "float", 5.0, "How often RDY is moved between connections.",
       low=0.001, high=5.0, **_SECONDS),
    _fastnsq("reconnect_delay", "consumer", "float", 0.4,
             "A missing nsqd is tried again every reconnect_delay/2 to reconnect_delay (the recovery rule).",
             low=0.001, high=60, **_SECONDS),
    _fastnsq("max_reconnect_delay", "consumer", "float", 0.4,
             "Above reconnect_delay: the wait doubles up to this.", low=0.001, high=3600, **_SECONDS),
    _fastnsq("connections_per_nsqd", "consumer", "int", 1, "Subscribed connections to each nsqd.", kind="int",
             low=1, high=64),
    _fastnsq("auto_touch", "consumer", "bool", False,
             "TOUCH messages whose handler runs past half their msg_timeout.", kind="bool"),
    _o("give_up_handler", "consumer", "Callable[[Message], object] | None", None,
       "Called with each message past max_attempts, after it was finished (may be async; None: a warning).",
       gonsq="FailedMessageLogger", pynsq=("giving_up",), off=(None,), callable_ok=True),
    _fastnsq("dead_letter_topic", "consumer", "str | None", None,
             "Messages past max_attempts are published here (their body as it came, on the nsqd they came "
             "from) and finished only once nsqd took them (None: finished and logged).", kind="str",
             off=(None,)),
    _fastnsq("ready_check", "consumer", "Callable[[], object] | None", None,
             "While a handler fails, polled every ready_check_interval (sync or async; raising or False: "
             "not ready): RDY 0 until it passes, then full max_in_flight at once, failed messages requeued "
             "without delay.", off=(None,), callable_ok=True),
    _fastnsq("hold_failed", "consumer", "bool", True,
             "A handler's failed message is held and its handler called again every ready_check_interval, "
             "requeued (an attempt) only once other messages succeed beside it; two failures in a row hold the "
             "consumer at RDY 0 until a retry succeeds (False, ordered or backoff_scope='partition': REQ with "
             "backoff at once, as go-nsq).",
             kind="bool"),
    _fastnsq("ready_check_interval", "consumer", "float", 0.25, "How often a failing ready_check is asked again.",
             low=0.01, high=60, **_SECONDS),
    _fastnsq("ordered", "consumer", "bool", False, "HA: SUB_ORDERED, one message at a time per partition.",
             kind="bool", gonsq="EnableOrdered"),
    _fastnsq("ordered_give_up", "consumer", "Literal['finish', 'requeue', 'stop']", "finish",
             "HA ordered: what to do with a message past max_attempts.", kind="str",
             choices=("finish", "requeue", "stop")),
    _o("discovery_filter", "consumer", "Callable[[list[str]], Iterable[str]] | None", None,
       "The nsqd addresses nsqlookupd listed in, those to consume from out.", gonsq="DiscoveryFilter",
       off=(None,), callable_ok=True),
    _fastnsq("logger", "consumer", "logging.Logger | logging.LoggerAdapter[Any] | None", None,
             "This consumer's logger (None: the module loggers fastnsq.consumer...).", off=(None,)),
    _fastnsq("express_lane", "consumer", "bool", True,
             "An unbuffered connection per nsqd carries the messages while they come slowly.", kind="bool"),
    _fastnsq("express_max_rate", "consumer", "float", 20_000.0, "The rate above which the express lane is left.",
             kind="number", unit="msg/s", low=1, high=10**8),
    # youzan/go-nsq's (HA)
    _o("partition", "consumer", "int | None", None, "HA: consume this partition only.", kind="int", off=(None,),
       low=0, high=2**31 - 1, gonsq="NewPartitionConsumer"),
    _o("consume_ext", "consumer", "bool | None", None,
       "HA: identify with extend_support where no lookupd says whether the topic is an ext topic.", kind="bool",
       off=(None,), gonsq="SetConsumeExt"),
    _o("enable_trace", "consumer", "bool", False, "HA: SUB_ADVANCED (message.offset and message.raw_size).",
       kind="bool", gonsq="EnableTrace"),
    _o("consume_offset", "consumer", "ConsumeOffset | str | Mapping[int, ConsumeOffset | str] | None", None,
       "HA: where each partition starts (ConsumeOffset, its text, or {partition: start}).", kind="str",
       checked=False,
       off=(None,), gonsq="SetConsumeOffset"),
    _o("disable_message_decompress", "consumer", "bool", False,
       "HA: hand over bodies a youzan producer compressed as they came.", kind="bool",
       gonsq="DisableMessageDecompress"),
    _fastnsq("fins_newest_first", "consumer", "bool", True,
             "HA: a loop pass's FINs go out newest first (one confirmed-offset move per pass).", kind="bool"),
]

_PRODUCER = [
    _fastnsq("pool_size", "producer", "int", 1, "Connections to each nsqd.", kind="int", low=1, high=64,
             gonsq="ProducerPoolSize"),
    _fastnsq("coalesce", "producer", "bool", True, "Publishes of one loop pass to a topic go out as one MPUB.",
             kind="bool"),
    _fastnsq("busy_poll", "producer", "float", 0.0002,
             "Up to this long the loop of an awaited publish, the producer's only one unanswered, polls for the "
             "answer before it sleeps, when timed round trips show polling faster (0: never; not the blocking "
             "facade's threads).", low=0, high=0.01, **_SECONDS),
    _fastnsq("publish_timeout", "producer", "float", 10.0, "How long one publish attempt may take.",
             low=0.001, high=3600, gonsq="PubTimeout", **_SECONDS),
    _fastnsq("max_retries", "producer", "int", 3,
             "Retries after a lost connection (never after an error a retry cannot fix).", kind="int", low=0,
             high=100, gonsq="PubMaxRetry"),
    _fastnsq("retry_delay", "producer", "float", 0.05, "The wait before a retry, doubled per retry.", low=0,
             high=60, **_SECONDS),
    _fastnsq("reconnect_delay", "producer", "float", 0.4,
             "A lost nsqd is tried again every reconnect_delay/2 to reconnect_delay (the recovery rule).",
             low=0.001, high=60, pynsq=("reconnect_interval",), **_SECONDS),
    _fastnsq("max_reconnect_delay", "producer", "float", 0.4, "Above reconnect_delay: the wait doubles up to this.",
             low=0.001, high=3600, **_SECONDS),
    _fastnsq("lazy_connect", "producer", "bool", True,
             "start() returns even when no nsqd answers (False: it raises NoConnectionError).", kind="bool"),
    _fastnsq("suspect_after", "producer", "float", 0.5,
             "A connection whose oldest unanswered publish is this old takes no new publishes while another "
             "answers, and what it holds is sent again there (it may arrive twice).", low=0.01, high=3600, **_SECONDS),
    _fastnsq("fail_fast", "producer", "bool", True,
             "While no connection is open and the attempts failed, a publish raises at once "
             "(False: it waits for a connection within its timeout).", kind="bool"),
    _o("lookupd_poll_interval", "producer", "float", 60.0, "How often nsqlookupd is asked where topics are.",
       low=0.01, high=300, **_SECONDS),
    _o("lookupd_poll_jitter", "producer", "float", 0.3, "Each poll interval is shortened by up to this fraction.",
       kind="number", low=0, high=1),
    _o("lookupd_poll_timeout", "producer", "float", 60.0, "How long one nsqlookupd request may take.",
       low=0.001, high=3600, **_SECONDS),
    _o("hasher", "producer", "Callable[[bytes], int] | None", None,
       "HA: the sharding key's hash (None: murmur3 32-bit).", gonsq="Hasher", off=(None,), callable_ok=True),
    _fastnsq("logger", "producer", "logging.Logger | logging.LoggerAdapter[Any] | None", None,
             "This producer's logger (None: the module loggers fastnsq.producer...).", off=(None,)),
    # youzan/go-nsq's (HA)
    _o("topics_for_compress", "producer", "Sequence[str]", (), "HA: topics whose large bodies are compressed.",
       gonsq="TopicsForCompress", default_doc="()"),
    _o("message_size_for_compress", "producer", "int", DEFAULT_MESSAGE_SIZE_FOR_COMPRESS, "HA: bodies from this size on are compressed.",
       kind="int", unit="bytes", gonsq="MessageSizeForCompress"),
    _o("client_compress_decodec", "producer", "str", "not_specified",
       "HA: the body compression ('gzip', 'snappy', 'lz4').", kind="str", checked=False, gonsq="ClientCompressDecodec"),
    _fastnsq("pub_strategy", "producer", "Literal['round_robin', 'dynamic_load', 0, 1]", "round_robin",
             "HA: how partitions take turns (go-nsq's PubStrategy 0 / 1).", kind="str",
             choices=("round_robin", "dynamic_load", 0, 1), gonsq="PubStrategy"),
    _o("pub_max_background_retry", "producer", "int", 15, "HA: retries of publish_and_retry_background.",
       kind="int", low=1, high=100, gonsq="PubMaxBackgroundRetry"),
    _o("pub_background_buffer", "producer", "int", 1000, "HA: publishes waiting for a background retry, at most.",
       kind="int", unit="messages", low=10, high=10000, gonsq="PubBackgroundBuffer"),
    _fastnsq("background_failure_handler", "producer", "Callable[[Unsent], object] | None", None,
             "Called with each background publish given up.", off=(None,), callable_ok=True),
]

#: Every option, in the order the docs list them.
OPTIONS: tuple[Option, ...] = (*_CONSUMER, *_PRODUCER, *_CONNECTION)

#: Names other clients use for something fastnsq takes elsewhere or not at all: name -> hint.
_OTHER_NAMES = {
    "message_handler": "pynsq's name; fastnsq calls it handler (an argument of Consumer)",
    "name": "pynsq's Reader name; fastnsq has none (its logs name the topic, channel and nsqd; "
            "logger= takes a LoggerAdapter)",
    "tls_config": "go-nsq's name; fastnsq calls it tls_context (an ssl.SSLContext)",
    "skip_lookupd_authorization": "go-nsq's; fastnsq sends auth_secret to nsqlookupd only when it is set",
}


def options_of(client_name: str) -> dict[str, Option]:
    """The options ``client_name`` ("Consumer" or "Producer") takes, by name."""
    parts = CLIENTS[client_name]
    return {option.name: option for option in OPTIONS if option.client in parts}


def check_options(client_name: str, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The connection options given (checked) and every option of ``client_name``'s own with its
    value (the given ones checked, the rest defaulted): what ``ConnectionOptions`` and the client take.

    An unknown name raises ``InvalidValueError`` naming it, and, where it is pynsq's or
    go-nsq's name for one of ours (or the other client's option, or a near miss), the name to use.
    """
    known = options_of(client_name)
    unknown = [name for name in given if name not in known]
    if unknown:
        hints = [f"{name}: {unknown_hint(client_name, name, known)}" for name in unknown]
        if len(hints) == 1:
            raise InvalidValueError(f"unknown {client_name} option {hints[0]}")
        raise InvalidValueError(f"unknown {client_name} options: " + " | ".join(hints))
    connection: dict[str, Any] = {}
    own = {name: option.default for name, option in known.items() if option.client != "connection"}
    for name, value in given.items():
        option = known[name]
        (connection if option.client == "connection" else own)[name] = option.check(value)
    return connection, own


def unknown_hint(client_name: str, name: str, known: Mapping[str, Option]) -> str:
    """What to say of an option ``client_name`` does not take."""
    for option in known.values():
        if name in option.pynsq and name != option.name:
            return f"pynsq's name; fastnsq calls it {option.name}"
        if name == option.gonsq and name != option.name:
            return f"go-nsq's name; fastnsq calls it {option.name}"
    if name in _OTHER_NAMES:
        return _OTHER_NAMES[name]
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    if snake != name and snake in known:
        return f"go-nsq's Config field; fastnsq calls it {snake}"
    others = [other for other, parts in CLIENTS.items() if other != client_name
              and any(o.name == name and o.client in parts for o in OPTIONS)]
    if others:
        return f"a {others[0]} option, not a {client_name} one"
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"no such option (did you mean {close[0]}?)" if close else "no such option (docs/options.md lists them)"


def options_docstring(client_name: str) -> str:
    """The options of ``client_name`` as a docstring section (appended to the client's ``__doc__``:
    ``help()`` and the API reference show each default and unit)."""
    lines = ["", "    Options (default, unit):", ""]
    for option in options_of(client_name).values():
        unit = f" {option.unit}" if option.unit and option.default is not None else ""
        lines.append(f"    * ``{option.name}`` ({option.shown_default}{unit}): {option.doc}")
    return "\n".join(lines) + "\n"
