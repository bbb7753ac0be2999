"""One TCP connection to nsqd: handshake, upgrades, AUTH, commands, responses, errors.

The connection is the ``asyncio.BufferedProtocol``: the event loop reads straight
into the codec's read buffer, the codec splits frames and calls back here (or,
for messages, straight into the consumer). What it does (nsq's TCP protocol spec and youzan/nsq's source):

* magic and IDENTIFY; acts on the flags nsqd answers, not on what was asked;
  TLS through ``loop.start_tls``; snappy or deflate, with the bytes already read
  past the IDENTIFY answer fed to the decompressor first; AUTH when required.
* every command written during one pass of the loop goes out in one write;
  commands that produce a response resolve futures in FIFO order.
* heartbeats are answered with NOP at once; a connection that has been silent
  for two heartbeat intervals is declared dead.
* the non-fatal errors (which differ between upstream and HA nsqd) fail only the
  command they answer; any other error fails every pending command with an
  exception that carries the code and says the connection is gone.

It knows nothing of other connections, RDY policy or retries.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import codec
from ._protocol import HEARTBEAT, MAX_EXT_SIZE, MESSAGE_HEADER_SIZE, OK
from ._write_marks import WriteMarks
from .config import ConnectionOptions, parse_address
from .dial import dial
from .errors import (
    ConnectionClosedError,
    InvalidValueError,
    NSQError,
    ProtocolError,
    ServerError,
    is_fatal,
    server_error,
)
from .liveness import SilenceWatch, tune_socket

if TYPE_CHECKING:
    from .compression import CompressionStream

__all__ = ["STATE_CLOSED", "STATE_CLOSING", "STATE_CONNECTED", "STATE_INIT", "STATE_SUBSCRIBED", "Answer", "Connection"]


class Answer(Protocol):
    """What a command's answer goes to: an ``asyncio.Future`` by default. A publisher may pass its
    own (``publish(..., answer=)``): it is answered within the read that brings nsqd's answer,
    with no future and no loop pass in between, so it must not raise and must not block."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...

logger = logging.getLogger(__name__)

STATE_INIT = "init"
STATE_CONNECTING = "connecting"
STATE_CONNECTED = "connected"
STATE_SUBSCRIBED = "subscribed"
STATE_CLOSING = "closing"  # CLS sent: no new messages, FIN/REQ/TOUCH still legal
STATE_CLOSED = "closed"
_NOT_OPEN = (STATE_CLOSED, STATE_INIT)

# What a pending response answers.
KIND_IDENTIFY = 0
KIND_UPGRADE = 1
KIND_AUTH = 2
KIND_SUB = 3
KIND_PUBLISH = 4
KIND_MPUB_EXT = 5  # HA: a non-fatal error leaves the stream out of step (protocol.md §9.6)
KIND_CLS = 6
KIND_OTHER = 7

#: Errors that answer FIN/REQ/TOUCH, which are silent on success: never matched to a pending command.
UNSOLICITED_ERRORS = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})
_MPUB_EXT_DESYNC = frozenset({"E_EXT_NOT_SUPPORT", "E_INVALID_JSON_HEADER", "INVALID_TRACE_ID"})

HANDSHAKE_TIMEOUT = 10.0
_RAW_READ_SIZE = 65536  # compressed reads stay within the decompressor's guard-free size


def _frame_limit(options: ConnectionOptions) -> int:
    # A message frame may carry the HA ext header and offset/size on top of the body.
    return 4 + MESSAGE_HEADER_SIZE + 3 + MAX_EXT_SIZE + 12 + max(options.max_msg_size, 65536)


class Connection(asyncio.BufferedProtocol):
    """A connection to one nsqd, used by a consumer (one topic/channel) or a producer.

    >>> async def main():                                  # doctest: +SKIP
    ...     conn = Connection("127.0.0.1:4150", ConnectionOptions())
    ...     await conn.connect()
    ...     await conn.publish("events", b"hello")
    ...     await conn.close()
    """

    def __init__(
        self,
        address: str,
        options: ConnectionOptions | None = None,
        *,
        extend_support: bool = False,
        on_message: Callable[[Any], object] | None = None,
        on_close: Callable[[Connection, BaseException | None], object] | None = None,
        on_error: Callable[[Connection, ServerError], object] | None = None,
    ) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.options = options if options is not None else ConnectionOptions()
        self.extend_support = extend_support
        self.identify_response: dict[str, Any] = {}
        self.is_ha = False
        self.max_rdy_count = codec.DEFAULT_MAX_RDY_COUNT
        self.state = STATE_INIT
        self.close_error: BaseException | None = None
        self.last_read = 0.0
        self.bytes_received = 0
        self.bytes_sent = 0
        self._on_close = on_close
        self._on_error = on_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[Answer, int]] = deque()
        self._answered = 0  # commands popped from _pending so far
        self._write_marks = WriteMarks()  # when commands went out: expire_pending(), the round trips
        self._wbuf = codec.WriteBuffer(
            max_msg_size=self.options.max_msg_size, max_body_size=self.options.max_body_size
        )
        self._reader = codec.FrameReader(
            on_message if on_message is not None else self._on_unexpected_message,
            self._on_response,
            self._on_error_frame,
            max_frame_size=_frame_limit(self.options),
        )
        self._reader.address = address
        self._flush_scheduled = False
        # Set while a read is handled or writes are held (hold_writes): the write goes out at its
        # end, not in a loop pass of its own.
        self._in_read = False
        self._inflater: CompressionStream | None = None
        self._deflater: CompressionStream | None = None
        self._raw_buffer: bytearray | None = None
        self._closed_waiter: asyncio.Future[None] | None = None
        self._heartbeat_timer: SilenceWatch | None = None
        self._write_paused = False
        self._eof_written = False  # close(wait_for_server=...): nothing more goes out
        self._write_timer: asyncio.TimerHandle | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._established = False  # on_close is only reported for connections that were up
        #: Called with the seconds from a write to the answer of its last command (one call per
        #: write, not per command: the commands of one write are answered together); metrics set it.
        self.round_trip_observer: Callable[[float], object] | None = None
        #: HA: the FINs of this loop pass, written newest first when the pass's write goes out
        #: (None: each FIN is written at once). See :meth:`batch_fins`.
        self.fins: list[Any] | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state}{' HA' if self.is_ha else ''}>"

    # ---- public API: lifecycle --------------------------------------------------------

    @property
    def reader(self) -> Any:
        """The codec's FrameReader (its ``layout`` and message ``delegate`` are set by the consumer)."""
        return self._reader

    @property
    def pending(self) -> int:
        """Commands written and still waiting for their response."""
        return len(self._pending)

    @property
    def answered(self) -> int:
        """Commands nsqd answered (or that failed) so far on this connection."""
        return self._answered

    def unanswered_since(self) -> float | None:
        """When the oldest command still waiting for nsqd's answer went out (time.perf_counter()),
        from the write marks expire_pending() has not taken; None: nothing written is unanswered."""
        return self._write_marks.unanswered_since(self._answered)

    @property
    def is_open(self) -> bool:
        return self.state in (STATE_CONNECTED, STATE_SUBSCRIBED, STATE_CLOSING)

    async def connect(self, handshake_timeout: float = HANDSHAKE_TIMEOUT) -> dict[str, Any]:
        """Open TCP, send magic and IDENTIFY, run the upgrades nsqd agreed to, AUTH if required
        (within ``dial_timeout``, then ``handshake_timeout``: a hung nsqd's kernel still accepts).

        Returns nsqd's IDENTIFY answer. Raises ``ConnectionError``/``OSError`` when
        nsqd cannot be reached, ``ServerError`` when it refuses, ``asyncio.TimeoutError``
        when it does not answer in time.
        """
        if self.state != STATE_INIT:
            raise RuntimeError(f"connect() on a connection in state {self.state}")
        self.state = STATE_CONNECTING
        self._loop = loop = asyncio.get_running_loop()
        self._closed_waiter = loop.create_future()
        try:
            local = self.options.local_addr  # staggered SYNs: a black hole that heals is not waited out
            sock = await dial(self.host, self.port, self.options.dial_timeout,
                              None if local is None else parse_address(local, default_port=0))
            try:
                await loop.create_connection(lambda: self, sock=sock)
            except BaseException:
                sock.close()
                raise
            try:
                await asyncio.wait_for(self._handshake(), handshake_timeout)
            except asyncio.TimeoutError:  # its own text: the logs said only "TimeoutError"
                raise asyncio.TimeoutError(f"nsqd {self.host}:{self.port} accepted the connection but did not "
                                           f"answer the handshake within {handshake_timeout:g} s") from None
        except BaseException as exc:
            self._abort(exc)
            # GeneratorExit: the coroutine is being closed (its loop went away); awaiting now
            # would be "coroutine ignored GeneratorExit". The socket is closed either way.
            if not isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                await asyncio.wait([self._closed_waiter], timeout=1.0)  # closed when we raise
            raise
        self.state = STATE_CONNECTED
        self._established = True
        self._heartbeat_timer = SilenceWatch.start(self)  # None: no bound (heartbeats off)
        return self.identify_response

    async def _handshake(self) -> None:
        assert self._transport is not None
        self._wbuf.magic()
        body = json.dumps(self.options.identify_body(extend_support=self.extend_support)).encode()
        self._wbuf.identify(body)
        answer = await self._expect(KIND_IDENTIFY)
        self._apply_identify(answer)
        if self.identify_response.get("tls_v1"):
            await self._upgrade_tls()
        if self.identify_response.get("snappy"):
            await self._upgrade_compression("snappy", 0)
        elif self.identify_response.get("deflate"):
            await self._upgrade_compression("deflate", int(self.identify_response.get("deflate_level", 6)))
        self._reader.resume()
        if self.identify_response.get("auth_required"):
            await self._authenticate()

    def _apply_identify(self, answer: bytes) -> None:
        if answer == codec.OK:  # nsqd without feature negotiation
            self.identify_response = {}
            return
        try:
            info = json.loads(answer)
        except ValueError as exc:
            raise ProtocolError(f"nsqd answered IDENTIFY with something that is not JSON: {exc}") from None
        if not isinstance(info, dict):
            raise ProtocolError("nsqd answered IDENTIFY with JSON that is not an object")
        self.identify_response = info
        self.is_ha = "HA" in str(info.get("version", ""))
        self.max_rdy_count = int(info.get("max_rdy_count", codec.DEFAULT_MAX_RDY_COUNT))
        self._wbuf.max_rdy_count = self.max_rdy_count
        if self.is_ha:
            self._wbuf.max_req_timeout = 72 * 3600 * 1000  # HA clamps REQ at 72 h, not 1 h
        if info.get("tls_v1") and not self.options.tls_enabled:
            raise ProtocolError("nsqd turned on TLS although it was not asked for")
        if info.get("snappy") and info.get("deflate"):
            raise ProtocolError("nsqd turned on both snappy and deflate")

    async def _upgrade_tls(self) -> None:
        assert self._loop is not None and self._transport is not None
        if self._reader.take_unparsed():
            raise ProtocolError("nsqd sent data before the TLS handshake")
        context = self.options.ssl_context()
        hostname = self.options.tls_server_hostname or self.host
        answer = self._expect(KIND_UPGRADE)  # registered first: OK may arrive with the handshake's end
        self._reader.resume()
        try:
            transport = await self._loop.start_tls(
                self._transport, self, context, server_hostname=hostname, ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )
        except BaseException:
            answer.cancel()  # nobody will read it: the handshake's own error is what connect() raises
            raise
        if transport is None:
            raise ConnectionClosedError(f"{self.address}: the connection closed during the TLS handshake")
        self._transport = transport
        await self._check_ok(answer, "TLS")

    async def _upgrade_compression(self, kind: str, level: int) -> None:
        from .compression import make_stream  # snappy and CRC32C libraries load only when negotiated

        stream = make_stream(kind, level or 6)
        already_read = self._reader.take_unparsed()  # these bytes belong to the compressed stream
        self._inflater = stream
        self._deflater = stream
        self._raw_buffer = bytearray(_RAW_READ_SIZE)
        answer = self._expect(KIND_UPGRADE)
        self._reader.resume()
        if already_read:
            self._feed_compressed(already_read)
        await self._check_ok(answer, kind)

    @staticmethod
    async def _check_ok(answer: asyncio.Future[Any], what: str) -> None:
        data = await answer
        if data != codec.OK:
            raise ProtocolError(f"nsqd answered the {what} upgrade with {data!r}, not OK")

    async def _authenticate(self) -> None:
        secret = self.options.auth_secret
        if secret is None:
            raise NSQError(f"nsqd at {self.address} requires AUTH and no auth_secret is configured")
        self._wbuf.auth(secret)
        answer = await self._expect(KIND_AUTH)
        try:
            self.auth_response = json.loads(answer)
        except ValueError:
            raise ProtocolError("nsqd answered AUTH with something that is not JSON") from None

    async def close(self, wait_for_server: float = 0.0) -> None:
        """Close the socket (after writing what is buffered) and wait until it is closed. With
        ``wait_for_server`` s, end our side first and let nsqd close its own (that long at most):
        nsqd has then dropped the client from its channel (and ``/stats``) when this returns."""
        if self._transport is not None and self.state != STATE_CLOSED:
            self._flush()
            if wait_for_server > 0 and self._closed_waiter is not None and self._transport.can_write_eof():
                self._transport.write_eof()
                self._eof_written = True
                await asyncio.wait([self._closed_waiter], timeout=wait_for_server)
        if self._transport is not None and self.state != STATE_CLOSED:
            self._transport.close()
        if self._closed_waiter is not None:
            await asyncio.shield(self._closed_waiter)

    def abort(self, error: BaseException | None = None) -> None:
        """Drop the connection now; pending commands fail with ``ConnectionClosedError``."""
        self._abort(error or ConnectionClosedError(f"connection to {self.address} aborted"))

    async def wait_closed(self) -> None:
        if self._closed_waiter is not None:
            await asyncio.shield(self._closed_waiter)

    # ---- public API: consuming ------------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        channel: str,
        *,
        partition: int | None = None,
        ordered: bool = False,
        advanced: bool = False,
        position: str | None = None,
    ) -> None:
        """SUB (or, on HA, SUB_ORDERED / SUB_ADVANCED) and wait for nsqd's OK.

        The message layout this connection decodes is fixed here by what it sends.
        """
        self._check_open("SUB")
        layout = codec.LAYOUT_UPSTREAM
        if self.is_ha:
            layout |= codec.LAYOUT_HA_ID
            if self.extend_support:
                layout |= codec.LAYOUT_EXT
            if ordered or advanced:
                layout |= codec.LAYOUT_OFFSET
        elif ordered or advanced:
            raise InvalidValueError(f"{self.address} is not an HA nsqd: ordered/advanced SUB needs HA")
        if ordered:
            self._wbuf.sub_ordered(topic, channel, partition)
        elif advanced:
            self._wbuf.sub_advanced(topic, channel, partition, position)
        else:
            self._wbuf.sub(topic, channel, partition)
        self._reader.layout = layout
        self._reader.partition = partition
        await self._expect(KIND_SUB)
        self.state = STATE_SUBSCRIBED

    def rdy(self, count: int) -> None:
        """Send RDY (absolute, not an increment)."""
        self._check_open("RDY")
        self._wbuf.rdy(count)
        self._schedule_flush()

    def fin(self, message: Any) -> None:
        self._check_open("FIN")
        if self.fins is not None:
            self.fins.append(message)
        else:
            self._wbuf.fin(message)
        self._schedule_flush()

    def batch_fins(self) -> None:
        """HA nsqd: write each pass's FINs newest first (a consumer's fast lane appends to ``fins``).

        A youzan leader moves its channel's confirmed offset with every FIN of the oldest
        unconfirmed message and tells each replica each time (FinishMessageToCluster); a FIN
        above that offset is only recorded. FINs of a batch sent newest first move the offset
        once per batch: on a 3-node cluster with 2 replicas, nsqd's CPU per message went from
        13 to 5.6 us and consumption from ~65k to ~120k msg/s. The order of FINs means nothing
        else to nsqd.
        """
        if self.fins is None:
            self.fins = []

    def req(self, message: Any, delay_ms: int) -> None:
        self._check_open("REQ")
        self._wbuf.req(message, delay_ms)
        self._schedule_flush()

    def touch(self, message: Any) -> None:
        self._check_open("TOUCH")
        self._wbuf.touch(message)
        self._schedule_flush()

    async def cls(self) -> None:
        """CLS: nsqd stops sending and answers CLOSE_WAIT; FIN/REQ/TOUCH stay legal."""
        self._check_open("CLS")
        self._wbuf.cls()
        self.state = STATE_CLOSING
        await self._expect(KIND_CLS)

    # ---- public API: publishing -------------------------------------------------------

    def publish(
        self, topic: str, body: Any, *, partition: int | None = None, answer: Any = None, now: bool = False
    ) -> Any:
        """PUB; the future (or ``answer``, see :class:`Answer`) gets nsqd's answer (``b"OK"``).
        ``now``: written before this returns, with what is buffered, not at the end of the loop
        pass (a caller that knows nothing else is coming: the producer's lone publish)."""
        # _check_open and _expect written out: this is the per-message path of coalesce=False.
        if self._transport is None or self.state in _NOT_OPEN:
            self._check_open("PUB")
        self._wbuf.pub(topic, body, partition)
        if answer is None:
            answer = self._loop.create_future()  # type: ignore[union-attr]
        self._pending.append((answer, KIND_PUBLISH))
        if now and not self._in_read:
            self._flush()  # no flush scheduled: a handle queued is a loop pass, and a poll, more
        elif not self._flush_scheduled:
            self._schedule_flush()
        return answer

    def mpublish(
        self, topic: str, bodies: Sequence[Any], *, partition: int | None = None, answer: Any = None, now: bool = False
    ) -> Any:
        """MPUB; as :meth:`publish`."""
        self._check_open("MPUB")
        self._wbuf.mpub(topic, bodies, partition)
        if not now or self._in_read:
            return self._expect(KIND_PUBLISH, answer)
        if answer is None:
            assert self._loop is not None
            answer = self._loop.create_future()
        self._pending.append((answer, KIND_PUBLISH))
        self._flush()
        return answer

    def dpublish(self, topic: str, defer_ms: int, body: Any) -> asyncio.Future[Any]:
        self._check_open("DPUB")
        if self.is_ha:
            raise InvalidValueError(f"{self.address} is an HA nsqd, which has no DPUB (deferred publish)")
        self._wbuf.dpub(topic, defer_ms, body)
        return self._expect(KIND_PUBLISH)

    def publish_trace(self, topic: str, partition: int | None, trace_id: int, body: Any) -> asyncio.Future[Any]:
        """HA PUB_TRACE; resolves with a ``TracedResponse``."""
        self._check_ha("PUB_TRACE")
        self._wbuf.pub_trace(topic, partition, trace_id, body)
        return self._expect(KIND_PUBLISH)

    def mpublish_trace(self, topic: str, partition: int | None, items: Sequence[tuple[int, Any]]) -> asyncio.Future[Any]:
        self._check_ha("MPUB_TRACE")
        self._wbuf.mpub_trace(topic, partition, items)
        return self._expect(KIND_PUBLISH)

    def publish_ext(self, topic: str, partition: int | None, ext: bytes, body: Any) -> asyncio.Future[Any]:
        """HA PUB_EXT: ``ext`` is the JSON header; resolves with OK or a ``TracedResponse``."""
        self._check_ha("PUB_EXT")
        self._wbuf.pub_ext(topic, partition, ext, body)
        return self._expect(KIND_PUBLISH)

    def mpublish_ext(self, topic: str, partition: int | None, items: Sequence[tuple[bytes, Any]]) -> asyncio.Future[Any]:
        self._check_ha("MPUB_EXT")
        self._wbuf.mpub_ext(topic, partition, items)
        return self._expect(KIND_MPUB_EXT)

    def internal_create_topic(self, topic: str, partition: int, ext: bool | None = None) -> asyncio.Future[Any]:
        """HA standalone only: create a topic partition."""
        self._check_ha("INTERNAL_CREATE_TOPIC")
        self._wbuf.internal_create_topic(topic, partition, ext)
        return self._expect(KIND_OTHER)

    def nop(self) -> None:
        self._check_open("NOP")
        self._wbuf.nop()
        self._schedule_flush()

    @property
    def writing_paused(self) -> bool:
        """True while the transport's write buffer is above its high-water mark."""
        return self._write_paused

    async def drain(self) -> None:
        """Wait until the transport accepts more data (publishers call this under load)."""
        if not self._write_paused:
            return
        assert self._loop is not None
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    # ---- asyncio protocol callbacks ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        tune_socket(transport.get_extra_info("socket"), self.options.dead_after)  # ends a black-holed one
        assert self._loop is not None
        self.last_read = self._loop.time()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._raw_buffer is not None:
            return memoryview(self._raw_buffer)
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        assert self._loop is not None
        self.last_read = self._loop.time()
        self.bytes_received += nbytes
        self._in_read = True
        try:
            if self._raw_buffer is not None:
                self._feed_compressed(self._raw_buffer[:nbytes])
            else:
                self._reader.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._abort(exc)
            return
        finally:
            self._in_read = False
        if self._flush_scheduled:
            self._flush()  # what handlers answered inline goes out in this one write

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        was = self.state
        self.state = STATE_CLOSED
        self._transport = None
        for timer in (self._heartbeat_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._heartbeat_timer = self._write_timer = None
        error = self.close_error or exc
        closed = ConnectionClosedError(f"connection to {self.address} closed" + (f": {error}" if error else ""))
        if error is not None:
            closed.__cause__ = error
        self._fail_pending(closed)
        self._release_drain_waiters()
        if self._closed_waiter is not None and not self._closed_waiter.done():
            self._closed_waiter.set_result(None)
        if was != STATE_CLOSED and self._established and self._on_close is not None:
            self._on_close(self, error)

    def pause_writing(self) -> None:
        self._write_paused = True
        timeout = self.options.write_timeout
        if timeout is not None and self._write_timer is None and self._loop is not None:
            self._write_timer = self._loop.call_later(timeout, self._check_writing, self._buffered())

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._release_drain_waiters()

    def _buffered(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def _check_writing(self, buffered_before: int) -> None:
        """write_timeout: while writing is paused, nsqd must take some of what is buffered."""
        self._write_timer = None
        if not self._write_paused or self._transport is None:
            return
        buffered = self._buffered()
        if buffered >= buffered_before:
            self._abort(ConnectionClosedError(
                f"{self.address} took none of {buffered} buffered bytes within write_timeout="
                f"{self.options.write_timeout} s: it stopped reading"
            ))
            return
        assert self._loop is not None and self.options.write_timeout is not None
        self._write_timer = self._loop.call_later(self.options.write_timeout, self._check_writing, buffered)

    # ---- frames from the codec --------------------------------------------------------

    def _on_response(self, data: Any) -> None:
        pending = self._pending
        if data is OK and pending and pending[0][1] > KIND_UPGRADE:
            # The common answer (the codec hands out the one OK object): a publish's, a SUB's.
            future = pending.popleft()[0]
            self._answered += 1
            if not future.done():
                future.set_result(data)
            if self.round_trip_observer is not None:
                self._observe_round_trip()
            return
        if data is HEARTBEAT or data == HEARTBEAT:
            self._answer_heartbeat()
            return
        if not self._pending:
            self._abort(ProtocolError(f"nsqd sent a response nobody asked for ({len(data)} bytes)"))
            return
        future, kind = self._pending.popleft()
        self._answered += 1
        if kind <= KIND_UPGRADE:
            self._reader.pause()  # what follows may belong to a TLS or compressed stream
        if not future.done():
            future.set_result(data)
        if self.round_trip_observer is not None:
            self._observe_round_trip()

    def _on_error_frame(self, code: str, description: str) -> None:
        head_kind = self._pending[0][1] if self._pending else None
        answers_publish = head_kind in (KIND_PUBLISH, KIND_MPUB_EXT)
        fatal = is_fatal(code, ha=self.is_ha, answers_publish=answers_publish)
        error = server_error(code, description, fatal)
        if code in UNSOLICITED_ERRORS and not fatal:
            self._report(error)  # answers a FIN/REQ/TOUCH, which have no pending future
            return
        if not fatal:
            if head_kind is None:
                self._report(error)
                return
            future, kind = self._pending.popleft()
            self._answered += 1
            if not future.done():
                future.set_exception(error)
            if kind == KIND_MPUB_EXT and code in _MPUB_EXT_DESYNC:
                # nsqd stopped reading the batch midway: the rest would be parsed as commands.
                self._abort(ConnectionClosedError(f"{self.address}: MPUB_EXT left the stream out of step"))
            return
        if self._pending:
            future, _ = self._pending.popleft()
            self._answered += 1
            if not future.done():
                future.set_exception(error)
        else:
            self._report(error)
        self._abort(error)

    def _on_unexpected_message(self, message: Any) -> None:
        self._abort(ProtocolError(f"nsqd sent a message on a connection that did not subscribe ({message!r})"))

    def _report(self, error: ServerError) -> None:
        if self._on_error is not None:
            self._on_error(self, error)
        else:
            logger.warning("%s: %s", self.address, error)

    # ---- internals --------------------------------------------------------------------

    def _feed_compressed(self, data: Any) -> None:
        assert self._inflater is not None
        plain = self._inflater.decompress(data)
        if plain:
            self._reader.feed(plain)

    def _expect(self, kind: int, answer: Any = None) -> Any:
        if answer is None:
            assert self._loop is not None
            answer = self._loop.create_future()
        self._pending.append((answer, kind))
        self._schedule_flush()
        return answer

    def _check_open(self, command: str) -> None:
        if self.state in _NOT_OPEN or self._transport is None:
            cause = f": {self.close_error}" if self.close_error else ""
            raise ConnectionClosedError(f"cannot send {command}: connection to {self.address} is closed{cause}")

    def _check_ha(self, command: str) -> None:
        self._check_open(command)
        if not self.is_ha:
            raise InvalidValueError(f"{command} needs an HA nsqd; {self.address} is not one")

    def _schedule_flush(self) -> None:
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        if not self._in_read:
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def flush(self) -> None:
        """Write what is buffered now instead of at the end of this loop pass."""
        self._flush()

    def hold_writes(self) -> bool:
        """Commands queued until :meth:`release_writes` go out in one write there, with no loop pass
        scheduled for them: a caller at the end of a pass (the coalescer's flush, the blocking
        facade's hand-over) writes at once instead of a pass later. False, and nothing held, inside
        this connection's own read, which writes at its end anyway."""
        if self._in_read:
            return False
        self._in_read = True
        return True

    def release_writes(self) -> None:
        """End :meth:`hold_writes`: write what was queued meanwhile."""
        self._in_read = False
        if self._flush_scheduled:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        fins = self.fins
        if fins:
            for message in reversed(fins):
                self._wbuf.fin(message)
            fins.clear()
        if self._transport is None or not len(self._wbuf) or self._eof_written:
            return
        data = self._wbuf.take()
        if self._deflater is not None:
            data = self._deflater.compress(data)
        self.bytes_sent += len(data)
        expected = self._answered + len(self._pending)
        if expected > self._write_marks.marked:
            self._write_marks.mark(expected, self._answered)
        # The write last: on a busy machine nsqd, woken by it, may take this CPU until it answers,
        # and what is left to do here would wait for that.
        self._transport.write(data)

    def _observe_round_trip(self) -> None:
        seconds = self._write_marks.answered_write(self._answered)
        if seconds is not None and self.round_trip_observer is not None:
            self.round_trip_observer(seconds)

    def expire_pending(self, written_before: float, error: Callable[[], BaseException]) -> int:
        """Fail (with ``error()``) the commands written before ``written_before`` (a
        ``time.perf_counter()`` reading, the clock of the write marks) that
        nsqd has not answered; returns how many. Their answers, if they still come, are ignored.

        nsqd answers in command order, so these are the oldest ones; the producer calls this
        to enforce ``publish_timeout`` without keeping a timestamp per publish.
        """
        start, upto = self._write_marks.expired(written_before, self._answered)
        failed = 0
        if upto > start:
            for future, _ in itertools.islice(self._pending, start - self._answered, upto - self._answered):
                if not future.done():
                    future.set_exception(error())
                    failed += 1
        return failed

    def _answer_heartbeat(self) -> None:
        if self._transport is not None and self.state != STATE_CLOSED:
            self._wbuf.nop()
            self._schedule_flush()

    def _fail_pending(self, error: BaseException) -> None:
        self._write_marks.clear()
        while self._pending:
            future, _ = self._pending.popleft()
            self._answered += 1
            if not future.done():
                future.set_exception(error)

    def _release_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _abort(self, error: BaseException) -> None:
        if self.close_error is None:
            self.close_error = error
        if isinstance(error, (ServerError, ProtocolError)):
            logger.warning("%s: closing connection: %s", self.address, error)
        closed = ConnectionClosedError(f"connection to {self.address} closed: {error}")
        closed.__cause__ = error
        self._fail_pending(closed)
        if self._transport is not None:
            self._transport.abort()
        elif self.state != STATE_CLOSED:
            self.connection_lost(error)
        if self._closed_waiter is not None and self._transport is None and not self._closed_waiter.done():
            self._closed_waiter.set_result(None)

