"""What a put's commit checks against the committed queue table it follows (see
:meth:`~mqspark.engine.puts.Puts.commit_put`): the group rules across puts, and the messages
that ``before_msg_id`` names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from mqspark import store
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.groups import GROUP_COLUMNS, check_group_items


def before_targets(messages: pa.Table) -> list[str]:
    """The msg_ids a put's messages are to be placed before."""
    return pc.unique(messages["before_msg_id"].drop_null()).to_pylist()


def check_before_targets(queue: str, table: DeltaTable, targets: Sequence[str]) -> None:
    """A ``before_msg_id`` must name a committed message outside any group, not itself placed before another."""
    if not targets:
        return
    found = store.table_dataset(table).to_table(
        columns=["msg_id", "group_id", "before_msg_id"], filter=pc.field("msg_id").isin(targets)
    )
    for target in targets:
        rows = found.filter(pc.equal(found["msg_id"], target))
        if rows.num_rows == 0:
            raise MQError(
                f"queue {queue}: field before_msg_id names {target}, which is not on the queue",
                Reason.MQRC_NO_MSG_AVAILABLE,
            )
        if pc.any(pc.is_valid(rows["group_id"])).as_py() or pc.any(pc.is_valid(rows["before_msg_id"])).as_py():
            raise MQValidationError(
                f"queue {queue}: field before_msg_id names {target}, which is in a group or was itself placed "
                "before another message"
            )


def check_against_committed(queue: str, table: DeltaTable, groups: pa.Table) -> None:
    """Group rules across puts: no msg_seq_number twice, nothing after the group's last message."""
    if groups.num_rows == 0:
        return
    group_ids = pc.unique(groups["group_id"])
    paths = _files_with_groups(table, group_ids)
    if not paths:
        return
    committed = store.table_dataset(table, paths).to_table(
        columns=GROUP_COLUMNS, filter=pc.field("group_id").isin(group_ids)
    )
    if committed.num_rows:
        check_group_items(queue, pa.concat_tables([committed.cast(groups.schema), groups]))


def _files_with_groups(table: DeltaTable, group_ids: pa.Array) -> list[str]:
    """The live files whose group_id statistics do not rule out all of ``group_ids``: a put of a
    grouped message read every file's footer, so each put took longer than the last until
    maintenance compacted the table. Files without statistics are kept."""
    files = store.live_files(table)
    ids = np.sort(np.array(group_ids.to_pylist(), dtype=object))
    low, high = files["min_group_id"].to_pylist(), files["max_group_id"].to_pylist()
    never = files["never_grouped"].to_pylist()
    kept = []
    for path, ungrouped, first, last in zip(files["path"].to_pylist(), never, low, high, strict=True):
        if ungrouped:
            continue
        if first is None or last is None or np.searchsorted(ids, last, "right") > np.searchsorted(ids, first, "left"):
            kept.append(path)
    return kept
