"""The folder layout of a queue manager root: where the catalog, each queue's message table, state
table, maintenance lease, forwarder checkpoints, monitor history and instance registry live.
"""

from __future__ import annotations

import os
from typing import Protocol

from mqspark.store.filesystems import is_uri

CATALOG_DIR = "_qmgr"
STATE_DIR = "state"
MAINTENANCE_DIR = "maintenance"
FORWARD_DIR = "forward"
MONITOR_DIR = "monitor"
INSTANCES_DIR = "instances"
QUEUES_DIR = "queues"
AUDIT_DIR = "audit"

StorageOptions = dict[str, str] | None


class QueueManagerRoot(Protocol):
    """A queue manager's root and the options that reach its store: all that code working on one
    queue's tables (maintenance, say) needs of the queue manager."""

    @property
    def root(self) -> str: ...

    @property
    def storage_options(self) -> StorageOptions: ...


def normalize_root(root: str | os.PathLike) -> str:
    """A root as delta-rs wants it: URIs unchanged, local paths absolute."""
    location = os.fspath(root)
    return location.rstrip("/") if is_uri(location) else os.path.abspath(location)


def queue_dir_name(queue: str) -> str:
    return queue.replace("%", "~25").replace("/", "~2F")


def catalog_location(root: str) -> str:
    return f"{root}/{CATALOG_DIR}"


def queue_location(root: str, queue: str) -> str:
    return f"{root}/{QUEUES_DIR}/{queue_dir_name(queue)}"


def state_location(root: str, queue: str) -> str:
    return f"{root}/{STATE_DIR}/{queue_dir_name(queue)}"


def maintenance_location(root: str, queue: str) -> str:
    """The table holding the queue's maintenance lease: apart from the state table, whose commits
    several times a second would make taking the lease wait."""
    return f"{root}/{MAINTENANCE_DIR}/{queue_dir_name(queue)}"


def forward_location(root: str, queue: str, consumer: str) -> str:
    """The checkpoint of the forwarding service of ``queue`` in consumer group ``consumer``."""
    return f"{root}/{FORWARD_DIR}/{queue_dir_name(queue)}/{consumer}"


def monitor_location(root: str, queue: str) -> str:
    """The backlog monitor's history of ``queue``: a point per row, every group's."""
    return f"{root}/{MONITOR_DIR}/{queue_dir_name(queue)}"


def audit_location(root: str) -> str:
    """The console's audit table of the queue manager: who did what to it, when, with what result."""
    return f"{root}/{AUDIT_DIR}"
