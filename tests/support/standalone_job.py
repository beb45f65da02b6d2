"""The spark-submit job of the standalone-cluster tests (``tests/test_standalone_cluster.py``), run on
the Spark standalone cluster of ``tests/support/standalone.py``.

    put ROOT INPUT CHECKPOINT [CLUSTER]   a streaming put of the JSON files in INPUT to queue ORDERS
                                          (of cluster CLUSTER, routed not fixed, when given), availableNow
    get ROOT OUTPUT CHECKPOINT [N]        a streaming get of ORDERS, group g, N messages a trigger
                                          (default 10), into the Delta table OUTPUT, availableNow
    forever ROOT OUTPUT CHECKPOINT [N]    the same get every 0.5 s until killed
    put-get ROOT INPUT CHECKPOINT OUTPUT  put, then get, in one application

Prints ``done`` at the end. Queue managers and outputs may be on the object store (credentials
from the AZURE_* environment variables, on the driver and the executors alike).
"""

from __future__ import annotations

import sys

import mqspark

SCHEMA = "payload string, group_id string, msg_seq_number int, last_in_group boolean"


def main(mode: str, root: str, place: str, checkpoint: str, *rest: str) -> None:
    spark = mqspark.session(app_name=f"mqspark-cluster-{mode}", **{"spark.sql.shuffle.partitions": "2"})
    if mode in ("put", "put-get"):
        _put(spark, root, place, f"{checkpoint}/put", rest[0] if mode == "put" and rest else None)
    if mode == "put-get":
        _get(spark, root, rest[0], f"{checkpoint}/get", 10, forever=False)
    if mode in ("get", "forever"):
        _get(spark, root, place, f"{checkpoint}/get", int(rest[0]) if rest else 10, forever=mode == "forever")
    print("done", flush=True)
    spark.stop()


def _put(spark, root: str, source: str, checkpoint: str, cluster: str | None) -> None:
    writer = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(source)
        .writeStream.format("mq")
        .option("queue", "ORDERS")
        .option("checkpointLocation", checkpoint)
    )
    if cluster:
        writer = writer.option("cluster", cluster).option("bind", "not_fixed")
    writer.trigger(availableNow=True).start(root).awaitTermination()


def _get(spark, root: str, output: str, checkpoint: str, per_trigger: int, forever: bool) -> None:
    writer = (
        spark.readStream.format("mq")
        .option("queue", "ORDERS")
        .option("consumer", "g")
        .option("maxMessagesPerTrigger", per_trigger)
        .load(root)
        .selectExpr("delivery_seq", "msg_id", "offset", "cast(payload as string) as payload")
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
    )
    trigger = {"processingTime": "500 milliseconds"} if forever else {"availableNow": True}
    writer.trigger(**trigger).start(output).awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
