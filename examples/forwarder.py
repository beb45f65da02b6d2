"""A forwarding service (Tuxedo TMQFORWARD) with its service in the same file: it answers each
request on QUOTES with a price, and stops once the queue is drained.

    .venv/bin/mqspark submit examples/forwarder.py --root /data/qm --queue QUOTES

Requests carry their reply queue (``reply_to_queue``); a request for an unknown item fails, is
retried as the queue's retry_count says, then goes to its failure queue.
"""

import argparse

from pyspark.sql import SparkSession

import mqspark

PRICES = {b"apple": "0.40", b"pear": "0.55"}


def quote(request: dict) -> str:
    item = request["payload"]
    if item not in PRICES:
        raise mqspark.ServiceError(f"no price for {item.decode()!r}", return_code=404)
    return f"{item.decode()} {PRICES[item]}"


parser = argparse.ArgumentParser()
parser.add_argument("--root", required=True)
parser.add_argument("--queue", required=True)
args = parser.parse_args()

spark = mqspark.register(SparkSession.builder.appName("quote-forwarder").getOrCreate())
query = mqspark.forward(spark, args.root, args.queue, quote, exit_when_empty=True)
query.awaitTermination()
