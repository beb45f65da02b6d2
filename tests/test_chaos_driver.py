"""A chaos run's Spark drivers (``chaos/driver.py``): a query that fails as docs/limits.md says a query
may is recorded as that documented failure and started again; any other failure ends the driver.

Real streaming queries of the rate source, whose ``foreachBatch`` raises the failure's text."""

from __future__ import annotations

import pytest

from chaos import driver
from chaos.history import History, events

pytestmark = pytest.mark.spark

SLOW_WORKER = "Python worker failed to connect back"


def _starts(spark, tmp_path, errors: list[str | None]):
    """A ``start`` whose n-th query raises ``errors[n]`` in its first batch (None: processes it);
    and the batches processed without error."""
    processed: list[int] = []

    def start():
        error = errors[len(starts)]
        starts.append(error)

        def batch(frame, batch_id: int) -> None:
            if error is not None:
                raise RuntimeError(error)
            processed.append(batch_id)

        stream = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
        checkpoint = str(tmp_path / "checkpoint")
        return stream.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint).start()

    starts: list[str | None] = []
    return start, starts, processed


def test_a_query_failing_as_documented_is_recorded_and_started_again(spark, tmp_path):
    start, starts, processed = _starts(spark, tmp_path, [SLOW_WORKER, SLOW_WORKER, None])
    history = History(tmp_path, "F#1")
    driver.run_query(start, lambda _: bool(processed), history, "the forwarder", every=0.1)
    history.close()

    assert starts == [SLOW_WORKER, SLOW_WORKER, None]
    recorded = [(e["e"], e["actor"], e["documented"]) for e in events(tmp_path)]
    documented = "a Python data source's worker that started too slowly (docs/limits.md)"
    assert recorded == [("failure", "F#1", documented)] * 2
    assert all(SLOW_WORKER in e["error"] for e in events(tmp_path))


def test_any_other_failure_ends_the_driver_with_it(spark, tmp_path):
    start, starts, processed = _starts(spark, tmp_path, ["the sink refused batch 0", None])
    history = History(tmp_path, "W#1")
    failed = "(?s)the streaming put's query failed: .*RuntimeError: the sink refused batch 0"
    with pytest.raises(SystemExit, match=failed):
        driver.run_query(start, lambda _: bool(processed), history, "the streaming put", every=0.1)
    history.close()

    assert starts == ["the sink refused batch 0"]
    assert list(events(tmp_path)) == []
