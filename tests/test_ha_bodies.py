"""Client-side body compression as youzan/go-nsq does it: gzip, snappy and lz4 marked in the ext header.

The codec on its own, then Producer -> HA nsqd -> Consumer on the embedded HA cluster and on a
real youzan cluster. (Bodies compressed by youzan/go-nsq itself, and the reverse: the interop
tests, tests/test_youzan_interop.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from fastnsq import Consumer, Producer, codec
from fastnsq.bodies import (
    COMPRESS_KEY,
    SIZE_KEY,
    BodyCompressor,
    BodyDecompressError,
    compress,
    decompress,
    decompress_message,
)
from fastnsq.errors import InvalidValueError

from .helpers import eventually, unique

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3}
#: Compressible, and big enough for the default threshold (20480).
BIG = b"".join(b"record %06d: the quick brown fox jumps over the lazy dog\n" % i for i in range(600))


@pytest.mark.parametrize("name", CODECS)
def test_each_codec_round_trips(name: str) -> None:
    number = CODECS[name]
    packed = compress(BIG, number)
    assert packed is not None and len(packed) < len(BIG) / 4
    assert decompress(packed, number, len(BIG)) == BIG


def test_snappy_and_lz4_are_block_formats() -> None:
    import cramjam

    assert bytes(cramjam.snappy.decompress_raw(compress(BIG, 2))) == BIG  # not the framed stream
    assert bytes(cramjam.lz4.decompress_block(compress(BIG, 3), output_len=len(BIG))) == BIG  # no size prefix
    assert compress(BIG, 1)[:2] == b"\x1f\x8b"  # gzip, not raw deflate


def test_an_lz4_body_that_does_not_shrink_goes_out_as_it_is() -> None:
    noise = os.urandom(30000)
    compressor = BodyCompressor(["t"], 100, "lz4")
    assert compressor.apply("t", noise, {"k": "v"}) == (noise, {"k": "v"})


def test_the_threshold_and_the_topics_decide() -> None:
    compressor = BodyCompressor(["t"], 20480, "gzip")
    assert compressor.apply("t", BIG[:20479], {}) == (BIG[:20479], {})
    assert compressor.apply("other", BIG, {}) == (BIG, {})
    body, ext = compressor.apply("t", BIG[:20480], {"k": "v"})
    assert ext == {"k": "v", COMPRESS_KEY: "1", SIZE_KEY: "20480"}
    assert decompress(body, 1, None) == BIG[:20480]


def test_bad_settings_name_the_option() -> None:
    with pytest.raises(InvalidValueError, match="client_compress_decodec must be one of"):
        BodyCompressor(["t"], 1, "zstd")
    with pytest.raises(InvalidValueError, match="message_size_for_compress must be an int >= 1"):
        BodyCompressor(["t"], 0, "gzip")
    with pytest.raises(InvalidValueError, match="topics_for_compress must be a list"):
        BodyCompressor("t", 1, "gzip")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="client_compress_decodec"):
        Producer(["127.0.0.1:4150"], client_compress_decodec="brotli")


def message_with(body: bytes, ext: dict[str, Any]) -> Any:
    return codec.Message(1, 1, bytes(16), body, ha=True, ext_version=4, ext_bytes=json.dumps(ext).encode())


@pytest.mark.parametrize("name", CODECS)
def test_a_marked_message_is_decompressed_and_loses_the_keys(name: str) -> None:
    message = message_with(compress(BIG, CODECS[name]), {"a": "1", COMPRESS_KEY: str(CODECS[name]),
                                                        SIZE_KEY: str(len(BIG))})
    assert decompress_message(message) is True
    assert message.body == BIG and message.ext == {"a": "1"}
    plain = message_with(b"plain", {"a": "1"})
    assert decompress_message(plain) is False and plain.body == b"plain"


def test_a_body_that_cannot_be_decompressed_is_an_error() -> None:
    with pytest.raises(BodyDecompressError, match="codec-1"):
        decompress_message(message_with(b"not gzip", {COMPRESS_KEY: "1", SIZE_KEY: "8"}))
    with pytest.raises(BodyDecompressError, match="unknown body codec number 7"):
        decompress_message(message_with(b"x", {COMPRESS_KEY: "7"}))


# ---- through the servers ------------------------------------------------------------------------


async def ext_topic(cluster: Any, *channels: str) -> str:
    topic = unique("zip")
    await cluster.create_topic(topic, partitions=2, ext=True, channels=list(channels))
    return topic


def consumer_on(cluster: Any, topic: str, channel: str, got: dict[bytes, Any], **options: Any) -> Consumer:
    def handle(message: Any) -> None:
        got[message.body] = message

    return Consumer(topic, channel, lookupd_http_addresses=cluster.lookupd_http_addresses, handler=handle,
                    max_in_flight=20, lookupd_poll_interval=0.5, **options)


@pytest.mark.parametrize("name", CODECS)
async def test_compressed_publishes_reach_the_handler_as_published(nsq_cluster_ha: Any, name: str) -> None:
    topic = await ext_topic(nsq_cluster_ha, "plain", "raw")
    bodies = [BIG + b"%d" % i for i in range(4)]
    small = b"under the threshold"
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        topics_for_compress=[topic], client_compress_decodec=name) as producer:
        for i, body in enumerate(bodies[:2]):
            await producer.publish(topic, body, ext={"k": f"v{i}"})
        await producer.mpublish(topic, bodies[2:], exts=[{"k": "v2"}, {"k": "v3"}])
        await producer.publish(topic, small, ext={"k": "small"})
        await producer.publish(topic, BIG + b"plain", partition=0)  # no ext header: not compressed
    got: dict[bytes, Any] = {}
    raw: dict[bytes, Any] = {}
    consumers = [consumer_on(nsq_cluster_ha, topic, "plain", got),
                 consumer_on(nsq_cluster_ha, topic, "raw", raw, disable_message_decompress=True)]
    for consumer in consumers:
        await consumer.start()
    await eventually(lambda: len(got) == 6 and len(raw) == 6, timeout=30)
    for consumer in consumers:
        await consumer.stop()
    for i, body in enumerate(bodies):
        assert got[body].ext == {"k": f"v{i}"}
    assert got[small].ext == {"k": "small"} and got[BIG + b"plain"].ext is None
    # Without decompression: the bytes on the wire and go-nsq's keys.
    packed = [m for b, m in raw.items() if b not in (small, BIG + b"plain")]
    assert len(packed) == 4
    for message in packed:
        ext = message.ext
        assert ext[COMPRESS_KEY] == str(CODECS[name]) and ext[SIZE_KEY] == str(len(BIG) + 1)
        assert decompress(message.body, CODECS[name], int(ext[SIZE_KEY])) in bodies
    assert all(state.decompress_errors == 0 for state in consumers[0].partitions.values())


async def test_a_body_marked_but_not_compressed_is_requeued_then_given_up(nsq_cluster_ha: Any) -> None:
    topic = await ext_topic(nsq_cluster_ha, "ch")
    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await producer.publish(topic, b"not gzip at all", ext={COMPRESS_KEY: "1", SIZE_KEY: "15"}, partition=0)
    given_up: list[Any] = []
    handled: list[Any] = []
    consumer = Consumer(topic, "ch", lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses,
                        handler=handled.append, max_attempts=2, default_requeue_delay=0, max_backoff_duration=0,
                        give_up_handler=given_up.append, lookupd_poll_interval=0.5)
    await consumer.start()
    await eventually(lambda: given_up, timeout=30)
    await asyncio.sleep(0.3)
    await consumer.stop()
    assert handled == []  # never handed a body it could not read
    # Attempts 1 and 2 requeued; the 3rd is past max_attempts: given up on, as it arrived.
    assert consumer.partitions[0].decompress_errors == 3
    assert given_up[0].body == b"not gzip at all"
