"""A consumer process for tests/test_express.py: a CPU-bound sync handler, as a busy worker has.

    python -m tests.express_consumer NSQD_TCP TOPIC CHANNEL HANDLER_US MAX_IN_FLIGHT

It consumes until its stdin closes, then stops and prints one JSON line: the messages its
handler saw and, per connection, whether it was the express lane's and what it received. Each
message's handler spins ``HANDLER_US`` microseconds of CPU: a consumer slower than half of
``express_max_rate`` however fast the machine.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from fastnsq import Consumer


async def consume(address: str, topic: str, channel: str, handler_us: float, max_in_flight: int) -> dict:
    handled = 0

    def spin(message: object) -> None:
        nonlocal handled
        until = time.perf_counter() + handler_us / 1e6
        while time.perf_counter() < until:
            pass
        handled += 1

    consumer = Consumer(topic, channel, nsqd_tcp_addresses=[address], handler=spin, max_in_flight=max_in_flight)
    await consumer.start()
    print("started", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes it
    connections = [{"express": c.express, "received": c.received} for c in consumer.snapshot().connections]
    await consumer.stop()
    return {"handled": handled, "connections": connections}


if __name__ == "__main__":
    address, topic, channel, handler_us, max_in_flight = sys.argv[1:6]
    print(json.dumps(asyncio.run(consume(address, topic, channel, float(handler_us), int(max_in_flight)))))
