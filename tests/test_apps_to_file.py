"""``fastnsq to-file``: nsq_to_file's command line on fastnsq, run as a real process against nsqd.

Real files, real signals: the archive holds every published body, files are named and rotated
as nsq_to_file names them (side by side with nsq's own binary in the real pass), a message is
FINed only once its file is fsynced, and a SIGKILL loses nothing.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import cramjam
import pytest

from fastnsq.apps.filenames import FilenameError, compute_format, go_strftime
from fastnsq.apps.goflags import long_options, normalize
from fastnsq.cli.main import build_parser, go_style

from .apps_support import Source, channel_drained, create_channels, go_app, run_to_exit, start, start_go
from .helpers import eventually, unique
from .test_consumer import channel_stats, publish_spread

SHORT_HOST = socket.gethostname().split(".")[0]


def read_lines(folder: Path) -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        elif path.suffix == ".zst":
            data = bytes(cramjam.zstd.decompress(data))
        lines += data.splitlines()
    return lines


async def drained(nsqd, topic: str, channel: str = "nsq_to_file", *, published: int) -> bool:
    return await channel_drained(nsqd.http_address, topic, channel, published=published)


# ---- the command line --------------------------------------------------------------------------


def test_go_spelling_is_taken() -> None:
    parser = build_parser()
    args = parser.parse_args(go_style(parser, [
        "to-file", "-topic=events", "-topic", "more", "-gzip", "-gzip-level=1", "-sync-interval=1s",
        "-rotate-interval", "1h", "-skip-empty-files=false", "--nsqd-tcp-address=127.0.0.1:4150", "-v"]))
    assert args.topic == ["events", "more"] and args.gzip is True and args.gzip_level == 1
    assert args.sync_interval == 1.0 and args.rotate_interval == 3600.0 and args.skip_empty_files is False
    assert args.verbose and args.channel == "nsq_to_file" and args.max_in_flight == 200
    assert args.output_dir == "/tmp" and args.datetime_format == "%Y-%m-%d_%H"
    known = long_options(parser)  # the top parser's: -- stays, a negative number and -v too
    assert normalize(["-version", "-1", "-v", "--", "-help"], known | {"--version"}) == ["--version", "-1", "-v",
                                                                                      "--", "-help"]


async def test_bad_values_are_named() -> None:
    nsqd = "-nsqd-tcp-address=127.0.0.1:4150"
    status, out = await run_to_exit("to-file", "-topic=t", "-gzip", "-gzip-level=10", nsqd)
    assert status == 2 and "invalid --gzip-level value (10), should be 1-9" in out
    status, out = await run_to_exit("to-file", "-topic=t", "-gzip", "-filename-format=<TOPIC>.log", nsqd)
    assert status == 2 and "missing <REV>" in out and "--filename-format" in out
    status, out = await run_to_exit("to-file", nsqd)
    assert status == 2 and "--topic or --topic-pattern required" in out
    status, out = await run_to_exit("to-file", "-topic=t", "-sync-interval=soon", nsqd)
    assert status == 2 and "--sync-interval" in out and "'soon'" in out


def test_filenames_follow_nsq_to_file() -> None:
    plain = compute_format("<TOPIC>.<HOST><REV>.<DATETIME>.log", "ev", identifier="h", rev_needed=False)
    assert plain == "ev.h.<DATETIME>.log"
    gz = compute_format("<TOPIC>.<HOST><REV>.<DATETIME>.log", "ev", identifier="h", rev_needed=True, suffix=".gz")
    assert gz == "ev.h<REV>.<DATETIME>.log.gz"
    with pytest.raises(FilenameError, match="missing <REV>"):
        compute_format("<TOPIC>.log", "ev", identifier="h", rev_needed=True)
    moment = time.mktime((2024, 3, 5, 7, 8, 9, 0, 0, -1))
    assert go_strftime("%Y-%m-%d_%H", moment) == "2024-03-05_07"
    assert go_strftime("%y%b%M%S%%%j", moment) == "24Mar0809%%j"  # %j: not a code nsq_to_file knows


# ---- archiving ---------------------------------------------------------------------------------


async def test_archives_every_message_gzip_through_a_work_dir(nsqd, tmp_path: Path) -> None:
    topic = unique("tofile")
    bodies = await publish_spread([nsqd.tcp_address], topic, 3000)
    out, work = tmp_path / "out", tmp_path / "work"
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      f"-work-dir={work}", "-gzip", "-gzip-level=1", "-sync-interval=200ms", "-max-in-flight=500",
                      log=tmp_path / "log")
    await eventually(lambda: drained(nsqd, topic, published=3000), 30, "the channel drained")
    assert await app.stop() == 0, app.log()
    names = [p.name for p in out.iterdir()]
    assert len(names) == 1 and re.fullmatch(rf"{topic}\.{SHORT_HOST}-000000\.\d{{4}}-\d\d-\d\d_\d\d\.log\.gz",
                                            names[0]), names
    assert list(work.iterdir()) == []  # moved out on close
    assert sorted(read_lines(out)) == sorted(bodies)
    [stats] = await channel_stats([nsqd.http_address], topic, "nsq_to_file")
    assert stats["message_count"] == 3000 and stats["requeue_count"] == 0


async def test_rotate_size_starts_the_next_rev_past_the_size(nsqd, tmp_path: Path) -> None:
    topic = unique("tofile")
    bodies = await publish_spread([nsqd.tcp_address], topic, 100, size=20)  # 21 bytes a line
    app = await start("to-file", f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}",
                      f"--output-dir={tmp_path / 'out'}", "--rotate-size=200", "--sync-interval=100ms",
                      "--skip-empty-files",  # else a tick past the size opens an empty next file, as Go does
                      log=tmp_path / "log")
    await eventually(lambda: drained(nsqd, topic, published=100), 20, "the channel drained")
    assert await app.stop() == 0, app.log()
    files = sorted((tmp_path / "out").iterdir())
    revs = [re.search(r"-(\d{6})\.", p.name).group(1) for p in files]  # type: ignore[union-attr]
    assert revs == [f"{i:06d}" for i in range(10)], revs  # 10 lines (210 bytes) a file: past 200, then the next
    assert all(len(p.read_bytes().splitlines()) == 10 for p in files)
    assert sorted(read_lines(tmp_path / "out")) == sorted(bodies)


async def test_a_message_is_fined_only_after_its_file_is_synced(nsqd, tmp_path: Path) -> None:
    """Fewer messages than max in flight and a long sync interval: they stay in flight, and no
    file holds them, until the drain writes, fsyncs, then FINs them."""
    topic = unique("tofile")
    bodies = await publish_spread([nsqd.tcp_address], topic, 50)
    out = tmp_path / "out"
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      "-sync-interval=1h", "-max-in-flight=1000", "--skip-empty-files", log=tmp_path / "log")

    async def all_in_flight() -> bool:
        stats = await channel_stats([nsqd.http_address], topic, "nsq_to_file")
        return bool(stats) and stats[0]["in_flight_count"] == 50

    await eventually(all_in_flight, 20, "50 messages in flight")
    await __import__("asyncio").sleep(0.5)
    [stats] = await channel_stats([nsqd.http_address], topic, "nsq_to_file")
    assert stats["message_count"] == 50 and stats["in_flight_count"] == 50
    assert not out.exists() or read_lines(out) == []
    assert await app.stop() == 0, app.log()
    assert sorted(read_lines(out)) == sorted(bodies)
    assert await drained(nsqd, topic, published=50)


async def test_zstd_frames_and_parquet_read_back(nsqd, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    for flags, folder in ((["--zstd"], "zst"), (["--format", "parquet"], "pq")):
        topic = unique("tofile")
        bodies = await publish_spread([nsqd.tcp_address], topic, 2000)
        app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                          f"-output-dir={tmp_path / folder}", "-sync-interval=100ms",
                          "-max-in-flight=300", *flags, log=tmp_path / f"{folder}.log")
        await eventually(lambda topic=topic: drained(nsqd, topic, published=2000), 30, "the channel drained")
        assert await app.stop() == 0, app.log()
    assert all(p.name.endswith(".log.zst") for p in (tmp_path / "zst").iterdir())
    assert all(p.name.endswith(".log.parquet") for p in (tmp_path / "pq").iterdir())
    assert sorted(read_lines(tmp_path / "zst")) == sorted(bodies)
    tables = [pq.read_table(p) for p in sorted((tmp_path / "pq").iterdir())]
    read = [body for table in tables for body in table.column("body").to_pylist()]
    assert len(read) == 2000 and sorted(read) == sorted(bodies)
    assert tables[0].column_names == ["body", "id", "timestamp", "attempts"]
    # Many syncs (150 messages at most each: --max-in-flight 300), one file of one row group:
    # each sync went to the spool, the drain finished the file.
    groups = [meta.row_group(i).num_rows for p in sorted((tmp_path / "pq").iterdir())
              for meta in [pq.ParquetFile(p).metadata] for i in range(meta.num_row_groups)]
    assert groups == [2000] and len(tables) == 1, (groups, len(tables))
    assert all(len(i) == 16 for i in tables[0].column("id").to_pylist())
    assert set(tables[0].column("attempts").to_pylist()) == {1}
    stamps = tables[0].column("timestamp").to_pylist()
    assert all(abs(stamp.timestamp() - time.time()) < 120 for stamp in stamps)  # when nsqd took them


async def test_several_topics_a_file_each(nsqd, tmp_path: Path) -> None:
    one, two = unique("tofile"), unique("tofile")
    bodies = {one: await publish_spread([nsqd.tcp_address], one, 300), two: await publish_spread(
        [nsqd.tcp_address], two, 200)}
    app = await start("to-file", f"-topic={one}", f"-topic={two}", f"-nsqd-tcp-address={nsqd.tcp_address}",
                      f"-output-dir={tmp_path}", "-sync-interval=100ms", "-max-in-flight=100", log=tmp_path / "log")
    await eventually(lambda: drained(nsqd, one, published=300), 20, "the first topic drained")
    await eventually(lambda: drained(nsqd, two, published=200), 20, "the second topic drained")
    assert await app.stop() == 0, app.log()
    for topic, published in bodies.items():
        [path] = tmp_path.glob(f"{topic}.*.log")
        assert sorted(path.read_bytes().splitlines()) == sorted(published)


async def test_several_topics_and_a_pattern_refreshed_through_lookupd(nsq_cluster, tmp_path: Path) -> None:
    """--topic-pattern without --topic: a process per matching topic nsqlookupd lists, a topic
    created later found at the next --topic-refresh, a topic that does not match left alone."""
    base = unique("pat")
    nsqd = [nsq_cluster.tcp_addresses[0]]
    first = await publish_spread(nsqd, f"{base}_a", 200)
    await publish_spread(nsqd, f"{base}_other", 10)
    lookupd = [f"-lookupd-http-address={address}" for address in nsq_cluster.lookupd_http_addresses]
    out = tmp_path / "out"
    app = await start("to-file", f"-topic-pattern=^{base}_(a|b)$", "-topic-refresh=300ms", *lookupd,
                      f"-output-dir={out}", "-sync-interval=100ms", log=tmp_path / "log")

    async def archived(topic: str, count: int) -> bool:
        return out.exists() and len(read_lines(out)) >= count and any(
            p.name.startswith(topic + ".") for p in out.iterdir())

    await eventually(lambda: archived(f"{base}_a", 200), 30, "topic a archived")
    second = await publish_spread(nsqd, f"{base}_b", 300)
    await eventually(lambda: archived(f"{base}_b", 500), 30, "topic b found and archived")
    assert await app.stop() == 0, app.log()
    topics = sorted({p.name.split(".")[0] for p in out.iterdir()})
    assert topics == [f"{base}_a", f"{base}_b"]
    assert sorted(read_lines(out)) == sorted(first + second)


async def test_parquet_from_an_ha_topic_has_partition_and_offset(nsq_cluster_ha, tmp_path: Path) -> None:
    """On youzan's partitioned nsqd (embedded), the Parquet rows carry each message's partition
    (and an offset column, filled when consumed with SUB_ORDERED)."""
    pq = pytest.importorskip("pyarrow.parquet")
    topic = unique("haparquet")
    await nsq_cluster_ha.create_topic(topic, partitions=2, channels=["nsq_to_file"])
    bodies = [b"ha-%05d" % i for i in range(600)]
    from fastnsq import Producer

    async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
        await asyncio.gather(*(producer.publish(topic, body) for body in bodies))
    out = tmp_path / "out"
    lookupd = [f"-lookupd-http-address={a}" for a in nsq_cluster_ha.lookupd_http_addresses]
    app = await start("to-file", f"-topic={topic}", *lookupd, f"-output-dir={out}", "-format=parquet",
                      f"-work-dir={tmp_path / 'work'}",  # the output dir gets whole files only
                      "-sync-interval=200ms", "-consumer-opt=lookupd_poll_interval,0.5",
                      "-rotate-interval=1s",  # files finished while it runs: the rows show up in them
                      log=tmp_path / "log")

    def rows() -> list[dict]:
        return [row for path in sorted(out.glob("*.parquet")) for row in pq.read_table(path).to_pylist()] \
            if out.exists() else []

    await eventually(lambda: len(rows()) >= 600, 30, "600 rows archived")
    assert await app.stop() == 0, app.log()
    found = rows()
    assert sorted(r["body"] for r in found) == bodies
    assert {r["partition"] for r in found} == {0, 1} and all("offset" in r for r in found)


@pytest.mark.slow
async def test_parquet_files_read_back_by_spark(nsqd, tmp_path: Path) -> None:
    """The files of --format parquet, read by Spark (local[1]): the same count and bodies."""
    import shutil

    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs java")
    topic = unique("tofile")
    bodies = await publish_spread([nsqd.tcp_address], topic, 3000)
    out = tmp_path / "pq"
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      "-sync-interval=200ms", "-max-in-flight=500", "-format=parquet", log=tmp_path / "log")
    await eventually(lambda: drained(nsqd, topic, published=3000), 30, "the channel drained")
    assert await app.stop() == 0, app.log()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("fastnsq-to-file")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        frame = spark.read.parquet(str(out))
        rows = frame.select("body", "attempts").collect()
    finally:
        spark.stop()
    assert len(rows) == 3000 and sorted(bytes(r["body"]) for r in rows) == sorted(bodies)
    assert {r["attempts"] for r in rows} == {1}


@pytest.mark.slow
async def test_sigkill_mid_stream_loses_nothing(nsqd, tmp_path: Path) -> None:
    """Killed while archiving, started again: every body is in a file, duplicates at most max in flight."""
    topic = unique("tofile")
    bodies = await publish_spread([nsqd.tcp_address], topic, 60_000)
    out = tmp_path / "out"
    args = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
            "-sync-interval=1s", "-max-in-flight=500",
            "-consumer-opt=msg_timeout,3s"]  # a killed worker's messages come back in 3 s, not 60
    app = await start("to-file", *args, log=tmp_path / "log")

    source = Source(nsqd.http_address, topic, "nsq_to_file")
    await eventually(lambda: source.taken(5000), 30, "a part archived", progress=source.done)
    await app.kill()
    assert "drained:" not in app.log()  # killed: no drain
    app = await start("to-file", *args, log=tmp_path / "log")
    await eventually(lambda: source.drained(60_000), 60, "the channel drained", progress=source.done)
    assert await app.stop() == 0, app.log()
    counts = Counter(read_lines(out))
    assert set(counts) == set(bodies)  # nothing lost
    duplicates = sum(counts.values()) - len(bodies)
    assert duplicates <= 500, duplicates


# ---- beside nsq's own nsq_to_file (the real pass) -----------------------------------------------


@pytest.mark.skipif(not go_app("nsq_to_file"), reason="nsq's nsq_to_file is run beside ours in the real pass")
async def test_same_files_as_nsq_to_file(nsqd, tmp_path: Path) -> None:
    """The same flags to nsq_to_file and to ours, on two channels of one topic: the same file
    names (revisions, the work dir, gzip) and the same lines in each."""
    topic = unique("tofile")
    await create_channels(nsqd.http_address, topic, "go", "ours")
    bodies = await publish_spread([nsqd.tcp_address], topic, 300, size=30)
    common = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", "-gzip", "-rotate-size=1000",
              "-sync-interval=200ms", "-max-in-flight=1"]  # one at a time: both split files alike
    for name, starter in (("go", start_go), ("ours", start)):
        app = await starter("nsq_to_file" if name == "go" else "to-file", *common, f"-channel={name}",
                            f"-output-dir={tmp_path / name}", f"-work-dir={tmp_path / (name + '-work')}",
                            log=tmp_path / f"{name}.log")
        await eventually(lambda name=name: drained(nsqd, topic, name, published=300), 60, f"{name} drained")
        assert await app.stop() == 0, app.log()
    go_files, our_files = _by_hourless_name(tmp_path / "go"), _by_hourless_name(tmp_path / "ours")
    assert sorted(our_files) == sorted(go_files) and len(go_files) == 10  # 31 bytes a line: 33 lines past 1000
    for name, go_file in go_files.items():
        assert gzip.decompress(our_files[name].read_bytes()) == gzip.decompress(go_file.read_bytes())
    assert sorted(read_lines(tmp_path / "ours")) == sorted(bodies)


def _by_hourless_name(folder: Path) -> dict[str, Path]:
    """The files by name with the default datetime (%Y-%m-%d_%H) blanked: the two apps run one
    after the other, and an hour may turn between them."""
    return {re.sub(r"\.\d{4}-\d{2}-\d{2}_\d{2}\.", ".<hour>.", path.name): path for path in folder.iterdir()}


# ---- SIGHUP: sync and close the file, as nsq_to_file does ------------------------------------------

APPS = [pytest.param("ours", id="ours"),
        pytest.param("go", id="nsq_to_file", marks=pytest.mark.skipif(
            not go_app("nsq_to_file"), reason="nsq's nsq_to_file is run beside ours in the real pass"))]


@pytest.mark.parametrize("impl", APPS)
@pytest.mark.parametrize("layout", ["logrotate", "work-dir"])
async def test_sighup_closes_the_file_and_the_next_message_opens_one(nsqd, tmp_path: Path, impl: str,
                                                                      layout: str) -> None:
    """SIGHUP syncs and closes the file and the app goes on: after logrotate moved the file
    away, the next messages go to a new file of the same name; with a work dir, the closed
    file is moved to the output dir at once and the next ones go to the next <REV>. The same
    expectations for nsq_to_file (real pass) and ours, but for nsq_to_file's crash after a
    SIGHUP with a work dir."""
    topic = unique("tofile")
    out, work = tmp_path / "out", tmp_path / "work"
    flags = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
             "-sync-interval=100ms", "-filename-format=<TOPIC><REV>.log", f"-channel={impl}"]
    if layout == "work-dir":
        flags.append(f"-work-dir={work}")
    await create_channels(nsqd.http_address, topic, impl)
    first = await publish_spread([nsqd.tcp_address], topic, 200)
    app = await (start_go("nsq_to_file", *flags, log=tmp_path / "log") if impl == "go"
                 else start("to-file", *flags, log=tmp_path / "log"))
    await eventually(lambda: drained(nsqd, topic, impl, published=200), 30, "the first messages written")
    name = f"{topic}.log" if layout == "logrotate" else f"{topic}-000000.log"
    if layout == "logrotate":
        (out / name).rename(out / f"{name}.1")  # what logrotate does before it signals
    app.process.send_signal(signal.SIGHUP)
    # Closed: a new file of the same name opened at the next tick (logrotate's), or the closed
    # one moved to the output dir (a work dir's).
    await eventually(lambda: (out / name).exists(), 10, f"{name} after SIGHUP")
    assert app.running, app.log()
    second = await publish_spread([nsqd.tcp_address], topic, 100)
    if impl == "go" and layout == "work-dir":
        # nsq_to_file v1.3.0's bug, not followed: its Close() returns after the move without
        # forgetting the file, so the next message is written to the closed file and it exits.
        await eventually(lambda: not app.running, 10, "nsq_to_file exited")
        assert "file already closed" in app.log() and app.process.returncode == 1
        return
    await eventually(lambda: drained(nsqd, topic, impl, published=300), 30, "the next messages written")
    assert await app.stop() == 0, app.log()
    if layout == "logrotate":
        assert sorted((out / f"{name}.1").read_bytes().splitlines()) == sorted(first)
        assert sorted((out / name).read_bytes().splitlines()) == sorted(second)
    else:
        assert sorted(p.name for p in out.iterdir()) == [name, f"{topic}-000001.log"]
        assert sorted((out / name).read_bytes().splitlines()) == sorted(first)
        assert sorted((out / f"{topic}-000001.log").read_bytes().splitlines()) == sorted(second)


# ---- gzip: the fastest library at hand, standard members ----------------------------------------


@pytest.mark.parametrize("level", [1, 3, 6, 9])
def test_every_gzip_library_writes_members_gzip_reads(level: int, monkeypatch) -> None:
    """ISA-L (when installed, levels 1-3), cramjam, or zlib: each sync's member is standard gzip,
    and members written one after another read back as one stream (gzip -d's view of a file)."""
    import builtins
    import subprocess

    from fastnsq.apps.filelog import gzip_member

    data = [b"".join(b"%08d-%s\n" % (i, b"line of a sync " * (i % 5)) for i in range(start, start + 500))
            for start in (0, 500)]
    chosen = [gzip_member(level)]
    real_import = builtins.__import__

    def without(*names: str):
        def fake(name, *args, **kwargs):
            if name.split(".")[0] in names:
                raise ImportError(name)
            return real_import(name, *args, **kwargs)
        return fake

    monkeypatch.setattr(builtins, "__import__", without("isal"))
    chosen.append(gzip_member(level))
    monkeypatch.setattr(builtins, "__import__", without("isal", "cramjam"))
    chosen.append(gzip_member(level))
    monkeypatch.undo()
    assert [name for _, name in chosen[1:]] == ["cramjam", "zlib"]
    for member, name in chosen:
        stream = member(data[0]) + member(data[1])
        assert gzip.decompress(stream) == data[0] + data[1], name
        unzipped = subprocess.run(["gzip", "-dc"], input=stream, capture_output=True, check=True).stdout
        assert unzipped == data[0] + data[1], name
