"""Test helpers for "an error changes nothing": a snapshot of a queue manager, and exact-error checks."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from mqspark import MQError, QueueDefinition, QueueManager, Reason, store


@dataclasses.dataclass(frozen=True)
class State:
    queues: list[QueueDefinition]
    catalog_version: int
    queue_dirs: list[str]
    messages: dict[str, tuple[int, list[dict[str, Any]]]]


def snapshot(qm: QueueManager) -> State:
    """Everything a command could change: catalog, table directories, and every local queue's version and rows."""
    queues = qm.queues()
    return State(
        queues=queues,
        catalog_version=DeltaTable(store.catalog_location(qm.root)).version(),
        queue_dirs=sorted(os.listdir(Path(qm.root) / store.QUEUES_DIR)),
        messages={
            q.name: (DeltaTable(store.queue_location(qm.root, q.name)).version(), qm.browse(q.name).to_pylist())
            for q in queues
            if q.type == "local"
        },
    )


@contextmanager
def unchanged(qm: QueueManager) -> Iterator[None]:
    before = snapshot(qm)
    yield
    assert snapshot(qm) == before


@contextmanager
def refused(error: type[MQError], text: str, reason: Reason | None = None) -> Iterator[None]:
    """Expect exactly ``error`` with exactly ``text`` as its message and ``reason`` as its reason."""
    with pytest.raises(error, match=f"^{re.escape(text)}$") as caught:
        yield
    assert type(caught.value) is error
    assert caught.value.reason is reason
