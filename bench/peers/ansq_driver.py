"""Benchmark driver for ansq (asyncio streams): one workload, one ``RESULT`` line.

How each workload maps onto ansq's API:

* pub: ``--concurrency`` tasks each ``await writer.pub(topic, body)`` in a loop
  (``create_writer``; ansq pipelines commands on the connection and awaits each OK).
* mpub: ``--concurrency`` tasks each ``await writer.mpub(topic, *bodies)``.
* consume: ansq's high-level ``create_reader()`` keeps RDY 1 per connection and
  cannot take a max_in_flight (``set_max_in_flight`` raises NotImplementedError), so
  the driver uses ansq's documented low-level API instead: ``open_connection()``,
  ``subscribe(topic, channel, max_in_flight)`` (SUB + RDY n), then
  ``async for message in conn.messages(): await message.fin()``.
"""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

CLIENT = "ansq"


async def run_pub(args, meter, loop_name):
    import ansq

    writer = await ansq.create_writer(nsqd_tcp_addresses=[args.nsqd_tcp_address])
    payload = _common.body(args.size)

    async def caller():
        while n := meter.claim(_common.CHUNK):
            for _ in range(n):
                await writer.pub(args.topic, payload)
            meter.add(n)

    await asyncio.gather(*(caller() for _ in range(args.concurrency)))
    meter.close_window()
    await writer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="pub", variant="await writer.pub()", loop=loop_name,
        end="the OK of the last publish", settings={"concurrency": args.concurrency, "warmup": args.warmup},
    )


async def run_mpub(args, meter, loop_name):
    import ansq

    writer = await ansq.create_writer(nsqd_tcp_addresses=[args.nsqd_tcp_address])
    payload = _common.body(args.size)

    async def caller():
        while n := meter.claim(args.batch):
            await writer.mpub(args.topic, *([payload] * n))
            meter.add(n)

    await asyncio.gather(*(caller() for _ in range(args.concurrency)))
    meter.close_window()
    await writer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="mpub", variant=f"batches of {args.batch}",
        loop=loop_name, end="the OK of the last MPUB",
        settings={"batch": args.batch, "concurrency": args.concurrency, "warmup": args.warmup},
    )


async def run_consume(args, meter, loop_name):
    import ansq

    host, port = _common.host_port(args.nsqd_tcp_address)
    conn = await ansq.open_connection(host, port)
    await conn.subscribe(args.topic, args.channel, args.max_in_flight)

    async def consume():
        async for message in conn.messages():
            await message.fin()
            meter.add()
            if meter.finished:
                return

    task = asyncio.ensure_future(consume())
    while not task.done():
        await asyncio.wait({task}, timeout=0.05)
        if not task.done() and meter.past_deadline():
            task.cancel()
    end = await _common.end_of_consume(meter, args)
    meter.close_window()
    await conn.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="consume",
        variant=f"open_connection + subscribe(rdy={args.max_in_flight}), await msg.fin()", loop=loop_name, end=end,
        settings={"max_in_flight": args.max_in_flight, "warmup": args.warmup},
        notes="create_reader() cannot set max_in_flight (RDY 1 per connection); the low-level connection API can",
    )


def main() -> None:
    _common.run_asyncio_driver(CLIENT, version(CLIENT), {"pub": run_pub, "mpub": run_mpub, "consume": run_consume})


if __name__ == "__main__":
    main()
