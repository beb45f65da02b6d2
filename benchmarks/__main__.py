"""Run the benchmarks and print one JSON object per line: python -m benchmarks [NAME ...]

A benchmark that takes arguments (``backlog``) takes every argument after its name:
python -m benchmarks backlog 100k 1M 20M"""

from __future__ import annotations

import json
import sys

from . import (
    backlog,
    backout,
    browse,
    cluster_drain,
    cluster_put,
    console,
    forward,
    idle_neighbour,
    instances,
    maintenance,
    monitor,
    object_store,
    python_mq,
    python_put,
    state_log,
    stream_get,
    stream_put,
)


def _spark():
    import mqspark

    return mqspark.session(app_name="mqspark-bench", master="local[2]", **{"spark.ui.showConsoleProgress": "false"})


BENCHMARKS = {
    "python_put_10k": lambda: python_put.run(put_size=10_000),
    "python_put_100": lambda: python_put.run(messages=20_000, put_size=100),
    "python_mq": lambda: python_mq.run(),
    "python_mq_quick": lambda: python_mq.run(messages=40, consumed=10_000, put_messages=40),
    "stream_put_10k": lambda: stream_put.run(batch_rows=10_000),
    "stream_put_100k": lambda: stream_put.run(batch_rows=100_000),
    "browse_ungrouped": lambda: browse.run(_spark(), "ungrouped"),
    "browse_open_groups": lambda: browse.run(_spark(), "open_groups"),
    "browse_segments": lambda: browse.run(_spark(), "segments"),
    "stream_get_drain": lambda: stream_get.run("drain", _spark()),
    "stream_get_drain_5m": lambda: stream_get.run("drain", _spark(), messages=5_000_000, puts=50),
    "stream_get_latency": lambda: stream_get.run("latency", _spark()),
    "stream_get_planning": lambda: stream_get.run("planning"),
    "stream_get_read_profile": lambda: stream_get.run("read_profile"),
    "cluster_put": lambda: cluster_put.run(batch_rows=100_000),
    "maintenance": lambda: maintenance.run(),
    "maintenance_quick": lambda: maintenance.run(history=1_000, bulk_messages=20_000, bulk_puts=20),
    "backout": lambda: backout.run(_spark()),
    "forward": lambda: forward.run(_spark()),
    "monitor": lambda: monitor.run(),
    "monitor_quick": lambda: monitor.run(messages=100_000, waiting=1_000, points=5, history=20),
    "instances_takeover": lambda: instances.run(),
    "object_store_put": lambda: object_store.run(),
    "cluster_drain": lambda: cluster_drain.run(),
    "backlog": lambda: backlog.run(),
    "state_log": lambda: state_log.run(),
    "console": lambda: console.run(),
    # An hour, to tell memory that levels off from memory that keeps growing; its parts are 5 minutes.
    "console_hour": lambda: console.run(minutes=60, pairs=16, windows=12),
    # The same load with a bare server in place of the console: what serving the pollers costs at least.
    "console_bare": lambda: console.run(minutes=10, server="bare"),
    # Rounds of three drains: a third with the console's reader process alone stopped.
    "console_reader": lambda: console.run(minutes=10, pairs=16, aged=False, reader_stopped=True),
    # Drains alone, beside SCHED_IDLE spinners, beside the console's answers computed unpaced.
    "idle_neighbour": lambda: idle_neighbour.run(),
    # Drains of 3,000,000 messages, 200,000 a micro-batch (13-15 s each), three back to back (one
    # not counted first): the machine stays busy for longer than the console's refresh while it is
    # busy (30 s), so this is what a get that runs for long loses beside the console.
    "console_sustained": lambda: console.run(minutes=15, messages=3_000_000, per_trigger=200_000, pairs=8, aged=False),
    "console_quick": lambda: console.run(minutes=2, messages=50_000, pairs=2, aged=False),
    "state_log_quick": lambda: state_log.run(entries=2_000, gets=40),
}
# Benchmarks that take arguments: called with every argument after their name.
WITH_ARGUMENTS = {"backlog": backlog.main}


def main(names: list[str]) -> None:
    if names and names[0] in WITH_ARGUMENTS:
        print(json.dumps(WITH_ARGUMENTS[names[0]](names[1:])), flush=True)
        return
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        sys.exit(f"unknown benchmark {unknown[0]}; known: {', '.join(BENCHMARKS)}")
    for name in names or BENCHMARKS:
        print(json.dumps(BENCHMARKS[name]()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
