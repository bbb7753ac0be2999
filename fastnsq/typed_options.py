"""The clients' keyword options as TypedDicts (PEP 692), for type checkers and editors.

WRITTEN by ``python -m fastnsq.optionfiles --write`` from the table in :mod:`fastnsq.optionspec`:
edit the table, not this file (tests/test_optionspec.py fails when they differ). Each key's
docstring gives its default and unit, and go-nsq's and pynsq's names for it.

>>> from fastnsq.typed_options import ConsumerOptions
>>> options: ConsumerOptions = {"max_in_flight": 20, "max_attempts": 3}
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from .backoff import BackoffStrategy
from .codec import Message

if TYPE_CHECKING:
    from .consumer.positions import ConsumeOffset
    from .producer.background import Unsent

__all__ = ["AsyncHandler", "BackoffStrategy", "Body", "ConsumerOptions", "Handler", "ProducerOptions",
           "SyncHandler", "SyncProducerOptions"]

#: What a publish takes as a message body (a str goes out as UTF-8).
Body = bytes | bytearray | memoryview | str

#: A plain handler: returns to finish the message, raises to have it held and handled again
#: (hold_failed; requeued with backoff when that is off); what it
#: returns is not read, so it is typed None (pynsq's ``return False`` would finish the message).
SyncHandler = Callable[[Message], None]
#: A coroutine handler: the same rules once it returns.
AsyncHandler = Callable[[Message], Awaitable[None]]
#: What ``Consumer(handler=...)`` takes.
Handler = SyncHandler | AsyncHandler


class ConnectionKeywords(TypedDict, total=False):
    """What every connection negotiates (both clients take these)."""

    client_id: str
    """The client's id in nsqd's /stats (IDENTIFY). Default the short host name; fastnsq's own; pynsq: client_id."""
    hostname: str
    """The host name sent in IDENTIFY. Default socket.gethostname(); go-nsq: hostname; pynsq: hostname."""
    user_agent: str
    """The user agent sent in IDENTIFY. Default 'fastnsq/<version>'; go-nsq: user_agent; pynsq: user_agent."""
    dial_timeout: float
    """How long a TCP connect may take. Default 1.0 s; go-nsq: dial_timeout; pynsq: timeout."""
    read_timeout: float | None
    """A connection silent this long is dead (None: two heartbeat intervals; above heartbeat_interval). Default None (10 with the default heartbeat); go-nsq: read_timeout."""
    write_timeout: float | None
    """Buffered writes nsqd takes none of for this long close the connection (None: wait for ever). Default 1.0 s; go-nsq: write_timeout."""
    local_addr: str | None
    """The local 'host' or 'host:port' to connect from. Default None; go-nsq: local_addr."""
    heartbeat_interval: float | None
    """nsqd's heartbeat interval; None or -1 switches heartbeats off (a producer only). Default 5.0 s; go-nsq: heartbeat_interval; pynsq: heartbeat_interval."""
    output_buffer_size: int
    """nsqd's output buffer for this client; -1 switches it off. Default 16384 bytes; go-nsq: output_buffer_size; pynsq: output_buffer_size."""
    output_buffer_timeout: float
    """How long nsqd buffers output for this client; -1 switches it off (pynsq: milliseconds). Default 0.25 s; go-nsq: output_buffer_timeout; pynsq: output_buffer_timeout."""
    msg_timeout: float | None
    """How long nsqd waits for an answer to a message before it gives it out again (None: nsqd's, 60 s). Default None; go-nsq: msg_timeout; pynsq: msg_timeout."""
    sample_rate: int
    """Percent of the channel's messages nsqd sends this client (0: all). Default 0 %; go-nsq: sample_rate; pynsq: sample_rate."""
    tls_v1: bool
    """Upgrade the connection to TLS. Default False; go-nsq: tls_v1; pynsq: tls_v1."""
    tls_context: ssl.SSLContext | None
    """Your own TLS context (else one is built). Default None; go-nsq: tls_config; pynsq: tls_options."""
    tls_root_ca_file: str | None
    """The CA bundle that verifies nsqd's certificate. Default None; go-nsq: tls_root_ca_file."""
    tls_cert: str | None
    """The client certificate file (with tls_key). Default None; go-nsq: tls_cert."""
    tls_key: str | None
    """The client key file (with tls_cert). Default None; go-nsq: tls_key."""
    tls_server_hostname: str | None
    """The name nsqd's certificate is checked against (default: the address's host). Default None; fastnsq's own."""
    tls_insecure_skip_verify: bool
    """Do not verify nsqd's certificate. Default False; go-nsq: tls_insecure_skip_verify."""
    tls_min_version: Literal['1.2', '1.3']
    """The lowest TLS version accepted. Default '1.2'; go-nsq: tls_min_version."""
    snappy: bool
    """Snappy-compress the connection. Default False; go-nsq: snappy; pynsq: snappy."""
    deflate: bool
    """Deflate-compress the connection. Default False; go-nsq: deflate; pynsq: deflate."""
    deflate_level: int
    """The deflate level (1-9). Default 6; go-nsq: deflate_level; pynsq: deflate_level."""
    auth_secret: str | bytes | None
    """The AUTH secret (also sent to nsqlookupd as a Bearer token). Default None; go-nsq: auth_secret; pynsq: auth_secret."""
    topology_region: str
    """The region nsqd's topology-aware delivery sees. Default ''; go-nsq: topology_region."""
    topology_zone: str
    """The zone nsqd's topology-aware delivery sees. Default ''; go-nsq: topology_zone."""
    max_msg_size: int
    """The largest message body taken or sent. Default 1048576 bytes; go-nsq: max_msg_size."""
    max_body_size: int
    """The largest MPUB body; mpublish splits under it. Default 5242880 bytes; fastnsq's own."""
    desired_tag: str | None
    """HA: the tag of the messages to receive. Default None; go-nsq: DesiredTag."""
    ext_filter: Mapping[str, Any] | None
    """HA: nsqd's filter on the messages' ext headers (a JSON object). Default None; go-nsq: ExtFilter."""


class ConsumerOptions(ConnectionKeywords, total=False):
    """The keyword options of ``Consumer`` and ``fastnsq.sync.Consumer``."""

    max_in_flight: int
    """Messages held unanswered at most, over all connections. Default 1 messages; go-nsq: max_in_flight; pynsq: max_in_flight."""
    max_attempts: int
    """Deliveries after which a message is given up (0: never). Default 5; go-nsq: max_attempts; pynsq: max_tries."""
    default_requeue_delay: float
    """A requeue's delay, times the message's attempts (capped by max_requeue_delay). Default 90.0 s; go-nsq: default_requeue_delay; pynsq: requeue_delay."""
    max_requeue_delay: float
    """The longest automatic requeue delay (go-nsq's 15 min; both at most 3600, go-nsq's limit and nsqd's default --max-req-timeout). Default 900.0 s; go-nsq: max_requeue_delay."""
    backoff_strategy: BackoffStrategy
    """How long a backoff level waits: 'exponential' (go-nsq: multiplier x 2^level), 'full_jitter' (a random part of that), 'linear' (multiplier x level: pynsq-like small steps) or a callable level -> seconds. Default 'exponential'; go-nsq: backoff_strategy."""
    max_backoff_duration: float
    """The longest backoff wait (0: no backoff). Default 120.0 s; go-nsq: max_backoff_duration; pynsq: max_backoff_duration."""
    backoff_multiplier: float
    """The backoff strategy's unit. Default 1.0 s; go-nsq: backoff_multiplier."""
    backoff_scope: Literal['consumer', 'partition']
    """'consumer': a failure slows every connection (go-nsq); 'partition': only its partition's (youzan's RequeueBackoffSingleConn). Default 'consumer'; fastnsq's own."""
    lookupd_poll_interval: float
    """How often nsqlookupd is asked where the topic is. Default 60.0 s; go-nsq: lookupd_poll_interval; pynsq: lookupd_poll_interval."""
    lookupd_poll_jitter: float
    """Each poll interval is shortened by up to this fraction. Default 0.3; go-nsq: lookupd_poll_jitter; pynsq: lookupd_poll_jitter."""
    lookupd_poll_timeout: float
    """How long one nsqlookupd request may take. Default 60.0 s; go-nsq: lookupd_poll_timeout; pynsq: lookupd_request_timeout, lookupd_connect_timeout."""
    low_rdy_idle_timeout: float
    """A connection idle this long gives its RDY to the others (when max_in_flight < connections). Default 10.0 s; go-nsq: low_rdy_idle_timeout; pynsq: low_rdy_idle_timeout."""
    low_rdy_timeout: float
    """How long a low RDY may stay unused. Default 30.0 s; go-nsq: low_rdy_timeout."""
    rdy_redistribute_interval: float
    """How often RDY is moved between connections. Default 5.0 s; go-nsq: rdy_redistribute_interval."""
    reconnect_delay: float
    """A missing nsqd is tried again every reconnect_delay/2 to reconnect_delay (the recovery rule). Default 0.4 s; fastnsq's own."""
    max_reconnect_delay: float
    """Above reconnect_delay: the wait doubles up to this. Default 0.4 s; fastnsq's own."""
    connections_per_nsqd: int
    """Subscribed connections to each nsqd. Default 1; fastnsq's own."""
    auto_touch: bool
    """TOUCH messages whose handler runs past half their msg_timeout. Default False; fastnsq's own."""
    give_up_handler: Callable[[Message], object] | None
    """Called with each message past max_attempts, after it was finished (may be async; None: a warning). Default None; go-nsq: FailedMessageLogger; pynsq: giving_up."""
    dead_letter_topic: str | None
    """Messages past max_attempts are published here (their body as it came, on the nsqd they came from) and finished only once nsqd took them (None: finished and logged). Default None; fastnsq's own."""
    ready_check: Callable[[], object] | None
    """While a handler fails, polled every ready_check_interval (sync or async; raising or False: not ready): RDY 0 until it passes, then full max_in_flight at once, failed messages requeued without delay. Default None; fastnsq's own."""
    hold_failed: bool
    """A handler's failed message is held and its handler called again every ready_check_interval, requeued (an attempt) only once other messages succeed beside it; two failures in a row hold the consumer at RDY 0 until a retry succeeds (False, ordered or backoff_scope='partition': REQ with backoff at once, as go-nsq). Default True; fastnsq's own."""
    ready_check_interval: float
    """How often a failing ready_check is asked again. Default 0.25 s; fastnsq's own."""
    ordered: bool
    """HA: SUB_ORDERED, one message at a time per partition. Default False; go-nsq: EnableOrdered."""
    ordered_give_up: Literal['finish', 'requeue', 'stop']
    """HA ordered: what to do with a message past max_attempts. Default 'finish'; fastnsq's own."""
    discovery_filter: Callable[[list[str]], Iterable[str]] | None
    """The nsqd addresses nsqlookupd listed in, those to consume from out. Default None; go-nsq: DiscoveryFilter."""
    logger: logging.Logger | logging.LoggerAdapter[Any] | None
    """This consumer's logger (None: the module loggers fastnsq.consumer...). Default None; fastnsq's own."""
    express_lane: bool
    """An unbuffered connection per nsqd carries the messages while they come slowly. Default True; fastnsq's own."""
    express_max_rate: float
    """The rate above which the express lane is left. Default 20000.0 msg/s; fastnsq's own."""
    partition: int | None
    """HA: consume this partition only. Default None; go-nsq: NewPartitionConsumer."""
    consume_ext: bool | None
    """HA: identify with extend_support where no lookupd says whether the topic is an ext topic. Default None; go-nsq: SetConsumeExt."""
    enable_trace: bool
    """HA: SUB_ADVANCED (message.offset and message.raw_size). Default False; go-nsq: EnableTrace."""
    consume_offset: ConsumeOffset | str | Mapping[int, ConsumeOffset | str] | None
    """HA: where each partition starts (ConsumeOffset, its text, or {partition: start}). Default None; go-nsq: SetConsumeOffset."""
    disable_message_decompress: bool
    """HA: hand over bodies a youzan producer compressed as they came. Default False; go-nsq: DisableMessageDecompress."""
    fins_newest_first: bool
    """HA: a loop pass's FINs go out newest first (one confirmed-offset move per pass). Default True; fastnsq's own."""


class SyncProducerOptions(ConnectionKeywords, total=False):
    """The keyword options of ``fastnsq.sync.Producer`` (its own parameters aside)."""

    pool_size: int
    """Connections to each nsqd. Default 1; go-nsq: ProducerPoolSize."""
    coalesce: bool
    """Publishes of one loop pass to a topic go out as one MPUB. Default True; fastnsq's own."""
    busy_poll: float
    """Up to this long the loop of an awaited publish, the producer's only one unanswered, polls for the answer before it sleeps, when timed round trips show polling faster (0: never; not the blocking facade's threads). Default 0.0002 s; fastnsq's own."""
    publish_timeout: float
    """How long one publish attempt may take. Default 10.0 s; go-nsq: PubTimeout."""
    max_retries: int
    """Retries after a lost connection (never after an error a retry cannot fix). Default 3; go-nsq: PubMaxRetry."""
    retry_delay: float
    """The wait before a retry, doubled per retry. Default 0.05 s; fastnsq's own."""
    reconnect_delay: float
    """A lost nsqd is tried again every reconnect_delay/2 to reconnect_delay (the recovery rule). Default 0.4 s; fastnsq's own; pynsq: reconnect_interval."""
    max_reconnect_delay: float
    """Above reconnect_delay: the wait doubles up to this. Default 0.4 s; fastnsq's own."""
    suspect_after: float
    """A connection whose oldest unanswered publish is this old takes no new publishes while another answers, and what it holds is sent again there (it may arrive twice). Default 0.5 s; fastnsq's own."""
    fail_fast: bool
    """While no connection is open and the attempts failed, a publish raises at once (False: it waits for a connection within its timeout). Default True; fastnsq's own."""
    lookupd_poll_interval: float
    """How often nsqlookupd is asked where topics are. Default 60.0 s; go-nsq: lookupd_poll_interval."""
    lookupd_poll_jitter: float
    """Each poll interval is shortened by up to this fraction. Default 0.3; go-nsq: lookupd_poll_jitter."""
    lookupd_poll_timeout: float
    """How long one nsqlookupd request may take. Default 60.0 s; go-nsq: lookupd_poll_timeout."""
    hasher: Callable[[bytes], int] | None
    """HA: the sharding key's hash (None: murmur3 32-bit). Default None; go-nsq: Hasher."""
    logger: logging.Logger | logging.LoggerAdapter[Any] | None
    """This producer's logger (None: the module loggers fastnsq.producer...). Default None; fastnsq's own."""
    topics_for_compress: Sequence[str]
    """HA: topics whose large bodies are compressed. Default (); go-nsq: TopicsForCompress."""
    message_size_for_compress: int
    """HA: bodies from this size on are compressed. Default 20480 bytes; go-nsq: MessageSizeForCompress."""
    client_compress_decodec: str
    """HA: the body compression ('gzip', 'snappy', 'lz4'). Default 'not_specified'; go-nsq: ClientCompressDecodec."""
    pub_strategy: Literal['round_robin', 'dynamic_load', 0, 1]
    """HA: how partitions take turns (go-nsq's PubStrategy 0 / 1). Default 'round_robin'; go-nsq: PubStrategy."""
    pub_max_background_retry: int
    """HA: retries of publish_and_retry_background. Default 15; go-nsq: PubMaxBackgroundRetry."""
    pub_background_buffer: int
    """HA: publishes waiting for a background retry, at most. Default 1000 messages; go-nsq: PubBackgroundBuffer."""
    background_failure_handler: Callable[[Unsent], object] | None
    """Called with each background publish given up. Default None; fastnsq's own."""


class ProducerOptions(SyncProducerOptions, total=False):
    """The keyword options of ``Producer``."""

    lazy_connect: bool
    """start() returns even when no nsqd answers (False: it raises NoConnectionError). Default True; fastnsq's own."""
