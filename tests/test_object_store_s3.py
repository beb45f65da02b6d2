"""Queue managers on S3, as moto's S3 server serves it (conditional puts included): the Python API
with storage options, and Spark's streaming put and get with the AWS_* environment variables the
session's Python workers inherited (see ``tests/conftest.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mqspark import QueueManager, store
from mqspark.store.filesystems import filesystem_of

from .support.samples import spec_example
from .test_object_store import (
    LOGICAL_ORDER,
    _payloads,
    one_writer_wins_each_version,
    producers_and_a_repeated_transaction_put_exactly_once,
    without_environment,
)
from .test_object_store_spark import put_then_drain_in_logical_order

# Every test needs the S3 emulator's server process.
pytestmark = pytest.mark.slow


@pytest.fixture
def _options_only(monkeypatch):
    """Credentials as storage options only: the session's AWS_* variables go."""
    without_environment(monkeypatch, "AWS")


def _bucket(root: str) -> str:
    return root.removeprefix("s3://").split("/")[0]


@pytest.mark.usefixtures("_options_only")
def test_a_queue_manager_on_s3_puts_browses_gets_and_maintains(s3, s3_root):
    qm = QueueManager.create(s3_root, "QM1", storage_options=s3.storage_options)
    spec_example(qm)
    assert _payloads(qm.browse("Q")) == LOGICAL_ORDER
    assert _payloads(qm.get("Q", consumer="c", max_messages=3)) == ["A", "Y1", "Y2"]
    again = QueueManager.open(s3_root, storage_options=s3.storage_options)
    assert _payloads(again.get("Q", consumer="c", max_messages=10)) == LOGICAL_ORDER[3:]
    summary = again.maintain("Q", retention=timedelta(0))
    assert (summary.removed_consumed, summary.files_after) == (8, 0)
    assert again.depth("Q") == 0
    filesystem, path = filesystem_of(store.queue_location(s3_root, "Q"))
    assert filesystem.type_name == "s3"
    assert path == f"{_bucket(s3_root)}/qm/queues/Q"


@pytest.mark.usefixtures("_options_only")
def test_commits_on_s3_are_conditional_puts_so_one_writer_of_a_version_wins(s3, s3_root):
    """The server refused log entries on the way (412 to ``If-None-Match: *``)."""
    refused = s3.refused_log_entries(_bucket(s3_root))
    one_writer_wins_each_version(f"{s3_root}/plain", s3.storage_options)
    assert s3.refused_log_entries(_bucket(s3_root)) > refused


@pytest.mark.usefixtures("_options_only")
def test_concurrent_puts_and_a_repeated_transaction_on_s3_are_exactly_once(s3, s3_root):
    producers_and_a_repeated_transaction_put_exactly_once(
        QueueManager.create(s3_root, "QM1", storage_options=s3.storage_options)
    )


def test_a_streaming_put_and_a_streaming_get_on_s3_deliver_in_logical_order(spark, s3, s3_root, tmp_path):
    put_then_drain_in_logical_order(spark, s3_root, tmp_path, 3)
