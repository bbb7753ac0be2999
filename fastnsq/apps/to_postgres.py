"""``fastnsq to-postgres``: JSON bodies into a PostgreSQL table, a batch per COPY, idempotent on a key.

The built-in handler the worker runtime runs (:mod:`fastnsq.runner`), ``--concurrency``
batches at once per process, each on its own pooled connection (asyncpg, the ``postgres``
extra, imported in ``setup()``). A batch (``Consumer.batches()``: full, starved or old) is
made into COPY text lines (:mod:`.pgrows`), copied into a temporary staging table and moved
into the table with ``INSERT ... ON CONFLICT (key) DO NOTHING`` (``--on-conflict update``:
``DO UPDATE`` of every other column), in one transaction; its messages are FINed only after
the commit, and a key already there is a duplicate absorbed and counted. A body that cannot be
a row, and a row PostgreSQL refuses (a data or constraint error; the batch is split in halves
until the row is found), go to the dead-letter topic (:mod:`.deadletter`); any other failure
(PostgreSQL down) raises, and the runtime requeues what was not answered.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ..consumer import Batch
from ..extras import require
from .deadletter import DeadLetters, dead_letter_topic_for
from .pgrows import BadBody, RowMaker

logger = logging.getLogger("fastnsq.apps.to_postgres")

#: SQLSTATE classes a row causes (22: data exception, 23: integrity constraint violation).
ROW_ERROR_CLASSES = ("22", "23")
#: Seconds the ready check waits for a connection and its answer.
READY_TIMEOUT = 2.0
#: Each pooled connection's staging table (a temporary table: its own session's).
STAGE = "fastnsq_to_postgres_stage"


class ToPostgres:
    """The handler: ``ToPostgres(dsn=..., table=..., key=..., ...)``."""

    answers_batches = True  # FIN after the commit; the runtime requeues the rest of a batch that raised

    def __init__(self, *, dsn: str, table: str, key: str, rest_column: str = "", refuse_unknown: bool = False,
                 on_conflict: str = "nothing", concurrency: int = 4, dead_letter_topic: str = "",
                 producer_options: dict[str, Any] | None = None) -> None:
        self.dsn, self.table, self.key = dsn, table, key
        self.rest_column, self.refuse_unknown, self.on_conflict = rest_column, refuse_unknown, on_conflict
        self.concurrency = concurrency
        self.dead_letters = DeadLetters(dead_letter_topic, producer_options)
        self.pool: Any = None
        self.rows: RowMaker | None = None
        self.insert = ""
        self.counts = {"inserted": 0, "duplicate": 0, "dead_lettered": 0}
        self.metric: Any = None

    # ---- the life of the handler ------------------------------------------------------------

    async def setup(self) -> None:
        require("postgres", "fastnsq to-postgres")
        import asyncpg

        conn = await asyncpg.connect(self.dsn or None)
        try:
            columns = await self._describe(conn)
        finally:
            await conn.close()
        # min_size 0: connections are opened as batches need them (and kept 5 min idle); a floor
        # would be restored in the background through an outage, a traceback a second per process.
        self.pool = await asyncpg.create_pool(self.dsn or None, min_size=0, max_size=self.concurrency,
                                              init=self._init_connection)
        self.rows = RowMaker(list(columns), self.key, self.rest_column, self.refuse_unknown,
                             arrays=[name for name, kind in columns.items() if kind.endswith("[]")])
        self.insert = self._insert_sql()
        self.metric = _counter()

    async def _describe(self, conn: Any) -> dict[str, str]:
        """The table's columns, checked: the key one with a unique index, the rest one a jsonb."""
        qualified = await conn.fetchval("SELECT to_regclass($1)::text", self.table)
        if qualified is None:
            raise ValueError(f"--table {self.table}: no such table")
        rows = await conn.fetch(
            "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute WHERE attrelid = $1::regclass"
            " AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum", qualified)
        types = {row["attname"]: row["type"] for row in rows}
        if self.key not in types:
            raise ValueError(f"--key {self.key}: table {qualified} has no such column (it has: {', '.join(types)})")
        unique = await conn.fetchval(
            "SELECT count(*) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = "
            "i.indkey[0] WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indnatts = 1 AND a.attname = $2",
            qualified, self.key)
        if not unique:
            raise ValueError(f"--key {self.key}: table {qualified} has no unique index on it (ON CONFLICT needs one)")
        if self.rest_column and types.get(self.rest_column) not in ("jsonb", "json"):
            raise ValueError(f"--rest-column {self.rest_column}: table {qualified} has no json or jsonb column so "
                             f"named ({types.get(self.rest_column) or 'no such column'})")
        self.table = qualified
        return dict(types)

    async def _init_connection(self, conn: Any) -> None:
        """Each pooled connection's staging table: its own, emptied by every commit."""
        await conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_quote(STAGE)} (LIKE {self.table} INCLUDING DEFAULTS) "
                           "ON COMMIT DELETE ROWS")

    def _insert_sql(self) -> str:
        assert self.rows is not None
        columns = ", ".join(_quote(name) for name in self.rows.columns)
        conflict = f"ON CONFLICT ({_quote(self.key)}) DO NOTHING"
        if self.on_conflict == "update":
            others = [name for name in self.rows.columns if name != self.key]
            conflict = (f"ON CONFLICT ({_quote(self.key)}) DO "
                        + ("UPDATE SET " + ", ".join(f"{_quote(n)} = EXCLUDED.{_quote(n)}" for n in others)
                           if others else "NOTHING"))
        return f"INSERT INTO {self.table} ({columns}) SELECT {columns} FROM {_quote(STAGE)} {conflict}"

    async def ready(self) -> bool:
        """The worker's ready check (issue 58): while batches fail, the consumer holds its messages
        and asks this every fraction of a second; PostgreSQL answering ends the hold at once."""
        if self.pool is None:
            return False
        async with self.pool.acquire(timeout=READY_TIMEOUT) as conn:
            return bool(await conn.fetchval("SELECT 1", timeout=READY_TIMEOUT) == 1)

    def attach(self, consumer: Any) -> None:
        if not self.dead_letters.topic:
            self.dead_letters.topic = dead_letter_topic_for(consumer.topic)

    async def teardown(self) -> None:
        logger.info("to-postgres: %d rows inserted, %d duplicates absorbed, %d dead-lettered",
                    self.counts["inserted"], self.counts["duplicate"], self.counts["dead_lettered"])
        await self.dead_letters.close()
        if self.pool is not None:
            await self.pool.close()

    # ---- a batch ----------------------------------------------------------------------------

    async def handle(self, batch: Any) -> None:
        assert self.rows is not None
        line = self.rows.line
        good: list[tuple[Any, Any, str]] = []
        bad: list[tuple[Any, str]] = []
        for message in batch:
            try:
                key, text = line(message.body)
            except BadBody as exc:
                bad.append((message, str(exc)))
                continue
            good.append((message, key, text))
        if bad:
            self._count("dead_lettered", await self.dead_letters.put(bad))
        if good:
            await self._write(good)

    async def _write(self, entries: list[tuple[Any, Any, str]]) -> None:
        if self.on_conflict == "update":
            entries = self._last_per_key(entries)
        with contextlib.suppress(TypeError):  # keys of mixed types: left in the order they came
            # In key order, so two transactions inserting the same keys (a redelivery, a duplicate,
            # another process) wait for each other instead of deadlocking (seen with 2 processes).
            entries.sort(key=_key_of)
        async with self.pool.acquire() as conn:
            try:
                await self._copy(conn, entries)
            except Exception as exc:
                if not _caused_by_a_row(exc):
                    raise  # PostgreSQL down, a timeout: the runtime requeues the batch
                await self._isolate(conn, entries, exc)

    def _last_per_key(self, entries: list[tuple[Any, Any, str]]) -> list[tuple[Any, Any, str]]:
        """``DO UPDATE`` cannot touch a row twice in one statement: a key's last message wins, the
        earlier ones are duplicates (finished with the batch)."""
        last: dict[str, tuple[Any, Any, str]] = {}
        for entry in entries:
            earlier = last.pop(repr(entry[1]), None)
            if earlier is not None:
                earlier[0].finish()
                self._count("duplicate", 1)
            last[repr(entry[1])] = entry
        return list(last.values())

    async def _copy(self, conn: Any, entries: list[tuple[Any, Any, str]]) -> None:
        """COPY into the staging table and INSERT from it, one transaction; FIN after the commit."""
        assert self.rows is not None
        data = ("\n".join([text for _, _, text in entries]) + "\n").encode()
        async with conn.transaction():
            # A memoryview: asyncpg would take bytes for a file name (os.fspath accepts them).
            await conn.copy_to_table(STAGE, source=memoryview(data), columns=self.rows.columns, format="text")
            status = await conn.execute(self.insert)
        written = int(status.rsplit(" ", 1)[1])  # "INSERT 0 <rows>"
        Batch([message for message, _, _ in entries]).finish()  # one write per connection
        self._count("inserted", written)
        self._count("duplicate", len(entries) - written)

    async def _isolate(self, conn: Any, entries: list[tuple[Any, Any, str]], error: Exception) -> None:
        """A row PostgreSQL refuses: halves copied on their own until it is alone, then dead-lettered."""
        if len(entries) == 1:
            message = entries[0][0]
            self._count("dead_lettered", await self.dead_letters.put(
                [(message, f"PostgreSQL refused the row: {type(error).__name__}: {error}")]))
            return
        middle = len(entries) // 2
        for half in (entries[:middle], entries[middle:]):
            try:
                await self._copy(conn, half)
            except Exception as exc:
                if not _caused_by_a_row(exc):
                    raise
                await self._isolate(conn, half, exc)

    def _count(self, outcome: str, rows: int) -> None:
        if rows:
            self.counts[outcome] += rows
            if self.metric is not None:
                self.metric.labels(outcome).inc(rows)


def _key_of(entry: tuple[Any, Any, str]) -> Any:
    return entry[1]


def _caused_by_a_row(exc: Exception) -> bool:
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in ROW_ERROR_CLASSES


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _counter() -> Any:
    """The rows by outcome in the process's registry (the runtime's /metrics adds the processes')."""
    try:
        import prometheus_client
    except ImportError:  # the metrics extra: no /metrics without it
        return None
    return prometheus_client.Counter("fastnsq_to_postgres_rows", "Messages answered by to-postgres, by outcome: "
                                     "inserted, duplicate (the key was there), dead_lettered", ["outcome"])
