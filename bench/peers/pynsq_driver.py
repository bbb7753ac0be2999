"""Benchmark driver for pynsq (the official Python client, on Tornado): one workload, one ``RESULT`` line.

pynsq's API is callbacks on Tornado's IOLoop, which runs on the asyncio loop
(uvloop with ``--loop uvloop``). How each workload maps onto it:

* pub: ``--concurrency`` independent callback chains: each calls
  ``writer.pub(topic, body, callback)`` and publishes its next message from that
  callback, so 1,000 publishes are outstanding at any time, as with 1,000
  callers. pynsq pipelines them on the connection and matches the answers in order.
* mpub: the same chains with ``writer.mpub(topic, bodies, callback)``.
* consume: ``nsq.Reader(topic, channel, message_handler=handler,
  max_in_flight=...)`` with a trivial handler returning True (FIN).
"""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

CLIENT = "pynsq"


async def _connected_writer(args):
    import nsq

    writer = nsq.Writer([args.nsqd_tcp_address])
    for _ in range(500):  # the Writer connects in the background
        if writer.conns:
            return writer
        await asyncio.sleep(0.01)
    raise RuntimeError("pynsq Writer did not connect within 5 s")


async def _publish_chains(args, meter, send):
    """``--concurrency`` chains of ``send(n, callback)``; returns when none is outstanding.

    A chain claims its messages from the meter in chunks (``_common.CHUNK`` single
    publishes, or one MPUB batch) and counts them when the chunk is done, so the
    harness's bookkeeping costs pynsq as little as it costs the other clients.
    """
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    state = {"outstanding": 0, "errors": 0, "first_error": None}
    per_send = 1 if args.workload == "pub" else args.batch
    chunk = _common.CHUNK if args.workload == "pub" else args.batch

    def start_chunk():
        claimed = meter.claim(chunk)
        if claimed:
            state["outstanding"] += 1
            step([claimed, 0])  # [messages claimed, messages acknowledged]
        elif state["outstanding"] == 0 and not finished.done():
            finished.set_result(None)

    def step(chain):
        n = min(per_send, chain[0] - chain[1])
        send(n, lambda conn, data: on_answer(chain, n, data))

    def on_answer(chain, n, data):
        if isinstance(data, Exception):
            state["errors"] += 1
            state["first_error"] = state["first_error"] or repr(data)
        chain[1] += n
        if chain[1] < chain[0]:
            step(chain)
            return
        state["outstanding"] -= 1
        meter.add(chain[0])
        start_chunk()

    for _ in range(args.concurrency):
        start_chunk()
    await finished
    meter.close_window()
    if state["errors"]:
        raise RuntimeError(f"{state['errors']} publishes failed, first: {state['first_error']}")


async def run_pub(args, meter, loop_name):
    writer = await _connected_writer(args)
    payload = _common.body(args.size)
    await _publish_chains(args, meter, lambda n, callback: writer.pub(args.topic, payload, callback=callback))
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="pub", variant="writer.pub(callback) chains",
        loop=loop_name, end="the OK of the last publish",
        settings={"concurrency": args.concurrency, "warmup": args.warmup},
        notes="callback API: each of the concurrent chains publishes its next message from the previous one's callback",
    )


async def run_mpub(args, meter, loop_name):
    writer = await _connected_writer(args)
    payload = _common.body(args.size)
    await _publish_chains(args, meter, lambda n, callback: writer.mpub(args.topic, [payload] * n, callback=callback))
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="mpub", variant=f"batches of {args.batch}",
        loop=loop_name, end="the OK of the last MPUB",
        settings={"batch": args.batch, "concurrency": args.concurrency, "warmup": args.warmup},
    )


async def run_consume(args, meter, loop_name):
    import nsq

    loop = asyncio.get_running_loop()
    all_done = loop.create_future()
    meter.on_all_done = lambda: all_done.done() or all_done.set_result(None)
    add = meter.add

    def handler(message):
        add()
        return True

    reader = nsq.Reader(
        args.topic, args.channel, message_handler=handler, nsqd_tcp_addresses=[args.nsqd_tcp_address],
        max_in_flight=args.max_in_flight,
    )
    while not all_done.done():
        await asyncio.wait({all_done}, timeout=0.05)
        if meter.past_deadline():
            break
    end = await _common.end_of_consume(meter, args)
    meter.close_window()
    reader.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="consume", variant="Reader(message_handler=sync)",
        loop=loop_name, end=end, settings={"max_in_flight": args.max_in_flight, "warmup": args.warmup},
    )


def main() -> None:
    import tornado

    _common.run_asyncio_driver(
        CLIENT, f"{version(CLIENT)} (tornado {tornado.version})",
        {"pub": run_pub, "mpub": run_mpub, "consume": run_consume},
    )


if __name__ == "__main__":
    main()
