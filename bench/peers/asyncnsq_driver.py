"""Benchmark driver for asyncnsq 2.x (asyncio streams; needs Python >= 3.12): one workload, one ``RESULT`` line.

How each workload maps onto asyncnsq's API:

* pub: ``--concurrency`` tasks each ``await writer.pub(topic, body)`` in a loop
  (``create_writer(host, port)``; one connection, commands pipelined, each OK awaited).
* mpub: ``--concurrency`` tasks each ``await writer.mpub(topic, *bodies)``.
* consume: ``create_reader(nsqd_tcp_addresses, max_in_flight)``, then
  ``set_message_handler(handler, auto_fin=True, direct=True)`` with a trivial sync
  handler and ``subscribe(topic, channel)``. ``direct=True`` runs the handler as
  frames are parsed, without the queue and worker task: asyncnsq's README measures
  it as its fastest mode.
"""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

CLIENT = "asyncnsq"


async def run_pub(args, meter, loop_name):
    import asyncnsq

    host, port = _common.host_port(args.nsqd_tcp_address)
    writer = await asyncnsq.create_writer(host=host, port=port)
    payload = _common.body(args.size)

    async def caller():
        while n := meter.claim(_common.CHUNK):
            for _ in range(n):
                await writer.pub(args.topic, payload)
            meter.add(n)

    await asyncio.gather(*(caller() for _ in range(args.concurrency)))
    meter.close_window()
    writer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="pub", variant="await writer.pub()", loop=loop_name,
        end="the OK of the last publish", settings={"concurrency": args.concurrency, "warmup": args.warmup},
    )


async def run_mpub(args, meter, loop_name):
    import asyncnsq

    host, port = _common.host_port(args.nsqd_tcp_address)
    writer = await asyncnsq.create_writer(host=host, port=port)
    payload = _common.body(args.size)

    async def caller():
        while n := meter.claim(args.batch):
            await writer.mpub(args.topic, *([payload] * n))
            meter.add(n)

    await asyncio.gather(*(caller() for _ in range(args.concurrency)))
    meter.close_window()
    writer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="mpub", variant=f"batches of {args.batch}",
        loop=loop_name, end="the OK of the last MPUB",
        settings={"batch": args.batch, "concurrency": args.concurrency, "warmup": args.warmup},
    )


async def run_consume(args, meter, loop_name):
    import asyncnsq

    loop = asyncio.get_running_loop()
    all_done = loop.create_future()
    meter.on_all_done = lambda: all_done.done() or all_done.set_result(None)
    add = meter.add

    def handler(message):
        add()

    reader = await asyncnsq.create_reader(
        nsqd_tcp_addresses=[args.nsqd_tcp_address], max_in_flight=args.max_in_flight
    )
    reader.set_message_handler(handler, auto_fin=True, direct=True)
    await reader.subscribe(args.topic, args.channel)
    while not all_done.done():
        await asyncio.wait({all_done}, timeout=0.05)
        if meter.past_deadline():
            break
    end = await _common.end_of_consume(meter, args)
    meter.close_window()
    reader.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="consume",
        variant="set_message_handler(sync, auto_fin, direct=True)", loop=loop_name, end=end,
        settings={"max_in_flight": args.max_in_flight, "warmup": args.warmup},
    )


def main() -> None:
    _common.run_asyncio_driver(CLIENT, version(CLIENT), {"pub": run_pub, "mpub": run_mpub, "consume": run_consume})


if __name__ == "__main__":
    main()
