"""`NSQDataSource`: the `nsq` format of PySpark's Python Data Source API.

One job: turn Spark's options into a reader or a writer. Options are checked
here, in the driver, before any task runs; a bad one raises naming it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from ..errors import InvalidValueError
from ._options import parse_common, parse_sink, parse_source
from .offset_batch import NSQOffsetBatchReader
from .offset_source import NSQOffsetStreamReader
from .sink import make_stream_writer, make_writer
from .source import NSQSimpleStreamReader, NSQStreamReader, source_schema

__all__ = ["NSQDataSource"]


def _not_implemented(feature: str) -> Exception:
    # Spark falls back from streamReader() to simpleStreamReader() on this error.
    from pyspark.errors import PySparkNotImplementedError

    return PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED", messageParameters={"feature": feature})


class NSQDataSource(DataSource):
    """Read a topic's channel as a stream; publish DataFrames to nsqd.

    >>> spark.dataSource.register(NSQDataSource)                      # doctest: +SKIP
    >>> stream = (spark.readStream.format("nsq")
    ...           .option("nsqd", "127.0.0.1:4150").option("topic", "events")
    ...           .option("channel", "spark").load())
    >>> df.select("body").write.format("nsq").mode("append") \\
    ...     .option("nsqd", "127.0.0.1:4150").option("topic", "out").save()

    Columns of a read: ``id string, body binary, attempts int, timestamp timestamp,
    nsqd string, topic string`` (with ``ha=true`` also ``partition int, offset bigint,
    trace_id bigint``). Guarantee: at-least-once; the message id is the dedupe key.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        parse_common(self.options)  # every value checked now: fail on the driver, naming the option

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return source_schema(parse_source(self.options).ha)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_source(self.options)
        if options.read_mode == "offsets":
            return NSQOffsetBatchReader(options, schema)
        raise InvalidValueError(
            f"format 'nsq' with readMode={options.read_mode} is a streaming source (a channel cannot replay a range "
            "of messages): use spark.readStream.format('nsq'), with Trigger.AvailableNow to drain a topic once, "
            "or, on youzan's HA topics, option('readMode', 'offsets') for a batch read of an offset window"
        )

    def streamReader(self, schema: StructType) -> Any:
        options = parse_source(self.options)
        if options.read_mode == "simple":
            raise _not_implemented("streamReader")
        if options.read_mode == "offsets":
            return NSQOffsetStreamReader(options, schema)
        return NSQStreamReader(options, schema)

    def simpleStreamReader(self, schema: StructType) -> Any:
        options = parse_source(self.options)
        if options.read_mode == "offsets":  # Spark asks for this only when streamReader() is not implemented
            raise InvalidValueError("readMode=offsets has no simple stream reader")
        return NSQSimpleStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        _append_only(overwrite)
        return make_writer(parse_sink(self.options, has_topic_column="topic" in schema.fieldNames()), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        _append_only(overwrite)
        return make_stream_writer(
            parse_sink(self.options, has_topic_column="topic" in schema.fieldNames()), schema
        )


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise InvalidValueError("format 'nsq' can only append: a topic cannot be overwritten (use mode 'append')")
