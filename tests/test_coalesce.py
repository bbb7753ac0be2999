"""The producer's coalescing of publishes, both implementations (C and the Python twin)."""

from __future__ import annotations

import asyncio

import pytest

from fastnsq import _coalesce_py
from fastnsq.errors import ConnectionClosedError, InvalidValueError

from .conftest import NO_EXTENSIONS

try:
    from fastnsq import _coalesce as _coalesce_c
except ImportError:  # pragma: no cover
    _coalesce_c = None

IMPLS = [pytest.param(m, id=m.IMPLEMENTATION) for m in (_coalesce_c, _coalesce_py) if m is not None]


def test_default_coalescer_is_the_c_extension():
    from fastnsq import codec

    expected = "fastnsq._coalesce_py" if NO_EXTENSIONS else "fastnsq._coalesce"
    assert codec.Coalescer.__module__ == expected


@pytest.mark.parametrize("impl", IMPLS)
async def test_one_flush_per_loop_pass_one_batch_per_key(impl):
    loop = asyncio.get_running_loop()
    flushed: list[dict] = []
    coalescer = impl.Coalescer(loop, flushed.append, 100)  # lone_at_once off: the pass decides alone
    a = [coalescer.add("t", b"x%d" % i) for i in range(3)]
    b = coalescer.add(("t", "nsqd:4150", 2), "é")
    assert coalescer.pending == 4 and not flushed
    await asyncio.sleep(0)
    assert len(flushed) == 1
    batches = flushed[0]
    assert list(batches) == ["t", ("t", "nsqd:4150", 2)]
    assert batches["t"].bodies == [b"x0", b"x1", b"x2"] and len(batches["t"]) == 3
    assert batches["t"].nbytes == 4 + 3 * (4 + 2)
    assert batches[("t", "nsqd:4150", 2)].nbytes == 4 + 4 + 2  # UTF-8 length of "é"
    sent = loop.create_future()
    sent.add_done_callback(batches["t"].resolve)
    sent.set_result(b"OK")
    batches[("t", "nsqd:4150", 2)].fail(ConnectionClosedError("gone"))
    assert await asyncio.gather(*a) == [b"OK"] * 3
    with pytest.raises(ConnectionClosedError):
        await b
    assert coalescer.pending == 0 and coalescer.published == 3


@pytest.mark.parametrize("impl", IMPLS)
async def test_a_lone_publish_goes_out_at_once_and_the_rest_of_the_pass_behind_it(impl):
    loop = asyncio.get_running_loop()
    flushed: list[dict] = []
    coalescer = impl.Coalescer(loop, flushed.append, 100, lone_at_once=True)
    first = coalescer.add("t", b"a")
    assert len(flushed) == 1 and flushed[0]["t"].bodies == [b"a"]  # nothing else unanswered: at once
    rest = [coalescer.add("t", b"b%d" % i) for i in range(3)]
    assert len(flushed) == 1  # the first is unanswered: these wait for the end of the pass
    await asyncio.sleep(0)
    assert len(flushed) == 2 and flushed[1]["t"].bodies == [b"b0", b"b1", b"b2"]
    flushed[0]["t"].set_result(b"OK")
    flushed[1]["t"].set_result(b"OK")
    assert await asyncio.gather(first, *rest) == [b"OK"] * 4 and coalescer.pending == 0
    again = coalescer.add("t", b"c")  # all answered again: at once
    assert len(flushed) == 3 and flushed[2]["t"].bodies == [b"c"]
    flushed[2]["t"].set_result(b"OK")
    assert await again == b"OK"


@pytest.mark.parametrize("impl", IMPLS)
async def test_a_failed_command_fails_every_publish_of_its_batch(impl):
    loop = asyncio.get_running_loop()
    flushed: list[dict] = []
    coalescer = impl.Coalescer(loop, flushed.append, 100)
    futures = [coalescer.add("t", b"m") for _ in range(5)]
    futures[1].cancel()  # a caller gave up: the others still get the answer
    await asyncio.sleep(0)
    sent = loop.create_future()
    sent.add_done_callback(flushed[0]["t"].resolve)
    sent.set_exception(ConnectionClosedError("reset"))
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError)
    assert all(isinstance(r, ConnectionClosedError) for i, r in enumerate(results) if i != 1)
    assert coalescer.pending == 0 and coalescer.published == 0


@pytest.mark.parametrize("impl", IMPLS)
async def test_split_respects_bytes_and_count(impl):
    loop = asyncio.get_running_loop()
    flushed: list[dict] = []
    coalescer = impl.Coalescer(loop, flushed.append, 1000)
    futures = [coalescer.add("t", b"y" * 96) for _ in range(10)]  # 100 bytes each with the length
    await asyncio.sleep(0)
    parts = flushed[0]["t"].split(4 + 300, 100)
    assert [len(p) for p in parts] == [3, 3, 3, 1]
    parts = flushed[0]["t"].split(10_000, 4)
    assert [len(p) for p in parts] == [4, 4, 2]
    for part in parts:
        part.fail(ConnectionClosedError("x"))
    assert all(f.done() for f in futures) and coalescer.pending == 0


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("body, words", [(b"", "empty message body"), (b"z" * 11, "exceeds max_msg_size 10"),
                                          (42, "must be bytes")])
async def test_bad_bodies_are_refused_before_batching(impl, body, words):
    coalescer = impl.Coalescer(asyncio.get_running_loop(), lambda batches: None, 10)
    with pytest.raises(InvalidValueError, match=words):
        coalescer.add("t", body)
    assert coalescer.pending == 0


@pytest.mark.parametrize("impl", IMPLS)
async def test_a_full_batch_is_flushed_at_once(impl):
    loop = asyncio.get_running_loop()
    flushed: list[dict] = []
    coalescer = impl.Coalescer(loop, flushed.append, 100, 3, 1000)
    for i in range(4):
        coalescer.add("t", b"m%d" % i)
    assert len(flushed) == 1 and flushed[0]["t"].bodies == [b"m0", b"m1", b"m2"]  # at once, not at the pass's end
    await asyncio.sleep(0)
    assert len(flushed) == 2 and flushed[1]["t"].bodies == [b"m3"]  # the rest at the end of the pass
    by_bytes = impl.Coalescer(loop, flushed.append, 100, 0, 4 + 2 * (4 + 50))
    by_bytes.add("u", b"x" * 50)
    assert len(flushed) == 2
    by_bytes.add("u", b"y" * 50)
    assert len(flushed) == 3 and len(flushed[2]["u"]) == 2
