"""Put every line of a text file on a queue, in one transaction (a batch put).

.venv/bin/mqspark submit examples/put_file.py --root /data/qm --queue ORDERS --file orders.txt [--priority 5]
"""

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import mqspark

parser = argparse.ArgumentParser()
parser.add_argument("--root", required=True)
parser.add_argument("--queue", required=True)
parser.add_argument("--file", required=True)
parser.add_argument("--priority", type=int)
args = parser.parse_args()

spark = mqspark.register(SparkSession.builder.appName("put-file").getOrCreate())
lines = spark.read.text(args.file).withColumnRenamed("value", "payload")
if args.priority is not None:
    lines = lines.withColumn("priority", F.lit(args.priority))
lines.write.format("mq").option("queue", args.queue).mode("append").save(args.root)
print(f"put {lines.count()} messages on {args.queue}")
