"""What every part of the embedded nsqd shares: its options and the versions it emulates.

The parts of the embedded nsqd import downward only (see ``fastnsq.testing``): this
module is at the bottom, with nothing of the servers above it. Each part above says
in a ``Protocol`` of its own what it uses of the server, so that none of them needs
the ``NSQD`` class itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from fastnsq import codec
from fastnsq.errors import InvalidValueError

__all__ = ["EMULATED", "HA_VERSION", "MASTER", "RELEASED", "VERSION", "Emulated", "NSQDIdentity", "NSQDOptions"]

#: The nsqd version the embedded server answers with (IDENTIFY, /info, /stats):
#: both the released nsqd v1.3.0 and nsq master 3103474b report it.
VERSION = "1.3.0"
#: The HA (youzan) nsqd's version (IDENTIFY, /info).
HA_VERSION = "0.3.7-HA.1.13.0"

#: Which upstream nsqd the embedded one answers like (see RELEASED and MASTER).
Emulated = Literal["v1.3.0", "master"]
#: The released nsqd v1.3.0 (tag v1.3.0, f580340f): the default.
RELEASED: Emulated = "v1.3.0"
#: nsq master 3103474b (topology-aware delivery, PR #1301), which still reports 1.3.0
#: and adds ``topology_zone`` / ``topology_region`` to the IDENTIFY answer, ``/info``,
#: the client entries of ``/stats``, and what nsqd tells nsqlookupd (so lookupd's
#: ``/lookup`` and ``/nodes`` show them too).
MASTER: Emulated = "master"
EMULATED: tuple[Emulated, ...] = ("v1.3.0", "master")


@dataclass(frozen=True)
class NSQDOptions:
    """nsqd's flags that the embedded server honours; durations in seconds.

    Defaults are nsqd 1.3's (``nsqd/options.go``); :class:`NSQD` puts in the HA nsqd's
    own defaults for ``ha=True`` where they differ (72 h ``max_req_timeout``, 50 ms /
    1 s output buffer timeout). ``allow_ext_compatible``, ``allow_sub_ext_compatible``
    and ``sync_timeout`` are the HA nsqd's ``--allow-ext-compatible``,
    ``--allow-sub-ext-compatible`` and ``--sync-timeout``.
    """

    host: str = "127.0.0.1"
    tcp_port: int = 0
    http_port: int = 0
    broadcast_address: str = "127.0.0.1"
    lookupd_tcp_addresses: tuple[str, ...] = ()
    ha: bool = False
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_req_timeout: float = 3600.0
    max_rdy_count: int = codec.DEFAULT_MAX_RDY_COUNT
    max_msg_size: int = codec.DEFAULT_MAX_MSG_SIZE
    max_body_size: int = codec.DEFAULT_MAX_BODY_SIZE
    client_timeout: float = 60.0  # the default heartbeat interval is half of it
    max_heartbeat_interval: float = 60.0
    max_output_buffer_size: int = 65536
    output_buffer_timeout: float = 0.25
    min_output_buffer_timeout: float = 0.025
    max_output_buffer_timeout: float = 30.0
    max_deflate_level: int = 6
    snappy: bool = True
    deflate: bool = True
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_auth_policy: str | None = None
    tls_root_ca_file: str | None = None
    tls_required: bool = False
    auth_http_addresses: tuple[str, ...] = ()
    max_channel_consumers: int = 0
    queue_scan_interval: float = 0.1
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    topology_region: str = ""
    topology_zone: str = ""
    lookupd_ping_interval: float = 15.0
    allow_ext_compatible: bool = False
    allow_sub_ext_compatible: bool = False
    max_conn_for_client: int = 0  # HA: more client connections are refused (0: no limit)
    #: HA: youzan's --sync-timeout, the interval of its flush ticker (each tick flushes
    #: a quarter of the partitions): a partition's first channel also gets what was
    #: published since that partition's last flush.
    sync_timeout: float = 2.0
    #: HA: the messages each partition keeps for start positions (``SUB_ADVANCED`` with a
    #: timestamp, queue offset or count, ``/channel/setoffset``), as youzan keeps its disk
    #: queue for its retention days; older ones are forgotten (a start before them begins
    #: at the oldest kept).
    retained_messages: int = 100_000
    #: Which upstream nsqd the answers follow: the released v1.3.0 or nsq master.
    emulate: Emulated = RELEASED

    @property
    def topology(self) -> bool:
        """Whether the answers carry nsq master's topology fields."""
        return self.emulate == MASTER and not self.ha

    def __post_init__(self) -> None:
        for name in (
            "msg_timeout",
            "max_msg_timeout",
            "max_req_timeout",
            "client_timeout",
            "max_heartbeat_interval",
            "output_buffer_timeout",
            "min_output_buffer_timeout",
            "max_output_buffer_timeout",
            "queue_scan_interval",
            "http_client_connect_timeout",
            "http_client_request_timeout",
            "lookupd_ping_interval",
            "sync_timeout",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("max_rdy_count", "max_msg_size", "max_body_size", "max_output_buffer_size", "retained_messages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("tcp_port", "http_port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise InvalidValueError(f"{name} must be a port number in 0..65535, got {value!r}")
        if self.emulate not in EMULATED:
            raise InvalidValueError(f"emulate must be one of {list(EMULATED)}, got {self.emulate!r}")
        if not 1 <= self.max_deflate_level <= 9:
            raise InvalidValueError(f"max_deflate_level must be in 1..9, got {self.max_deflate_level!r}")
        if self.max_channel_consumers < 0:
            raise InvalidValueError(f"max_channel_consumers must be >= 0, got {self.max_channel_consumers!r}")
        if self.tls_client_auth_policy not in (None, "", "require", "require-verify"):
            raise InvalidValueError(
                "tls_client_auth_policy must be None, 'require' or 'require-verify', "
                f"got {self.tls_client_auth_policy!r}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidValueError("tls_cert and tls_key go together")
        if self.tls_required and self.tls_cert is None:
            raise InvalidValueError("tls_required needs tls_cert and tls_key")


class NSQDIdentity(Protocol):
    """Who an nsqd is: what its HTTP API and its lookupd registration tell about it."""

    @property
    def options(self) -> NSQDOptions: ...

    @property
    def version(self) -> str: ...

    @property
    def hostname(self) -> str: ...

    @property
    def tcp_port(self) -> int: ...

    @property
    def http_port(self) -> int: ...
