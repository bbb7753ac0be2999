"""Differential, coverage-guided fuzzing of the codec with atheris (not part of the test run).

    python tests/fuzz/fuzz_codec.py -atheris_runs=2000000 tests/corpus/server_bytes
    python tests/fuzz/run_fuzz.py --runs 10000000      # the recorded run (counts in bench/results/)

Each input's first byte picks a target:

* **server bytes** (frames and messages in every layout: upstream hex ids, youzan's
  binary ids, the ext header, SUB_ORDERED/SUB_ADVANCED's offset and size): a layout
  byte, a chunk-size seed, then the bytes. Both implementations (C and pure Python)
  decode them in the same chunks; they must produce the same frames, or both raise
  ProtocolError, and nothing else may be raised; the read buffer stays bounded.
* **client bytes**: the server side's command splitter (upstream and binary ids) gets
  them in chunks; same rule.
* **commands**: one encoder of either dialect (PUB, MPUB, DPUB, SUB, SUB_ORDERED,
  SUB_ADVANCED, RDY, FIN, REQ, TOUCH, AUTH, IDENTIFY, PUB_TRACE, PUB_EXT, MPUB_TRACE,
  MPUB_EXT, INTERNAL_CREATE_TOPIC) with fuzzed arguments and limits: both must write the
  same bytes or raise the same exception type (with several bad arguments the two may
  name a different one first); what they write must split back the same way with the
  server side's splitter.

atheris instruments the Python twin for coverage; the C extension is compared to it.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from fastnsq import _frame_py

from fastnsq import _frame as _frame_c
from fastnsq.errors import ProtocolError

LAYOUTS = (0, 1, 3, 5, 7)
MAX_FRAME = 1 << 16
IMPLEMENTATIONS = (_frame_py, _frame_c)


def decode(impl, data: bytes, layout: int, step: int) -> list:
    out: list = []

    def on_message(m):
        out.append(("m", m.timestamp, m.attempts, m.id, m.body, m.ext_version, m.ext_bytes, m.offset, m.raw_size))

    reader = impl.FrameReader(on_message, lambda d: out.append(("r", tuple(d) if isinstance(d, tuple) else bytes(d))),
                              lambda c, d: out.append(("e", c, d)), layout=layout, max_frame_size=MAX_FRAME)
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
    except ProtocolError:
        out.append("protocol-error")
    assert reader.capacity <= 4 * MAX_FRAME + 65536, "read buffer grew past the frame limit"
    return out


def split_commands(impl, data: bytes, step: int, binary_ids: bool) -> list:
    out: list = []
    reader = impl.CommandReader(lambda n, p, b: out.append((n, p, b)), binary_ids=binary_ids, max_line=512)
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
    except ProtocolError:
        out.append("protocol-error")
    return out


# ---- commands -------------------------------------------------------------------------------------


def _name(fdp: atheris.FuzzedDataProvider) -> str:
    """Mostly valid names (so the encoders get past validation), sometimes anything."""
    if fdp.ConsumeIntInRange(0, 7) == 0:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 70))
    alphabet = "abcXYZ09._-#"
    size = fdp.ConsumeIntInRange(0, 66)
    raw = fdp.ConsumeBytes(size)
    name = "".join(alphabet[b % len(alphabet)] for b in raw)
    return name + ("#ephemeral" if fdp.ConsumeBool() else "")


def _int(fdp: atheris.FuzzedDataProvider) -> int:
    choice = fdp.ConsumeIntInRange(0, 3)
    if choice == 0:
        return fdp.ConsumeIntInRange(-2, 3000)
    if choice == 1:
        return fdp.ConsumeIntInRange(-(2**63), 2**64)
    return fdp.ConsumeIntInRange(0, 2**32)


def _partition(fdp: atheris.FuzzedDataProvider) -> int | None:
    return None if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-3, 70000)


def _body(fdp: atheris.FuzzedDataProvider) -> bytes:
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))


def _message_id(fdp: atheris.FuzzedDataProvider) -> bytes:
    return fdp.ConsumeBytes(fdp.PickValueInList([16, 16, 16, 15, 17, 0]))


def command_call(fdp: atheris.FuzzedDataProvider) -> tuple[dict, str, tuple]:
    """(WriteBuffer limits, encoder name, arguments) drawn from the input."""
    limits = {"max_msg_size": fdp.ConsumeIntInRange(1, 400), "max_body_size": fdp.ConsumeIntInRange(1, 2000),
              "max_rdy_count": fdp.ConsumeIntInRange(0, 3000), "max_req_timeout": fdp.ConsumeIntInRange(0, 10**7)}
    kind = fdp.ConsumeIntInRange(0, 18)
    if kind == 0:
        return limits, "pub", (_name(fdp), _body(fdp), _partition(fdp))
    if kind == 1:
        return limits, "mpub", (_name(fdp), [_body(fdp) for _ in range(fdp.ConsumeIntInRange(0, 5))], _partition(fdp))
    if kind == 2:
        return limits, "dpub", (_name(fdp), _int(fdp), _body(fdp))
    if kind == 3:
        return limits, "sub", (_name(fdp), _name(fdp), _partition(fdp))
    if kind == 4:
        return limits, "sub_ordered", (_name(fdp), _name(fdp), fdp.ConsumeIntInRange(-2, 70000))
    if kind == 5:
        return limits, "sub_advanced", (_name(fdp), _name(fdp), fdp.ConsumeIntInRange(-2, 70000))
    if kind == 6:
        return limits, "rdy", (_int(fdp),)
    if kind == 7:
        return limits, "fin", (_message_id(fdp),)
    if kind == 8:
        return limits, "req", (_message_id(fdp), _int(fdp))
    if kind == 9:
        return limits, "touch", (_message_id(fdp),)
    if kind == 10:
        return limits, "auth", (_body(fdp),)
    if kind == 11:
        return limits, "identify", (_body(fdp),)
    if kind == 12:
        return limits, "pub_trace", (_name(fdp), _partition(fdp), _int(fdp), _body(fdp))
    if kind == 13:
        return limits, "pub_ext", (_name(fdp), _partition(fdp), _body(fdp), _body(fdp))
    if kind == 14:
        items = [(_int(fdp), _body(fdp)) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        return limits, "mpub_trace", (_name(fdp), _partition(fdp), items)
    if kind == 15:
        items = [(_body(fdp), _body(fdp)) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        return limits, "mpub_ext", (_name(fdp), _partition(fdp), items)
    if kind == 16:
        return limits, "internal_create_topic", (_name(fdp), fdp.ConsumeIntInRange(-2, 70000),
                                                 fdp.PickValueInList([None, True, False]))
    if kind == 17:
        return limits, "cls", ()
    return limits, "nop", ()


def encode(impl, limits: dict, name: str, args: tuple) -> tuple:
    out = impl.WriteBuffer(**limits)
    try:
        getattr(out, name)(*args)
    except Exception as exc:  # noqa: BLE001 - compared between the two implementations by type
        return ("raised", type(exc).__name__)
    return ("wrote", out.take())


def check_commands(raw: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(raw)
    limits, name, args = command_call(fdp)
    py, c = (encode(impl, limits, name, args) for impl in IMPLEMENTATIONS)
    if py != c:
        raise AssertionError(f"C and Python encode {name}{args!r} differently: {py!r} != {c!r}")
    if py[0] == "wrote":
        binary = name in ("fin", "req", "touch") and bool(args[0]) and not args[0].isascii()
        if split_commands(_frame_py, py[1], 7, binary) != split_commands(_frame_c, py[1], 7, binary):
            raise AssertionError(f"C and Python split what {name} wrote differently")


# ---- the entry ---------------------------------------------------------------------------------


def check_frames(raw: bytes) -> None:
    layout = LAYOUTS[raw[0] % len(LAYOUTS)]
    step = 1 + raw[1] % 64
    data = raw[2:]
    py = decode(_frame_py, data, layout, step)
    c = decode(_frame_c, data, layout, step)
    if py != c:
        raise AssertionError(f"C and Python decode differently: {py!r} != {c!r}")


def check_command_stream(raw: bytes) -> None:
    step = 1 + raw[0] % 64
    binary = bool(raw[1] & 1)
    data = raw[2:]
    if split_commands(_frame_py, data, step, binary) != split_commands(_frame_c, data, step, binary):
        raise AssertionError("C and Python split commands differently")


TARGETS = (check_frames, check_frames, check_command_stream, check_commands)


def one_input(raw: bytes) -> None:
    if len(raw) < 3:
        return
    TARGETS[raw[0] % len(TARGETS)](raw[1:])


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
