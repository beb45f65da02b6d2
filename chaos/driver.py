"""What the chaos run's Spark drivers share: a small local session, and the end of a query."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

import mqspark


def session(name: str) -> SparkSession:
    """A one-core local session without UI: four of them share two cores in a run."""
    return mqspark.session(
        app_name=f"chaos-{name}",
        master="local[1]",
        **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1", "spark.ui.showConsoleProgress": "false"},
    )


def finish(spark: SparkSession, query: StreamingQuery, what: str) -> None:
    """Stop ``query`` and the session; exit with the query's failure, if it failed (the run records
    an actor that exits by itself as a violation)."""
    failure = query.exception()
    query.stop()
    spark.stop()
    if failure is not None:
        raise SystemExit(f"{what}'s query failed: {failure}")
