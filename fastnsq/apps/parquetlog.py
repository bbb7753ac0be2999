"""The Parquet file of ``fastnsq to-file --format parquet``: a spool per file, finished at rotation.

Each sync appends the records to the spool of the file being made (:mod:`.spool`: fsynced
before a message is FINed); the file rotates by the rules of every to-file file (``<DATETIME>``,
``--rotate-interval``, ``--rotate-size``, counted in spool bytes), and a rotated spool is
handed to the :class:`~.parquetfile.Finisher`, which writes the Parquet file while the next
spool takes the syncs. A name is free when neither a file nor a spool holds it, so a spool an
earlier run left keeps its name until the restart finishes it.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from .filelog import FileOptions, RotatingFile
from .parquetfile import Finisher
from .spool import SpoolWriter, record_batch, spool_name


class ParquetLog(RotatingFile):
    """One topic's Parquet file being made in one partition folder."""

    def __init__(self, options: FileOptions, topic: str, identifier: str, finisher: Finisher,
                 folder: str = "") -> None:
        super().__init__(options, topic, identifier, folder)
        self.finisher = finisher
        self.spool: SpoolWriter | None = None

    @property
    def is_open(self) -> bool:
        return self.spool is not None

    def open_next(self) -> None:
        self.close()

        def attempt(path: str) -> SpoolWriter | None:
            folder, name = os.path.split(path)
            spool = os.path.join(folder, spool_name(name))
            if os.path.exists(self._output_path(path)) or os.path.exists(spool):
                return None
            header = {"topic": self.topic, "id": uuid.uuid4().hex, "rev": self.rev,
                      "template": os.path.basename(self.filename),
                      "created": time.time()}
            try:
                return SpoolWriter(spool, header)
            except FileExistsError:
                return None

        _, spool = self._open_first_free(attempt, what="the spool of ")
        self.spool, self.size = spool, spool.size

    def sync(self, records: list[Any]) -> None:
        """The records appended to the spool and fsynced (rotating first if due)."""
        if not records:
            return
        if self.needs_rotation():
            self.open_next()
        assert self.spool is not None
        self.spool.append(record_batch(records))
        self.size = self.spool.size

    def close(self) -> None:
        """The spool closed and handed to the finisher (its file is written in its thread)."""
        if self.spool is None:
            return
        spool, self.spool = self.spool, None
        spool.close()
        if spool.rows:
            self.finisher.submit(spool.path)
        else:
            os.unlink(spool.path)  # nothing in it: no empty Parquet file
