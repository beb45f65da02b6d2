"""The demo pipeline: a queue manager under ./mq-data, queues, puts (one a group), browsed from Python and Spark."""

from __future__ import annotations

import argparse
import os
import sys

from . import storage
from .cli import render
from .qmgr import QueueManager

DEMO_QMGR = "DEMO.QM"


def run(root: str) -> None:
    location = storage.normalize_root(root)
    if storage.table_exists(storage.catalog_location(location), None):
        existing = QueueManager.open(location)
        if existing.name != DEMO_QMGR:
            sys.exit(f"{location} holds queue manager {existing.name}; the demo only replaces its own ({DEMO_QMGR})")
        storage.remove_tree(location)

    qm = QueueManager.create(location, DEMO_QMGR)
    qm.define_queue("ORDERS", default_priority=4, max_depth=10_000, description="incoming orders")
    qm.define_queue("REPLIES", delivery_sequence="fifo", description="replies to requesters")
    print(f"queue manager {qm.name} at {qm.root}")
    print(
        render(
            [
                {"queue": q.name, "delivery_sequence": q.delivery_sequence, "default_priority": q.default_priority}
                for q in qm.queues()
            ],
            as_json=False,
        )
    )

    qm.put("ORDERS", [{"payload": "order 1"}, {"payload": "order 2", "correl_id": "C2"}])
    qm.put("ORDERS", [{"payload": "rush order", "priority": 9}])
    qm.put(
        "ORDERS",
        [
            {"payload": f"basket item {n}", "group_id": "BASKET-7", "msg_seq_number": n, "last_in_group": n == 3}
            for n in (1, 2, 3)
        ],
    )
    print(f"\nput 6 messages on ORDERS; depth is {qm.depth('ORDERS')}")

    print("\nqm.browse('ORDERS'): logical order, priority 9 first, then commit order, the basket together")
    columns = ["priority", "group_id", "msg_seq_number", "last_in_group", "correl_id", "payload"]
    print(render(qm.browse("ORDERS").select(columns), as_json=False))

    from .spark import session

    spark = session(app_name="mqspark-demo")
    print('\nspark.read.format("mq").option("queue", "ORDERS").load(root)')
    orders = spark.read.format("mq").option("queue", "ORDERS").load(qm.root)
    orders.select(*columns[:-1], orders.payload.cast("string").alias("payload")).show(truncate=False)
    print('spark.read.format("delta") on the queue table, as any Delta table')
    spark.read.format("delta").load(storage.queue_location(qm.root, "ORDERS")).groupBy("priority").count().orderBy(
        "priority"
    ).show()
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="mqspark-demo", description=__doc__)
    parser.add_argument("--root", default="./mq-data", help="where the demo queue manager lives")
    run(parser.parse_args().root)


if __name__ == "__main__":
    main()
    # Skip interpreter shutdown, where delta-rs can abort a finished process (see mqspark.cli.entry).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
