"""The console's audit table: every admin action made through the console (a redrive, a test
message, purge, inhibit or allow, alter, switchover; not the REST API's puts and gets, which are
messaging), a Delta table in the queue manager's root (``audit/``) with who, what, on which queue,
when, and the result or the error."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from mqspark import store
from mqspark.qmgr import QueueManager, engine

AUDIT_SCHEMA = pa.schema(
    [
        pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("who", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("queue", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("ok", pa.bool_(), nullable=False),
        pa.field("result", pa.string()),
    ]
)
_lock = threading.Lock()


def record(
    qm: QueueManager, who: str, action: str, queue: str | None, detail: dict[str, Any], ok: bool, result: Any
) -> None:
    """Append one action to ``qm``'s audit table (made on first use); ``detail`` and ``result`` as JSON."""
    row = pa.table(
        {
            "at": [datetime.now(UTC)],
            "who": [who],
            "action": [action],
            "queue": [queue],
            "detail": [json.dumps(detail, default=str, sort_keys=True)],
            "ok": [ok],
            "result": [json.dumps(result, default=str)],
        },
        schema=AUDIT_SCHEMA,
    )
    location, options = store.audit_location(qm.root), engine(qm).storage_options
    with _lock:
        if not store.table_exists(location, options):
            try:
                store.create_table(location, AUDIT_SCHEMA, options)
            except Exception:  # noqa: BLE001 - another console created it first
                if not store.table_exists(location, options):
                    raise
        write_deltalake(location, row, mode="append", storage_options=options or None)


def read(qm: QueueManager, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` actions of ``qm``'s audit table, newest first."""
    table = store.open_table(store.audit_location(qm.root), engine(qm).storage_options)
    if table is None:
        return []
    rows = store.table_dataset(table).to_table().sort_by([("at", "descending")]).slice(0, limit).to_pylist()
    return [{**row, "at": row["at"].isoformat()} for row in rows]
