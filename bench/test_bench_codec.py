"""Codec micro-benchmarks, C against the pure-Python twin (pytest-benchmark).

    python -m pytest bench/test_bench_codec.py --benchmark-columns=mean,ops \
        --benchmark-json=bench/results/codec.json

Each round decodes or encodes BATCH items; ops/s x BATCH is items per second.
``bench/codec_report.py`` turns the JSON into the per-item table quoted in the README.
"""

from __future__ import annotations

import pytest

from fastnsq import _frame_py

try:
    from fastnsq import _frame as _frame_c
except ImportError:  # pragma: no cover
    _frame_c = None

BATCH = 10_000
BODY = bytes(range(100))
IMPLS = [pytest.param(m, id=m.IMPLEMENTATION) for m in (_frame_c, _frame_py) if m is not None]


def _stream(codec) -> list[bytes]:
    """BATCH message frames with 100-byte bodies, cut into 64 KiB reads as a socket gives them."""
    data = b"".join(codec.encode_message(1700000000000000000, 1, b"%016x" % i, BODY) for i in range(BATCH))
    return [data[i : i + 65536] for i in range(0, len(data), 65536)]


@pytest.mark.parametrize("codec", IMPLS)
def test_decode_messages(benchmark, codec):
    chunks = _stream(codec)
    benchmark.extra_info["items_per_round"] = BATCH

    def run():
        messages = []
        reader = codec.FrameReader(messages.append, None, None)
        for chunk in chunks:
            while chunk:  # as the event loop does: fill the free tail, report, repeat
                view = reader.get_buffer(65536)
                n = min(len(view), len(chunk))
                view[:n] = chunk[:n]
                reader.buffer_updated(n)
                chunk = chunk[n:]
        assert len(messages) == BATCH
        return messages

    benchmark(run)


@pytest.mark.parametrize("codec", IMPLS)
def test_encode_fin(benchmark, codec):
    messages = []
    reader = codec.FrameReader(messages.append, None, None)
    for chunk in _stream(codec):
        reader.feed(chunk)
    writer = codec.WriteBuffer()
    fin = writer.fin
    benchmark.extra_info["items_per_round"] = BATCH

    def run():
        for message in messages:
            fin(message)
        return writer.take()

    assert len(benchmark(run)) == 21 * BATCH


@pytest.mark.parametrize("codec", IMPLS)
def test_encode_pub(benchmark, codec):
    writer = codec.WriteBuffer()
    pub = writer.pub
    benchmark.extra_info["items_per_round"] = BATCH

    def run():
        for _ in range(BATCH):
            pub("events", BODY)
        return writer.take()

    assert len(benchmark(run)) == (len("PUB events\n") + 4 + 100) * BATCH


@pytest.mark.parametrize("codec", IMPLS)
def test_encode_mpub_200(benchmark, codec):
    writer = codec.WriteBuffer()
    batch = [BODY] * 200
    benchmark.extra_info["items_per_round"] = 200 * (BATCH // 200)

    def run():
        for _ in range(BATCH // 200):
            writer.mpub("events", batch)
        return writer.take()

    benchmark(run)
