"""Sample queue contents shared by several test files."""

from __future__ import annotations


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
