"""Every exception fastnsq raises, and the map from nsqd error codes to them.

Users import them from here (the commonest from ``fastnsq`` too), whichever module raises
them: ``docs/api/errors.md`` lists each with its parents and the calls that raise it, and
``tests/test_docs.py`` checks that no exception class of the package is missing there.

An nsqd error frame is ``"<CODE> <description>"``. Whether the server closes the
connection after it depends on the code, on the dialect (upstream nsqd or the HA
nsqd of youzan) and, on HA, on which command it answers (nsq's TCP protocol spec, youzan/nsq's ``nsqd/protocol_v2.go``).
:func:`is_fatal` encodes those rules; :func:`server_error` builds the exception.

This module is a leaf: it imports nothing from fastnsq, so every layer may use it.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BackgroundBufferFullError",
    "BadBodyError",
    "BadChannelError",
    "BadMessageError",
    "BadPartitionError",
    "BadProtocolError",
    "BadTopicError",
    "BodyDecompressError",
    "ConnectionClosedError",
    "CreateTopicFailedError",
    "DPubFailedError",
    "DataLossError",
    "ExtNotSupportError",
    "FinFailedError",
    "IdentifyFailedError",
    "InvalidError",
    "InvalidJsonHeaderError",
    "InvalidTraceIdError",
    "InvalidValueError",
    "LookupdError",
    "LookupdHTTPError",
    "MPubFailedError",
    "NSQError",
    "NoConnectionError",
    "NotLeaderError",
    "NotWritableError",
    "NsqdDown",
    "NsqdHTTPError",
    "ProtocolError",
    "PubFailedError",
    "PubTooMuchWaitingError",
    "PublishTimeoutError",
    "RangeReadError",
    "ReqFailedError",
    "ServerError",
    "SubExtendError",
    "SubFailedError",
    "SubOrderIsMustError",
    "TooManyConnectionsError",
    "TopicNotExistError",
    "TouchFailedError",
    "is_fatal",
    "server_error",
    "split_error",
]


class NSQError(Exception):
    """Base class of every fastnsq error."""


class ProtocolError(NSQError):
    """The server sent bytes that break the NSQ protocol; the connection is closed."""


class InvalidValueError(NSQError, ValueError):
    """User input (a name, a size, an option) was rejected before any byte was sent."""


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection closed before the command was answered.

    A publish that fails with this error may or may not have reached nsqd: the
    command was written but its ``OK`` never arrived.
    """


class PublishTimeoutError(NSQError, TimeoutError):
    """A publish was not acknowledged within its timeout (it may still arrive)."""


class NoConnectionError(NSQError, ConnectionError):
    """No nsqd could be reached for this command."""


class NsqdDown(NoConnectionError):
    """A publish while nsqd is down (``fail_fast``, the default): no open connection to the nsqd
    it needs, and the attempt to reach it made just now failed too (the message names each nsqd
    and that attempt's cause); the pool reconnects in the background. Catch
    :class:`NoConnectionError`, its parent, for every way of having no nsqd."""


class BackgroundBufferFullError(NSQError):
    """``publish_and_retry_background``: the retry buffer is full; this publish was not taken."""


class BodyDecompressError(NSQError):
    """A body marked as compressed could not be decompressed (the message is requeued)."""


class NsqdHTTPError(NSQError):
    """nsqd's HTTP API refused a request, or could not be reached."""


class LookupdError(NSQError):
    """nsqlookupd could not be reached, or answered something that is not a lookupd answer."""


class LookupdHTTPError(LookupdError):
    """nsqlookupd answered with an error: ``status`` is the HTTP (or wrapped) status code,
    ``message`` the server's error text (``{"message": ...}`` or the wrapper's ``status_txt``)."""

    def __init__(self, status: int, message: str, url: str = "") -> None:
        self.status = status
        self.message = message
        self.url = url
        where = f" from {url}" if url else ""
        super().__init__(f"nsqlookupd error{where}: HTTP {status} {message}".rstrip())


class DataLossError(NSQError):
    """Spark: messages a range should read are gone from the partition (retention removed them
    first), and ``failOnDataLoss`` is true."""


class RangeReadError(NSQError):
    """Spark: a range could not be read completely; Spark retries the task."""


class ServerError(NSQError):
    """An error frame from nsqd.

    ``code`` is the first token (``E_BAD_TOPIC``), ``description`` the rest, and
    ``fatal`` says whether the server closed the connection after sending it.
    """

    def __init__(self, code: str, description: str = "", fatal: bool = True) -> None:
        self.code = code
        self.description = description
        self.fatal = fatal
        super().__init__(code, description, fatal)

    def __str__(self) -> str:
        text = f"{self.code} {self.description}".rstrip()
        state = "the server closed the connection" if self.fatal else "the connection is kept"
        return f"{text} ({state})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.description!r}, fatal={self.fatal})"


class InvalidError(ServerError):
    """E_INVALID: a command the server could not accept in this state or form."""


class BadProtocolError(ServerError):
    """E_BAD_PROTOCOL: wrong magic."""


class BadBodyError(ServerError):
    """E_BAD_BODY."""


class BadTopicError(ServerError):
    """E_BAD_TOPIC."""


class BadChannelError(ServerError):
    """E_BAD_CHANNEL."""


class BadMessageError(ServerError):
    """E_BAD_MESSAGE: empty or oversized message."""


class PubFailedError(ServerError):
    """E_PUB_FAILED."""


class MPubFailedError(ServerError):
    """E_MPUB_FAILED."""


class DPubFailedError(ServerError):
    """E_DPUB_FAILED."""


class SubFailedError(ServerError):
    """E_SUB_FAILED."""


class FinFailedError(ServerError):
    """E_FIN_FAILED: usually the message timed out and was requeued already."""


class ReqFailedError(ServerError):
    """E_REQ_FAILED."""


class TouchFailedError(ServerError):
    """E_TOUCH_FAILED."""


class IdentifyFailedError(ServerError):
    """E_IDENTIFY_FAILED."""


class AuthError(ServerError):
    """E_AUTH_DISABLED, E_AUTH_FAILED, E_AUTH_FIRST, E_AUTH_ERROR, E_UNAUTHORIZED."""


class TopicNotExistError(ServerError):
    """HA: E_TOPIC_NOT_EXIST, the topic partition is not on this node."""


class NotLeaderError(ServerError):
    """HA: E_FAILED_ON_NOT_LEADER, this node does not lead the partition."""


class NotWritableError(ServerError):
    """HA: E_FAILED_ON_NOT_WRITABLE."""


class SubOrderIsMustError(ServerError):
    """HA: E_SUB_ORDER_IS_MUST, the topic only allows SUB_ORDERED."""


class SubExtendError(ServerError):
    """HA: E_SUB_EXTEND_NEED / E_SUB_EXTEND_FORBIDDON, extend_support does not match the topic."""


class BadPartitionError(ServerError):
    """HA: E_BAD_PARTITION."""


class ExtNotSupportError(ServerError):
    """HA: E_EXT_NOT_SUPPORT, an ext publish to a topic without ext headers."""


class InvalidJsonHeaderError(ServerError):
    """HA: E_INVALID_JSON_HEADER."""


class InvalidTraceIdError(ServerError):
    """HA: INVALID_TRACE_ID (sent without the ``E_`` prefix)."""


class PubTooMuchWaitingError(ServerError):
    """HA: E_PUB_TOO_MUCH_WAITING."""


class CreateTopicFailedError(ServerError):
    """HA: E_CREATE_TOPIC_FAILED."""


class TooManyConnectionsError(ServerError):
    """HA: "too much client connections" (sent without an ``E_`` code)."""


_CLASS_BY_CODE: dict[str, type[ServerError]] = {
    "E_INVALID": InvalidError,
    "E_BAD_PROTOCOL": BadProtocolError,
    "E_BAD_BODY": BadBodyError,
    "E_BAD_TOPIC": BadTopicError,
    "E_BAD_CHANNEL": BadChannelError,
    "E_BAD_MESSAGE": BadMessageError,
    "E_PUB_FAILED": PubFailedError,
    "E_MPUB_FAILED": MPubFailedError,
    "E_DPUB_FAILED": DPubFailedError,
    "E_SUB_FAILED": SubFailedError,
    "E_FIN_FAILED": FinFailedError,
    "E_REQ_FAILED": ReqFailedError,
    "E_TOUCH_FAILED": TouchFailedError,
    "E_IDENTIFY_FAILED": IdentifyFailedError,
    "E_AUTH_DISABLED": AuthError,
    "E_AUTH_FAILED": AuthError,
    "E_AUTH_FIRST": AuthError,
    "E_AUTH_ERROR": AuthError,
    "E_UNAUTHORIZED": AuthError,
    "E_TOPIC_NOT_EXIST": TopicNotExistError,
    "E_FAILED_ON_NOT_LEADER": NotLeaderError,
    "E_FAILED_ON_NOT_WRITABLE": NotWritableError,
    "E_SUB_ORDER_IS_MUST": SubOrderIsMustError,
    "E_SUB_EXTEND_NEED": SubExtendError,
    "E_SUB_EXTEND_FORBIDDON": SubExtendError,
    "E_BAD_PARTITION": BadPartitionError,
    "E_EXT_NOT_SUPPORT": ExtNotSupportError,
    "E_INVALID_JSON_HEADER": InvalidJsonHeaderError,
    "INVALID_TRACE_ID": InvalidTraceIdError,
    "E_PUB_TOO_MUCH_WAITING": PubTooMuchWaitingError,
    "E_CREATE_TOPIC_FAILED": CreateTopicFailedError,
    "too much client connections": TooManyConnectionsError,
}

_AUTH_CODES = ("E_AUTH_DISABLED", "E_AUTH_FAILED", "E_AUTH_FIRST", "E_AUTH_ERROR", "E_UNAUTHORIZED")

#: The codes upstream nsqd may answer a consumer's commands with (IDENTIFY, AUTH, SUB, RDY,
#: FIN, REQ, TOUCH, CLS), and a producer's (IDENTIFY, AUTH, PUB, MPUB, DPUB). The metrics show
#: each at 0 before its first error, so that a rate over them is 0, not empty.
CONSUMER_CODES = ("E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL", "E_IDENTIFY_FAILED", *_AUTH_CODES,
                  "E_SUB_FAILED", "E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED")
PRODUCER_CODES = ("E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_MESSAGE", "E_IDENTIFY_FAILED", *_AUTH_CODES,
                  "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED")
#: The codes only the HA dialect adds for a consumer (protocol.md §6.2).
HA_CONSUMER_CODES = ("E_TOPIC_NOT_EXIST", "E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE", "E_SUB_ORDER_IS_MUST",
                     "E_SUB_EXTEND_NEED", "E_SUB_EXTEND_FORBIDDON", "E_BAD_PARTITION")

#: The only codes after which upstream nsqd keeps the connection (protocol.md §6.1).
NON_FATAL_UPSTREAM = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})

#: HA codes that are non-fatal whatever command they answer (protocol.md §6.2).
NON_FATAL_HA = NON_FATAL_UPSTREAM | frozenset(
    {
        "E_CREATE_TOPIC_FAILED",
        "E_INVALID_JSON_HEADER",
        "INVALID_TRACE_ID",
        "E_EXT_NOT_SUPPORT",
        "E_PUB_FAILED",
        "E_MPUB_FAILED",
    }
)

#: HA codes that are non-fatal only when they answer a PUB-family command.
NON_FATAL_HA_FOR_PUB = frozenset({"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE"})

_TOO_MANY = "too much client connections"


def split_error(text: str) -> tuple[str, str]:
    """Split an error frame's text into (code, description).

    The description may be empty (HA sends ``"E_TOPIC_NOT_EXIST "`` with a trailing
    space) and one HA error has no code at all but a sentence.

    >>> split_error("E_FIN_FAILED FIN 00 failed ID not in flight")
    ('E_FIN_FAILED', 'FIN 00 failed ID not in flight')
    >>> split_error("E_TOPIC_NOT_EXIST ")
    ('E_TOPIC_NOT_EXIST', '')
    """
    if text.startswith(_TOO_MANY):
        return _TOO_MANY, text[len(_TOO_MANY):].strip()
    code, _, description = text.partition(" ")
    return code, description.strip()


def is_fatal(code: str, *, ha: bool = False, answers_publish: bool = False) -> bool:
    """Whether nsqd closes the connection after sending error ``code``.

    ``ha`` selects the HA dialect's rules; ``answers_publish`` says the error answers
    a PUB-family command (on HA, NOT_LEADER and NOT_WRITABLE are then non-fatal).

    >>> is_fatal("E_FIN_FAILED"), is_fatal("E_PUB_FAILED"), is_fatal("E_PUB_FAILED", ha=True)
    (False, True, False)
    """
    if not ha:
        return code not in NON_FATAL_UPSTREAM
    if code in NON_FATAL_HA:
        return False
    return not (answers_publish and code in NON_FATAL_HA_FOR_PUB)


def server_error(code: str, description: str = "", fatal: bool = True) -> ServerError:
    """Build the exception for an nsqd error frame.

    >>> server_error("E_BAD_TOPIC", "PUB topic name 'a b' is not valid")
    BadTopicError('E_BAD_TOPIC', "PUB topic name 'a b' is not valid", fatal=True)
    """
    return _CLASS_BY_CODE.get(code, ServerError)(code, description, fatal)
