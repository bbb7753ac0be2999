# cython: language_level=3
"""A command written and its answer read on a blocking socket, the GIL given up once.

The blocking producer's threads publish on connections of their own (``_thread_publish``):
a write, then a read of nsqd's answer. Through the ``socket`` module each of the two
syscalls gives the GIL up and takes it back, and with many threads publishing at once
every taking back is a wait behind the others (a futex and a thread switch): half the
cost of a call. Here both syscalls run in one stretch without the GIL.

It knows nothing of NSQ. ``_blocking_py.py`` is the pure-Python twin with the same API.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EBADF, EINTR, errno
from libc.string cimport strerror

IMPLEMENTATION = "c"

cdef extern from *:
    """
    #include <sys/socket.h>
    #ifndef MSG_NOSIGNAL  /* macOS and the BSDs: SIGPIPE is ignored by Python anyway */
    #define MSG_NOSIGNAL 0
    #endif
    """
    ssize_t send(int fd, const void* data, size_t size, int flags) nogil
    ssize_t recv(int fd, void* into, size_t room, int flags) nogil
    int MSG_NOSIGNAL


def round_trip(object sock, bytes command, bytearray answer):
    """Write all of ``command`` to the blocking ``sock``, then read once into ``answer``:
    the count of bytes read (0: the peer closed). Raises OSError as ``socket`` does
    (BlockingIOError when SO_RCVTIMEO / SO_SNDTIMEO ran out); an interrupted syscall runs
    the signal handlers (Ctrl-C raises KeyboardInterrupt) and carries on, as PEP 475 says."""
    cdef int fd = sock.fileno()
    cdef const char* data = PyBytes_AS_STRING(command)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(command)
    cdef char* into = PyByteArray_AS_STRING(answer)
    cdef Py_ssize_t room = PyByteArray_GET_SIZE(answer)
    cdef Py_ssize_t sent = 0
    cdef ssize_t done = 0
    cdef int error = 0
    if fd < 0:
        raise OSError(EBADF, "the socket is closed")
    if room == 0:
        raise ValueError("answer has no room: a bytearray of at least one byte is needed")
    while True:
        with nogil:
            while sent < size:
                done = send(fd, data + sent, size - sent, MSG_NOSIGNAL)
                if done < 0:
                    error = errno
                    break
                sent += done
            if error == 0:
                done = recv(fd, into, room, 0)
                if done < 0:
                    error = errno
        if error == 0:
            return done
        if error != EINTR:
            raise OSError(error, strerror(error).decode())
        PyErr_CheckSignals()  # raises what a handler raised; else the syscall is tried again
        error = 0
