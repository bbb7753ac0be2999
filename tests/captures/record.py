"""Record the conversations from a real nsqd: its answers to the master recording's client side.

    python -m tests.captures.record --nsqd-tcp 127.0.0.1:4150 --nsqd-http 127.0.0.1:4151 \\
        --lookupd-http 127.0.0.1:4161 --out tests/captures/nsqd-v1.3.0 --server "nsqd v1.3.0"

(``python3 dev.py captures --real BIN_DIR`` starts fresh servers from a folder of
binaries and runs this, into ``nsqd-v1.3.0`` or ``nsqd-master`` by the server it finds.)
The nsqd must be fresh: no topic yet, registered with the lookupd. Every scenario of the
reference recording (``--reference``, by default ``tests/captures/nsqd-master``) is
replayed step by step (publish first, then consume, which reads what publish left, then
the others), what the server answers is written in the same format
(``tests/captures/README.md``), and :mod:`http_requests` asks the HTTP questions last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
from pathlib import Path
from typing import Any

from . import CAPTURES, http_requests
from .wire import FRAME_MESSAGE, Conversation, expected_frames, split_frames

FIRST = ["publish", "consume"]


def _frames_for_reading(data: bytes) -> list[dict[str, Any]]:
    """A plain decoding of ``data`` that stops where the bytes are no frame (a compressed stream).

    As in the reference recording: a message frame as its timestamp, attempts, id and
    body; any other frame as its data.
    """
    frames, _ = split_frames(data)
    out: list[dict[str, Any]] = []
    for kind, payload in frames:
        entry: dict[str, Any] = {"size": 4 + len(payload), "type": kind}
        if kind == FRAME_MESSAGE:
            timestamp, attempts = struct.unpack_from(">qH", payload)
            entry.update(
                timestamp=timestamp,
                attempts=attempts,
                id=payload[10:26].decode("latin-1"),
                body=payload[26:].decode("latin-1"),
            )
        else:
            entry["data"] = payload.decode("latin-1")
        out.append(entry)
    return out


def _reference_names(reference: Path) -> list[str]:
    return sorted(p.stem for p in reference.glob("*.json") if p.stem != "http")


def _load_reference(reference: Path, name: str) -> dict[str, Any]:
    recording: dict[str, Any] = json.loads((reference / f"{name}.json").read_text())
    return recording


async def record_scenario(reference: dict[str, Any], name: str, nsqd_tcp: str, server: str) -> dict[str, Any]:
    """Replay the client side of ``reference`` (scenario ``name``) and return the new recording."""
    wanted = iter(expected_frames(reference))
    conversation = await Conversation.open(nsqd_tcp, reference)
    steps: list[dict[str, Any]] = []
    try:
        for step in reference["steps"]:
            if "send" in step:
                sent = await conversation.send(bytes.fromhex(step["send"]))
                steps.append({"send": sent.hex(), "text": sent.decode("latin-1"), "why": step.get("why", "")})
                continue
            recorded_frames = next(wanted)
            data, frames, closed = await conversation.receive(len(recorded_frames), bool(step.get("eof")))
            conversation.learn_ids(recorded_frames, frames)
            entry: dict[str, Any] = {"recv": data.hex(), "why": step.get("why", "")}
            entry["frames"] = _frames_for_reading(data)
            if closed:
                entry["eof"] = True
            steps.append(entry)
    finally:
        await conversation.close()
    note = reference.get("note", "").split(" [recorded from ")[0]
    return {
        "scenario": name,
        "note": f"{note} [recorded from {server} by tests/captures/record.py, "
        f"replaying the client side of tests/captures/nsqd-master/{name}.json]",
        "variable": reference.get("variable", []),
        "steps": steps,
    }


async def record(
    nsqd_tcp: str, nsqd_http: str, lookupd_http: str, out: Path, server: str, reference: Path = CAPTURES
) -> None:
    # Every reference scenario is read before the first write: --out may be the reference itself.
    scenarios = _reference_names(reference)
    references = {name: _load_reference(reference, name) for name in scenarios}
    out.mkdir(parents=True, exist_ok=True)
    names = FIRST + [n for n in scenarios if n not in FIRST]
    for name in names:
        recording = await record_scenario(references[name], name, nsqd_tcp, server)
        (out / f"{name}.json").write_text(json.dumps(recording, indent=1) + "\n")
        print(f"recorded {name}: {sum('recv' in s for s in recording['steps'])} answers", flush=True)
    answers = await http_requests.run(nsqd_tcp, nsqd_http, lookupd_http)
    (out / "http.json").write_text(json.dumps(answers, indent=1) + "\n")
    print(f"recorded http: {len(answers)} answers from {server} into {out}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nsqd-tcp", required=True)
    parser.add_argument("--nsqd-http", required=True)
    parser.add_argument("--lookupd-http", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--server", default="a real nsqd", help="what to call the server in the notes")
    parser.add_argument("--reference", type=Path, default=CAPTURES,
                        help="the recording whose client side is replayed (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.reference.is_dir():
        parser.error(f"the reference recording {args.reference} is missing")
    asyncio.run(record(args.nsqd_tcp, args.nsqd_http, args.lookupd_http, args.out, args.server, args.reference))


if __name__ == "__main__":
    main()
