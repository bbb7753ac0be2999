"""NSQ's own utilities on fastnsq: ``fastnsq to-file``, ``to-nsq`` and ``to-http``.

Each app is a built-in handler run by the runtime of ``fastnsq worker`` (:mod:`fastnsq.runner`:
its supervisor and child, signals, drain, ``/metrics``), taking batches from
``Consumer.batches()`` and answering them itself once the output holds them. They sit above
the runner and the public Consumer and Producer; nothing but the command line imports them.
"""
