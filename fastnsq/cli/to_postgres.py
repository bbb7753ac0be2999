"""``fastnsq to-postgres``: JSON bodies into a PostgreSQL table (:mod:`fastnsq.apps.to_postgres`)."""

from __future__ import annotations

import argparse
from typing import Any

from ._apps import add_app_parser, add_consume_flags, duration_arg, require_servers, run_app_from
from ._common import UsageError, int_at_least, passthrough_options

_EPILOG = """\
Each batch (full at --batch-size, or when nsqd will send no more until it is answered, or
--batch-wait old) is copied into a staging table and inserted with ON CONFLICT (KEY) DO
NOTHING (--on-conflict update: DO UPDATE), one transaction; its messages are finished only
after the commit. A key already there is a duplicate (absorbed, counted); a body that is not a
JSON object with the key, or a row PostgreSQL refuses, goes to the dead-letter topic. Without
--max-in-flight each process holds --concurrency + 1 batches. Needs the postgres extra
(asyncpg). docs/apps.md has the guarantees and the measurements.
"""


def _build_to_postgres(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = add_app_parser(commands, [common, client], "to-postgres", help="write JSON messages into a PostgreSQL table",
                         description="Consume TOPIC and COPY its JSON messages into a PostgreSQL table, idempotent on "
                                     "a key column.", epilog=_EPILOG)
    what = add_consume_flags(sub, app="to-postgres", several_topics=False)
    for action in sub._actions:  # the apps' --dead-letter-topic: here also where bad bodies go, with a default
        if action.dest == "dead_letter_topic":
            action.help = ("where bad bodies go (on the nsqd they came from) and messages past max_attempts "
                           "(default TOPIC.dead)")
    what.set_defaults(max_in_flight=None)
    for action in what._group_actions:
        if action.dest == "max_in_flight":
            action.help = "messages in flight for all the processes (default: (--concurrency + 1) x --batch-size each)"
    out = sub.add_argument_group("PostgreSQL")
    out.add_argument("--dsn", default="", metavar="DSN",
                     help="postgresql://user:password@host:port/database (default: libpq's PG* environment variables)")
    out.add_argument("--table", required=True, metavar="TABLE", help="the table (schema.table, or on the search path)")
    out.add_argument("--key", required=True, metavar="COLUMN",
                     help="the key column, with a unique index: a message whose key is there is a duplicate")
    out.add_argument("--on-conflict", choices=("nothing", "update"), default="nothing",
                     help="a key already there: keep the row (nothing, default) or update its other columns")
    out.add_argument("--rest-column", default="", metavar="COLUMN",
                     help="a jsonb column for the fields without a column of their own (default: they are left out)")
    out.add_argument("--refuse-unknown-fields", action="store_true",
                     help="a body with a field that has no column goes to the dead-letter topic")
    run = sub.add_argument_group("batches and processes")
    run.add_argument("--batch-size", type=int_at_least(1), default=1000, metavar="N",
                     help="rows per COPY at most (default 1000)")
    run.add_argument("--batch-wait", type=duration_arg, default=0.25, metavar="DURATION",
                     help="a batch goes at this age even if not full (default 250ms)")
    run.add_argument("--concurrency", type=int_at_least(1), default=4, metavar="N",
                     help="batches written at once per process, each on its own connection (default 4)")
    run.add_argument("--processes", type=int_at_least(1), default=1, metavar="N", help="processes (default 1)")
    run.add_argument("--producer-opt", action="append", default=[], metavar="NAME,VALUE",
                     help="option of the dead letters' Producer (go-nsq's names; may be given multiple times)")
    sub.set_defaults(run=_run_to_postgres)


def _run_to_postgres(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if len(args.topic) != 1 or not args.channel:
        raise UsageError("one --topic and a --channel are required")
    require_servers(args)
    from ..extras import MissingExtra, require

    try:
        require("postgres", "fastnsq to-postgres")
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    if args.max_in_flight is None:
        args.max_in_flight = (args.concurrency + 1) * args.batch_size * args.processes
    producer = passthrough_options(args.producer_opt, for_="producer", flag="--producer-opt")
    from ..apps.deadletter import dead_letter_topic_for

    dead_letters = args.dead_letter_topic or dead_letter_topic_for(args.topic[0])
    return run_app_from(
        args, name="to-postgres", target="fastnsq.apps.to_postgres:ToPostgres", topics=[],
        topic=args.topic[0], processes=args.processes, concurrency=args.concurrency,
        batch_wait=args.batch_wait, batch_size=args.batch_size, dead_letter_topic=dead_letters,
        handler_options={
            "dsn": args.dsn, "table": args.table, "key": args.key, "rest_column": args.rest_column,
            "refuse_unknown": args.refuse_unknown_fields, "on_conflict": args.on_conflict,
            "concurrency": args.concurrency, "dead_letter_topic": dead_letters,
            "producer_options": producer,
        },
    )
