"""The end of a chaos run, as the checker reads it: what the queues hold (:func:`final_state`, saved
as ``final.json``, see :class:`chaos.history.Final`) and the streaming get's Delta output as
``batch`` events (:func:`record_stream_output`).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from chaos import stream
from chaos.actor import BACKOUT_QUEUE, FRONT, PYTHON_GROUP, QUEUE, REPLY_QUEUE, STREAM_GROUP, message_id, replica_group
from chaos.history import Final
from mqspark import QueueManager, store
from mqspark.engine.waiting import waiting_messages
from mqspark.qmgr import engine


def _moved(qm: QueueManager, queues: tuple[str, ...], prefix: str) -> list[dict[str, Any]]:
    """The messages of ``queues`` of ``qm``, their queue and group named with ``prefix``."""
    moved = []
    columns = ["payload", "dlq_reason", "backout_count", "dlq_original_queue", "dlq_consumer_group"]
    for queue in queues:
        # What waits there, in any order: a browse shows too what redrive took until maintenance removes it.
        rows = waiting_messages(engine(qm), queue, columns=columns)
        moved += [
            {
                "id": message_id(row["payload"]),
                "queue": prefix + queue,
                "reason": row["dlq_reason"],
                "backout_count": row["backout_count"],
                "original_queue": row["dlq_original_queue"],
                "consumer": None if row["dlq_consumer_group"] is None else prefix + row["dlq_consumer_group"],
            }
            for row in rows.select(columns).to_pylist()
        ]
    return moved


def _holdings(qm: QueueManager, consumers: list[str], prefix: str, final: Final) -> None:
    """Add what ``qm``'s queue holds to ``final``, after two maintenance runs (the second deletes
    what the first removed); its groups and queues named with ``prefix``."""
    for _ in range(2):
        qm.maintain(QUEUE, retention=timedelta(0))
    for group in consumers:
        payloads = waiting_messages(engine(qm), QUEUE, group, ["payload"])["payload"].to_pylist()
        final.waiting[prefix + group] = [message_id(payload) for payload in payloads]
    final.moved += _moved(qm, (BACKOUT_QUEUE, engine(qm).dead_letter_queue), prefix)
    table = DeltaTable(store.queue_location(qm.root, QUEUE), storage_options=engine(qm).storage_options)
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    final.storage[prefix + QUEUE] = {"files": len(sizes), "bytes": int(sum(sizes)), "live": qm.browse(QUEUE).num_rows}


def final_state(qm: QueueManager, consumers: dict[str, str], replica: QueueManager | None, front: str) -> Final:
    """What the queues hold at the end: the main queue manager's, and with a cluster the second
    replica's (its groups and queues named ``CHAOS2/...``) and the dead letters of the routed put's
    queue manager (``FRONT/...``)."""
    final = Final(consumers=dict(consumers))
    _holdings(qm, list(consumers), "", final)
    # Those no requester read: one it read may be gone, removed by maintenance of the reply queue.
    waiting = waiting_messages(engine(qm), REPLY_QUEUE, columns=["payload"])
    final.replies = [message_id(payload) for payload in waiting["payload"].to_pylist()]
    if replica is not None:
        final.consumers[replica_group(PYTHON_GROUP)] = "syncpoint"
        _holdings(replica, [PYTHON_GROUP], replica_group(""), final)
        front_qm = QueueManager.open(front)
        final.moved += _moved(front_qm, (engine(front_qm).dead_letter_queue,), f"{FRONT}/")
    return final


def record_stream_output(folder: Path) -> None:
    """The streaming get's Delta output as ``batch`` events of the instance that wrote each batch."""
    location = stream.output(folder)
    if not DeltaTable.is_deltatable(location):
        return
    rows = DeltaTable(location).to_pyarrow_table().to_pylist()
    batches: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        batches.setdefault((row["batch"], row["instance"]), []).append(row)
    with (folder / "history" / "stream-output.jsonl").open("w") as output:
        for (batch, instance), written in sorted(batches.items()):
            event = {
                "t": max(row["at"] for row in written) / 1e6,
                "actor": instance,
                "e": "batch",
                "consumer": STREAM_GROUP,
                "batch": batch,
                "rows": [
                    {
                        "id": message_id(row["id"].encode()),
                        "delivery_seq": row["delivery_seq"],
                        "priority": row["priority"],
                        "group": row["group_id"],
                        "seq": row["msg_seq_number"],
                    }
                    for row in written
                ],
            }
            output.write(json.dumps(event) + "\n")
