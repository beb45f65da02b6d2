"""The spark-submit job of the ``cluster_drain`` benchmark: drain queue Q for one consumer group
with an availableNow streaming get into ``noop``, and print the wall time and rows as JSON.

    drain_job.py ROOT GROUP CHECKPOINT MAX_PER_TRIGGER
"""

from __future__ import annotations

import json
import sys
import time

import mqspark


def main(root: str, group: str, checkpoint: str, per_trigger: str) -> None:
    spark = mqspark.session(app_name=f"mqspark-bench-drain-{group}", **{"spark.ui.enabled": "false"})
    started = time.perf_counter()
    query = (
        spark.readStream.format("mq")
        .option("queue", "Q")
        .option("consumer", group)
        .option("maxMessagesPerTrigger", int(per_trigger))
        .load(root)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    rows = sum(progress["numInputRows"] for progress in query.recentProgress)
    print("drained " + json.dumps({"seconds": round(seconds, 2), "rows": rows}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
