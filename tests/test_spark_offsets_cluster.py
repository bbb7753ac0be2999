"""``readMode=offsets`` on a real Spark standalone cluster: exactly once through failures (issue 22).

The HA cluster is the embedded one, or the real youzan cluster with ``dev.py test --real-ha``;
Spark is a standalone master and two 1-core workers from pyspark's jars
(:mod:`tests.spark_cluster`). Into Spark's parquet file sink, with Trigger.AvailableNow:

* an executor SIGKILLed while its task holds a range: the task runs again on the other
  executor and reads the same range (every row once);
* a task made to fail once: the same;
* the driver SIGKILLed after a committed micro-batch, more messages published, the query run
  again from its checkpoint: every message of both rounds once, no gap, no duplicate.

``FASTNSQ_SPARK_OFFSETS_MESSAGES`` sets the messages of a run (default 20,000 over 4
partitions; the closing note's acceptance runs use 500,000 on the real cluster).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import unique
from .spark_cluster import SparkStandalone, spark_standalone  # noqa: F401 - a fixture
from .spark_ha import ThreadedHACluster
from .test_spark import REPO, spark_test, stop_query
from .test_spark_cluster import _kill_executor_mid_task, _marking, _progress, _retried, cluster_spark  # noqa: F401
from .test_spark_offsets import (  # noqa: F401
    PARTITIONS,
    assert_exactly,
    ha,
    needs_available_now,
    offsets_stream,
    published,
    stored,
)

MESSAGES = int(os.environ.get("FASTNSQ_SPARK_OFFSETS_MESSAGES", "20000"))
JOB = Path(__file__).parent / "spark_jobs" / "offsets_to_parquet.py"


def _failing_once(marks: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapInArrow function whose first task attempt with rows raises, once in the whole run."""

    def fail(batches: Iterator[Any]) -> Iterator[Any]:
        import os

        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        flag = os.path.join(marks, "failed")
        for batch in batches:
            if batch.num_rows and ctx.attemptNumber() == 0 and not os.path.exists(flag):
                with open(flag, "w") as f:
                    f.write(f"{ctx.stageId()} {ctx.partitionId()}")
                raise RuntimeError("made to fail once by the test")
            yield batch

    return fail


@spark_test
@pytest.mark.parametrize(("failure", "prefetch"), [("executor-killed", False), ("task-fails-once", False),
                                                   ("task-fails-once", True)])
def test_offsets_source_writes_every_message_once_through_a_failure(
    cluster_spark: Any, spark_standalone: SparkStandalone, ha: ThreadedHACluster,  # noqa: F811
    tmp_path: Path, failure: str, prefetch: bool,
) -> None:
    """With prefetchRanges=true the retried task fetches its range from the driver again."""
    needs_available_now()
    topic = unique("spk_offc")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, failure, per_partition=MESSAGES // PARTITIONS)
    folder = tmp_path / "marks"
    folder.mkdir()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    spark_standalone.wait_for_executors(2)
    stream = offsets_stream(cluster_spark, ha, topic, maxRecordsPerBatch=MESSAGES // 4,
                            **({"prefetchRanges": "true"} if prefetch else {}))
    fn = _marking(str(folder), 0.5) if failure == "executor-killed" else _failing_once(str(folder))
    rows = stream.select("partition", "offset", "body").mapInArrow(fn, "partition int, offset bigint, body binary")
    started = time.monotonic()
    query = (rows.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        if failure == "executor-killed":
            executor, killed = _kill_executor_mid_task(
                spark_standalone, folder, ready=lambda marks: len({m[0] for m in marks}) >= 2,
                eligible=lambda state: _progress(state)[0] > 0 and _progress(state)[1] == 0,
                running=lambda: bool(query.isActive),
            )
            what = f"executor {executor} SIGKILLed in stage {killed[0]} task {killed[1]}"
        assert query.awaitTermination(600), "the AvailableNow query did not stop by itself"
    finally:
        stop_query(query)
    took = time.monotonic() - started
    assert query.exception() is None
    if failure == "executor-killed":
        assert _retried(folder, killed), f"the killed task {killed[:2]} was never run again"
    else:
        assert (folder / "failed").exists(), "no task failed"
        what = f"task (stage, partition) {(folder / 'failed').read_text()} failed once"
    rows_written = stored(cluster_spark, out)
    print(f"\noffsets source on the standalone cluster: {MESSAGES} messages over {PARTITIONS} partitions, {what}; "
          f"{len(rows_written)} rows, {len({(p, o) for p, o, _ in rows_written})} distinct (partition, offset); "
          f"{took:.1f} s")
    assert_exactly(rows_written, sent)


class _Driver:
    """offsets_to_parquet.py as its own process group (so that a SIGKILL takes its JVM too)."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self._log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, str(JOB), *args], stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, text=True, start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()

    def finish(self, timeout: float) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        self._log.close()
        return out


@spark_test
def test_offsets_source_restarted_from_its_checkpoint_after_the_driver_is_killed(
    spark_standalone: SparkStandalone, ha: ThreadedHACluster, tmp_path: Path,  # noqa: F811
    cluster_spark: Any,  # noqa: F811 - to read the output (and to have the executors up)
) -> None:
    needs_available_now()
    topic = unique("spk_offd")
    ha.create_topic(topic, PARTITIONS)
    sent = published(ha, topic, "round1", per_partition=MESSAGES // PARTITIONS)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = ["--master", spark_standalone.master_url, "--lookupd", ha.lookupd_http, "--topic", topic,
            "--checkpoint", str(checkpoint), "--out", str(out), "--max-batch", str(MESSAGES // 5), "--pause", "0.3"]
    cluster_spark.stop()  # the standalone cluster's 2 cores go to the job's own driver
    try:
        driver = _Driver(args, tmp_path / "driver1.log")
        commits = checkpoint / "commits"
        deadline = time.monotonic() + 300
        while not (commits.is_dir() and any(p.name.isdigit() for p in commits.iterdir())):
            assert driver.proc.poll() is None, (tmp_path / "driver1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no micro-batch committed within 300 s"
            time.sleep(0.2)
        driver.kill()
        committed = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
        more = published(ha, topic, "round2", per_partition=MESSAGES // PARTITIONS // 5)
        rerun = _Driver(args, tmp_path / "driver2.log")
        output = rerun.finish(900)
        assert rerun.proc.returncode == 0, (tmp_path / "driver2.log").read_text()[-3000:]
        assert "DONE" in output
    finally:
        from pyspark.sql import SparkSession

        reader = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        rows = stored(reader, out)
    finally:
        reader.stop()
    print(f"\noffsets source, driver SIGKILLed after batch(es) {committed} committed, then {len(more)} more messages "
          f"and a restart from the checkpoint: {len(rows)} rows for {len(sent) + len(more)} messages")
    assert_exactly(rows, sent | more)
