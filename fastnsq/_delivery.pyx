# cython: language_level=3
"""The consumer's per-message hot path in C: a message's arrival, its handler call, its FIN.

A consumer connection is a :class:`Link`. The codec's ``FrameReader`` hands it each
message (``MessageSink.deliver``) and ``Message.finish()`` comes back to it
(``MessageSink.finish_message_c``), both as C calls. In the common case (the RDY
controller in normal operation, nothing unusual about the message) the link does the
bookkeeping itself, on C fields: the RDY record of its connection
(:class:`ConnRdy`, which :mod:`fastnsq.rdy` owns and marks ``fast`` when this is
allowed), its counters, the FIN into the connection's write buffer. A sync handler
is the only Python call per message. Everything else (backoff, the refill of RDY,
give-up, ordered and traced consumption, requeue, touch, a closed connection, a
stopping consumer) goes to the link's owner, the consumer's dispatcher
(``fastnsq.consumer.dispatch``, the ``LinkOwner`` protocol of ``_delivery.pyi``), whose
Python methods are also the whole behaviour of the pure-Python twin ``_delivery_py.py``.

Why: a profile of the sync-handler consumer against nsqd 1.3 had five Python frames
per message between the codec and the write (``_on_message``, ``_auto_answer``,
``finish_message``, ``_done``, ``RdyController.on_message[_done]``, ``Connection.fin``),
3.6 us of client CPU per message.
"""

cimport cython
from libc.math cimport INFINITY, NAN, isnan
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from ._frame cimport Message, MessageSink, WriteBuffer

from . import tracing

IMPLEMENTATION = "c"

__all__ = ["IMPLEMENTATION", "ConnRdy", "Inbox", "Link", "MessageIterator", "finish_all"]

cdef enum:
    MODE_SLOW = 0  # every message through the consumer's Python path
    MODE_SYNC = 1  # a sync handler, called inline
    MODE_ASYNC = 2  # a coroutine handler, started by the consumer
    MODE_QUEUE = 3  # no handler: `async for` / batches() take messages from the inbox

cdef dict _tracing = tracing.__dict__


cdef inline double _monotonic() noexcept nogil:
    # The clock of time.monotonic() and of the event loop's time(): CLOCK_MONOTONIC.
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


@cython.final
cdef class ConnRdy:
    """The RDY controller's record of one connection (see :mod:`fastnsq.rdy`).

    Plain data with C fields, so a :class:`Link` can count a delivery and a FIN
    without Python. ``fast`` is set by the controller when it is in normal
    operation (no backoff, nobody waiting for capacity, no lowered RDY settling on
    this connection): only then may a link apply the two common-case updates
    itself, exactly as ``RdyController.on_message`` / ``on_message_done`` would.
    """

    cdef public object conn_id
    cdef public long seq
    cdef public long max_rdy
    cdef public long rdy
    cdef public long remaining
    cdef public long target
    cdef public long in_flight
    cdef public long pending
    cdef public double pending_until
    cdef double _last_message_at  # NaN: none yet
    cdef public object last_rdy_at
    cdef public object granted_at
    cdef public object extra_since
    cdef public object waiting_since
    cdef public bint fast

    def __init__(self, conn_id, long seq, long max_rdy, now):
        self.conn_id = conn_id
        self.seq = seq  # insertion order: the deterministic tie-break
        self.max_rdy = max_rdy
        self.rdy = 0
        self.remaining = 0
        self.target = 0
        self.in_flight = 0
        self.pending = 0
        self.pending_until = 0.0
        self._last_message_at = NAN
        self.last_rdy_at = None
        self.granted_at = None  # when rdy last reached target from below
        self.extra_since = None  # holds one of the rotating "extra" slots since
        self.waiting_since = now  # without an extra slot since (None while holding one)
        self.fast = False

    @property
    def last_message_at(self):
        return None if isnan(self._last_message_at) else self._last_message_at

    @last_message_at.setter
    def last_message_at(self, value):
        self._last_message_at = NAN if value is None else value


@cython.final
cdef class Inbox:
    """Messages of a consumer without a handler, waiting for ``async for`` or ``batches()``.

    ``waiter`` is a future the reader sets when it waits for the first message;
    :meth:`push` resolves it (once) and forgets it.
    """

    cdef public object queue
    cdef public object waiter
    cdef object _append

    def __init__(self):
        from collections import deque

        self.queue = deque()
        self.waiter = None
        self._append = self.queue.append

    cpdef push(self, message):
        self._append(message)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wake(self):
        """Resolve the waiter without a message (the consumer is stopping)."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def __len__(self):
        return len(self.queue)


@cython.final
cdef class Link(MessageSink):
    """One subscribed connection of a consumer, and the delegate of its messages.

    The consumer makes it with its dispatcher as the ``owner`` (the only Python object
    the link calls: ``on_message``, ``on_handler_failed``, ``on_finish``, ``on_requeue``,
    ``on_touch``), passes it to its ``Connection`` as ``on_message`` and to the reader
    as the messages' delegate, and calls :meth:`attach` once the connection exists and
    :meth:`configure` when its mode or the controller's record changes. ``fast`` is
    the consumer's half of the permission (not ordered, not stopping); the record's
    ``fast`` is the controller's.
    """

    cdef public object owner
    cdef public object endpoint
    cdef public object conn
    cdef public dict in_flight  # message -> delivered at (loop clock): messages not answered inline
    cdef public dict touched  # message -> last TOUCH (only messages touched)
    cdef public double msg_timeout
    cdef public bint closed
    cdef public bint fast
    cdef public bint inspect_ext  # messages with an ext header go to the owner (HA decompression)
    cdef public long received
    cdef public long finished
    cdef public long requeued
    cdef public long timed_out
    # The smallest (arrival on the monotonic clock - nsqd's timestamp) since the express lane last
    # read it: how long the freshest message waited, plus the clocks' offset (comparable only with
    # itself). INFINITY when none came.
    cdef public double freshest_age
    cdef public ConnRdy rdy_state
    cdef WriteBuffer _wbuf
    cdef list _fins  # the connection's FINs of this pass, when it batches them (HA: conn.batch_fins)
    cdef object _schedule_flush
    cdef object _handler
    cdef object _async_dispatch
    cdef Inbox _inbox
    cdef int _mode
    cdef long _max_attempts
    cdef Message _current  # the message a sync handler is running for
    cdef double _current_at

    def __init__(self, owner, endpoint):
        self.owner = owner
        self.endpoint = endpoint
        self.conn = None
        self.in_flight = {}
        self.touched = {}
        self.msg_timeout = 60.0
        self.closed = False
        self.fast = False
        self.inspect_ext = False
        self.received = self.finished = self.requeued = self.timed_out = 0
        self.freshest_age = INFINITY
        self.rdy_state = None
        self._mode = MODE_SLOW

    def __repr__(self):
        return f"<link {self.endpoint.address} p={self.endpoint.partition}>"

    def attach(self, conn):
        """The connection this link answers on (its write buffer takes the FINs, or its ``fins``
        list when it batches them: call after ``conn.batch_fins()``)."""
        self.conn = conn
        self._wbuf = conn._wbuf
        self._fins = conn.fins
        self._schedule_flush = conn._schedule_flush

    def configure(self, *, handler=None, bint is_async=False, Inbox inbox=None, long max_attempts=0,
                  async_dispatch=None):
        """How messages are dispatched: a sync handler, an async one, or the inbox."""
        self._handler = handler
        self._inbox = inbox
        self._async_dispatch = async_dispatch
        self._max_attempts = max_attempts
        if handler is None:
            self._mode = MODE_QUEUE if inbox is not None else MODE_SLOW
        else:
            self._mode = MODE_ASYNC if is_async else MODE_SYNC

    def __call__(self, message):
        self.deliver(message)

    # ---- arrival ---------------------------------------------------------------------

    cdef int deliver(self, Message msg) except -1:
        cdef ConnRdy s = self.rdy_state
        cdef double now = _monotonic()
        cdef double age = now - msg.timestamp * 1e-9
        if age < self.freshest_age and msg.attempts == 1:  # a requeued message is old by design
            self.freshest_age = age
        if (
            not self.fast
            or self._mode == MODE_SLOW
            or s is None
            or not s.fast
            or s.in_flight >= s.rdy  # unauthorized: nsqd sent more than RDY allows
            or (s.remaining - 1) * 4 <= s.rdy  # the 25 % refill is due
            or (self._max_attempts and msg.attempts > self._max_attempts)
            or (self.inspect_ext and msg.ext_bytes is not None)
            or _tracing["ENABLED"]
        ):
            self.owner.on_message(self, msg)
            return 0
        # What RdyController.on_message does for an authorized message that needs no refill.
        s.in_flight += 1
        s.remaining -= 1
        s._last_message_at = now
        self.received += 1
        if self._mode == MODE_SYNC:
            self._current = msg
            self._current_at = now
            try:
                try:
                    self._handler(msg)
                except Exception:
                    self.owner.on_handler_failed(msg)
                else:
                    if not msg._responded and msg._auto_response:
                        msg.finish()
            finally:
                self._current = None
            if not msg._responded:
                self.in_flight[msg] = now  # the handler keeps it: answered later, or at stop
        elif self._mode == MODE_QUEUE:
            self.in_flight[msg] = now
            self._inbox.push(msg)
        else:
            self.in_flight[msg] = now
            self._async_dispatch(self._handler, msg)
        return 0

    # ---- answers -----------------------------------------------------------------------

    cdef int finish_message_c(self, Message msg) except -1:
        cdef ConnRdy s = self.rdy_state
        cdef object delivered
        cdef double at
        if self.closed or not self.fast or s is None or not s.fast or s.in_flight <= 0:
            self.owner.on_finish(self, msg)
            return 0
        # What _link_done + RdyController.on_message_done do for a FIN in normal operation.
        if msg is self._current:
            at = self._current_at
        else:
            delivered = self.in_flight.pop(msg, None)
            at = NAN if delivered is None else <double>delivered
        if self.touched:
            self.touched.pop(msg, None)
        elif not isnan(at) and _monotonic() - at > self.msg_timeout:
            self.timed_out += 1  # nsqd gave it to someone else already
        s.in_flight -= 1
        self.finished += 1
        if self._fins is not None:
            if not self._fins:
                self._schedule_flush()  # the first FIN since the last write (the write takes them all)
            self._fins.append(msg)
            return 0
        if len(self._wbuf) == 0:
            self._schedule_flush()  # the first command since the last write: one write per pass
        self._wbuf.put_fin(msg)
        return 0

    def finish_message(self, message):
        """``message.finish()`` of a delegate called the Python way."""
        if isinstance(message, Message):
            self.finish_message_c(message)
        else:
            self.owner.on_finish(self, message)

    def requeue_message(self, message, delay, backoff):
        self.owner.on_requeue(self, message, delay, backoff)

    def touch_message(self, message):
        self.owner.on_touch(self, message)

    def current_delivery(self, message):
        """When ``message`` is the one a sync handler is running for: when it arrived, else None."""
        return self._current_at if message is self._current and message is not None else None


@cython.final
@cython.freelist(8)
cdef class _Ready:
    """An awaitable that is already done: ``await`` gets its value without suspending."""

    cdef object _value

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        value = self._value
        self._value = None
        raise StopIteration(value)

    def send(self, arg):
        return self.__next__()

    def throw(self, typ, val=None, tb=None):
        raise typ if val is None else val

    def close(self):
        self._value = None


@cython.final
cdef class MessageIterator:
    """``async for message in consumer``: a queued message is handed out without a coroutine.

    An async generator costs a frame resumption and an awaitable per message; this hands
    out what the inbox holds as already-done awaitables, and awaits the consumer's
    ``slow_next(pass_first)`` when the inbox is empty, or after ``yield_every`` messages
    in a row (then with ``pass_first`` True: the loop gets a pass to write the FINs).
    """

    cdef Inbox _inbox
    cdef object _popleft
    cdef object _slow_next
    cdef long _handed
    cdef long _yield_every

    def __init__(self, Inbox inbox, slow_next, long yield_every):
        self._inbox = inbox
        self._popleft = inbox.queue.popleft
        self._slow_next = slow_next
        self._handed = 0
        self._yield_every = yield_every

    def __aiter__(self):
        return self

    def __anext__(self):
        cdef _Ready ready
        if self._handed < self._yield_every and self._inbox.queue:
            self._handed += 1
            ready = _Ready.__new__(_Ready)
            ready._value = self._popleft()
            return ready
        pass_first = self._handed >= self._yield_every
        self._handed = 0
        return self._slow_next(pass_first)


def finish_all(messages):
    """FIN every message of a batch that is not answered yet, in C."""
    cdef Message msg
    for item in messages:
        if type(item) is Message:
            msg = <Message>item
            if not msg._responded:
                msg.finish()
        elif not item.has_responded:
            item.finish()
