"""Data files: writing Parquet files with the statistics Delta records, and reading them back whole
or by row range.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from mqspark.store.filesystems import filesystem_of

# Parsed footers kept: a file's footer is read by the index, by a row read and by a reader of whole
# rows in turn. One of a 1M-row file (100 row groups) takes about 2.3 MB parsed.
FOOTERS_KEPT = 8
_footers: OrderedDict[tuple[str, str], pq.FileMetaData] = OrderedDict()
_footers_lock = threading.Lock()

# Rows per Parquet row group: a get or a micro-batch reads the row groups holding its messages, so a
# put of 100k messages in one group made every block of 500 read all of them.
ROW_GROUP_ROWS = 10_000


def cast_to(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``, metadata included, as ``table.cast(schema)`` gives it; cast only when the
    schemas differ: a cast to the same schema still runs a kernel per column (about 0.15 ms for a
    message or state table), several times a get."""
    return table if table.schema.equals(schema, check_metadata=True) else table.cast(schema)


def read_data_file(location: str, path: str, columns: list[str] | None = None) -> pa.Table:
    """One data file of the table at ``location`` (``path`` relative to it), as written; ``columns``
    the file lacks (written before the table had them) come back as nulls, as Delta reads them.

    Read with ``ParquetFile``: ``pq.read_table`` builds a dataset for every file.
    """
    filesystem, base = filesystem_of(location)
    with filesystem.open_input_file(f"{base}/{path}") as handle:
        parquet = _parquet_file(location, path, handle)
        present = _present(parquet, columns)
        if present is not None:
            # A column the footer says holds only nulls comes back as nulls that take no memory.
            empty = _only_nulls(parquet.metadata)
            present = [name for name in present if name not in empty]
        data = parquet.read(columns=present, use_threads=False)
        if columns is not None and present is not None and len(present) < len(columns):
            schema = parquet.schema_arrow
            data = pa.table(
                {
                    name: data[name] if name in present else pa.nulls(data.num_rows, schema.field(name).type)
                    for name in columns
                    if name in schema.names
                }
            )
        return _with_nulls(data, columns)


def _only_nulls(metadata: pq.FileMetaData) -> set[str]:
    """The top-level columns whose every value is null, from the row groups' statistics."""
    nulls: dict[str, int] = {}
    unknown = set()
    for group in range(metadata.num_row_groups):
        chunks = metadata.row_group(group)
        for index in range(chunks.num_columns):
            chunk = chunks.column(index)
            name, stats = chunk.path_in_schema, chunk.statistics
            if stats is None or not stats.has_null_count:
                unknown.add(name)
            else:
                nulls[name] = nulls.get(name, 0) + stats.null_count
    rows = metadata.num_rows
    return {name for name, count in nulls.items() if count == rows > 0 and name not in unknown and "." not in name}


def read_data_part(
    location: str, path: str, rows: tuple[int, int] | None, columns: list[str] | None = None
) -> pa.Table:
    """Rows ``rows`` (start, stop) of one data file, or all of it (None): :func:`read_data_rows` or
    :func:`read_data_file`."""
    if rows is None:
        return read_data_file(location, path, columns)
    return read_data_rows(location, path, rows[0], rows[1], columns)


def read_data_rows(location: str, path: str, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
    """Rows ``start`` to ``stop`` (exclusive) of one data file, reading only the row groups holding
    them; missing ``columns`` as in :func:`read_data_file`."""
    filesystem, base = filesystem_of(location)
    with filesystem.open_input_file(f"{base}/{path}") as handle:
        parquet = _parquet_file(location, path, handle)
        ends = np.cumsum([parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)])
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        present = _present(parquet, columns)
        data = parquet.read_row_groups(list(range(first, last + 1)), columns=present, use_threads=False)
    skipped = int(ends[first - 1]) if first else 0
    return _with_nulls(data.slice(start - skipped, stop - start), columns)


def row_group_minima(location: str, path: str, column: str) -> tuple[np.ndarray, list[Any]]:
    """Where each row group of one data file starts (its first row, plus the file's row count at the
    end), and the smallest value of top-level ``column`` in each from the footer's statistics (None
    where it has none): Delta's statistics leave out timestamps, Parquet's do not."""
    groups = row_group_statistics(location, path, [column])
    stops = groups["stop"]
    bounds = np.append(groups["start"], stops[-1] if len(stops) else 0).astype(np.int64)
    return bounds, groups[f"min.{column}"]


def row_group_statistics(location: str, path: str, columns: list[str]) -> dict[str, Any]:
    """The row groups of one data file from its footer: ``start`` and ``stop`` (row numbers, arrays),
    and for each of the top-level ``columns`` lists of ``min.<column>``, ``max.<column>`` and
    ``null_count.<column>`` (None where the footer has no such statistic)."""
    filesystem, base = filesystem_of(location)
    with filesystem.open_input_file(f"{base}/{path}") as handle:
        metadata = _parquet_file(location, path, handle).metadata
    paths = [metadata.schema.column(index).path for index in range(metadata.num_columns)]
    rows = np.array([metadata.row_group(number).num_rows for number in range(metadata.num_row_groups)], np.int64)
    stops = np.cumsum(rows)
    result: dict[str, Any] = {"start": stops - rows, "stop": stops}
    for column in columns:
        where = paths.index(column) if column in paths else None
        found = [None if where is None else metadata.row_group(n).column(where).statistics for n in range(len(rows))]
        bounded = [stats if stats is not None and stats.has_min_max else None for stats in found]
        result[f"min.{column}"] = [None if stats is None else stats.min for stats in bounded]
        result[f"max.{column}"] = [None if stats is None else stats.max for stats in bounded]
        result[f"null_count.{column}"] = [
            stats.null_count if stats is not None and stats.has_null_count else None for stats in found
        ]
    return result


def _parquet_file(location: str, path: str, handle: Any) -> pq.ParquetFile:
    """The data file ``path`` open as ``handle``, its footer parsed once for the last few files read:
    a committed data file never changes (its name is new for every file written). ``pre_buffer``
    fetches the column chunks a read wants in few requests, as ``pq.read_table`` does: without it, a
    get's one message on Azurite took 80-90 ms (a request per column chunk), with it 6.5 ms."""
    key = (location, path)
    with _footers_lock:
        metadata = _footers.get(key)
        if metadata is not None:
            _footers.move_to_end(key)
    parquet = pq.ParquetFile(handle, metadata=metadata, pre_buffer=True)
    if metadata is None:
        with _footers_lock:
            _footers[key] = parquet.metadata
            while len(_footers) > FOOTERS_KEPT:
                _footers.popitem(last=False)
    return parquet


def _present(parquet: pq.ParquetFile, columns: list[str] | None) -> list[str] | None:
    if columns is None:
        return None
    names = set(parquet.schema_arrow.names)
    return [name for name in columns if name in names]


def _with_nulls(data: pa.Table, columns: list[str] | None) -> pa.Table:
    """``data`` with the ``columns`` it lacks added as nulls, in the order of ``columns``."""
    if columns is None or len(columns) == data.num_columns:
        return data
    return pa.table({name: data[name] if name in data.column_names else pa.nulls(data.num_rows) for name in columns})


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a table's folder but not yet committed; plain data, so it pickles."""

    path: str
    size: int
    modification_time: int
    rows: int
    stats: str

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, {}, self.modification_time, True, self.stats)


class _Stats:
    """Delta file statistics: row count, null counts, and exact min/max of integer, string and boolean
    columns (a reader learns from ``top_of_queue``'s max that a file holds no such message).

    Delta writes timestamps at millisecond precision, so their min is rounded down and their max up:
    bounds, never a value that would make a reader skip a file holding a matching row.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.rows = 0
        self.nulls = {f.name: 0 for f in schema if not pa.types.is_map(f.type)}
        self.bounded = [
            f.name
            for f in schema
            if pa.types.is_integer(f.type)
            or pa.types.is_string(f.type)
            or pa.types.is_boolean(f.type)
            or pa.types.is_timestamp(f.type)
        ]
        self.minimum: dict[str, object] = {}
        self.maximum: dict[str, object] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for name in self.nulls:
            self.nulls[name] += batch.column(name).null_count
        for name in self.bounded:
            column = batch.column(name)
            if column.null_count == len(column):
                continue
            if len(column) == 1:
                # A single message's value is both bounds; pc.min_max costs ten times the lookup.
                low = high = column[0].as_py()
            else:
                low, high = (bound.as_py() for bound in pc.min_max(column).values())
            self.minimum[name] = min(low, self.minimum.get(name, low))
            self.maximum[name] = max(high, self.maximum.get(name, high))

    def to_json(self) -> str:
        bounds = {
            "minValues": {name: _json_bound(value, down=True) for name, value in self.minimum.items()},
            "maxValues": {name: _json_bound(value, down=False) for name, value in self.maximum.items()},
        }
        return json.dumps({"numRecords": self.rows, **bounds, "nullCount": self.nulls})


def _json_bound(value: object, down: bool) -> object:
    """A statistic as Delta's JSON holds it; a timestamp (UTC) rounded to milliseconds, ``down`` or up."""
    if not isinstance(value, datetime):
        return value
    milliseconds = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if not down and milliseconds != value:
        milliseconds += timedelta(milliseconds=1)
    if milliseconds.tzinfo is not None:
        milliseconds = milliseconds.astimezone(UTC)
    return milliseconds.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def write_data_file(location: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> DataFile | None:
    """Write ``batches`` as one Parquet file in the table folder at ``location``; None when there are no rows."""
    filesystem, base = filesystem_of(location)
    name = f"part-{uuid.uuid4()}.snappy.parquet"
    batches = (_conform(batch, schema) for batch in batches)
    stats = _Stats(schema)
    writer = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                writer = pq.ParquetWriter(f"{base}/{name}", schema, filesystem=filesystem, compression="snappy")
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
            stats.add(batch)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return None
    size = filesystem.get_file_info(f"{base}/{name}").size
    return DataFile(name, size, int(time.time() * 1000), stats.rows, stats.to_json())


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the nullable columns of ``schema`` it lacks added as nulls."""
    if batch.schema.names == schema.names:
        return batch
    columns = [
        batch.column(field.name) if field.name in batch.schema.names else pa.nulls(batch.num_rows, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def remove_data_files(location: str, files: Iterable[DataFile]) -> None:
    """Delete written files that will never be committed."""
    filesystem, base = filesystem_of(location)
    for file in files:
        # Spark may abort a batch whose commit already removed its files.
        if filesystem.get_file_info(f"{base}/{file.path}").type != pafs.FileType.NotFound:
            filesystem.delete_file(f"{base}/{file.path}")
