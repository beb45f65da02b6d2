"""Reading queues in Spark: the batch browse reader behind ``spark.read.format("mq")``.

Python data-source methods run in worker processes without a SparkSession, so the queue is read
with delta-rs through the engine (:func:`mqspark.engine.browse.browse_queue`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from mqspark.engine.browse import browse_queue
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.queues import Queues


@dataclass(frozen=True)
class BrowsePlan:
    """A browse fixed on the driver: what to read, the table version, and the moment for time rules."""

    root: str
    queue: str
    delivery: DeliveryOptions
    limit: int | None
    now: datetime
    version: int


class BrowseReader(DataSourceReader):
    """Reads the queue in one partition, so every group stays together and in order."""

    def __init__(self, plan: BrowsePlan) -> None:
        self.plan = plan

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        plan = self.plan
        table = browse_queue(
            Queues.open(plan.root), plan.queue, plan.delivery, limit=plan.limit, now=plan.now, version=plan.version
        )
        yield from table.to_batches(max_chunksize=batch_rows(table))


def batch_rows(table: pa.Table, target_bytes: int = 32 * 1024 * 1024) -> int:
    """Rows per Arrow batch handed to Spark: about ``target_bytes`` each, as the JVM copies every
    batch into a direct buffer (1 GiB by default, and a 1M-message browse is larger than that)."""
    return max(1, target_bytes * table.num_rows // max(table.nbytes, 1))
