"""The `nsq` data source's options: parsed and checked once, on the driver, before any task runs.

Spark hands a data source its options as strings in a case-insensitive dict
(keys arrive lower-cased). :func:`parse_options` turns them into frozen
:class:`SourceOptions` / :class:`SinkOptions`; a bad value raises
:class:`~fastnsq.errors.InvalidValueError` naming the option, the value and what
is accepted. Nothing here opens a socket.

Durations are milliseconds in Spark options (the convention of Spark's own
sources, e.g. Kafka's ``kafkaConsumer.pollTimeoutMs``) and seconds in fastnsq's
Python API; the conversion happens here, once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import codec
from ..config import ConnectionOptions, parse_address
from ..errors import InvalidValueError

__all__ = [
    "KNOWN_OPTIONS",
    "CommonOptions",
    "SinkOptions",
    "SourceOptions",
    "parse_common",
    "parse_sink",
    "parse_source",
]

#: Options Spark itself may put next to ours (never ours to reject).
_SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation", "queryname"})

_READ_MODES = ("partitioned", "simple", "offsets")
#: readMode=offsets names its channels <channel>-<partition>-<10 hex>#ephemeral, at most 64 characters.
MAX_OFFSETS_CHANNEL_PREFIX = 64 - len("-1023-0123456789#ephemeral")
_ROW_TRANSPORTS = ("plan", "tcp")
#: 9999-12-31T23:59:59.999Z in milliseconds: the largest time option a timestamp option takes.
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: More read tasks than this for one batch is a mistake, not a plan (Spark schedules each).
MAX_MIN_PARTITIONS = 100_000


def _addresses(name: str, text: str, *, http: bool = False) -> tuple[str, ...]:
    items = tuple(part.strip() for part in text.split(",") if part.strip())
    if not items:
        raise InvalidValueError(f"option {name!r} is empty: give one or more 'host:port', comma-separated")
    for item in items:
        bare = item.split("://", 1)[1] if http and "://" in item else item
        parse_address(bare.rstrip("/"), 4161 if http else 4150)
    return items


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidValueError(f"option {name!r} must be true or false, got {text!r}")


def _int(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidValueError(f"option {name!r} must be an integer in {low}..{high}, got {text!r}") from None
    if not low <= value <= high:
        raise InvalidValueError(f"option {name!r}={value} is outside the accepted range {low}..{high}")
    return value


def _partitions_json(name: str, text: str, expected: str) -> dict[int, Any]:
    """A non-empty JSON object keyed by partition number; refused naming ``expected``."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or not raw:
            raise ValueError("not a JSON object of partitions")
        return {int(key): value for key, value in raw.items()}
    except ValueError as exc:
        raise InvalidValueError(f"option {name!r}={text!r} is not {expected} ({exc})") from None


def _timestamps(name: str, text: str) -> dict[int, int]:
    """JSON ``{"partition": milliseconds since the epoch}`` (Kafka's ``...OffsetsByTimestamp``)."""
    parsed = _partitions_json(name, text, 'JSON {"partition": milliseconds}')
    for partition, value in parsed.items():
        if partition < 0 or isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMESTAMP_MS:
            raise InvalidValueError(f"option {name!r}: partition {partition} timestamp {value!r} must be milliseconds "
                                    f"since the epoch in 0..{MAX_TIMESTAMP_MS}")
    return parsed


def _text(name: str, text: str) -> str:
    if not text.strip():
        raise InvalidValueError(f"option {name!r} is empty")
    return text.strip()


def _topic(name: str, text: str) -> str:
    value = text.strip()
    if not codec.valid_topic_name(value):
        raise InvalidValueError(
            f"option {name!r}={value!r} is not a valid topic name: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    return value


def _channel(name: str, text: str) -> str:
    value = text.strip()
    if not codec.valid_channel_name(value):
        raise InvalidValueError(
            f"option {name!r}={value!r} is not a valid channel name: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise InvalidValueError(f"option {name!r} must be one of {', '.join(choices)}, got {text!r}")
        return value

    return parse


def _tls_version(name: str, text: str) -> str:
    value = text.strip()
    if value not in ("1.2", "1.3"):
        raise InvalidValueError(f"option {name!r} must be 1.2 or 1.3, got {text!r}")
    return value


# name as documented -> parser. Spark lower-cases keys; the documented spelling is
# kept for error messages.
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    # where
    "nsqd": _addresses,
    "lookupd": lambda n, t: _addresses(n, t, http=True),
    "nsqdHttp": lambda n, t: _addresses(n, t, http=True),
    "topic": _topic,
    # connection (fastnsq.ConnectionOptions)
    "tls": _bool,
    "tlsRootCaFile": _text,
    "tlsCert": _text,
    "tlsKey": _text,
    "tlsServerHostname": _text,
    "tlsInsecureSkipVerify": _bool,
    "tlsMinVersion": _tls_version,
    "snappy": _bool,
    "deflate": _bool,
    "deflateLevel": lambda n, t: _int(n, t, 1, 9),
    "authSecret": _text,
    "dialTimeoutMs": lambda n, t: _int(n, t, 1, 3_600_000),
    "heartbeatIntervalMs": lambda n, t: _int(n, t, 1000, 60_000),
    "maxMsgSize": lambda n, t: _int(n, t, 1, 2**31 - 1),
    "maxBodySize": lambda n, t: _int(n, t, 9, 2**31 - 1),
    "clientId": _text,
    # source
    "channel": _channel,
    "maxInFlight": lambda n, t: _int(n, t, 1, 10_000_000),
    "connectionsPerNsqd": lambda n, t: _int(n, t, 1, 64),
    "maxRecordsPerBatch": lambda n, t: _int(n, t, 1, 2**31 - 1),
    "msgTimeoutMs": lambda n, t: _int(n, t, 1000, 900_000),
    "numPartitions": lambda n, t: _int(n, t, 1, 100_000),
    "readMode": _choice(_READ_MODES),
    "rowTransport": _choice(_ROW_TRANSPORTS),
    "rowServerHost": _text,
    "rowServerPort": lambda n, t: _int(n, t, 0, 65535),
    "availableNowTimeoutMs": lambda n, t: _int(n, t, 100, 86_400_000),
    "ha": _bool,
    "startingOffsets": _text,
    "readStallTimeoutMs": lambda n, t: _int(n, t, 100, 86_400_000),
    "leaderWaitTimeoutMs": lambda n, t: _int(n, t, 1_000, 604_800_000),
    "prefetchRanges": _bool,
    # readMode=offsets, named as Spark's Kafka source names them
    "endingOffsets": _text,
    "startingTimestamp": lambda n, t: _int(n, t, 0, MAX_TIMESTAMP_MS),
    "endingTimestamp": lambda n, t: _int(n, t, 0, MAX_TIMESTAMP_MS),
    "startingOffsetsByTimestamp": lambda n, t: _timestamps(n, t),
    "endingOffsetsByTimestamp": lambda n, t: _timestamps(n, t),
    "failOnDataLoss": _bool,
    "minPartitions": lambda n, t: _int(n, t, 1, MAX_MIN_PARTITIONS),
    "maxOffsetsPerTrigger": lambda n, t: _int(n, t, 1, 2**31 - 1),
    # sink
    "deferMs": lambda n, t: _int(n, t, 0, 3_600_000),
    "publishTimeoutMs": lambda n, t: _int(n, t, 1, 3_600_000),
    "publishWindow": lambda n, t: _int(n, t, 1, 1024),
    "poolSize": lambda n, t: _int(n, t, 1, 64),
}

#: Every option the data source knows, in its documented spelling.
KNOWN_OPTIONS = tuple(_PARSERS)
_BY_LOWER = {name.lower(): name for name in _PARSERS}
#: Options of readMode=offsets only (Spark's Kafka source has each of them, under the same name).
OFFSETS_ONLY = ("startingOffsets", "readStallTimeoutMs", "leaderWaitTimeoutMs", "prefetchRanges", "endingOffsets",
                "startingTimestamp",
                "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "failOnDataLoss", "minPartitions",
                "maxOffsetsPerTrigger")
_SOURCE_ONLY = ("channel", "maxInFlight", "connectionsPerNsqd", "maxRecordsPerBatch", "msgTimeoutMs",
                "numPartitions", "readMode", "rowTransport", "rowServerHost", "rowServerPort",
                "availableNowTimeoutMs", "ha") + OFFSETS_ONLY
_SINK_ONLY = ("deferMs", "publishTimeoutMs", "publishWindow", "poolSize")


@dataclass(frozen=True)
class CommonOptions:
    """Where nsqd is and how to talk to it (both directions)."""

    nsqd: tuple[str, ...] = ()
    lookupd: tuple[str, ...] = ()
    nsqd_http: tuple[str, ...] = ()
    topic: str | None = None
    connection: dict[str, Any] = field(default_factory=dict, repr=False)  # fastnsq keywords; may hold authSecret
    values: dict[str, Any] = field(default_factory=dict, repr=False)  # every parsed option by documented name

    def __post_init__(self) -> None:
        # Built here so that a bad combination (tlsCert without tlsKey, snappy with
        # deflate...) fails on the driver with fastnsq's own message.
        ConnectionOptions(**self.connection)

    @property
    def addresses(self) -> dict[str, Any]:
        """Keyword arguments naming the servers for fastnsq's Consumer / Producer."""
        out: dict[str, Any] = {}
        if self.nsqd:
            out["nsqd_tcp_addresses"] = list(self.nsqd)
        if self.lookupd:
            out["lookupd_http_addresses"] = list(self.lookupd)
        return out


@dataclass(frozen=True)
class SourceOptions:
    """Options of ``spark.readStream.format("nsq")``."""

    common: CommonOptions
    topic: str
    channel: str
    max_in_flight: int = 2500
    connections_per_nsqd: int = 1
    max_records_per_batch: int | None = None
    msg_timeout_ms: int | None = None
    num_partitions: int = 1
    read_mode: str = "partitioned"
    row_transport: str = "plan"
    row_server_host: str = "127.0.0.1"
    row_server_port: int = 0
    available_now_timeout: float = 30.0
    ha: bool = False
    starting_offsets: str = "earliest"  # readMode=offsets: earliest, latest or JSON {"partition": offset}
    read_stall_timeout: float = 30.0  # readMode=offsets: a range read with no message for this long fails
    #: readMode=offsets: how long a partition may have no leader that answers (lookupd lists none,
    #: or the one listed is down) before its read task, or the driver's planning, fails the query
    leader_wait_timeout: float = 600.0
    #: readMode=offsets: the driver reads each batch's ranges as it plans them and serves them to the tasks
    prefetch_ranges: bool = False
    # readMode=offsets, as Spark's Kafka source has them (a timestamp option wins over its offsets option)
    ending_offsets: str | None = None  # latest or JSON {"partition": offset}; None: no end (streaming)
    starting_timestamp: int | None = None  # ms since the epoch, every partition
    ending_timestamp: int | None = None
    starting_by_timestamp: dict[int, int] | None = None  # {partition: ms}
    ending_by_timestamp: dict[int, int] | None = None
    fail_on_data_loss: bool = True
    min_partitions: int | None = None

    @property
    def has_ending(self) -> bool:
        """Whether an ending option was given (a streaming query then stops reading there)."""
        return (self.ending_offsets is not None or self.ending_timestamp is not None
                or self.ending_by_timestamp is not None)

    def consumer_kwargs(self) -> dict[str, Any]:
        """fastnsq Consumer keyword arguments.

        ``max_attempts=0``: the Consumer must never give up on (FIN) a message by
        itself; a message redelivered many times after crashes is still data.
        ``auto_touch=True``: every delivered and unfinished message is TOUCHed
        before nsqd's msg_timeout, so a slow micro-batch causes no redelivery.
        """
        kwargs: dict[str, Any] = dict(self.common.connection)
        kwargs.update(self.common.addresses)
        kwargs.update(
            max_in_flight=self.max_in_flight,
            connections_per_nsqd=self.connections_per_nsqd,
            max_attempts=0,
            auto_touch=True,
            max_backoff_duration=0,  # the source never requeues with backoff
        )
        if self.ha:
            # SUB_ADVANCED: every HA message then carries its queue offset (the `offset`
            # column); a plain SUB delivers it without one.
            kwargs["enable_trace"] = True
        if self.msg_timeout_ms is not None:
            kwargs["msg_timeout"] = self.msg_timeout_ms / 1000
        return kwargs


@dataclass(frozen=True)
class SinkOptions:
    """Options of ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``."""

    common: CommonOptions
    topic: str | None  # None: route every row by its `topic` column
    defer_ms: int | None = None
    publish_timeout: float = 10.0
    publish_window: int = 16
    pool_size: int = 1

    def producer_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self.common.connection)
        kwargs.update(self.common.addresses)
        # A task fails at its start when no nsqd answers, and rides out an nsqd restart shorter
        # than publishTimeout (a failed task is run again whole: its messages twice).
        kwargs.update(pool_size=self.pool_size, publish_timeout=self.publish_timeout, lazy_connect=False,
                      fail_fast=False)
        return kwargs

    @property
    def max_msg_size(self) -> int:
        return int(self.common.connection.get("max_msg_size", codec.DEFAULT_MAX_MSG_SIZE))


def _parse_values(options: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, raw in options.items():
        lowered = key.lower()
        if lowered in _SPARK_KEYS:
            continue
        name = _BY_LOWER.get(lowered)
        if name is None:
            raise InvalidValueError(
                f"unknown option {key!r} for format 'nsq'; known options: {', '.join(KNOWN_OPTIONS)}"
            )
        if raw is None:
            raise InvalidValueError(f"option {name!r} has no value")
        try:
            values[name] = _PARSERS[name](name, str(raw))
        except InvalidValueError as exc:
            if repr(name) in str(exc):
                raise
            raise InvalidValueError(f"option {name!r}: {exc}") from None
    return values


def parse_common(options: Mapping[str, str]) -> CommonOptions:
    """Check every option's value (whatever the direction) and build the connection settings.

    >>> parse_common({"nsqd": "127.0.0.1:4150", "snappy": "true"}).connection
    {'snappy': True}
    """
    values = _parse_values(options)
    if "nsqd" not in values and "lookupd" not in values:
        raise InvalidValueError("format 'nsq' needs option 'nsqd' (nsqd TCP addresses) or 'lookupd' (HTTP addresses)")
    if "tls" not in values and any(k in values for k in ("tlsRootCaFile", "tlsCert", "tlsServerHostname")):
        values["tls"] = True  # naming TLS material means TLS
    connection: dict[str, Any] = {}
    direct = {
        "tls": "tls_v1",
        "tlsRootCaFile": "tls_root_ca_file",
        "tlsCert": "tls_cert",
        "tlsKey": "tls_key",
        "tlsServerHostname": "tls_server_hostname",
        "tlsInsecureSkipVerify": "tls_insecure_skip_verify",
        "tlsMinVersion": "tls_min_version",
        "snappy": "snappy",
        "deflate": "deflate",
        "deflateLevel": "deflate_level",
        "authSecret": "auth_secret",
        "maxMsgSize": "max_msg_size",
        "maxBodySize": "max_body_size",
        "clientId": "client_id",
    }
    for name, keyword in direct.items():
        if name in values:
            connection[keyword] = values[name]
    if "dialTimeoutMs" in values:
        connection["dial_timeout"] = values["dialTimeoutMs"] / 1000
    if "heartbeatIntervalMs" in values:
        connection["heartbeat_interval"] = values["heartbeatIntervalMs"] / 1000
    if "msgTimeoutMs" in values:
        connection["msg_timeout"] = values["msgTimeoutMs"] / 1000
    try:
        return CommonOptions(
            nsqd=values.get("nsqd", ()),
            lookupd=values.get("lookupd", ()),
            nsqd_http=values.get("nsqdHttp", ()),
            topic=values.get("topic"),
            connection=connection,
            values=values,
        )
    except InvalidValueError as exc:
        raise InvalidValueError(f"format 'nsq': {exc}") from None


def parse_source(options: Mapping[str, str]) -> SourceOptions:
    """The options of a streaming read; ``topic`` and ``channel`` are required.

    >>> opts = parse_source({"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c", "maxInFlight": "100"})
    >>> opts.max_in_flight, opts.read_mode
    (100, 'partitioned')
    """
    common = parse_common(options)
    values = common.values
    for name in ("topic", "channel"):
        if name not in values:
            raise InvalidValueError(f"readStream.format('nsq') needs option {name!r}")
    misplaced = [name for name in _SINK_ONLY if name in values]
    if misplaced:
        raise InvalidValueError(f"option(s) {', '.join(misplaced)} only apply when writing to nsq")
    if "nsqdHttp" in values and "nsqd" in values and len(values["nsqdHttp"]) != len(values["nsqd"]):
        raise InvalidValueError("option 'nsqdHttp' must list one HTTP address per address of option 'nsqd'")
    opts = SourceOptions(
        common=common,
        topic=values["topic"],
        channel=values["channel"],
        max_in_flight=values.get("maxInFlight", 2500),
        connections_per_nsqd=values.get("connectionsPerNsqd", 1),
        max_records_per_batch=values.get("maxRecordsPerBatch", values.get("maxOffsetsPerTrigger")),
        msg_timeout_ms=values.get("msgTimeoutMs"),
        num_partitions=values.get("numPartitions", 1),
        read_mode=values.get("readMode", "partitioned"),
        row_transport=values.get("rowTransport", "plan"),
        row_server_host=values.get("rowServerHost", "127.0.0.1"),
        row_server_port=values.get("rowServerPort", 0),
        available_now_timeout=values.get("availableNowTimeoutMs", 30_000) / 1000,
        ha=values.get("ha", False) or values.get("readMode") == "offsets",
        starting_offsets=values.get("startingOffsets", "earliest"),
        read_stall_timeout=values.get("readStallTimeoutMs", 30_000) / 1000,
        leader_wait_timeout=values.get("leaderWaitTimeoutMs", 600_000) / 1000,
        prefetch_ranges=values.get("prefetchRanges", False),
        ending_offsets=values.get("endingOffsets"),
        starting_timestamp=values.get("startingTimestamp"),
        ending_timestamp=values.get("endingTimestamp"),
        starting_by_timestamp=values.get("startingOffsetsByTimestamp"),
        ending_by_timestamp=values.get("endingOffsetsByTimestamp"),
        fail_on_data_loss=values.get("failOnDataLoss", True),
        min_partitions=values.get("minPartitions"),
    )
    if opts.read_mode == "offsets":
        _check_offsets_mode(opts, values)
    elif any(name in values for name in OFFSETS_ONLY):
        given = ", ".join(repr(name) for name in OFFSETS_ONLY if name in values)
        raise InvalidValueError(f"option(s) {given} apply only with option 'readMode'=offsets "
                                "(HA topics: read by queue offsets)")
    if opts.row_transport != "tcp" and not opts.prefetch_ranges and ("rowServerHost" in values
                                                                     or "rowServerPort" in values):
        raise InvalidValueError("options 'rowServerHost' and 'rowServerPort' apply only with option 'rowTransport'=tcp "
                                "or (readMode=offsets) option 'prefetchRanges'=true")
    if opts.row_transport == "tcp" and opts.read_mode != "partitioned":
        raise InvalidValueError(
            "option 'rowTransport'=tcp needs option 'readMode'=partitioned (with readMode=simple Spark itself "
            "reads the rows in the source process)"
        )
    if opts.max_in_flight < opts.connections_per_nsqd:
        raise InvalidValueError(
            f"option 'maxInFlight'={opts.max_in_flight} is below 'connectionsPerNsqd'="
            f"{opts.connections_per_nsqd}: every connection needs at least one message of RDY"
        )
    return opts


def _check_offsets_mode(opts: SourceOptions, values: Mapping[str, Any]) -> None:
    """readMode=offsets plans offset ranges from the HA lookupd and reads them on the executors."""
    if not opts.common.lookupd:
        raise InvalidValueError("option 'readMode'=offsets needs option 'lookupd' (the HA nsqlookupd's HTTP "
                                "address): it finds each partition's leader there")
    if "ha" in values and not values["ha"]:
        raise InvalidValueError("option 'readMode'=offsets reads youzan's HA topics: option 'ha' cannot be false")
    served = ("rowServerHost", "rowServerPort") if opts.prefetch_ranges else ()
    misplaced = [name for name in ("rowTransport", "rowServerHost", "rowServerPort", "numPartitions",
                                   "connectionsPerNsqd", "availableNowTimeoutMs") if name in values and name not in served]
    if misplaced:
        raise InvalidValueError(f"option(s) {', '.join(misplaced)} do not apply with option 'readMode'=offsets "
                                "(one read task per topic partition, reading from its leader"
                                + ("; rowServerHost and rowServerPort apply with prefetchRanges=true)" if not served else ")"))
    if len(opts.channel) > MAX_OFFSETS_CHANNEL_PREFIX:
        raise InvalidValueError(
            f"option 'channel'={opts.channel!r} is {len(opts.channel)} characters; with readMode=offsets it is "
            f"the prefix of the channels the read tasks create and may be at most {MAX_OFFSETS_CHANNEL_PREFIX}"
        )
    parse_starting_offsets(opts.starting_offsets)
    if opts.ending_offsets is not None:
        parse_ending_offsets(opts.ending_offsets)
    if "maxRecordsPerBatch" in values and "maxOffsetsPerTrigger" in values:
        raise InvalidValueError("options 'maxRecordsPerBatch' and 'maxOffsetsPerTrigger' are the same limit: "
                                "give one of them")
    if opts.channel.endswith("#ephemeral"):
        raise InvalidValueError("option 'channel' must not end in #ephemeral with readMode=offsets: "
                                "the read tasks' channels are ephemeral already")


def parse_starting_offsets(text: str) -> str | dict[int, int]:
    """Option ``startingOffsets``: ``earliest``, ``latest``, or JSON ``{"partition": offset}``
    where an offset is a queue offset at which a message begins (as in the ``offset``
    column), ``-2`` (that partition's earliest) or ``-1`` (its latest).

    >>> parse_starting_offsets('{"0": 4096, "1": -2}')
    {0: 4096, 1: -2}
    """
    if text in ("earliest", "latest"):
        return text
    return _partition_offsets("startingOffsets", text, "earliest, latest", -2, ", -2 (earliest) or -1 (latest)")


def parse_ending_offsets(text: str) -> str | dict[int, int]:
    """Option ``endingOffsets``: ``latest``, or JSON ``{"partition": offset}`` where an offset is
    where a message begins (the first one not read) or ``-1`` (that partition's latest).
    ``earliest`` is refused, as Spark's Kafka source refuses it (the range would be empty).

    >>> parse_ending_offsets('{"0": 4096, "1": -1}')
    {0: 4096, 1: -1}
    """
    if text == "latest":
        return text
    return _partition_offsets("endingOffsets", text, "latest", -1, " or -1 (latest)")


def _partition_offsets(option: str, text: str, names: str, lowest: int, specials: str) -> dict[int, int]:
    """JSON ``{"partition": offset}`` of ``option``: each offset >= 0, or one of the special
    values down to ``lowest`` (``specials`` says what they mean)."""
    parsed = _partitions_json(option, text, f'{names} or JSON {{"partition": offset}}')
    for partition, offset in parsed.items():
        if partition < 0 or isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest:
            raise InvalidValueError(f"option {option!r}: partition {partition} offset {offset!r} must be "
                                    f"a queue offset >= 0{specials}")
    return parsed


def parse_sink(options: Mapping[str, str], *, has_topic_column: bool) -> SinkOptions:
    """The options of a batch or streaming write.

    Without option ``topic`` every row is routed by its ``topic`` column, which must
    then exist.

    >>> parse_sink({"nsqd": "127.0.0.1:4150", "topic": "out"}, has_topic_column=False).topic
    'out'
    """
    common = parse_common(options)
    values = common.values
    misplaced = [name for name in _SOURCE_ONLY if name in values and name != "msgTimeoutMs"]
    if misplaced:
        raise InvalidValueError(f"option(s) {', '.join(misplaced)} only apply when reading from nsq")
    topic = values.get("topic")
    if topic is None and not has_topic_column:
        raise InvalidValueError(
            "write.format('nsq') needs option 'topic', or a string column 'topic' to route each row"
        )
    return SinkOptions(
        common=common,
        topic=topic,
        defer_ms=values.get("deferMs"),
        publish_timeout=values.get("publishTimeoutMs", 10_000) / 1000,
        publish_window=values.get("publishWindow", 16),
        pool_size=values.get("poolSize", 1),
    )
