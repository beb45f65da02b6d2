"""Sample queue contents shared by several test files."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa


def spec_example(qm) -> None:
    """Spec section 4: physically A; Y1; Z2; Y2; Y3 segment 1; Y3 segment 2 (last); Z1; B."""
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "A"}])
    qm.put("Q", [{"payload": "Y1", "group_id": "Y", "msg_seq_number": 1}])
    qm.put("Q", [{"payload": "Z2", "group_id": "Z", "msg_seq_number": 2, "last_in_group": True}])
    qm.put("Q", [{"payload": "Y2", "group_id": "Y", "msg_seq_number": 2}])
    segment = {"group_id": "Y", "msg_seq_number": 3, "segmented": True, "last_in_group": True}
    qm.put("Q", [{**segment, "payload": "Y3-1:", "offset": 0}])
    qm.put("Q", [{**segment, "payload": "Y3-2", "offset": 5, "last_segment": True}])
    qm.put("Q", [{"payload": "Z1", "group_id": "Z", "msg_seq_number": 1}])
    qm.put("Q", [{"payload": "B"}])


def dead_letters(qm, queue: str, rows: list[dict], original: str = "Q") -> None:
    """Put messages on ``queue`` as earlier moves from queue ``original`` would have left them there:
    each row gives ``payload``, the message ``fields`` and the dead-letter ``reason``."""
    from mqspark import store
    from mqspark.model.dead_letter import dead_letter
    from mqspark.model.groups import group_items
    from mqspark.model.messages import QUEUE_TABLE_SCHEMA
    from mqspark.model.put import prepare_put, rows_to_table
    from mqspark.qmgr import engine

    definition = qm.inquire_queue(queue)
    prepared = prepare_put(definition, rows_to_table(queue, [{"payload": r["payload"], **r["fields"]} for r in rows]))
    messages = dead_letter(
        prepared.messages,
        pa.array([r["reason"] for r in rows], pa.int32()),
        pa.array(["moved"] * len(rows)),
        original,
        qm.name,
        datetime.now(UTC),
    )
    file = store.write_data_file(store.queue_location(qm.root, queue), messages.to_batches(), QUEUE_TABLE_SCHEMA)
    engine(qm).puts.commit_put(queue, [file], group_items(messages))
