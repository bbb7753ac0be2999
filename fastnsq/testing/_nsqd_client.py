"""One client connection of the embedded nsqd: protocol V2 as nsqd 1.3 speaks it.

Every command, check and error text follows nsqio/nsq ``nsqd/protocol_v2.go`` and
``nsqd/client_v2.go`` (and the recordings in tests/captures): the magic, IDENTIFY
with its validation and its exact JSON answer, the TLS / snappy / deflate upgrades,
AUTH against an auth HTTP server, SUB/RDY/FIN/REQ/TOUCH/CLS/NOP, PUB/MPUB/DPUB,
heartbeats and the read deadline (2 x heartbeat interval), and output buffering
(message frames wait in a buffer of ``output_buffer_size`` bytes, flushed when it is
full, when the client stops being ready, or on the ``output_buffer_timeout`` tick;
any other frame is flushed at once).

Two liberties that nothing on the wire can tell apart: responses to the commands
found in one read are written with one ``transport.write`` at the end of that read
(nsqd flushes after each), and the message pump runs inline (a message goes out as
soon as a client is ready, instead of from a separate goroutine), so the interleaving
of message frames with responses may differ from nsqd's, which is racy anyway.

The connection is an ``asyncio.BufferedProtocol``: the C ``CommandReader`` owns the
read buffer and calls :meth:`ClientConnection._on_command` per command.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from fastnsq import codec
from fastnsq._protocol import UPSTREAM_MAX_LINE
from fastnsq.compression import DeflateStream, SnappyStream
from fastnsq.errors import ProtocolError

from ._nsqd_parse import as_int64, base10, go_quote, parse_identify, text
from ._nsqd_queue import new_message

if TYPE_CHECKING:  # pragma: no cover
    import ssl

    from ._nsqd_auth import AuthState
    from ._nsqd_base import NSQDOptions
    from ._nsqd_faults import Faults
    from ._nsqd_queue import Channel, Topic

__all__ = [
    "STATE_CLOSING",
    "STATE_INIT",
    "STATE_SUBSCRIBED",
    "ClientConnection",
    "ConnectionServer",
    "go_quote",
]


class ConnectionServer(Protocol):
    """What a client connection uses of its nsqd."""

    @property
    def options(self) -> NSQDOptions: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def faults(self) -> Faults: ...

    @property
    def tls_context(self) -> ssl.SSLContext | None: ...

    @property
    def auth_enabled(self) -> bool: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    def next_client_id(self) -> int: ...

    def add_client(self, client: ClientConnection) -> None: ...

    def remove_client(self, client: ClientConnection) -> None: ...

    def identify_answer(self, **values: Any) -> bytes: ...

    async def query_auth(self, remote_ip: str, tls: bool, common_name: str, secret: str) -> AuthState | None: ...

    def next_id(self) -> bytes: ...

    def take_ids(self, count: int) -> int: ...

    def get_topic(self, name: str) -> Topic: ...

    def topic_preparation(self, name: str) -> Callable[[], Awaitable[None]] | None: ...

log = logging.getLogger("fastnsq.testing.nsqd")

STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

_encode_response = codec.encode_response
_encode_error = codec.encode_error
_valid_topic = codec.valid_topic_name
_valid_channel = codec.valid_channel_name
_HEARTBEAT_FRAME = codec.encode_response(codec.HEARTBEAT)
_OK_FRAME = codec.encode_response(codec.OK)
_OK = codec.OK
_DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024  # nsqd's defaultBufferSize
_RAW_READ_SIZE = 64 * 1024
# The read deadline passes this long after 2 x heartbeat interval, so that a
# heartbeat due at the same moment still goes out first, as it does from nsqd.
_DEADLINE_GRACE = 0.01
_NOTHING: Any = object()


class _ClientError(Exception):
    """An error frame for the client; ``fatal`` ones close the connection after it."""

    def __init__(self, code: str, description: str, fatal: bool = True) -> None:
        super().__init__(code, description)
        self.text = f"{code} {description}"
        self.fatal = fatal


class _Suspend(Exception):
    """A command must wait for I/O (auth server, lookupd) and is then run again."""

    def __init__(self, prepare: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self.prepare = prepare


def _fatal(code: str, description: str) -> _ClientError:
    return _ClientError(code, description, True)


class ClientConnection(asyncio.BufferedProtocol):
    """The server side of one TCP connection (a producer, a consumer, or both).

    Extension points for other dialects and for fault injection: :attr:`COMMANDS`
    maps a command name to its handler ``(connection, params, body)`` (a subclass
    can add or replace commands), and ``NSQD.connection_class`` picks the class.
    Handlers raise ``_ClientError`` to answer with an error frame.
    """

    #: Command name -> handler; filled in below the class.
    COMMANDS: ClassVar[dict[bytes, Callable[[Any, list[bytes], Any], None]]] = {}
    #: The read deadline is this many heartbeat intervals after the last read (HA: 3).
    READ_DEADLINE_FACTOR: ClassVar[int] = 2
    #: FIN/REQ/TOUCH ids are read as 16 raw bytes (the HA dialect's binary ids).
    BINARY_IDS: ClassVar[bool] = False
    #: The longest command line: nsqd's read buffer (upstream 16 KiB, HA 4 KiB).
    MAX_LINE: ClassVar[int] = UPSTREAM_MAX_LINE
    #: AUTH error texts (the HA nsqd capitalises them differently).
    AUTH_TEXTS: ClassVar[dict[str, str]] = {
        "already": "AUTH already set",
        "disabled": "AUTH disabled",
        "none": "AUTH no authorizations found",
    }

    def __init__(self, server: ConnectionServer) -> None:
        self.server = server
        options = server.options
        self.options = options
        self.loop = server.loop
        self.id = server.next_client_id()
        self.transport: asyncio.Transport | None = None
        self.remote_address = ""
        self.remote_ip = ""
        self.connect_ts = int(time.time())
        self.state = STATE_INIT
        self.alive = True
        self.channel: Channel | None = None
        # RDY accounting (read by Channel on the hot path).
        self.rdy = 0
        self.in_flight = 0
        self.in_ready = False
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        # What IDENTIFY configures (defaults as in newClientV2).
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.topology_zone = ""  # nsq master: the client's own, from IDENTIFY
        self.topology_region = ""
        self.heartbeat_interval = options.client_timeout / 2
        self.msg_timeout = options.msg_timeout
        self.output_buffer_size = _DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout = options.output_buffer_timeout
        self.sample_rate = 0
        # The message pump's copies, fixed by the first IDENTIFY (nsqd sets
        # identifyEventChan to nil after it).
        self.delivery_timeout = options.msg_timeout
        self._pump_heartbeat = options.client_timeout / 2
        self._pump_identified = False
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.auth_state: AuthState | None = None
        self._auth_secret = ""
        self._auth_answer: Any = _NOTHING
        self._refresh_answer: Any = _NOTHING
        # Output: frames waiting for one transport.write.
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_timer: asyncio.TimerHandle | None = None
        self._tick_origin = 0.0
        self._compressor: SnappyStream | DeflateStream | None = None
        self._decompressor: SnappyStream | DeflateStream | None = None
        self._raw_buffer: bytearray | None = None
        self._held: list[bytes] | None = None  # writes held during a TLS handshake
        # Input.
        self._reader = codec.CommandReader(
            self._on_command,
            on_magic=self._on_magic,
            binary_ids=self.BINARY_IDS,
            max_line=self.MAX_LINE,
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
        )
        self._in_read = False
        self._pending_flush = False
        self._pending_refill = False
        self._switch_compression: tuple[str, int] | None = None
        self._last_read = 0.0
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # Fault injection (see _nsqd_faults): frames still to write before a cut,
        # output held by a write stall, reads paused by a read stall.
        self.frames_left: int | None = None
        self.stalled_output: list[bytes] | None = None
        self.read_stalled = False

    def __repr__(self) -> str:
        return f"<ClientConnection {self.id} {self.remote_address}>"

    # -- asyncio.BufferedProtocol ---------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote_ip = str(peer[0])
            self.remote_address = (
                f"{peer[0]}:{peer[1]}" if ":" not in str(peer[0]) else f"[{peer[0]}]:{peer[1]}"
            )
        self.client_id = self.hostname = self.remote_ip
        self.server.add_client(self)
        self.server.faults.connection_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._decompressor is None:
            return self._reader.get_buffer(sizehint)
        if self._raw_buffer is None:
            self._raw_buffer = bytearray(_RAW_READ_SIZE)
        return memoryview(self._raw_buffer)

    def buffer_updated(self, nbytes: int) -> None:
        if self._closing:
            return
        if self._decompressor is None:
            self._run_reader(self._reader.buffer_updated, nbytes)
        else:
            self._feed_compressed(bytes(self._raw_buffer[:nbytes]))  # type: ignore[index]

    def eof_received(self) -> bool:
        return False  # close our side too, as nsqd does on EOF

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self._closing = True
        self.rdy = 0
        for timer in (self._heartbeat_timer, self._deadline_timer, self._flush_timer):
            if timer is not None:
                timer.cancel()
        self._heartbeat_timer = self._deadline_timer = self._flush_timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.channel is not None:
            self.channel.remove_client(self)
        self.server.remove_client(self)
        self._out.clear()

    # -- reading --------------------------------------------------------------

    def _run_reader(self, step: Callable[..., None], *args: Any) -> None:
        """Run the command splitter; write what the commands produced at the end."""
        self._in_read = True
        try:
            step(*args)
        except ProtocolError as exc:
            # A command line longer than nsqd's 16 KiB read buffer: nsqd drops the
            # connection without an error frame ("failed to read command").
            log.debug("client %s: %s", self, exc)
            self.close()
        finally:
            self._in_read = False
        self._last_read = self.loop.time()
        if self._pending_refill:
            self._pending_refill = False
            if self.channel is not None and not self._closing:
                self.channel.client_may_be_ready(self)
        if self._switch_compression is not None and not self._closing:
            self._start_decompressing()
        if self._pending_flush:
            self._pending_flush = False
            self._flush()

    def _feed_compressed(self, data: bytes) -> None:
        try:
            plain = self._decompressor.decompress(data)  # type: ignore[union-attr]
        except ProtocolError as exc:
            log.debug("client %s: %s", self, exc)
            self.close()
            return
        if plain:
            self._run_reader(self._reader.feed, plain)
        else:
            self._last_read = self.loop.time()

    def _start_decompressing(self) -> None:
        """After IDENTIFY negotiated compression: the rest of the input is compressed."""
        kind, level = self._switch_compression  # type: ignore[misc]
        self._switch_compression = None
        self._decompressor = SnappyStream() if kind == "snappy" else DeflateStream(level)
        rest = self._reader.take_unparsed()
        self._reader.resume()
        if rest:
            self._feed_compressed(rest)

    def _on_magic(self, magic: bytes) -> None:
        if magic != codec.MAGIC_V2:
            # tcp.go: an unknown protocol gets E_BAD_PROTOCOL, then the close.
            self._reader.pause()
            self._write_now(_encode_error(b"E_BAD_PROTOCOL"))
            self.close()
            return
        now = self.loop.time()
        self._last_read = now
        self._tick_origin = now
        self._start_heartbeats(now)
        self._arm_deadline()

    def _on_command(self, name: bytes, params: list[bytes], body: bytes | int | None) -> None:
        if self._closing:
            return
        handler = self.COMMANDS.get(name)
        try:
            if self.server.faults.rules:
                injected = self.server.faults.injected_error(self, name)
                if injected is not None:
                    raise _ClientError(*injected)
            if handler is None:
                raise self._unknown_command(name, params)
            if name != b"IDENTIFY" and self.options.tls_required and not self.tls:
                raise _fatal("E_INVALID", f"cannot {text(name)} in current state (TLS required)")
            handler(self, params, body)
        except _ClientError as err:
            self._send_error(err.text)
            if err.fatal:
                self._reader.pause()
                self.close()
        except _Suspend as wait:
            self._reader.pause()
            self._task = self.loop.create_task(self._resume_after(wait.prepare, name, params, body))

    def _unknown_command(self, name: bytes, params: list[bytes]) -> _ClientError:
        return _fatal("E_INVALID", f"invalid command {text(name)}")

    async def _resume_after(
        self, prepare: Callable[[], Awaitable[None]], name: bytes, params: list[bytes], body: Any
    ) -> None:
        """Wait for what a command needed, run the command again, then read on."""
        try:
            await prepare()
        except Exception:
            # Running the command again would only suspend it again: give up on
            # this connection (an nsqd would have failed it in some other way).
            log.exception("client %s: preparing %s failed", self, text(name))
            self.close()
            return
        if self._closing:
            return
        self._run_reader(self._redo, name, params, body)

    def _redo(self, name: bytes, params: list[bytes], body: Any) -> None:
        self._on_command(name, params, body)
        if not self._closing and self._reader.paused and self._task is asyncio.current_task():
            self._reader.resume()

    def _resume_reading(self) -> None:
        self._run_reader(self._reader.resume)

    # -- writing --------------------------------------------------------------

    def write_message(self, frame: bytes) -> None:
        """Buffer a message frame (nsqd's bufio.Writer of output_buffer_size bytes)."""
        self._out.append(frame)
        self._out_size += len(frame)
        if self._out_size >= self.output_buffer_size:
            self._flush()
        elif self._flush_timer is None and self.output_buffer_timeout > 0:
            self._arm_flush_tick()

    def _arm_flush_tick(self) -> None:
        # nsqd's flusher is a ticker: flush at its next tick.
        period = self.output_buffer_timeout
        now = self.loop.time()
        due = now + period - ((now - self._tick_origin) % period)
        self._flush_timer = self.loop.call_at(due, self._on_flush_tick)

    def write_messages(self, frames: list[bytes]) -> None:
        """Buffer several message frames at once (one delivery batch)."""
        self._out.extend(frames)
        self._out_size += sum(map(len, frames))
        if self._out_size >= self.output_buffer_size:
            self._flush()
        elif self._flush_timer is None and self.output_buffer_timeout > 0:
            self._arm_flush_tick()

    def refill(self) -> None:
        """A FIN or REQ freed room: let the channel hand this client more.

        Within a read pass this waits for the pass's end, so that a pass of many
        FINs refills in one batch (nsqd's message pump runs beside the reader; both
        orders are what a real nsqd may do).
        """
        if self._in_read:
            self._pending_refill = True
        elif self.channel is not None:
            self.channel.client_may_be_ready(self)

    def flush_messages(self) -> None:
        """The client is no longer ready: nsqd's message pump flushes."""
        if self._out:
            if self._in_read:
                self._pending_flush = True
            else:
                self._flush()

    def _send_response(self, data: bytes) -> None:
        self._out.append(_encode_response(data))
        self._request_flush()

    def _send_error(self, text: str) -> None:
        self._out.append(_encode_error(text.encode("latin-1")))
        self._request_flush()

    def _request_flush(self) -> None:
        if self._in_read:
            self._pending_flush = True
        else:
            self._flush()

    def _on_flush_tick(self) -> None:
        self._flush_timer = None
        if self._out:
            self._flush()

    def _flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_size = 0
        self._write_now(data)

    def _write_now(self, data: bytes) -> None:
        """Write plain protocol bytes (compressed when negotiated)."""
        if self._held is not None:
            self._held.append(data)
            return
        cut = False
        if self.frames_left is not None:
            data, cut = self.server.faults.count_frames(self, data)
        if self._compressor is not None:
            data = self._compressor.compress(data)
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self.stalled_output is not None:
                self.stalled_output.append(data)
            else:
                transport.write(data)
        if cut:
            self.cut()

    def cut(self) -> None:
        """Drop the connection at once: no error frame, unsent output lost (a fault)."""
        self._closing = True
        self._reader.pause()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after what was written (nsqd's conn.Close after the error frame)."""
        if self._closing and self.transport is not None and self.transport.is_closing():
            return
        self._closing = True
        self._flush()
        if self.transport is not None:
            self.transport.close()

    # -- timers ---------------------------------------------------------------

    def _start_heartbeats(self, origin: float) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        interval = self._pump_heartbeat
        if interval > 0:
            self._heartbeat_timer = self.loop.call_at(
                origin + interval, self._on_heartbeat, origin + interval
            )

    def _on_heartbeat(self, when: float) -> None:
        if self._closing:
            return
        interval = self._pump_heartbeat
        self._heartbeat_timer = self.loop.call_at(when + interval, self._on_heartbeat, when + interval)
        self._out.append(_HEARTBEAT_FRAME)
        self._flush()

    def _arm_deadline(self) -> None:
        """(Re)start the read deadline: READ_DEADLINE_FACTOR x heartbeat interval after the last read."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self.heartbeat_interval > 0:
            self._deadline_timer = self.loop.call_at(
                self._last_read + self.READ_DEADLINE_FACTOR * self.heartbeat_interval + _DEADLINE_GRACE,
                self._on_deadline,
            )

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        if self._closing or self.heartbeat_interval <= 0:
            return
        due = self._last_read + self.READ_DEADLINE_FACTOR * self.heartbeat_interval + _DEADLINE_GRACE
        if self.read_stalled or self.stalled_output is not None:
            # A stalled server is a hung one: it does not time its clients out either.
            self._last_read = self.loop.time()
            due = self._last_read + self.READ_DEADLINE_FACTOR * self.heartbeat_interval + _DEADLINE_GRACE
        if self.loop.time() >= due:
            log.debug("client %s: read deadline passed, closing", self)
            self.close()
        else:
            self._deadline_timer = self.loop.call_at(due, self._on_deadline)

    # -- commands -------------------------------------------------------------

    def _cmd_nop(self, params: list[bytes], body: Any) -> None:
        pass

    def _cmd_identify(self, params: list[bytes], body: bytes | int | None) -> None:
        if self.state != STATE_INIT:
            raise _fatal("E_INVALID", "cannot IDENTIFY in current state")
        if type(body) is int:
            if body > self.options.max_body_size:
                raise _fatal("E_BAD_BODY", f"IDENTIFY body too big {body} > {self.options.max_body_size}")
            raise _fatal("E_BAD_BODY", f"IDENTIFY invalid body size {body}")
        try:
            data = self._decode_identify(body)  # type: ignore[arg-type]
        except ValueError:
            raise _fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        self._take_identity(data)
        error = self._apply_identify(data)
        if error:
            raise _fatal("E_BAD_BODY", "IDENTIFY " + error)
        if not self._pump_identified:
            self._pump_identified = True
            self._pump_heartbeat = self.heartbeat_interval
            self.delivery_timeout = self.msg_timeout
            now = self.loop.time()
            self._tick_origin = now
            self._start_heartbeats(now)
        if not data["feature_negotiation"]:
            self._send_response(_OK)
            self._arm_deadline_after_read()
            return
        self._negotiate(data)

    def _decode_identify(self, body: bytes) -> dict[str, Any]:
        """The IDENTIFY body as nsqd's struct sees it (ValueError when it cannot be decoded)."""
        return parse_identify(body)

    def _take_identity(self, data: dict[str, Any]) -> None:
        self.client_id = data["client_id"]
        self.hostname = data["hostname"]
        self.user_agent = data["user_agent"]
        self.topology_zone = data.get("topology_zone", "")
        self.topology_region = data.get("topology_region", "")

    def _apply_identify(self, data: dict[str, Any]) -> str | None:
        """client_v2.go's Identify: each setting validated in nsqd's order."""
        options = self.options
        error = self._apply_heartbeat_interval(data["heartbeat_interval"])
        if error:
            return error
        timeout = data["output_buffer_timeout"]
        if timeout == -1:
            self.output_buffer_timeout = 0.0
        elif timeout != 0:
            low = round(options.min_output_buffer_timeout * 1000)
            if not low <= timeout <= int(options.max_output_buffer_timeout * 1000):
                return f"output buffer timeout ({timeout}) is invalid"
            self.output_buffer_timeout = timeout / 1000.0
        size = data["output_buffer_size"]
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0.0
        elif size != 0:
            if not 64 <= size <= options.max_output_buffer_size:
                return f"output buffer size ({size}) is invalid"
            self.output_buffer_size = size
        return self._apply_sample_rate_and_msg_timeout(data)

    def _apply_heartbeat_interval(self, interval: int) -> str | None:
        """IDENTIFY's heartbeat_interval (ms; -1 disables), as both dialects check it."""
        if interval == -1:
            self.heartbeat_interval = 0.0
        elif interval != 0:
            if not 1000 <= interval <= int(self.options.max_heartbeat_interval * 1000):
                return f"heartbeat interval ({interval}) is invalid"
            self.heartbeat_interval = interval / 1000.0
        return None

    def _apply_sample_rate_and_msg_timeout(self, data: dict[str, Any]) -> str | None:
        """IDENTIFY's sample_rate and msg_timeout, as both dialects check them."""
        rate = data["sample_rate"]
        if not 0 <= rate <= 99:
            return f"sample rate ({rate}) is invalid"
        self.sample_rate = rate
        msg_timeout = data["msg_timeout"]
        if msg_timeout != 0:
            if not 1000 <= msg_timeout <= int(self.options.max_msg_timeout * 1000):
                return f"msg timeout ({msg_timeout}) is invalid"
            self.msg_timeout = msg_timeout / 1000.0
        return None

    def _arm_deadline_after_read(self) -> None:
        # nsqd sets the next read deadline after the command with the new interval.
        self._last_read = self.loop.time()
        self._arm_deadline()

    def _negotiate(self, data: dict[str, Any]) -> None:
        answer, tls, compression = self._negotiation(data)
        self._flush()
        self._write_now(_encode_response(answer))
        self._arm_deadline_after_read()
        self._upgrade(tls, compression)

    def _negotiation(self, data: dict[str, Any]) -> tuple[bytes, bool, tuple[str, int] | None]:
        """IDENTIFY with feature negotiation: (JSON answer, TLS, (compression, level) or None)."""
        server = self.server
        options = self.options
        tls = server.tls_context is not None and data["tls_v1"]
        deflate = options.deflate and data["deflate"]
        level = 6
        if deflate and data["deflate_level"] > 0:
            level = data["deflate_level"]
        level = min(level, options.max_deflate_level)
        snappy = options.snappy and data["snappy"]
        if deflate and snappy:
            raise _fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        answer = server.identify_answer(
            msg_timeout=round(self.msg_timeout * 1000),
            tls_v1=tls,
            deflate=deflate,
            deflate_level=level,
            snappy=snappy,
            sample_rate=self.sample_rate,
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=round(self.output_buffer_timeout * 1000),
        )
        compression = ("snappy", 0) if snappy else ("deflate", level) if deflate else None
        return answer, tls, compression

    def _upgrade(self, tls: bool, compression: tuple[str, int] | None) -> None:
        """After the IDENTIFY answer: TLS, then compression, each confirmed with an OK."""
        if tls:
            # The client starts the handshake once it has the JSON: hold every byte
            # it sends until the TLS layer owns the socket.
            self.transport.pause_reading()  # type: ignore[union-attr]
            self._reader.pause()
            self._held = []
            self._task = self.loop.create_task(self._upgrade_tls(compression))
        elif compression is not None:
            self._start_compressing(compression)
            self._reader.pause()
            self._switch_compression = compression

    def _start_compressing(self, compression: tuple[str, int]) -> None:
        kind, level = compression
        if kind == "snappy":
            self._compressor = SnappyStream()
            self.snappy = True
        else:
            self._compressor = DeflateStream(level)
            self.deflate = True
        self._write_now(_OK_FRAME)

    async def _upgrade_tls(self, compression: tuple[str, int] | None) -> None:
        transport = self.transport
        try:
            tls_transport = await self.loop.start_tls(
                transport,  # type: ignore[arg-type]
                self,
                self.server.tls_context,  # type: ignore[arg-type]
                server_side=True,
                ssl_handshake_timeout=5.0,
            )
        except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
            log.debug("client %s: TLS handshake failed: %s", self, exc)
            held, self._held = self._held, None
            self._write_now(
                _encode_error(f"E_IDENTIFY_FAILED IDENTIFY failed {exc}".encode("latin-1", "replace"))
            )
            self.close()
            return
        if tls_transport is None or self._closing:
            return
        self.transport = tls_transport
        self.tls = True
        held, self._held = self._held or [], None
        self._write_now(_OK_FRAME)
        if compression is not None:
            self._start_compressing(compression)
        for data in held:
            self._write_now(data)
        self._reader.take_unparsed()  # nsqd reads through a new reader after the upgrade
        if compression is not None:
            kind, level = compression
            self._decompressor = SnappyStream() if kind == "snappy" else DeflateStream(level)
        self._resume_reading()

    def _cmd_auth(self, params: list[bytes], body: bytes | int | None) -> None:
        if self.state != STATE_INIT:
            raise _fatal("E_INVALID", "cannot AUTH in current state")
        if len(params) != 0:
            raise _fatal("E_INVALID", "AUTH invalid number of parameters")
        if type(body) is int:
            if body > self.options.max_body_size:
                raise _fatal("E_BAD_BODY", f"AUTH body too big {body} > {self.options.max_body_size}")
            raise _fatal("E_BAD_BODY", f"AUTH invalid body size {body}")
        if self.auth_state is not None and self.auth_state.authorizations:
            raise _fatal("E_INVALID", self.AUTH_TEXTS["already"])
        if not self.server.auth_enabled:
            raise _fatal("E_AUTH_DISABLED", self.AUTH_TEXTS["disabled"])
        answer = self._auth_answer
        if answer is _NOTHING:
            self._auth_secret = body.decode("latin-1")  # type: ignore[union-attr]
            raise _Suspend(functools.partial(self._ask_auth_server, "_auth_answer"))
        self._auth_answer = _NOTHING
        if answer is None:
            # nsqd does not leak why the auth server failed to an untrusted client.
            raise _fatal("E_AUTH_FAILED", "AUTH failed")
        self.auth_state = answer
        if not answer.authorizations:
            raise _fatal("E_UNAUTHORIZED", self.AUTH_TEXTS["none"])
        reply = {
            "identity": answer.identity,
            "identity_url": answer.identity_url,
            "permission_count": len(answer.authorizations),
        }
        self._send_response(json.dumps(reply, separators=(",", ":")).encode())

    async def _ask_auth_server(self, slot: str) -> None:
        """Ask the auth servers for this client's permissions (nsqd's QueryAnyAuthd)."""
        common_name = ""
        if self.tls and self.transport is not None:
            cert = self.transport.get_extra_info("peercert")
            for rdn in (cert or {}).get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        common_name = value
        try:
            state = await self.server.query_auth(self.remote_ip, self.tls, common_name, self._auth_secret)
        except Exception:  # the server going away, say: a failed AUTH
            log.exception("client %s: querying the auth server failed", self)
            state = None
        setattr(self, slot, state)

    def _check_auth(self, command: str, topic: str, channel: str) -> None:
        """nsqd's CheckAuth: AUTH first, a fresh answer once expired, then the permission."""
        if not self.server.auth_enabled:
            return
        state = self.auth_state
        if state is None or not state.authorizations:
            raise _fatal("E_AUTH_FIRST", f"AUTH required before {command}")
        if state.expired():
            answer = self._refresh_answer
            if answer is _NOTHING:
                raise _Suspend(functools.partial(self._ask_auth_server, "_refresh_answer"))
            self._refresh_answer = _NOTHING
            if answer is None:
                raise _fatal("E_AUTH_FAILED", "AUTH failed")
            self.auth_state = state = answer
        if not state.allows(topic, channel):
            quoted_topic = go_quote(topic.encode("latin-1"))
            quoted_channel = go_quote(channel.encode("latin-1"))
            raise _fatal("E_UNAUTHORIZED", f"AUTH failed for {command} on {quoted_topic} {quoted_channel}")

    def _get_topic(self, name: str) -> Any:
        topic = self.server.topics.get(name)
        if topic is None:
            prepare = self.server.topic_preparation(name)
            if prepare is not None:
                raise _Suspend(prepare)
            topic = self.server.get_topic(name)
        return topic

    def _cmd_sub(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_INIT:
            raise _fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise _fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 2:
            raise _fatal("E_INVALID", "SUB insufficient number of parameters")
        raw_topic, raw_channel = params[0], params[1]
        topic_name = text(raw_topic)
        if not _valid_topic(topic_name):
            raise _fatal("E_BAD_TOPIC", f"SUB topic name {go_quote(raw_topic)} is not valid")
        channel_name = text(raw_channel)
        if not _valid_channel(channel_name):
            raise _fatal("E_BAD_CHANNEL", f"SUB channel name {go_quote(raw_channel)} is not valid")
        self._check_auth("SUB", topic_name, channel_name)
        topic = self._get_topic(topic_name)
        channel = topic.get_channel(channel_name)
        if not channel.add_client(self):
            # nsqd 1.3 (v1.3.0 and master) wraps channel.AddClient's error: E_SUB_FAILED, fatal.
            raise _fatal(
                "E_SUB_FAILED",
                f"SUB failed consumers for {topic_name}:{channel_name} exceeds limit of "
                f"{self.options.max_channel_consumers}",
            )
        self.state = STATE_SUBSCRIBED
        self.channel = channel
        self._send_response(_OK)

    def _cmd_rdy(self, params: list[bytes], body: Any) -> None:
        state = self.state
        if state == STATE_CLOSING:
            return  # nsqd ignores RDY after CLS
        if state != STATE_SUBSCRIBED:
            raise _fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if params:
            parsed = base10(params[0])
            if parsed is None:
                raise _fatal("E_INVALID", f"RDY could not parse count {text(params[0])}")
            count = as_int64(parsed)
        max_rdy = self.options.max_rdy_count
        if count < 0 or count > max_rdy:
            raise _fatal("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.rdy = count
        self.channel.client_may_be_ready(self)  # type: ignore[union-attr]
        if count <= self.in_flight:
            self.flush_messages()

    def _message_id(self, params: list[bytes], command: str, needed: int) -> bytes:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise _fatal("E_INVALID", f"cannot {command} in current state")
        if len(params) < needed:
            raise _fatal("E_INVALID", f"{command} insufficient number of params")
        message_id = params[0]
        if len(message_id) != 16:
            raise _fatal("E_INVALID", "invalid message ID")
        return message_id

    def _cmd_fin(self, params: list[bytes], body: Any) -> None:
        message_id = self._message_id(params, "FIN", 1)
        channel = self.channel
        error = channel.finish(self, message_id)  # type: ignore[union-attr]
        if error is not None:
            raise _ClientError("E_FIN_FAILED", f"FIN {text(message_id)} failed {error}", fatal=False)
        self.finish_count += 1
        self.in_flight -= 1
        self.refill()

    def _cmd_req(self, params: list[bytes], body: Any) -> None:
        message_id = self._message_id(params, "REQ", 2)
        parsed = base10(params[1])
        if parsed is None:
            raise _fatal("E_INVALID", f"REQ could not parse timeout {text(params[1])}")
        delay_ms = min(parsed, int(self.options.max_req_timeout * 1000))
        channel = self.channel
        error = channel.requeue(self, message_id, delay_ms / 1000.0)  # type: ignore[union-attr]
        if error is not None:
            raise _ClientError("E_REQ_FAILED", f"REQ {text(message_id)} failed {error}", fatal=False)
        self.requeue_count += 1
        self.in_flight -= 1
        self.refill()

    def _cmd_touch(self, params: list[bytes], body: Any) -> None:
        message_id = self._message_id(params, "TOUCH", 1)
        error = self.channel.touch(self, message_id, self.msg_timeout)  # type: ignore[union-attr]
        if error is not None:
            raise _ClientError("E_TOUCH_FAILED", f"TOUCH {text(message_id)} failed {error}", fatal=False)

    def _cmd_cls(self, params: list[bytes], body: Any) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise _fatal("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        self.flush_messages()
        self._send_response(codec.CLOSE_WAIT)

    def _publish_topic(self, params: list[bytes], command: str, needed: int, prefix: str = "") -> str:
        if len(params) < needed:
            raise _fatal("E_INVALID", f"{command} insufficient number of parameters")
        name = text(params[0])
        if not _valid_topic(name):
            raise _fatal("E_BAD_TOPIC", f"{prefix}{command} topic name {go_quote(params[0])} is not valid")
        return name

    def _check_message_size(self, body: bytes | int | None, command: str) -> bytes:
        if type(body) is int:
            if body <= 0:
                raise _fatal("E_BAD_MESSAGE", f"{command} invalid message body size {body}")
            raise _fatal("E_BAD_MESSAGE", f"{command} message too big {body} > {self.options.max_msg_size}")
        return body  # type: ignore[return-value]

    def _cmd_pub(self, params: list[bytes], body: bytes | int | None) -> None:
        name = self._publish_topic(params, "PUB", 1)
        data = self._check_message_size(body, "PUB")
        self._check_auth("PUB", name, "")
        topic = self._get_topic(name)
        topic.put([(self.server.next_id(), data, time.time_ns(), 0, 0)], len(data))
        self._count_published(name, 1)
        self._send_response(_OK)

    def _cmd_mpub(self, params: list[bytes], body: bytes | int | None) -> None:
        name = self._publish_topic(params, "MPUB", 1, prefix="E_BAD_TOPIC ")
        self._check_auth("MPUB", name, "")
        options = self.options
        if type(body) is int:
            if body <= 0:
                raise _fatal("E_BAD_BODY", f"MPUB invalid body size {body}")
            raise _fatal("E_BAD_BODY", f"MPUB body too big {body} > {options.max_body_size}")
        try:
            bodies = codec.decode_mpub(body, options.max_msg_size, options.max_body_size)  # type: ignore[arg-type]
        except ValueError as exc:
            code, description = exc.args
            raise _fatal(code, description) from None
        topic = self._get_topic(name)
        server = self.server
        first = server.take_ids(len(bodies))
        timestamp = time.time_ns()
        msgs = [(b"%016x" % (first + i), data, timestamp, 0, 0) for i, data in enumerate(bodies)]
        topic.put(msgs, sum(map(len, bodies)))
        self._count_published(name, len(msgs))
        self._send_response(_OK)

    def _cmd_dpub(self, params: list[bytes], body: bytes | int | None) -> None:
        name = self._publish_topic(params, "DPUB", 2)
        parsed = base10(params[1])
        if parsed is None:
            raise _fatal("E_INVALID", f"DPUB could not parse timeout {text(params[1])}")
        max_ms = int(self.options.max_req_timeout * 1000)
        if as_int64(parsed) < 0 or parsed > max_ms:
            raise _fatal("E_INVALID", f"DPUB timeout {parsed} out of range 0-{max_ms}")
        data = self._check_message_size(body, "DPUB")
        self._check_auth("DPUB", name, "")
        topic = self._get_topic(name)
        msg = new_message(self.server.next_id(), data, time.time_ns(), parsed)
        topic.put([msg], len(data), deferrable=parsed > 0)
        self._count_published(name, 1)
        self._send_response(_OK)

    def _count_published(self, topic: str, count: int) -> None:
        counts = self.pub_counts
        counts[topic] = counts.get(topic, 0) + count

    # -- stats ----------------------------------------------------------------

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        """This client in ``/stats`` (nsqd's ClientV2Stats, field for field; master adds the topology)."""
        out: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.rdy,
            "in_flight_count": self.in_flight,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        state = self.auth_state
        if state is not None and state.authorizations:
            out["authed"] = True
            if state.identity:
                out["auth_identity"] = state.identity
            if state.identity_url:
                out["auth_identity_url"] = state.identity_url
        if self.options.topology:
            out["topology_zone"] = self.topology_zone
            out["topology_region"] = self.topology_region
        # nsqd 1.3 lists (at most) one pub count: its loop breaks after the first.
        for topic, count in self.pub_counts.items():
            if topic_filter and topic != topic_filter:
                continue
            out["pub_counts"] = [{"topic": topic, "count": count}]
            break
        out.update(self._tls_stats())
        return out

    def _tls_stats(self) -> dict[str, Any]:
        cipher, version = "", ""
        if self.tls and self.transport is not None:
            ssl_object = self.transport.get_extra_info("ssl_object")
            if ssl_object is not None:
                info = ssl_object.cipher()
                cipher = info[0] if info else ""
                version = (ssl_object.version() or "").replace("TLSv", "TLS")
        return {
            "tls": self.tls,
            "tls_cipher_suite": cipher,
            "tls_version": version,
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }


# The upstream command table. A dialect's subclass copies it and adds or replaces
# entries (the HA dialect will add SUB_ORDERED, PUB_TRACE...).
ClientConnection.COMMANDS = {
    b"IDENTIFY": ClientConnection._cmd_identify,
    b"FIN": ClientConnection._cmd_fin,
    b"RDY": ClientConnection._cmd_rdy,
    b"REQ": ClientConnection._cmd_req,
    b"PUB": ClientConnection._cmd_pub,
    b"MPUB": ClientConnection._cmd_mpub,
    b"DPUB": ClientConnection._cmd_dpub,
    b"NOP": ClientConnection._cmd_nop,
    b"TOUCH": ClientConnection._cmd_touch,
    b"SUB": ClientConnection._cmd_sub,
    b"CLS": ClientConnection._cmd_cls,
    b"AUTH": ClientConnection._cmd_auth,
}
