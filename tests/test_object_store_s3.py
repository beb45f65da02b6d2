"""Queue managers on S3, as moto's S3 server serves it (conditional puts included): the Python API
with storage options, and Spark's streaming put and get with the AWS_* environment variables the
session's Python workers inherited (see ``tests/conftest.py``)."""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from mqspark import QueueManager, storage
from mqspark.filesystems import filesystem_of

from .samples import spec_example
from .test_object_store_spark import _orders
from .test_stream_get import _expected_df, _reference

LOGICAL_ORDER = ["A", "Y1", "Y2", "Y3-1:", "Y3-2", "Z1", "Z2", "B"]


@pytest.fixture
def _options_only(monkeypatch):
    """Credentials as storage options only: the session's AWS_* variables go."""
    for name in list(os.environ):
        if name.startswith("AWS"):
            monkeypatch.delenv(name)


def _payloads(table: pa.Table) -> list[str]:
    return [payload.decode() for payload in table["payload"].to_pylist()]


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
    filesystem, path = filesystem_of(storage.queue_location(s3_root, "Q"))
    assert filesystem.type_name == "s3"
    assert path == f"{_bucket(s3_root)}/qm/queues/Q"


@pytest.mark.usefixtures("_options_only")
def test_commits_on_s3_are_conditional_puts_so_one_writer_of_a_version_wins(s3, s3_root):
    """What every mqspark commit relies on: of two writers that read the same version and commit the
    next one at the same moment without retrying, exactly one wins and the other gets delta-rs's
    CommitFailedError. The server refused log entries (412 to ``If-None-Match: *``) on the way: a
    store that overwrote them would have let both win."""
    location = f"{s3_root}/plain"
    options = s3.storage_options
    write_deltalake(location, pa.table({"n": [0]}), storage_options=options)
    refused = s3.refused_log_entries(_bucket(s3_root))
    rounds = 10
    for number in range(rounds):
        writers = [DeltaTable(location, storage_options=options) for _ in range(2)]
        together = threading.Barrier(2)
        outcomes: list[str] = []

        def commit(table: DeltaTable, name: str, together: threading.Barrier, outcomes: list[str]) -> None:
            together.wait()
            try:
                table.create_write_transaction(
                    [],
                    mode="append",
                    schema=table.schema(),
                    commit_properties=CommitProperties(max_commit_retries=0, custom_metadata={"writer": name}),
                )
                outcomes.append("won")
            except CommitFailedError:
                outcomes.append("refused")

        threads = [
            threading.Thread(target=commit, args=(table, f"{number}-{n}", together, outcomes))
            for n, table in enumerate(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["refused", "won"], f"round {number}: {outcomes}"
    assert DeltaTable(location, storage_options=options).version() == rounds
    assert s3.refused_log_entries(_bucket(s3_root)) > refused


@pytest.mark.usefixtures("_options_only")
def test_concurrent_puts_and_a_repeated_transaction_on_s3_are_exactly_once(s3, s3_root):
    qm = QueueManager.create(s3_root, "QM1", storage_options=s3.storage_options)
    qm.define_queue("Q")
    errors: list[BaseException] = []

    def producer(name: str) -> None:
        try:
            for batch in range(3):
                qm.put("Q", [{"payload": f"{name}-{batch}-{n}"} for n in range(2)], producer=name, batch_id=batch)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=producer, args=(name,)) for name in ("P0", "P1", "P2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for name in ("P0", "P1", "P2"):
        qm.put("Q", [{"payload": f"{name}-again"}], producer=name, batch_id=1)
        assert qm.committed_transaction("Q", name) == 2
    payloads = _payloads(qm.browse("Q"))
    for name in ("P0", "P1", "P2"):
        assert [payload for payload in payloads if payload.startswith(name)] == [
            f"{name}-{b}-{n}" for b in range(3) for n in range(2)
        ]
    assert len(payloads) == 18


def test_a_streaming_put_and_a_streaming_get_on_s3_deliver_in_logical_order(spark, s3, s3_root, tmp_path):
    qm = QueueManager.create(s3_root, "QM1")
    qm.define_queue("Q", delivery_sequence="fifo")
    _orders(tmp_path / "input", 3)
    (
        spark.readStream.schema("payload string, group_id string, msg_seq_number int, last_in_group boolean")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "input"))
        .writeStream.format("mq")
        .option("queue", "Q")
        .option("checkpointLocation", str(tmp_path / "put"))
        .trigger(availableNow=True)
        .start(qm.root)
        .awaitTermination()
    )
    delivered: list[tuple] = []

    def collect(batch, batch_id: int) -> None:
        rows = batch.select("delivery_seq", "msg_id", "offset", "payload").collect()
        delivered.extend((r.delivery_seq, r.msg_id, r.offset, r.payload.decode()) for r in rows)

    (
        spark.readStream.format("mq")
        .option("queue", "Q")
        .option("consumer", "e2e")
        .option("maxMessagesPerTrigger", 5)
        .load(qm.root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "get"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    got = spark.createDataFrame(sorted(delivered), "delivery_seq long, msg_id string, offset long, payload string")
    assert_df_equality(got, _expected_df(spark, _reference(qm)))
    assert qm.depth("Q", consumer="e2e") == 0
