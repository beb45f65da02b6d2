"""The streaming get of a chaos run: ``python -m chaos.stream RUN stream NAME INCARNATION SEED`` is one
instance (active or standby) of consumer group ``stream``, until the run stops.

Each micro-batch goes to the Delta table ``RUN/output/stream`` with its Spark batch id, the
instance and the time, written with ``txnAppId``/``txnVersion`` (Delta's idempotent writes), so a
replayed batch is written once. Poison messages are backed out first (``mqspark.backout``) and not
written: they move to the backout queue at the queue's backout threshold.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import mqspark
from chaos import driver
from chaos.actor import POISON, QUEUE, STREAM_GROUP, broken, queue_manager, stopping, timing
from chaos.history import History, run_clock
from mqspark import MQError, QueueManager, Reason
from mqspark.services.instances import Instance

APP_ID = "chaos-stream"  # the sink's txnAppId


def output(run: Path) -> str:
    return str(run / "output" / STREAM_GROUP)


def stream_get(run: Path, qm: QueueManager, history: History) -> None:
    """Stand by, deliver while active, and stand by again once the query ended (fenced with 2042
    when another instance took the lease while this one was paused; or failed, recorded, as a job
    with a restart policy would go on), until the run stops."""
    actor = history.actor
    spark = driver.session(actor)
    lease_timeout = timedelta(seconds=timing(run).lease_timeout)
    instance = None
    while not stopping(run):
        # A new instance after each query: one that stopped standing by cannot stand by again.
        instance = instance or Instance(qm, QUEUE, STREAM_GROUP, lease_timeout=lease_timeout)
        try:
            query = instance.run(partial(_start, spark, run, qm, history, instance), timeout=1.0)
        except MQError as error:
            if error.reason is not Reason.MQRC_OBJECT_IN_USE and not broken(error):
                raise
            time.sleep(0.2)
            continue  # standing by, or the store does not answer
        while query.isActive and not stopping(run):
            time.sleep(0.2)
        failure = query.exception()
        query.stop()
        instance.stop()
        if failure is not None and "(2042)" not in str(failure):
            text = str(failure)
            history.record("failure", error=driver.first_line(text), documented=driver.documented_failure(text))
        instance = None
    spark.stop()


def _written(target: str) -> int:
    """The last batch id the sink wrote (-1: none)."""
    if not DeltaTable.is_deltatable(target):
        return -1
    version = DeltaTable(target).transaction_version(APP_ID)
    return -1 if version is None else version


def _given_back_with(bad: list[Row]) -> Column:
    """The later items of the message groups of backed-out rows: they go back with them."""
    first: dict[str, int] = {}
    for row in bad:
        if row.group_id is not None:
            first[row.group_id] = min(first.get(row.group_id, row.msg_seq_number), row.msg_seq_number)
    condition = F.lit(False)
    for group, seq in first.items():
        condition = condition | ((F.col("group_id") == group) & (F.col("msg_seq_number") > seq))
    return condition


def _start(
    spark: SparkSession, run: Path, qm: QueueManager, history: History, instance: Instance, instance_id: str
) -> StreamingQuery:
    target = output(run)

    def process(batch: DataFrame, batch_id: int) -> None:
        if batch.isEmpty() and _written(target) >= batch_id:
            # A replay that delivers nothing, of a batch this sink wrote: the planner gave it up.
            history.record("given_up", consumer=STREAM_GROUP, batch=batch_id)
            return
        poison = F.col("payload").startswith(F.lit(POISON.encode()))
        bad = batch.filter(poison).select("queue", "delivery_seq", "group_id", "msg_seq_number").collect()
        if bad:
            mqspark.backout([row.asDict() for row in bad], "a poison message", root=qm.root, consumer=STREAM_GROUP)
        rows = batch.filter(~poison & ~_given_back_with(bad)).select(
            F.col("payload").cast("string").alias("id"),
            "delivery_seq",
            "priority",
            "group_id",
            "msg_seq_number",
            F.lit(batch_id).alias("batch"),
            F.lit(history.actor).alias("instance"),
            F.lit(round(run_clock() * 1e6)).alias("at"),
        )
        writer = rows.write.format("delta").mode("append")
        writer.option("txnAppId", APP_ID).option("txnVersion", batch_id).save(target)

    return (
        spark.readStream.format("mq")
        .option("queue", QUEUE)
        .option("consumer", STREAM_GROUP)
        .option("leaseTimeout", timing(run).lease_timeout)
        .option("instance", instance_id)
        .option("maxMessagesPerTrigger", 500)
        .option("reconnect", "qmgr")
        .load(qm.root)
        .writeStream.foreachBatch(instance.fence(process))
        .option("checkpointLocation", str(run / "checkpoints" / STREAM_GROUP))
        .trigger(processingTime="1 second")
        .start()
    )


def main(argv: list[str]) -> None:
    run, name, incarnation = Path(argv[0]), argv[2], int(argv[3])
    history = History(run, f"{name}#{incarnation}")
    stream_get(run, queue_manager(run), history)
    history.close()


if __name__ == "__main__":
    main(sys.argv[1:])
