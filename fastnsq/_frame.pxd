# The C-level interface of the codec, for other Cython modules to cimport.

from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t


cdef class Message:
    cdef readonly int64_t timestamp
    cdef readonly uint16_t attempts
    cdef char _id[16]
    cdef readonly bytes body
    cdef bint _ha
    cdef readonly int ext_version
    cdef readonly object ext_bytes
    cdef uint64_t _offset
    cdef uint32_t _raw_size
    cdef bint _has_offset
    cdef public object delegate
    cdef readonly object partition
    cdef readonly object address
    cdef bint _responded
    cdef bint _auto_response

    cdef object _check_open(self)
    cpdef finish(self)


cdef class MessageSink:
    # A consumer's end of one connection, as C code sees it: the FrameReader hands it each
    # message and Message.finish() lands in it, with no Python call in between.
    cdef int deliver(self, Message msg) except -1
    cdef int finish_message_c(self, Message msg) except -1


cdef class _SplitBuffer:
    cdef char* _buf
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _initial
    cdef Py_ssize_t _start
    cdef Py_ssize_t _end
    cdef Py_ssize_t _need
    cdef bint _paused

    cdef int _allocate(self, Py_ssize_t initial) except -1
    cdef int _make_room(self, Py_ssize_t want) except -1
    cdef int _split(self) except -1


cdef class FrameReader(_SplitBuffer):
    cdef object _on_message
    cdef MessageSink _sink
    cdef object _on_response
    cdef object _on_error
    cdef int _layout
    cdef public object delegate
    cdef public object partition
    cdef public object address
    cdef Py_ssize_t _max_frame_size

    cdef Message _decode_message(self, const char* data, Py_ssize_t n)


cdef class WriteBuffer:
    cdef char* _buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _initial
    cdef public Py_ssize_t max_msg_size
    cdef public Py_ssize_t max_body_size
    cdef public Py_ssize_t max_rdy_count
    cdef public Py_ssize_t max_req_timeout

    cdef _shrink(self)
    cdef int _reserve(self, Py_ssize_t extra) except -1
    cdef inline void _put(self, const char* data, Py_ssize_t n) noexcept
    cdef inline void _put_u32(self, uint32_t value) noexcept
    cdef int _put_decimal(self, uint64_t value) except -1
    cdef int _put_bytes(self, bytes data) except -1
    cdef int _put_id_command(self, const char* prefix, Py_ssize_t prefix_len, object message_id) except -1
    cdef int put_fin(self, Message msg) except -1
    cdef int _check_message(self, Py_ssize_t header, Py_ssize_t size) except -1
    cdef int _check_body_size(self, Py_ssize_t size, str what) except -1
    cdef int _put_body_command(self, bytes line, const char* prefix, Py_ssize_t prefix_len,
                               const char* body, Py_ssize_t size) except -1
    cdef _sub(self, bytes command, object topic, object channel, bytes suffix)
    cdef list _checked_batch(self, object items)
    cdef _mpub(self, bytes command, object topic, object partition, list prefixes, list bodies)


cdef class CommandReader(_SplitBuffer):
    cdef object _on_command
    cdef object _on_magic
    cdef public bint binary_ids
    cdef public Py_ssize_t max_line
    cdef public Py_ssize_t max_msg_size
    cdef public Py_ssize_t max_body_size
    cdef bint _stopped

    cdef int _split_one(self) except -1
