"""``fastnsq to-file``: nsq_to_file's command line, on fastnsq (:mod:`fastnsq.apps.to_file`)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..apps.goflags import add_bool
from ._apps import (
    add_app_parser,
    add_consume_flags,
    add_http_timeouts,
    check_http_timeouts,
    consumer_options,
    duration_arg,
    require_servers,
    run_app_from,
)
from ._common import UsageError

_EPILOG = """\
Flags as nsq_to_file's (one dash or two: -topic=events works). A message is FINed only after
the file that holds it is written and fsynced. Beyond nsq_to_file: --zstd, --format parquet,
--partition-by, --metrics-port, --drain-timeout. docs/apps.md maps every nsq_to_file flag.
"""

#: --rotate-size's default with --format parquet (0 with lines, as nsq_to_file): a spool of
#: 256 MiB makes a Parquet file of tens of MB, and no rotation waits on gigabytes.
PARQUET_ROTATE_SIZE = 256 << 20


def _build_to_file(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = add_app_parser(commands, [common, client], "to-file", help="archive topics to files (nsq_to_file)",
                         description="Write the messages of TOPIC to files, one body per line (nsq_to_file, "
                                     "faster).", epilog=_EPILOG)
    what = add_consume_flags(sub, app="nsq_to_file")
    what.add_argument("--topic-pattern", default="", metavar="REGEX",
                      help="only log topics matching the following pattern")
    what.add_argument("--topic-refresh", type=duration_arg, default=60.0, metavar="DURATION",
                      help="how frequently the topic list should be refreshed (default 1m)")
    add_http_timeouts(what, request_default="5s", note="; checked, lookupd requests use the Consumer's")
    files = sub.add_argument_group("files (nsq_to_file's flags)")
    files.add_argument("--output-dir", default="/tmp", metavar="DIR", help="directory to write output files to")
    files.add_argument("--work-dir", default="", metavar="DIR",
                       help="directory for in-progress files before moving to output-dir")
    files.add_argument("--datetime-format", default="%Y-%m-%d_%H", metavar="STRFTIME",
                       help="strftime compatible format for <DATETIME> in filename format")
    files.add_argument("--filename-format", default="<TOPIC>.<HOST><REV>.<DATETIME>.log", metavar="FORMAT",
                       help="output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
                            "<REV> is increased when file already exists)")
    files.add_argument("--host-identifier", default="", metavar="NAME",
                       help="value to output in log filename in place of hostname. <SHORT_HOST> and <HOSTNAME> "
                            "are valid replacement tokens")
    files.add_argument("--gzip-level", type=int, default=6, metavar="1-9",
                       help="gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)")
    add_bool(files, "--gzip", "gzip output files.")
    add_bool(files, "--zstd", "zstd output files (fastnsq's; level from --zstd-level)")
    files.add_argument("--zstd-level", type=int, default=3, metavar="1-22", help="zstd level (default 3)")
    add_bool(files, "--skip-empty-files", "skip writing empty files")
    files.add_argument("--rotate-size", type=int, default=None, metavar="BYTES",
                       help="rotate the file when it grows bigger than `rotate-size` bytes (default 0: off; "
                            f"with --format parquet, {PARQUET_ROTATE_SIZE >> 20} MiB of spool)")
    files.add_argument("--rotate-interval", type=duration_arg, default=0.0, metavar="DURATION",
                       help="rotate the file every duration")
    files.add_argument("--sync-interval", type=duration_arg, default=30.0, metavar="DURATION",
                       help="sync file to disk every duration (default 30s)")
    files.add_argument("--format", choices=("lines", "parquet"), default="lines",
                       help="lines: one body per line (nsq_to_file's); parquet: a Parquet file per rotation "
                            "(pyarrow, the extra: pip install 'fastnsq-client[parquet]'; columns body, id, timestamp, "
                            "attempts), each sync fsynced to its spool")
    files.add_argument("--partition-by", default="", metavar="SPEC",
                       help="Hive-style folders: KEY=VALUE parts joined by /, a VALUE of strftime codes (the "
                            "message's timestamp, UTC) and {FIELD}s (a JSON field of the body); hourly: "
                            "dt=%%Y-%%m-%%d/hr=%%H, daily: dt=%%Y-%%m-%%d (default: none)")
    files.add_argument("--parquet-row-group-size", type=int, default=64 << 20, metavar="BYTES",
                       help="with --format parquet, a row group holds at most this many bytes (uncompressed "
                            "Arrow data; and at most 1,048,576 rows) (default 64 MiB)")
    files.add_argument("--status-every", type=int, default=0, metavar="N",
                       help="print a status line every N messages written (default 0: off; nsq_to_file "
                            "logs each sync instead)")
    sub.set_defaults(run=_run_to_file)


def file_options(args: argparse.Namespace) -> dict[str, Any]:
    """The file flags, checked, as :class:`~fastnsq.apps.filelog.FileOptions` takes them."""
    if args.gzip and args.zstd:
        raise UsageError("--gzip and --zstd cannot go together")
    if not 1 <= args.gzip_level <= 9:
        raise UsageError(f"invalid --gzip-level value ({args.gzip_level}), should be 1-9")
    if not 1 <= args.zstd_level <= 22:
        raise UsageError(f"invalid --zstd-level value ({args.zstd_level}), should be 1-22")
    rotate_size = args.rotate_size
    if rotate_size is None:
        rotate_size = PARQUET_ROTATE_SIZE if args.format == "parquet" else 0
    for flag, value in (("--rotate-size", rotate_size), ("--rotate-interval", args.rotate_interval)):
        if value < 0:
            raise UsageError(f"{flag} {value}: must be 0 (off) or more")
    if args.parquet_row_group_size < 1:
        raise UsageError(f"--parquet-row-group-size {args.parquet_row_group_size}: must be 1 or more")
    compression = "gzip" if args.gzip else "zstd" if args.zstd else ""
    return {
        "output_dir": args.output_dir, "work_dir": args.work_dir or args.output_dir,
        "filename_format": args.filename_format, "datetime_format": args.datetime_format,
        "host_identifier": args.host_identifier, "compression": compression,
        "level": args.zstd_level if args.zstd else args.gzip_level,
        "rotate_size": rotate_size, "rotate_interval": args.rotate_interval,
        "skip_empty_files": bool(args.skip_empty_files), "format": args.format,
        "partition_by": args.partition_by, "row_group_size": args.parquet_row_group_size,
    }


def _check(args: argparse.Namespace) -> None:
    require_servers(args)
    if not args.topic and not args.topic_pattern:
        raise UsageError("--topic or --topic-pattern required")
    if not args.topic and not args.lookupd_http_address:
        raise UsageError("--lookupd-http-address must be specified when no --topic specified")
    if args.topic_pattern:
        try:
            re.compile(args.topic_pattern)
        except re.error as exc:
            raise UsageError(f"--topic-pattern {args.topic_pattern!r}: not a regular expression: {exc}") from None
    if args.topic_refresh <= 0:
        raise UsageError(f"--topic-refresh {args.topic_refresh}: must be more than 0")
    if args.sync_interval <= 0:
        raise UsageError(f"--sync-interval {args.sync_interval}: must be more than 0")
    check_http_timeouts(args)


def _run_to_file(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..apps.filelog import FileOptions
    from ..apps.filenames import FilenameError, compute_format, host_identifier
    from ..apps.partitioning import Partitioning
    from ..extras import MissingExtra, require
    _check(args)
    files = file_options(args)
    # Given topics are taken as they are, but those the pattern rejects (nsq_to_file's rule);
    # without --topic the pattern picks from what nsqlookupd lists, refreshed.
    topics = [t for t in dict.fromkeys(args.topic) if not args.topic_pattern or re.search(args.topic_pattern, t)]
    if args.topic and not topics:
        raise UsageError(f"no --topic matches --topic-pattern {args.topic_pattern!r}")
    try:  # the file names, the folders and pyarrow are checked here, before any process starts
        options = FileOptions(**files)
        compute_format(options.filename_format, topics[0] if topics else "topic",
                       identifier=host_identifier(options.host_identifier), rev_needed=options.rev_needed)
        if options.partition_by:
            Partitioning(options.partition_by)
        if options.format == "parquet":
            require("parquet", "--format parquet")
    except (FilenameError, ValueError, MissingExtra) as exc:
        raise UsageError(str(exc)) from None
    if options.format == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401 - only whether it is there
        except ImportError:
            raise UsageError("--format parquet needs pyarrow (pip install pyarrow)") from None
    consumer = consumer_options(args)
    # The express lane trades RDY for latency at low rates; an archive holds its messages until
    # the sync anyway, and the lane's small RDY would count as starved and sync every few messages.
    consumer.setdefault("express_lane", False)
    return run_app_from(
        args, name="to-file", target="fastnsq.apps.to_file:ToFile", topics=topics, consumer=consumer,
        topic_pattern="" if args.topic else args.topic_pattern, topic_refresh=args.topic_refresh,
        handler_options={"channel": args.channel, "max_in_flight": args.max_in_flight,
                         "sync_interval": args.sync_interval, "file": files, "status_every": args.status_every},
    )
