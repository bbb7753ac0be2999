# cython: language_level=3
"""Coalescing of concurrent publishes: the producer's hot path, in C.

Publishes for the same key (a topic, or a topic on one nsqd partition) made during
one pass of the event loop are gathered into one :class:`Batch`; at the end of the
pass the producer's flush callback turns each batch into one PUB or MPUB, and the
command's answer resolves every publish of the batch at once (the Batch is that command's answer).
With ``lone_at_once``, a publish made while no other is unanswered goes out at once instead
(Nagle's rule: a lone publisher pays no loop pass; the rest of that pass still coalesces behind it).

It holds futures and calls their methods; it knows nothing of sockets or NSQ.
``_coalesce_py.py`` is the pure-Python twin with the same API.
"""

from cpython.bytes cimport PyBytes_GET_SIZE

from .errors import ConnectionClosedError, InvalidValueError

IMPLEMENTATION = "c"

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL


cdef Py_ssize_t body_size(object body) except -1:
    """Bytes on the wire for a body (str is sent as UTF-8)."""
    cdef Py_ssize_t size
    if type(body) is bytes:
        return PyBytes_GET_SIZE(body)
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, str):
        PyUnicode_AsUTF8AndSize(body, &size)
        return size
    if isinstance(body, memoryview):
        return (<object>body).nbytes
    raise InvalidValueError(
        f"message body must be bytes, bytearray, memoryview or str, not {type(body).__name__}"
    )


cdef class Batch:
    """The publishes of one loop pass for one key: bodies, their futures, the MPUB size.

    A Batch is also the answer its PUB/MPUB waits for on the connection (``done``,
    ``set_result``, ``set_exception``: what the connection calls on a command's future): it
    resolves its publishes in the read that brings nsqd's answer, with no future of its own and
    no loop pass in between. ``on_settled``, when set, is called with the error (None: answered).
    """

    cdef readonly list bodies
    cdef readonly list futures
    cdef readonly Py_ssize_t nbytes
    cdef Coalescer owner
    cdef bint _settled
    cdef public object on_settled

    def __len__(self):
        return len(self.bodies)

    def done(self):
        return self._settled

    def set_result(self, result):
        self._settle(result, None)

    def set_exception(self, error):
        self._settle(None, error)

    def resolve(self, sent):
        """Done-callback of a PUB/MPUB future: resolve every publish of the batch with its outcome."""
        if sent.cancelled():
            self._settle(None, ConnectionClosedError("the command was cancelled"))
        elif sent.exception() is not None:
            self._settle(None, sent.exception())
        else:
            self._settle(sent.result(), None)

    cdef _settle(self, object result, object error):
        cdef Py_ssize_t ok = 0
        if self._settled:
            return
        self._settled = True
        for future in self.futures:
            if future.done():
                continue
            if error is None:
                future.set_result(result)
                ok += 1
            else:
                future.set_exception(error)
        self.owner.published += ok
        self.owner.pending -= len(self.futures)
        if self.on_settled is not None:
            self.on_settled(error)

    def fail(self, error):
        """The batch could not be sent: every publish of it gets ``error``."""
        self._settle(None, error)

    def split(self, Py_ssize_t max_bytes, Py_ssize_t max_count):
        """Batches of at most ``max_bytes`` (MPUB body) and ``max_count`` messages, in order."""
        cdef list parts = []
        cdef Batch part = None
        cdef Py_ssize_t i, size
        for i in range(len(self.bodies)):
            size = 4 + body_size(self.bodies[i])
            if part is None or (part.bodies and (part.nbytes + size > max_bytes or len(part.bodies) >= max_count)):
                part = _new_batch(self.owner)
                parts.append(part)
            part.bodies.append(self.bodies[i])
            part.futures.append(self.futures[i])
            part.nbytes += size
        return parts


cdef Batch _new_batch(Coalescer owner):
    cdef Batch batch = Batch.__new__(Batch)
    batch.bodies = []
    batch.futures = []
    batch.nbytes = 4  # the MPUB message count
    batch.owner = owner
    batch._settled = False
    batch.on_settled = None
    return batch


cdef class Coalescer:
    """Gathers publishes per key during one loop pass; ``flush(batches)`` runs once per pass.

    ``add`` checks the body (type, empty, ``max_msg_size``) before accepting it and
    returns the future the caller awaits. With ``lone_at_once``, a publish made while no other
    is unanswered is flushed at once, alone (the producer's choice). ``pending`` counts publishes not resolved
    yet, ``published`` those acknowledged.
    """

    cdef object _create_future
    cdef object _call_soon
    cdef object _flush
    cdef dict _batches
    cdef bint _scheduled
    cdef public Py_ssize_t max_msg_size
    cdef public Py_ssize_t pending
    cdef public Py_ssize_t published
    cdef public Py_ssize_t flush_at
    cdef public Py_ssize_t flush_bytes
    cdef public bint lone_at_once

    def __init__(self, loop, flush, Py_ssize_t max_msg_size, Py_ssize_t flush_at=0, Py_ssize_t flush_bytes=0,
                 bint lone_at_once=False):
        self._create_future = loop.create_future
        self._call_soon = loop.call_soon
        self._flush = flush
        self._batches = {}
        self._scheduled = False
        self.max_msg_size = max_msg_size
        self.pending = 0
        self.published = 0
        self.flush_at = flush_at
        self.flush_bytes = flush_bytes
        self.lone_at_once = lone_at_once

    cpdef object add(self, object key, object body):
        cdef Py_ssize_t size = body_size(body)
        if size == 0:
            raise InvalidValueError("empty message body: nsqd rejects empty messages")
        if size > self.max_msg_size:
            raise InvalidValueError(f"message of {size} bytes exceeds max_msg_size {self.max_msg_size}")
        future = self._create_future()
        cdef Batch batch = self._batches.get(key)
        if batch is None:
            batch = _new_batch(self)
            self._batches[key] = batch
        batch.bodies.append(body)
        batch.futures.append(future)
        batch.nbytes += 4 + size
        self.pending += 1
        if (self.lone_at_once and self.pending == 1) or (self.flush_at and len(batch.bodies) >= self.flush_at) or (
            self.flush_bytes and batch.nbytes >= self.flush_bytes
        ):
            # Out now, not at the end of the pass: a publish with nothing else unanswered (as
            # Nagle's rule sends when nothing is unacknowledged: one task publishing in a loop
            # saves a loop pass per message, and what comes later in this pass still coalesces
            # behind it), or a full batch (nsqd starts on it while this pass goes on, the
            # waiters of the previous answer still being woken).
            del self._batches[key]
            self._flush({key: batch})
            return future
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self._run_flush)
        return future

    def _run_flush(self):
        self._scheduled = False
        batches = self._batches
        self._batches = {}
        self._flush(batches)
