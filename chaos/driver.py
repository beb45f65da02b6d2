"""What the chaos run's Spark drivers share: a small local session, a query run until it is done
(started again after a documented failure), and what a query's failure says."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

import mqspark
from chaos.history import History


def session(name: str) -> SparkSession:
    """A one-core local session without UI: four of them share two cores in a run."""
    return mqspark.session(
        app_name=f"chaos-{name}",
        master="local[1]",
        **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1", "spark.ui.showConsoleProgress": "false"},
    )


def run_query(
    start: Callable[[], StreamingQuery],
    done: Callable[[StreamingQuery], bool],
    history: History,
    what: str,
    every: float = 0.2,
) -> None:
    """Run the query ``start`` starts, looking every ``every`` seconds, until ``done`` says so; then stop
    it. A query that failed as docs/limits.md says a query may (recorded as a ``failure`` naming
    that limit) is started again from its checkpoint, as a job with a restart policy would; any
    other failure ends the process with it (the run records an actor that exits by itself as a
    violation)."""
    while True:
        query = start()
        while query.isActive and not done(query):
            time.sleep(every)
        failure = query.exception()
        query.stop()
        documented = None if failure is None else documented_failure(str(failure))
        if documented is None:
            break
        history.record("failure", error=first_line(str(failure)), documented=documented)
    if failure is not None:
        raise SystemExit(f"{what}'s query failed: {failure}")


def documented_failure(error: str) -> str | None:
    """The name of the documented limit a query failure is, else None."""
    if "FileNotFoundError" in error and "/qm/queues/" in error:
        return "retention shorter than a micro-batch (docs/limits.md)"
    if "Python worker failed to connect back" in error:
        return "a Python data source's worker that started too slowly (docs/limits.md)"
    return None


def first_line(error: str) -> str:
    """The line of a query's error that says what went wrong: its MQ line, else the last line of a
    Python traceback, else the error's first line (Spark's own, before its stack and thread dumps)."""
    lines = [line.strip() for line in error.splitlines() if line.strip() and not line.strip().startswith("at ")]
    mq = [line for line in lines if "MQRC_" in line]
    if mq:
        return mq[0][:500]
    python = [line for line in lines if re.match(r"[\w.]*(Error|Exception): ", line)]
    return (python[-1] if python else lines[0] if lines else "")[:500]
