"""The ``mq`` Spark data source: ``spark.read.format("mq")`` browses a queue (physical order for now).

Python data-source methods run in worker processes without a SparkSession, so the queue is read
with delta-rs through :class:`mqspark.QueueManager`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from .errors import MQValidationError
from .messages import MESSAGE_SCHEMA
from .qmgr import ORDERS, QueueManager


class MQDataSource(DataSource):
    """Format ``mq``: ``.option("queue", Q).load(root)``."""

    @classmethod
    def name(cls) -> str:
        return "mq"

    def schema(self) -> StructType:
        # schema() is what load() calls: checking the options here reports mistakes at load time.
        _browse_options(dict(self.options))
        return from_arrow_schema(MESSAGE_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BrowseReader(_browse_options(dict(self.options)))


def _browse_options(options: dict[str, str]) -> dict[str, object]:
    root = options.get("path")
    if not root:
        raise MQValidationError('option path is missing: give the queue manager root, as in .load("/data/qm")')
    queue = options.get("queue")
    if not queue:
        raise MQValidationError('option queue is missing: give the queue to read, as in .option("queue", "ORDERS")')
    order = options.get("order", "physical")
    if order not in ORDERS:
        raise MQValidationError(f"option order must be one of {', '.join(ORDERS)}; got {order!r}")
    limit = options.get("limit")
    if limit is not None:
        if not limit.isdigit():
            raise MQValidationError(f"option limit must be a whole number >= 0, got {limit!r}")
        limit = int(limit)
    # Fail at load() time, like a missing Delta path, rather than inside a task.
    QueueManager.open(root).depth(queue)
    return {"root": root, "queue": queue, "order": order, "limit": limit}


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
