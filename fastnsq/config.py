"""Connection options: go-nsq's names and defaults, validated once into a frozen object.

Durations are seconds (floats), as everywhere in asyncio; the wire gets milliseconds.
A bad value raises :class:`~fastnsq.errors.InvalidValueError` naming the option,
the value and the accepted range. ``Consumer`` and ``Producer`` take these options
as keyword arguments and add their own (go-nsq's ``config.go`` lists its own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._protocol import DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_MSG_SIZE
from ._version import __version__
from .errors import InvalidValueError
from .optionspec import OPTIONS, check_options

__all__ = [
    "ConnectionOptions",
    "Endpoint",
    "LoggerLike",
    "address_list",
    "check_callable",
    "check_choice",
    "check_logger",
    "check_range",
    "connection_options",
    "parse_address",
    "secret_text",
    "split_options",
]

#: What the ``logger`` option of a Consumer or Producer takes.
LoggerLike = logging.Logger | logging.LoggerAdapter


def check_logger(value: Any, default: logging.Logger) -> LoggerLike:
    """The ``logger`` option: a logging.Logger or LoggerAdapter (None: ``default``, the module's)."""
    if value is None:
        return default
    if not isinstance(value, (logging.Logger, logging.LoggerAdapter)):
        raise InvalidValueError(f"logger must be a logging.Logger or logging.LoggerAdapter, got {value!r}")
    return value

_TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
CONNECTION_OPTIONS = tuple(option for option in OPTIONS if option.client == "connection")


def check_range(name: str, value: Any, low: float, high: float, *, integer: bool = False) -> Any:
    """Validate a numeric option; returns it unchanged.

    >>> check_range("sample_rate", 5, 0, 99, integer=True)
    5
    """
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool):
        kind = "an int" if integer else "a number"
        raise InvalidValueError(f"{name} must be {kind}, got {value!r}")
    if not low <= value <= high:
        raise InvalidValueError(f"{name}={value!r} is outside the accepted range {low}..{high}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value`` if it is one of ``choices``; otherwise an error naming the option and the choices."""
    if value not in choices:
        raise InvalidValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_callable(name: str, value: Any, what: str = "") -> Any:
    """``value`` if it is None or callable; otherwise an error naming the option (and what it is called with)."""
    if value is not None and not callable(value):
        raise InvalidValueError(f"{name} must be callable{what}, got {value!r}")
    return value


class Endpoint(NamedTuple):
    """What a client connects by: an nsqd TCP ``address`` and, on HA, the ``partition``.

    ``partition`` is ``None`` for upstream nsqd and for old (non-HA) nodes listed by
    an HA lookupd: talk to those with partition-less commands. (It lives here rather
    than in :mod:`fastnsq.lookupd` so a consumer of nsqd addresses never imports lookupd.)
    """

    address: str
    partition: int | None = None


def parse_address(address: str, default_port: int = 4150) -> tuple[str, int]:
    """Split ``"host:port"`` (``"[::1]:4150"`` for IPv6) into host and port.

    >>> parse_address("127.0.0.1:4150"), parse_address("[::1]:4151")
    (('127.0.0.1', 4150), ('::1', 4151))
    """
    if not isinstance(address, str) or not address.strip():
        raise InvalidValueError(f"an nsqd address is 'host:port', got {address!r}")
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, ""
    else:
        host, port_text = text, ""
    if not host:
        raise InvalidValueError(f"address {address!r} has no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidValueError(f"address {address!r} has an invalid port {port_text!r}")
    return host, int(port_text)


def address_list(addresses: str | Sequence[Any] | None) -> list[Any]:
    """Addresses given as one comma-separated string, a sequence, or None (none)."""
    if addresses is None:
        return []
    if isinstance(addresses, str):
        return [a for a in (part.strip() for part in addresses.split(",")) if a]
    return list(addresses)


def secret_text(secret: str | bytes | None) -> str | None:
    """An AUTH secret as text, for the HTTP ``Authorization`` header nsqlookupd gets."""
    if isinstance(secret, bytes):
        return secret.decode("utf-8", "replace")
    return secret


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class ConnectionOptions:
    """Everything one nsqd connection negotiates: IDENTIFY, TLS, compression, AUTH.

    >>> ConnectionOptions(heartbeat_interval=5, snappy=True).identify_body()["heartbeat_interval"]
    5000
    """

    client_id: str = field(default_factory=_short_hostname)
    hostname: str = field(default_factory=socket.gethostname)
    user_agent: str = f"fastnsq/{__version__}"
    dial_timeout: float = 1.0
    # A connection silent this long is dead (None: two heartbeat intervals, 10 s by default;
    # go-nsq's ReadTimeout is 60 s); with heartbeats off, None never times out.
    read_timeout: float | None = None
    # Writes buffered for nsqd that make no progress this long mean it stopped reading: the
    # connection is closed (go-nsq's WriteTimeout, 1 s; None waits for ever).
    write_timeout: float | None = 1.0
    local_addr: str | None = None  # the local "host" or "host:port" to connect from (go-nsq's LocalAddr)
    # None (or -1) disables heartbeats; consumers need them. 5 s (go-nsq: 30 s): a hung or
    # black-holed nsqd is noticed within 10 s, for one small frame each way per 5 s (issue 57).
    heartbeat_interval: float | None = 5.0
    output_buffer_size: int = 16384  # -1 disables nsqd's output buffering
    output_buffer_timeout: float = 0.25  # -1 disables
    msg_timeout: float | None = None  # None: nsqd's default (60 s)
    sample_rate: int = 0
    tls_v1: bool = False
    tls_context: ssl.SSLContext | None = None
    tls_root_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_hostname: str | None = None
    tls_insecure_skip_verify: bool = False
    tls_min_version: str = "1.2"
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | bytes | None = field(default=None, repr=False)
    topology_region: str = ""
    topology_zone: str = ""
    max_msg_size: int = DEFAULT_MAX_MSG_SIZE
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    desired_tag: str | None = None  # HA: tag-based dispatch
    ext_filter: Mapping[str, Any] | None = None  # HA: server-side filter on ext headers

    def __post_init__(self) -> None:
        # Each field's type and range, from the option table (fastnsq.optionspec).
        for option in CONNECTION_OPTIONS:
            option.check(getattr(self, option.name))
        if self.heartbeat_interval == -1:
            object.__setattr__(self, "heartbeat_interval", None)
        heartbeat = self.heartbeat_interval
        if self.read_timeout is not None and heartbeat is not None and self.read_timeout <= heartbeat:
            raise InvalidValueError(f"read_timeout={self.read_timeout!r} must be above heartbeat_interval={heartbeat!r}"
                                    " (nsqd is silent between heartbeats)")
        if self.local_addr is not None:
            parse_address(self.local_addr, default_port=0)
        if self.snappy and self.deflate:
            raise InvalidValueError("snappy and deflate cannot both be enabled (nsqd refuses it)")
        if self.tls_context is not None and not isinstance(self.tls_context, ssl.SSLContext):
            raise InvalidValueError("tls_context must be an ssl.SSLContext")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidValueError("tls_cert and tls_key go together")
        if self.auth_secret is not None and not isinstance(self.auth_secret, (str, bytes)):
            raise InvalidValueError("auth_secret must be str or bytes")
        if self.auth_secret is not None and not self.auth_secret:
            raise InvalidValueError("auth_secret is empty")
        if self.desired_tag is not None and (not isinstance(self.desired_tag, str) or len(self.desired_tag) > 100):
            raise InvalidValueError("desired_tag must be a string of at most 100 characters")
        if self.ext_filter is not None:
            try:
                json.dumps(dict(self.ext_filter))
            except (TypeError, ValueError) as exc:
                raise InvalidValueError(f"ext_filter must be a JSON object: {exc}") from None

    @property
    def dead_after(self) -> float | None:
        """Seconds of silence after which a connection is taken for dead (None: never)."""
        if self.read_timeout is not None:
            return self.read_timeout
        return None if self.heartbeat_interval is None else 2 * self.heartbeat_interval

    @property
    def tls_enabled(self) -> bool:
        return self.tls_v1 or self.tls_context is not None

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context: verification on unless explicitly turned off, TLS 1.2 minimum."""
        if self.tls_context is not None:
            return self.tls_context
        context = ssl.create_default_context(cafile=self.tls_root_ca_file)
        context.minimum_version = _TLS_VERSIONS[self.tls_min_version]
        if self.tls_cert is not None:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        if self.tls_insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def identify_body(self, *, extend_support: bool = False) -> dict[str, Any]:
        """The IDENTIFY JSON for one connection (extend_support is per connection, HA)."""
        body: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": -1 if self.heartbeat_interval is None else round(self.heartbeat_interval * 1000),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": -1
            if self.output_buffer_timeout == -1
            else round(self.output_buffer_timeout * 1000),
            "tls_v1": self.tls_enabled,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
        }
        if self.msg_timeout is not None:
            body["msg_timeout"] = round(self.msg_timeout * 1000)
        if self.topology_region:
            body["topology_region"] = self.topology_region
        if self.topology_zone:
            body["topology_zone"] = self.topology_zone
        if extend_support:
            body["extend_support"] = True
        if self.desired_tag:
            body["desired_tag"] = self.desired_tag
        if self.ext_filter is not None:
            body["ext_filter"] = dict(self.ext_filter)
        return body

    def replace(self, **changes: Any) -> ConnectionOptions:
        return dataclasses.replace(self, **changes)


def split_options(client_name: str, options: Mapping[str, Any]) -> tuple[ConnectionOptions, dict[str, Any]]:
    """The checked options of ``client_name`` ("Consumer" or "Producer"): its connections' and its own
    (every one, defaulted). An unknown name is refused with the name to use (:mod:`fastnsq.optionspec`).

    >>> conn, rest = split_options("Consumer", {"snappy": True, "max_in_flight": 10})
    >>> conn.snappy, rest["max_in_flight"], rest["max_attempts"]
    (True, 10, 5)
    """
    connection, own = check_options(client_name, options)
    return ConnectionOptions(**connection), own


def connection_options(options: Mapping[str, Any]) -> ConnectionOptions:
    """The connection options among ``options`` (a client's), the others left aside."""
    return ConnectionOptions(**{name: value for name, value in options.items() if name in _CONNECTION_NAMES})


_CONNECTION_NAMES = frozenset(option.name for option in CONNECTION_OPTIONS)
