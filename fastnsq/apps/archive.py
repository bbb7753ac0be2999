"""One topic's archive for ``fastnsq to-file``: a file per partition folder, each rotated on its own.

Without ``--partition-by`` there is one folder (the output dir) and one file at a time, by
nsq_to_file's rules (an idle file past its rotation is replaced by an empty one at the next
tick unless ``--skip-empty-files``). With it, each sync's records are split by folder
(:mod:`.partitioning`) and each folder has its own file, opened by its first record and closed
at its rotation (``<DATETIME>``, ``--rotate-interval``, ``--rotate-size``), checked at each
tick: an hour's folder stops getting records when the hour ends, and its file is closed then,
with no empty one after it. Parquet files are made from their spools by one
:class:`~.parquetfile.Finisher` per topic, which first finishes what an earlier run left.
"""

from __future__ import annotations

from typing import Any

from .filelog import FileLog, FileOptions, RotatingFile
from .partitioning import Partitioning


class Archive:
    """The files of one topic. Not thread safe: one sync or tick at a time (the finisher has its own thread)."""

    def __init__(self, options: FileOptions, topic: str, identifier: str) -> None:
        self.options, self.topic, self.identifier = options, topic, identifier
        self.partitioning = Partitioning(options.partition_by) if options.partition_by else None
        self.files: dict[str, RotatingFile] = {}
        self.finisher: Any = None
        if options.format == "parquet":
            from .parquetfile import Finisher  # pyarrow: imported only for Parquet

            self.finisher = Finisher(options, topic)

    def recover(self) -> None:
        """Finish what an earlier run left (Parquet spools: found now, before this run opens one;
        finished in the finisher's thread, before anything else)."""
        if self.finisher is not None:
            self.finisher.recover()

    def file(self, folder: str) -> RotatingFile:
        found = self.files.get(folder)
        if found is None:
            if self.finisher is not None:
                from .parquetlog import ParquetLog

                found = ParquetLog(self.options, self.topic, self.identifier, self.finisher, folder)
            else:
                found = FileLog(self.options, self.topic, self.identifier, folder)
            self.files[folder] = found
        return found

    def sync(self, records: list[Any]) -> None:
        """Write and fsync ``records``, each in its folder's file: after this they are on disk."""
        if self.partitioning is None:
            self.file("").sync(records)
            return
        for folder, part in self.partitioning.split(records).items():
            self.file(folder).sync(part)

    def tick(self) -> None:
        """Every sync interval (after its sync, if any): rotate the files due."""
        if self.partitioning is None and self.finisher is None:  # nsq_to_file's one plain file
            only = self.file("")
            if only.needs_rotation():
                if self.options.skip_empty_files:
                    only.close()
                else:
                    only.open_next()
            return
        for folder, file in list(self.files.items()):
            if file.is_open and file.needs_rotation():
                file.close()
                if self.partitioning is not None:
                    del self.files[folder]  # the next record of this folder opens a new one

    def hup(self) -> None:
        """nsq_to_file's SIGHUP: every file closed (a Parquet one finished); records open the next."""
        for file in self.files.values():
            file.close()
        if self.partitioning is not None:
            self.files.clear()  # a folder's next record opens its file anew

    def close(self) -> None:
        """Every file closed and, for Parquet, every spool finished (waits for the finisher)."""
        self.hup()
        if self.finisher is not None:
            self.finisher.close()
