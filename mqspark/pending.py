"""The pending messages of a consumer group: the index the streaming get plans its micro-batches on.

It holds, for one queue and one consumer group, every committed message the group has not
consumed, without payloads: the columns the ordering engine needs, each message's payload length,
its commit version, and where it lies (file and row). It is built once when a query starts and then
kept current by reading only the log entries of new commits, so planning a micro-batch costs what
the backlog and the new data cost, not what the table's history costs.

Consumed items of a group that is still in flight stay in the index, marked consumed: the group's
position in logical order and the next item it expects are decided by its first items.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import storage
from .messages import MESSAGE_SCHEMA

INDEX_COLUMNS = [
    "msg_id",
    "priority",
    "group_id",
    "msg_seq_number",
    "offset",
    "last_in_group",
    "segmented",
    "last_segment",
    "expiry",
    "available_at",
    "top_of_queue",
    "before_msg_id",
    "put_seq",
]
INDEX_SCHEMA = pa.schema(
    [
        *(MESSAGE_SCHEMA.field(name) for name in INDEX_COLUMNS),
        pa.field("payload_length", pa.int64(), nullable=False),
        pa.field("commit_version", pa.int64(), nullable=False),
        pa.field("file", pa.int32(), nullable=False),
        pa.field("row", pa.int64(), nullable=False),
        pa.field("consumed", pa.bool_(), nullable=False),
    ]
)


def message_keys(file: np.ndarray, row: np.ndarray) -> np.ndarray:
    """One int64 per message from its file number and row (a data file holds fewer than 2**32 rows)."""
    return file.astype(np.int64) << 32 | row.astype(np.int64)


class PendingMessages:
    """The messages of the table at ``location`` not yet consumed by one consumer group.

    ``payload_length`` is exact for segments (the ordering engine needs it) and, with
    ``exact_lengths``, for every message; otherwise it is the data file's size divided by its rows,
    which is enough to size partitions and spares reading every payload twice.
    """

    def __init__(
        self, location: str, storage_options: storage.StorageOptions = None, exact_lengths: bool = False
    ) -> None:
        self.location = location
        self.storage_options = storage_options
        self.exact_lengths = exact_lengths
        self.version = -1
        self.files: list[str] = []
        self._file_numbers: dict[str, int] = {}
        self.rows = INDEX_SCHEMA.empty_table()

    def load(self, consumed: pa.Table, up_to: int | None = None) -> None:
        """Read the table up to version ``up_to`` (default: its latest) and leave out ``consumed``
        (``file``/``row``/``count`` ranges of the group's consumed messages)."""
        if up_to is None:
            table = storage.open_table(self.location, self.storage_options)
            up_to = -1 if table is None else table.version()
        self.refresh(up_to)
        numbers = pc.index_in(consumed["file"], value_set=pa.array(self.files, pa.string()))
        known = pc.is_valid(numbers).to_numpy(zero_copy_only=False)
        file = numbers.to_numpy(zero_copy_only=False)[known].astype(np.int64)
        first = consumed["row"].to_numpy()[known]
        count = consumed["count"].to_numpy()[known]
        # Every row of every range: the range's first row repeated, plus 0, 1, ... within the range.
        within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        self.mark_consumed(message_keys(np.repeat(file, count), np.repeat(first, count) + within))

    def has_news(self) -> bool:
        """Whether a commit after the last one read exists: one file lookup."""
        return storage.version_exists(self.location, self.version + 1)

    def refresh(self, up_to: int | None = None) -> bool:
        """Read the commits after the last one read (up to ``up_to``); True when any added messages."""
        pieces = []
        while (up_to is None or self.version < up_to) and storage.version_exists(self.location, self.version + 1):
            self.version += 1
            for path, size in storage.files_added(self.location, self.version):
                pieces.append(self._read(path, size, self.version))
        if not pieces:
            return False
        self.rows = pa.concat_tables([self.rows, *pieces])
        return True

    def _read(self, path: str, size: int, version: int) -> pa.Table:
        number = self._file_numbers.setdefault(path, len(self.files))
        if number == len(self.files):
            self.files.append(path)
        data = storage.read_data_file(self.location, path, INDEX_COLUMNS)
        count = data.num_rows
        columns = {name: data[name].cast(MESSAGE_SCHEMA.field(name).type) for name in INDEX_COLUMNS}
        if self.exact_lengths or pc.any(data["segmented"]).as_py():
            payload = storage.read_data_file(self.location, path, ["payload"])["payload"]
            columns["payload_length"] = pc.binary_length(payload).cast(pa.int64())
        else:
            columns["payload_length"] = pa.array(np.full(count, size // max(count, 1), np.int64))
        columns["commit_version"] = pa.array(np.full(count, version, np.int64))
        columns["file"] = pa.array(np.full(count, number, np.int32))
        columns["row"] = pa.array(np.arange(count, dtype=np.int64))
        columns["consumed"] = pa.array(np.zeros(count, dtype=bool))
        return pa.table(columns, schema=INDEX_SCHEMA)

    def keys(self, rows: pa.Table | None = None) -> np.ndarray:
        rows = self.rows if rows is None else rows
        return message_keys(rows["file"].to_numpy(), rows["row"].to_numpy())

    def mark_consumed(self, keys: np.ndarray) -> None:
        """Mark messages consumed, and forget those no group in flight still needs."""
        if len(keys) == 0:
            return
        consumed = self.rows["consumed"].to_numpy(zero_copy_only=False) | pc.is_in(
            pa.array(self.keys()), value_set=pa.array(keys)
        ).to_numpy(zero_copy_only=False)
        self.rows = self.rows.set_column(
            INDEX_SCHEMA.get_field_index("consumed"), INDEX_SCHEMA.field("consumed"), pa.array(consumed)
        )
        grouped = pc.is_valid(self.rows["group_id"]).to_numpy(zero_copy_only=False)
        # A group is finished once its last item (the last segment of its last message) is consumed.
        ends_group = (
            self.rows["last_in_group"].to_numpy(zero_copy_only=False)
            & (
                ~self.rows["segmented"].to_numpy(zero_copy_only=False)
                | self.rows["last_segment"].to_numpy(zero_copy_only=False)
            )
            & consumed
            & grouped
        )
        finished = pc.is_in(self.rows["group_id"], self.rows["group_id"].filter(pa.array(ends_group))).to_numpy(
            zero_copy_only=False
        )
        keep = ~consumed | (grouped & ~finished)
        if not keep.all():
            self.rows = self.rows.filter(pa.array(keep))
