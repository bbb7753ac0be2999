"""The `nsq` data source for PySpark (>= 4.0): stream a topic in, publish DataFrames out.

Install with ``pip install "fastnsq-client[spark]"``, then register the source once per session::

    from fastnsq.spark import register
    register(spark)                      # or spark.dataSource.register(NSQDataSource)

    stream = (spark.readStream.format("nsq")
              .option("nsqd", "127.0.0.1:4150")
              .option("topic", "events").option("channel", "spark")
              .load())                   # id, body, attempts, timestamp, nsqd, topic

    df.select("body").write.format("nsq").mode("append") \\
        .option("nsqd", "127.0.0.1:4150").option("topic", "out").save()

Guarantee: at-least-once in both directions (duplicates after crashes and failed
batches, no ordering); the ``id`` column is the dedupe key.
"""

from __future__ import annotations

from typing import Any

from ..extras import require

require("spark", "fastnsq.spark")  # PySpark (>= 4.0) and pyarrow: names the extra when one is missing

from ._options import KNOWN_OPTIONS
from .datasource import NSQDataSource

__all__ = ["KNOWN_OPTIONS", "NSQDataSource", "register"]


def register(spark: Any) -> None:
    """Register the ``nsq`` format with a SparkSession (once per session)."""
    spark.dataSource.register(NSQDataSource)
