"""The queue manager's public names are the documented API and nothing else: the facade composes the
engine, so none of the engine's names leak into it, and docs/reference/python-api.md has a line for
each of them."""

from __future__ import annotations

import re
from pathlib import Path

from mqspark import QueueManager

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "python-api.md"

PUBLIC_NAMES = [
    "alter_qmgr",
    "alter_queue",
    "backlog",
    "browse",
    "claim",
    "consumer",
    "consumers",
    "create",
    "declare_consumer",
    "define_queue",
    "delete_consumer",
    "delete_queue",
    "depth",
    "get",
    "inquire_queue",
    "maintain",
    "name",
    "open",
    "purge",
    "put",
    "qmid",
    "queues",
    "redrive",
    "root",
    "syncpoint_get",
]


def test_the_queue_manager_shows_exactly_the_documented_names():
    assert PUBLIC_NAMES == sorted(PUBLIC_NAMES)
    assert [name for name in dir(QueueManager) if not name.startswith("_")] == PUBLIC_NAMES


def test_the_python_api_reference_has_a_line_for_each_public_name():
    # The first cell of each table row: `name`, `name(...)` or `QueueManager.name(...)`.
    documented = re.findall(r"^\| `(?:QueueManager\.)?(\w+)", REFERENCE.read_text(), flags=re.MULTILINE)
    assert sorted(documented) == PUBLIC_NAMES
