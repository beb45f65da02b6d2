"""Drain a queue into a Delta table, in logical order, then stop (trigger availableNow).

    .venv/bin/mqspark submit examples/drain_to_delta.py --root /data/qm --queue ORDERS \
        --consumer archive --output /data/orders --checkpoint /data/checkpoints/archive

Each run takes what waits for the consumer group now; the checkpoint makes it exactly once.
"""

import argparse

from pyspark.sql import SparkSession

import mqspark

parser = argparse.ArgumentParser()
parser.add_argument("--root", required=True)
parser.add_argument("--queue", required=True)
parser.add_argument("--consumer", default="default")
parser.add_argument("--output", required=True)
parser.add_argument("--checkpoint", required=True)
args = parser.parse_args()

spark = mqspark.register(SparkSession.builder.appName("drain-to-delta").getOrCreate())
query = (
    spark.readStream.format("mq")
    .option("queue", args.queue)
    .option("consumer", args.consumer)
    .load(args.root)
    .writeStream.format("delta")
    .option("checkpointLocation", args.checkpoint)
    .trigger(availableNow=True)
    .start(args.output)
)
query.awaitTermination()
print(f"drained {args.queue} for {args.consumer} into {args.output}")
