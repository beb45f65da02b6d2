"""Reading queues in Spark: the batch browse reader behind ``spark.read.format("mq")``.

Python data-source methods run in worker processes without a SparkSession, so the queue is read
with delta-rs through :class:`mqspark.QueueManager`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .qmgr import QueueManager


class BrowseReader(DataSourceReader):
    """Reads the whole queue in one partition, so the rows keep their delivery order."""

    def __init__(self, options: dict[str, object]) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        qm = QueueManager.open(self.options["root"])
        table = qm.browse(self.options["queue"], order=self.options["order"], limit=self.options["limit"])
        yield from table.to_batches()
