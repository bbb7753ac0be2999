"""Benchmark driver for gnsq (gevent greenlets): one workload, one ``RESULT`` line.

gnsq's API blocks the calling greenlet, so concurrency is greenlets (no asyncio
loop; ``--loop`` is ignored). How each workload maps onto it:

* pub: ``--concurrency`` greenlets each call ``producer.publish(topic, body)``
  (blocking until nsqd's OK) in a loop; gnsq pipelines the greenlets' commands on
  its connection and matches the answers in order.
* mpub: the same with ``producer.multipublish(topic, bodies)``.
* consume: ``gnsq.Consumer(topic, channel, max_in_flight=...)`` with a trivial
  ``on_message`` receiver; gnsq FINs each message when the receiver returns.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

CLIENT = "gnsq"
LOOP = "gevent"


def _producer(args):
    import gnsq

    producer = gnsq.Producer([args.nsqd_tcp_address])
    producer.start()  # connects and identifies before returning
    return producer


def _run_callers(args, meter, publish_one):
    import gevent

    def caller():
        if args.workload == "pub":
            while n := meter.claim(_common.CHUNK):
                for _ in range(n):
                    publish_one(1)
                meter.add(n)
            return
        while n := meter.claim(args.batch):
            publish_one(n)
            meter.add(n)

    greenlets = [gevent.spawn(caller) for _ in range(args.concurrency)]
    gevent.joinall(greenlets, raise_error=True)
    meter.close_window()


def run_pub(args, meter):
    producer = _producer(args)
    payload = _common.body(args.size)
    _run_callers(args, meter, lambda n: producer.publish(args.topic, payload))
    producer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="pub", variant="producer.publish() in greenlets",
        loop=LOOP, end="the OK of the last publish",
        settings={"concurrency": args.concurrency, "warmup": args.warmup},
    )


def run_mpub(args, meter):
    producer = _producer(args)
    payload = _common.body(args.size)
    _run_callers(args, meter, lambda n: producer.multipublish(args.topic, [payload] * n))
    producer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="mpub", variant=f"batches of {args.batch}",
        loop=LOOP, end="the OK of the last MPUB",
        settings={"batch": args.batch, "concurrency": args.concurrency, "warmup": args.warmup},
    )


def run_consume(args, meter):
    import gevent
    import gevent.event
    import gnsq

    all_done = gevent.event.Event()
    meter.on_all_done = all_done.set
    add = meter.add

    consumer = gnsq.Consumer(
        args.topic, args.channel, nsqd_tcp_addresses=[args.nsqd_tcp_address], max_in_flight=args.max_in_flight
    )

    @consumer.on_message.connect
    def handler(consumer, message):
        add()

    consumer.start(block=False)
    while not all_done.wait(0.05):
        if meter.past_deadline():
            break
    end = _common.HANDLED
    if meter.finished and args.nsqd_http_address:
        # A real thread, so gnsq's greenlets keep writing their last FINs meanwhile.
        gevent.get_hub().threadpool.apply(
            _common.wait_drained, (args.nsqd_http_address, args.topic, args.channel)
        )
        end = _common.DRAINED
    elif meter.capped:
        end = "max_seconds"
    meter.close_window()
    consumer.close()
    return meter.result(
        client=CLIENT, version=version(CLIENT), workload="consume", variant="Consumer + on_message receiver",
        loop=LOOP, end=end, settings={"max_in_flight": args.max_in_flight, "warmup": args.warmup},
    )


def main() -> None:
    args = _common.build_parser(CLIENT).parse_args()
    if args.workload == "info":
        import gevent

        _common.emit_info(CLIENT, f"{version(CLIENT)} (gevent {gevent.__version__})", LOOP)
        return
    meter = _common.Meter(args)
    runner = {"pub": run_pub, "mpub": run_mpub, "consume": run_consume}[args.workload]
    _common.emit(runner(args, meter))


if __name__ == "__main__":
    main()
