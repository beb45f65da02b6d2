"""Delivery order of a queue's committed messages: physical order (spec section 4).

Physical order is the Delta commit order, then the row's ``put_seq`` inside its put; under ``priority``
delivery each priority is its own lane, highest first.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def physical_order(messages: pa.Table, delivery_sequence: str) -> pa.Table:
    """Sort ``messages`` (message columns plus ``commit_version``) into physical order."""
    keys = [("commit_version", "ascending"), ("put_seq", "ascending")]
    if delivery_sequence == "priority":
        keys.insert(0, ("priority", "descending"))
    return messages.take(pc.sort_indices(messages, sort_keys=keys))
