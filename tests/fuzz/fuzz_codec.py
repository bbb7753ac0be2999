"""Differential, coverage-guided fuzzing of the codec with atheris (not part of the test run).

    python tests/fuzz/fuzz_codec.py -atheris_runs=2000000 tests/corpus/server_bytes

Each input is a layout byte, a chunk-size seed, then server bytes. Both implementations
(C and pure Python) decode it in the same chunks; they must produce the same frames, or
both raise ProtocolError, and nothing else may be raised. The command splitter of the
server side gets the same bytes. atheris instruments the Python twin for coverage.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from fastnsq import _frame_py

from fastnsq import _frame as _frame_c
from fastnsq.errors import ProtocolError

LAYOUTS = (0, 1, 3, 5, 7)


def decode(impl, data: bytes, layout: int, step: int) -> list:
    out: list = []

    def on_message(m):
        out.append(("m", m.timestamp, m.attempts, m.id, m.body, m.ext_version, m.ext_bytes, m.offset, m.raw_size))

    reader = impl.FrameReader(on_message, lambda d: out.append(("r", tuple(d) if isinstance(d, tuple) else bytes(d))),
                              lambda c, d: out.append(("e", c, d)), layout=layout, max_frame_size=1 << 16)
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
    except ProtocolError:
        out.append("protocol-error")
    assert reader.capacity <= 4 * (1 << 16) + 65536, "read buffer grew past the frame limit"
    return out


def split_commands(impl, data: bytes, step: int) -> list:
    out: list = []
    reader = impl.CommandReader(lambda n, p, b: out.append((n, p, b)), binary_ids=bool(step & 1), max_line=512)
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
    except ProtocolError:
        out.append("protocol-error")
    return out


def one_input(raw: bytes) -> None:
    if len(raw) < 2:
        return
    layout = LAYOUTS[raw[0] % len(LAYOUTS)]
    step = 1 + raw[1] % 64
    data = raw[2:]
    py = decode(_frame_py, data, layout, step)
    c = decode(_frame_c, data, layout, step)
    if py != c:
        raise AssertionError(f"C and Python decode differently: {py!r} != {c!r}")
    if split_commands(_frame_py, data, step) != split_commands(_frame_c, data, step):
        raise AssertionError("C and Python split commands differently")


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
