"""Client-side body compression of youzan/go-nsq: gzip, snappy and lz4 bodies marked in the ext header.

One job: compress a body before it is published and decompress it when it arrives,
exactly as youzan/go-nsq does (``compress.go``; ``producer.go`` compress; ``message.go``
tryDecompress and removeCompressHeader), so that each side reads the other's messages:

* a producer compresses the body of a publish that carries a JSON ext header when its topic
  is one of ``topics_for_compress`` and the body has at least ``message_size_for_compress``
  bytes (20480), with ``client_compress_decodec`` ("gzip", "snappy" or "lz4"), and adds
  ``"nsq.client.compress": "<codec no>"`` (1 gzip, 2 snappy, 3 lz4) and ``"nsq.msg.size":
  "<original size>"`` to the header. snappy and lz4 are *block* formats, not framed; an lz4
  body that does not shrink is sent as it is, without the keys (go-nsq's ErrNotCompressible);
* a consumer that finds the two keys decompresses the body and removes the keys from the
  header (unless ``disable_message_decompress``), so the handler sees what was published.

This is not the connection's snappy/deflate stream (:mod:`fastnsq.compression`), which
compresses everything on one TCP connection and which the server itself negotiates.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import BodyDecompressError, InvalidValueError

__all__ = [
    "CODECS",
    "COMPRESS_KEY",
    "SIZE_KEY",
    "BodyCompressor",
    "BodyDecompressError",
    "compress",
    "decompress",
    "decompress_message",
]

COMPRESS_KEY = "nsq.client.compress"
SIZE_KEY = "nsq.msg.size"
#: go-nsq's codec names and the numbers the header carries.
CODECS: dict[str, int] = {"not_specified": 0, "gzip": 1, "snappy": 2, "lz4": 3}
DEFAULT_MESSAGE_SIZE_FOR_COMPRESS = 20480
# go-nsq's guess of the original size when the header lacks it (COMPRESS_RATIO_WILD_GUESS).
_WILD_GUESS = 10
_MARKER = COMPRESS_KEY.encode()


def _cramjam() -> Any:
    # Imported on first use: `import fastnsq` stays light (tests/test_startup.py).
    import cramjam

    return cramjam


def compress(body: bytes, codec: int) -> bytes | None:
    """``body`` compressed with codec number ``codec``; None when lz4 cannot shrink it."""
    if codec == 1:
        return gzip.compress(body)
    if codec == 2:
        return bytes(_cramjam().snappy.compress_raw(body))
    if codec == 3:
        packed = bytes(_cramjam().lz4.compress_block(body, store_size=False))
        return packed if len(packed) < len(body) else None
    raise InvalidValueError(f"unknown body codec number {codec}")


def decompress(body: bytes, codec: int, original_size: int | None) -> bytes:
    """Undo :func:`compress`; ``original_size`` bounds an lz4 block (go-nsq's wild guess without it)."""
    try:
        if codec == 1:
            return gzip.decompress(body)
        if codec == 2:
            return bytes(_cramjam().snappy.decompress_raw(body))
        if codec == 3:
            size = original_size if original_size is not None else len(body) * _WILD_GUESS
            return bytes(_cramjam().lz4.decompress_block(body, output_len=size))
    except Exception as exc:  # each codec raises its own kinds
        raise BodyDecompressError(f"cannot decompress a codec-{codec} body of {len(body)} bytes: {exc}") from exc
    raise BodyDecompressError(f"unknown body codec number {codec}")


def decompress_message(message: Any) -> bool:
    """Decompress ``message`` in place if its ext header says it is compressed; True if it was.

    The header loses the two keys (as youzan/go-nsq's consumer removes them). Raises
    :class:`BodyDecompressError` for a header or body that cannot be read.
    """
    raw = message.ext_bytes
    if raw is None or _MARKER not in raw:
        return False
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise BodyDecompressError(f"the ext header of a compressed body is not JSON: {exc}") from None
    if not isinstance(header, dict) or not header.get(COMPRESS_KEY):
        return False
    try:
        codec = int(header[COMPRESS_KEY])
        size = int(header[SIZE_KEY]) if SIZE_KEY in header else None
    except (TypeError, ValueError):
        raise BodyDecompressError(f"bad compression keys in the ext header: {raw[:200]!r}") from None
    body = decompress(message.body, codec, size)
    del header[COMPRESS_KEY]
    header.pop(SIZE_KEY, None)
    message._replace_body(body, json.dumps(header, separators=(",", ":")).encode())
    return True


class BodyCompressor:
    """A producer's compression settings (go-nsq's names); :meth:`apply` for each ext publish.

    >>> compressor = BodyCompressor(["events"], 4, "snappy")
    >>> body, ext = compressor.apply("events", b"aaaaaaaa", {"k": "v"})
    >>> ext["nsq.client.compress"], ext["nsq.msg.size"], len(body) < 8
    ('2', '8', True)
    """

    def __init__(self, topics_for_compress: Iterable[str], message_size_for_compress: int, codec: str) -> None:
        if isinstance(topics_for_compress, str) or not all(isinstance(t, str) for t in topics_for_compress):
            raise InvalidValueError(f"topics_for_compress must be a list of topic names, got {topics_for_compress!r}")
        self.topics = frozenset(topics_for_compress)
        if isinstance(message_size_for_compress, bool) or not isinstance(message_size_for_compress, int) \
                or message_size_for_compress < 1:
            raise InvalidValueError(
                f"message_size_for_compress must be an int >= 1, got {message_size_for_compress!r}")
        self.threshold = message_size_for_compress
        if codec not in CODECS:
            raise InvalidValueError(f"client_compress_decodec must be one of {sorted(CODECS)}, got {codec!r}")
        self.codec = CODECS[codec]

    @property
    def active(self) -> bool:
        return bool(self.topics) and self.codec != 0

    def applies(self, topic: str, size: int) -> bool:
        return self.codec != 0 and topic in self.topics and size >= self.threshold

    def apply(self, topic: str, body: Any, ext: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
        """``(body, ext)`` to publish: compressed and marked when the rules say so, else as given."""
        data = body.encode() if isinstance(body, str) else bytes(body)
        if not self.applies(topic, len(data)):
            return body, ext
        packed = compress(data, self.codec)
        if packed is None:
            return body, ext
        marked = dict(ext)
        marked[COMPRESS_KEY] = str(self.codec)
        marked[SIZE_KEY] = str(len(data))
        return packed, marked
