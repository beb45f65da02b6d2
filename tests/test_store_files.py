"""The store's file helpers: a table brought to a schema as pyarrow's cast brings it."""

from __future__ import annotations

import pyarrow as pa

from mqspark import store

SCHEMA = pa.schema([pa.field("payload", pa.binary()), pa.field("priority", pa.int32())], metadata={b"owner": b"q"})


def test_a_table_already_in_the_schema_is_returned_as_it_is():
    table = pa.table({"payload": [b"a"], "priority": pa.array([4], pa.int32())}, schema=SCHEMA)
    assert store.cast_to(table, SCHEMA) is table


def test_a_table_differing_in_types_or_only_in_metadata_comes_back_as_cast_gives_it():
    typed = pa.table({"payload": [b"a", b"b"], "priority": pa.array([4, 9], pa.int64())})
    bare = typed.cast(SCHEMA.remove_metadata())
    for table in (typed, bare):
        cast = store.cast_to(table, SCHEMA)
        assert cast.schema.equals(SCHEMA, check_metadata=True)
        assert cast.equals(table.cast(SCHEMA))
        assert cast.to_pydict() == {"payload": [b"a", b"b"], "priority": [4, 9]}
