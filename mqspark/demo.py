"""The demo pipeline: a streaming producer and a streaming consumer on a local queue manager under ./mq-data.

A file stream of orders (with priorities, and a basket sent as a message group over several files)
is put on ORDERS with ``writeStream.format("mq")``, while ``readStream.format("mq")`` gets them in
logical order for the consumer group ``fulfilment`` and appends them to a Delta table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mqspark import store
from mqspark.cli.render import render
from mqspark.qmgr import QueueManager

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEMO_QMGR = "DEMO.QM"
CONSUMER = "fulfilment"
# Each list is one input file, which the producer puts as one micro-batch (one transaction).
ORDER_FILES = [
    [
        {"payload": "order 1", "priority": 4},
        {"payload": "basket item 1", "group_id": "BASKET-7", "msg_seq_number": 1, "priority": 4},
        {"payload": "order 2", "priority": 4, "correl_id": "C2"},
    ],
    [
        {"payload": "rush order", "priority": 9},
        {"payload": "order 3", "priority": 4},
        {"payload": "basket item 2", "group_id": "BASKET-7", "msg_seq_number": 2, "priority": 4},
    ],
    [
        {"payload": "bulk order", "priority": 1},
        {"payload": "basket item 3", "group_id": "BASKET-7", "msg_seq_number": 3, "last_in_group": True},
        {"payload": "order 4", "priority": 4},
    ],
]
COLUMNS = ["delivery_seq", "priority", "group_id", "msg_seq_number", "payload"]


def _write_input(folder: Path) -> None:
    folder.mkdir(parents=True)
    base = int(time.time()) - 60
    for number, rows in enumerate(ORDER_FILES):
        path = folder / f"orders-{number}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        # The file source takes files in modification-time order.
        os.utime(path, (base + number, base + number))


class _SparkLog:
    """Spark's own output (the JVM's warnings and the Python workers' lines, all on this process's
    stderr) goes to a log file; mqspark's lines among it are shown as well. The demo's own messages
    and errors still reach the terminal."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._terminal = os.fdopen(os.dup(2), "w", buffering=1)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        sys.stderr = self._terminal
        self._thread = threading.Thread(target=self._copy, args=(read,), name="mqspark-demo-log", daemon=True)
        self._thread.start()

    def _copy(self, read: int) -> None:
        with os.fdopen(read, errors="replace") as lines, self.path.open("w") as log:
            for line in lines:
                log.write(line)
                log.flush()
                if " mqspark." in line:
                    self._terminal.write(line)

    def close(self) -> None:
        os.dup2(self._terminal.fileno(), 2)
        self._thread.join(timeout=5)


def run(root: str) -> None:
    location = store.normalize_root(root)
    if store.table_exists(store.catalog_location(location), None):
        existing = QueueManager.open(location)
        if existing.name != DEMO_QMGR:
            sys.exit(f"{location} holds queue manager {existing.name}; the demo only replaces its own ({DEMO_QMGR})")
        store.remove_tree(location)

    qm = QueueManager.create(location, DEMO_QMGR)
    qm.define_queue("ORDERS", default_priority=4, max_depth=10_000, description="incoming orders")
    qm.declare_consumer("ORDERS", CONSUMER)
    print(f"queue manager {qm.name} at {qm.root}; queue ORDERS delivers by priority, then in logical order")
    print(f"consumer group {CONSUMER} is declared on ORDERS: every message waits for it")
    work = Path(location) / "demo"
    _write_input(work / "input")

    from mqspark.spark.session import delta_jars, session

    delta_jars()
    spark_log = _SparkLog(work / "spark.log")
    spark = session(app_name="mqspark-demo", **{"spark.ui.showConsoleProgress": "false"})

    def show(batch: DataFrame, batch_id: int) -> None:
        rows = batch.select(*COLUMNS[:-1], batch.payload.cast("string").alias("payload")).orderBy("delivery_seq")
        collected = rows.collect()
        if collected:
            print(f"\nconsumer {CONSUMER}, micro-batch {batch_id}:")
            print(render([row.asDict() for row in collected], as_json=False))
            rows.write.format("delta").mode("append").save(str(work / "fulfilled"))

    consumer = (
        spark.readStream.format("mq")
        .option("queue", "ORDERS")
        .option("consumer", CONSUMER)
        .option("maxMessagesPerTrigger", 3)
        .load(qm.root)
        .writeStream.foreachBatch(show)
        .option("checkpointLocation", str(work / "get-checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    print('consumer: spark.readStream.format("mq").option("consumer", "fulfilment").option("maxMessagesPerTrigger", 3)')
    print('producer: a file stream of orders -> writeStream.format("mq"), one transaction per file')
    producer = (
        spark.readStream.schema(
            "payload string, priority int, group_id string, msg_seq_number int, last_in_group boolean, correl_id string"
        )
        .option("maxFilesPerTrigger", 1)
        .json(str(work / "input"))
        .writeStream.format("mq")
        .option("queue", "ORDERS")
        .option("checkpointLocation", str(work / "put-checkpoint"))
        .trigger(availableNow=True)
        .start(qm.root)
    )
    producer.awaitTermination()
    deadline = time.monotonic() + 120
    while qm.depth("ORDERS", consumer=CONSUMER) and time.monotonic() < deadline:
        time.sleep(0.5)
    consumer.stop()

    print("\nqueue depth now (CURDEPTH: waiting for any group), in all and for the consumer group:")
    print(render([{"queue": "ORDERS", "consumer": c, "depth": qm.depth("ORDERS", c)} for c in (None, CONSUMER)], False))
    summary = qm.maintain("ORDERS")
    print(
        f"\nmaintenance removed {summary.removed_consumed} consumed messages; "
        f"data files {summary.files_before} -> {summary.files_after}"
    )
    print("\nthe fulfilled orders, a Delta table, in delivery_seq order:")
    spark.read.format("delta").load(str(work / "fulfilled")).orderBy("delivery_seq").show(truncate=False)
    spark.stop()
    spark_log.close()
    print(f"Spark's own log of this run: {spark_log.path}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="mqspark-demo", description=__doc__)
    parser.add_argument("--root", default="./mq-data", help="where the demo queue manager lives")
    run(parser.parse_args().root)


if __name__ == "__main__":
    main()
    # Skip interpreter shutdown, where delta-rs can abort a finished process (see mqspark.cli.main.entry).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
