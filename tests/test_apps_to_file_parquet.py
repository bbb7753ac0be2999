"""``fastnsq to-file``: Parquet files per rotation from a durable spool, and ``--partition-by`` folders.

The spool and the finishing of a file are driven directly (a crash at each step of the
commit is a file left as it would be), then the app as a real process: files as big as the
rotation says, partition folders that DuckDB and Spark prune, a SIGKILL mid-stream and at
rotations losing nothing, and a restart that says in one line what it found and did.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from fastnsq.apps.archive import Archive
from fastnsq.apps.filelog import FileOptions
from fastnsq.apps.partitioning import DEFAULT_PARTITION, Partitioning, PartitionSpecError, escape_value

from .apps_support import Source, channel_drained, run_to_exit, start
from .helpers import eventually, unique
from .test_consumer import publish_spread

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from fastnsq.apps import parquetfile, spool

HOUR_NS = 3600 * 10**9
T0 = 1_764_300_000 * 10**9  # 2025-11-28 03:20:00 UTC


def record(n: int, *, at: int = T0, body: bytes | None = None) -> SimpleNamespace:
    return SimpleNamespace(body=body if body is not None else b"body-%06d" % n, id=b"%016d" % n, timestamp=at,
                           attempts=1, partition=None, offset=None)


def parquet_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.parquet"))


def rows_of(folder: Path) -> list[bytes]:
    return [body for path in parquet_files(folder) for body in pq.read_table(path).column("body").to_pylist()]


async def drained(nsqd, topic: str, published: int) -> bool:
    return await channel_drained(nsqd.http_address, topic, "nsq_to_file", published=published)


def leftovers(folder: Path) -> list[Path]:
    """Spools and temporary files: none once the app has stopped cleanly."""
    return sorted(p for p in folder.rglob(".*") if p.is_file())


# ---- the spool -------------------------------------------------------------------------------------


def test_a_spool_reads_back_to_its_last_whole_frame(tmp_path: Path) -> None:
    path = str(tmp_path / spool.spool_name("t.parquet"))
    writer = spool.SpoolWriter(path, {"topic": "t", "id": "x"})
    for first in (0, 10, 20):
        writer.append(spool.record_batch([record(n) for n in range(first, first + 10)]))
    writer.close()
    whole = spool.read_spool(path)
    assert whole.header == {"topic": "t", "id": "x"} and whole.rows == 30 and whole.torn_bytes == 0
    size = os.path.getsize(path)
    with open(path, "r+b") as file:  # the last frame cut short: killed inside its write, before its fsync
        file.truncate(size - 7)
    cut = spool.read_spool(path)
    assert cut.rows == 20 and cut.torn_bytes > 0
    assert [b for batch in cut.batches for b in batch.column("body").to_pylist()] == [b"body-%06d" % n
                                                                                      for n in range(20)]
    with open(path, "r+b") as file:  # a flipped byte inside the second frame: its CRC fails, reading stops there
        file.seek(size // 2)
        byte = file.read(1)
        file.seek(size // 2)
        file.write(bytes([byte[0] ^ 0xFF]))
    assert spool.read_spool(path).rows == 10
    assert spool.read_header(path)["topic"] == "t"
    (tmp_path / ".other.spool").write_bytes(b"not a spool")
    with pytest.raises(spool.NotASpool):
        spool.read_header(str(tmp_path / ".other.spool"))
    with pytest.raises(FileExistsError):  # a name is never reused
        spool.SpoolWriter(path, {"topic": "t", "id": "y"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.spool", ".t.parquet.spool"]  # nothing half made


def _spool_of(folder: Path, name: str, batches: list[list[SimpleNamespace]], rev: int = 0) -> str:
    path = str(folder / spool.spool_name(name))
    writer = spool.SpoolWriter(path, {"topic": "t", "id": f"id-{name}", "rev": rev,
                                      "template": re.sub(r"-\d{6}\.", "<REV>.", name)})
    for batch in batches:
        writer.append(spool.record_batch(batch))
    writer.close()
    return path


def test_finishing_a_spool_writes_row_groups_of_the_size_asked(tmp_path: Path) -> None:
    options = FileOptions(output_dir=str(tmp_path), format="parquet", row_group_size=20_000)
    path = _spool_of(tmp_path, "t-000000.parquet", [[record(n) for n in range(i, i + 100)]
                                                    for i in range(0, 2000, 100)])
    done = parquetfile.finish(path, options)
    assert done.path == str(tmp_path / "t-000000.parquet") and done.rows == 2000 and not done.already_done
    meta = pq.read_metadata(done.path)
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(sizes) == 2000 and 1 < len(sizes) < 20  # several syncs a row group, several row groups
    assert meta.metadata[parquetfile.ID_KEY.encode()] == b"id-t-000000.parquet"
    assert leftovers(tmp_path) == []  # spool and temporary file removed
    assert pq.read_table(done.path).column("body").to_pylist() == [b"body-%06d" % n for n in range(2000)]


def test_a_crash_after_the_link_never_writes_a_file_twice(tmp_path: Path) -> None:
    """Killed between linking the file and removing its spool: the restart finds the file by
    the spool's id and removes the spool; a foreign file at the name is passed by."""
    options = FileOptions(output_dir=str(tmp_path), format="parquet")
    path = _spool_of(tmp_path, "t-000000.parquet", [[record(n) for n in range(50)]])
    spool_bytes = Path(path).read_bytes()
    first = parquetfile.finish(path, options)
    Path(path).write_bytes(spool_bytes)  # as the crash left it
    again = parquetfile.finish(path, options)
    assert again.already_done and again.path == first.path and parquet_files(tmp_path) == [Path(first.path)]
    assert leftovers(tmp_path) == []
    # A file at the name that is not this spool's (another writer): the next <REV>.
    other = _spool_of(tmp_path, "u-000000.parquet", [[record(n) for n in range(5)]])
    pq.write_table(pa.table({"body": [b"foreign"]}), tmp_path / "u-000000.parquet")
    done = parquetfile.finish(other, options)
    assert done.path == str(tmp_path / "u-000001.parquet") and pq.read_table(done.path).num_rows == 5


def test_a_spool_that_cannot_be_finished_stays_and_is_named(tmp_path: Path) -> None:
    """A frame whose CRC holds but whose bytes are no Arrow batch: the finisher reports the
    spool by name (the app's report ends the process), and the spool is left for the next start."""
    options = FileOptions(output_dir=str(tmp_path), format="parquet")
    path = _spool_of(tmp_path, "t-000000.parquet", [[record(n) for n in range(5)]])
    with open(path, "ab") as file:
        file.writelines(spool._frame(b"not an arrow stream"))
    failures: list[BaseException] = []
    finisher = parquetfile.Finisher(options, "t", on_failure=failures.append)
    finisher.submit(path)
    finisher.close()
    assert len(failures) == 1 and isinstance(failures[0], parquetfile.FinishError)
    assert path in str(failures[0])
    assert os.path.exists(path) and parquet_files(tmp_path) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_spool_whose_maker_is_a_zombie_was_killed_as_it_was_made(tmp_path: Path) -> None:
    """A SIGKILLed child not reaped yet (its supervisor killed too, init not there yet) still
    answers kill(pid, 0): a restart that looks then must take its spool as cut, not as live."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    stat = Path(f"/proc/{zombie.pid}/stat")
    while b") Z " not in stat.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)  # exited, not reaped: we do not wait() for it yet
    try:
        name = spool.spool_name("t-000001.parquet") + f".{zombie.pid}.new"
        assert parquetfile._maker_gone(name)
        assert not parquetfile._maker_gone(spool.spool_name("t-000002.parquet") + f".{os.getpid()}.new")
    finally:
        zombie.wait()


def test_a_restart_finishes_the_spools_left_and_says_so_in_one_line(tmp_path: Path, caplog) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    options = FileOptions(output_dir=str(out), work_dir=str(work), format="parquet", partition_by="hourly",
                          filename_format="<TOPIC><REV>.parquet")
    crashed = Archive(options, "t", "h")
    crashed.sync([record(n, at=T0 + (n % 2) * HOUR_NS) for n in range(100)])
    crashed.finisher.close()  # the process dies: the spools stay, nothing finished
    with open(next(work.rglob("*.spool")), "ab") as file:
        file.write(b"FRAM\x10")  # and one frame was cut short as it was written
    # Killed as spools were made: one a minute ago, one by a process now gone; and one being
    # made now by a live process (this one).
    cut = Path(spool.new_name(str(work / spool.spool_name("t-000009.parquet"))))
    cut.write_bytes(spool.MAGIC[:4])
    os.utime(cut, (time.time() - 120, time.time() - 120))
    gone = work / (spool.spool_name("t-000010.parquet") + f".{2**22 + 7}.new")  # above Linux's pid_max
    gone.write_bytes(b"")
    being_made = Path(spool.new_name(str(work / spool.spool_name("u-000000.parquet"))))
    being_made.write_bytes(b"")
    other = Archive(FileOptions(**options.__dict__), "another-topic", "h")
    other.sync([record(n) for n in range(7)])
    other.finisher.close()
    caplog.set_level(logging.INFO, logger="fastnsq.apps.to_file")
    restarted = Archive(options, "t", "h")
    restarted.recover()
    restarted.sync([record(n, at=T0) for n in range(100, 110)])  # a new spool beside the old one
    restarted.close()
    lines = [r.getMessage() for r in caplog.records if "restart:" in r.getMessage()]
    assert len(lines) == 1, lines
    assert re.search(r"found 2 spool\(s\) .* holding 100 message\(s\); wrote 2 Parquet file\(s\) of 100 row",
                     lines[0]) and "torn byte(s)" in lines[0], lines[0]
    assert "removed 2 spool(s) killed as they were made" in lines[0], lines[0]
    assert not cut.exists() and not gone.exists() and being_made.exists()
    being_made.unlink()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    bodies = sorted(rows_of(out))
    assert bodies == sorted([b"body-%06d" % n for n in range(110)])
    assert [p.relative_to(out).as_posix() for p in parquet_files(out)] == [
        "dt=2025-11-28/hr=03/t-000000.parquet", "dt=2025-11-28/hr=03/t-000001.parquet",
        "dt=2025-11-28/hr=04/t-000000.parquet"]
    assert [p.name for p in work.rglob(".*")] == [spool.spool_name("another-topic-000000.parquet")]


# ---- partitions ------------------------------------------------------------------------------------


def test_partition_folders_from_the_timestamp_and_a_json_field() -> None:
    hourly = Partitioning("hourly")
    assert hourly.folder(record(1)) == "dt=2025-11-28/hr=03"
    assert hourly.folder(record(1, at=T0 + 21 * HOUR_NS)) == "dt=2025-11-29/hr=00"  # UTC
    by_country = Partitioning("country={country}/dt=%Y-%m-%d")
    assert by_country.folder(record(1, body=b'{"country": "DE"}')) == "country=DE/dt=2025-11-28"
    assert by_country.folder(record(1, body=b'{"country": "a/b=c"}')) == "country=a%2Fb%3Dc/dt=2025-11-28"
    assert by_country.folder(record(1, body=b"not json")) == f"country={DEFAULT_PARTITION}/dt=2025-11-28"
    assert by_country.folder(record(1, body=b'{"country": 7}')) == "country=7/dt=2025-11-28"
    assert escape_value("") == DEFAULT_PARTITION
    split = hourly.split([record(n, at=T0 + (n % 3) * HOUR_NS) for n in range(9)])
    assert {k: [r.body for r in v] for k, v in split.items()}["dt=2025-11-28/hr=04"] == [
        b"body-000001", b"body-000004", b"body-000007"]
    for bad, says in (("dt", "is not KEY=VALUE"), ("body=%Y", "is a column"), ("a=%Y/a=%m", "given twice"),
                      ("dt=%Y//hr=%H", "is not KEY=VALUE")):
        with pytest.raises(PartitionSpecError, match=says):
            Partitioning(bad)


def test_plain_files_in_partition_folders_close_at_rotation_with_no_empty_one(tmp_path: Path) -> None:
    options = FileOptions(output_dir=str(tmp_path), partition_by="hourly", filename_format="<TOPIC><REV>.log",
                          rotate_interval=3600)
    archive = Archive(options, "t", "h")
    archive.sync([record(n, at=T0 + (n % 2) * HOUR_NS) for n in range(10)])
    assert len(archive.files) == 2
    options.rotate_interval = 1e-9  # every file now due
    archive.tick()
    assert archive.files == {}  # closed and forgotten; no empty successor
    archive.close()
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.log"))
    assert files == ["dt=2025-11-28/hr=03/t-000000.log", "dt=2025-11-28/hr=04/t-000000.log"]
    assert (tmp_path / files[1]).read_bytes().splitlines() == [b"body-%06d" % n for n in range(1, 10, 2)]


async def test_bad_partition_and_parquet_flags_are_named() -> None:
    nsqd = "-nsqd-tcp-address=127.0.0.1:4150"
    status, out = await run_to_exit("to-file", "-topic=t", "-partition-by=id=%Y", nsqd)
    assert status == 2 and "--partition-by 'id=%Y'" in out and "is a column" in out
    status, out = await run_to_exit("to-file", "-topic=t", "-format=parquet", "-parquet-row-group-size=0", nsqd)
    assert status == 2 and "--parquet-row-group-size 0: must be 1 or more" in out


# ---- the app ---------------------------------------------------------------------------------------


async def test_parquet_files_follow_the_rotation_not_the_syncs(nsqd, tmp_path: Path) -> None:
    """Messages over ~4 s, a sync every 100 ms or 100 messages, --rotate-interval 1s: a file a
    second or so, each of many syncs; every row read back; nothing left beside the files."""
    topic = unique("pqrot")
    out = tmp_path / "out"
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      "-format=parquet", "-rotate-interval=1s", "-sync-interval=100ms", "-max-in-flight=200",
                      log=tmp_path / "log")
    bodies = await publish_spread([nsqd.tcp_address], topic, 10)
    await eventually(lambda: drained(nsqd, topic, len(bodies)), 30, "the app consuming")
    for _ in range(16):
        bodies += await publish_spread([nsqd.tcp_address], topic, 250)
        await __import__("asyncio").sleep(0.25)
    await eventually(lambda: drained(nsqd, topic, len(bodies)), 30, "the channel drained")
    assert await app.stop() == 0, app.log()
    files = parquet_files(out)
    assert 3 <= len(files) <= 8, [p.name for p in files]
    assert sorted(rows_of(out)) == sorted(bodies) and leftovers(out) == []
    log = app.log()
    assert log.count(" wrote ") == len(files)
    assert "syncing" not in log  # per-sync lines are DEBUG
    assert re.search(rf"starting 1 worker process\(es\) for \S+ on topic {topic}, channel nsq_to_file", log), log
    assert f"[{topic}/nsq_to_file] archiving to {out}: Parquet" in log


async def test_a_restart_logs_no_warning_per_earlier_file(nsqd, tmp_path: Path) -> None:
    """Started again over 30 files of an earlier run: one line names the file opened and how
    many names were taken, where a WARNING per file was logged."""
    topic = unique("tofile")
    out = tmp_path / "out"
    out.mkdir()
    for rev in range(30):
        (out / f"{topic}-{rev:06d}.log.gz").write_bytes(b"")
    await publish_spread([nsqd.tcp_address], topic, 10)
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      "-gzip", "-filename-format=<TOPIC><REV>.log", "-sync-interval=100ms", log=tmp_path / "log")
    await eventually(lambda: drained(nsqd, topic, 10), 20, "the channel drained")
    assert await app.stop() == 0, app.log()
    log = app.log()
    assert "WARNING" not in log, log
    assert f"opening {out / topic}-000030.log.gz (the 30 name(s) before it taken)" in log, log


async def test_a_folder_that_gets_no_more_records_is_finished_while_others_are_busy(nsqd, tmp_path: Path) -> None:
    """Records for folder a, then a steady trickle for folder b: a's file is finished at its
    rotation while b's records keep every tick busy with a sync."""
    import asyncio

    from fastnsq import Producer

    topic = unique("pqidle")
    out = tmp_path / "out"
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      "-format=parquet", "-partition-by=k={k}", "-rotate-interval=1s", "-sync-interval=300ms",
                      "-max-in-flight=2000",  # a sync at 1,000 held: the trickle of b leaves some held at each tick
                      log=tmp_path / "log")
    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, [json.dumps({"k": "a", "n": n}).encode() for n in range(200)])
        finished_a = False
        for n in range(100):  # 5 s of b: 20 messages every 50 ms
            await producer.mpublish(topic, [json.dumps({"k": "b", "n": n * 20 + i}).encode() for i in range(20)])
            await asyncio.sleep(0.05)
            finished_a = finished_a or bool(list((out / "k=a").glob("*.parquet")))
    await eventually(lambda: drained(nsqd, topic, 2200), 30, "the channel drained")
    assert await app.stop() == 0, app.log()
    assert finished_a, app.log()
    assert len(rows_of(out / "k=a")) == 200 and len(rows_of(out / "k=b")) == 2000


def _duckdb_files_read(folder: Path, where: str) -> tuple[int, int, int]:
    """(rows, files scanned, files in all) of a filtered DuckDB count, from EXPLAIN ANALYZE."""
    duckdb = pytest.importorskip("duckdb")
    source = f"read_parquet('{folder}/**/*.parquet', hive_partitioning = true)"
    con = duckdb.connect()
    rows = con.execute(f"SELECT count(*) FROM {source} WHERE {where}").fetchall()[0][0]
    plan = con.execute(f"EXPLAIN ANALYZE SELECT count(*) FROM {source} WHERE {where}").fetchall()[0][1]
    scanned, total = map(int, re.search(r"Scanning Files: (\d+)/(\d+)", plan).groups())  # type: ignore[union-attr]
    return rows, scanned, total


async def test_partition_folders_are_pruned_by_duckdb(nsqd, tmp_path: Path) -> None:
    """--partition-by with a JSON field: a filter on it makes DuckDB open that folder's file only."""
    topic = unique("pqpart")
    countries = ["DE", "FR", "US", "a/b"]
    bodies = [json.dumps({"n": n, "country": countries[n % 4]}).encode() for n in range(2000)]
    from fastnsq import Producer

    async with Producer([nsqd.tcp_address]) as producer:
        await producer.mpublish(topic, bodies)
    out = tmp_path / "out"
    app = await start("to-file", f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}",
                      "-format=parquet", "-partition-by=country={country}/dt=%Y-%m-%d", "-sync-interval=100ms",
                      log=tmp_path / "log")
    await eventually(lambda: drained(nsqd, topic, 2000), 30, "the channel drained")
    assert await app.stop() == 0, app.log()
    files = parquet_files(out)
    assert sorted({p.parent.parent.name for p in files}) == ["country=DE", "country=FR", "country=US",
                                                             "country=a%2Fb"]
    assert sorted(rows_of(out)) == sorted(bodies)
    assert _duckdb_files_read(out, "country = 'FR'") == (500, 1, 4)
    assert _duckdb_files_read(out, "country = 'a/b'") == (500, 1, 4)  # unescaped by the reader
    assert _duckdb_files_read(out, "dt = '2000-01-01'") == (0, 0, 4)


@pytest.mark.slow
@pytest.mark.spark
async def test_partition_folders_are_pruned_by_spark(tmp_path: Path) -> None:
    """spark.read.parquet(dir) finds the hourly folders and reads one file for one hour."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs java")
    out = tmp_path / "out"
    archive = Archive(FileOptions(output_dir=str(out), format="parquet", partition_by="hourly"), "t", "h")
    archive.sync([record(n, at=T0 + (n % 4) * HOUR_NS) for n in range(4000)])
    archive.close()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("fastnsq-partitions")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        frame = spark.read.parquet(str(out))
        assert frame.count() == 4000
        hour = frame.where("dt = '2025-11-28' AND hr = 5").select("body")
        assert hour.count() == 1000
        hour.collect()
        plan = hour._jdf.queryExecution().executedPlan()
        assert "PartitionFilters: [" in plan.toString() and "(hr#" in plan.toString()
        metrics = _scan_metrics(plan)
    finally:
        spark.stop()
    assert metrics["numFiles"] == 1 and metrics["numPartitions"] == 1, metrics


def _scan_metrics(node) -> dict[str, int]:
    if "Scan" in node.nodeName():
        found, entries = {}, node.metrics().iterator()
        while entries.hasNext():
            entry = entries.next()
            found[entry._1()] = entry._2().value()
        return found
    children = node.children()
    for index in range(children.size()):
        found = _scan_metrics(children.apply(index))
        if found:
            return found
    return {}


@pytest.mark.slow
async def test_sigkill_between_syncs_and_at_rotations_loses_nothing(nsqd, tmp_path: Path) -> None:
    """--rotate-size small enough that a file is finished every few syncs: killed three times
    (wherever it is: a sync, a rotation, a file being written) and started again, every body is
    in a readable file, duplicates at most max in flight a kill, no spool left at the end."""
    topic = unique("pqkill")
    bodies = await publish_spread([nsqd.tcp_address], topic, 60_000)
    out = tmp_path / "out"
    args = [f"-topic={topic}", f"-nsqd-tcp-address={nsqd.tcp_address}", f"-output-dir={out}", "-format=parquet",
            "-rotate-size=100000", "-partition-by=hourly", "-sync-interval=1s", "-max-in-flight=500",
            "-consumer-opt=msg_timeout,3s"]  # a killed worker's messages come back in 3 s, not 60
    source = Source(nsqd.http_address, topic, "nsq_to_file")
    for kill in range(3):
        app = await start("to-file", *args, log=tmp_path / "log")

        await eventually(lambda kill=kill: source.taken(10_000 * (kill + 1)), 60, "a part archived",
                         progress=source.done)
        await app.kill()
    app = await start("to-file", *args, log=tmp_path / "log")
    await eventually(lambda: source.drained(60_000), 90, "the channel drained", progress=source.done)
    assert await app.stop() == 0, app.log()
    assert app.log().count("restart: found") >= 1, app.log()
    counts = Counter(rows_of(out))  # every file readable, or this raises
    assert set(counts) == set(bodies)  # nothing lost
    duplicates = sum(counts.values()) - len(bodies)
    assert duplicates <= 3 * 500, duplicates
    assert leftovers(out) == []
