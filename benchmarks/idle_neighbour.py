"""What work beside a streaming get costs it even at the lowest CPU priority: drains of a backlog
(a producer putting, getting and maintaining as in the console benchmark) alone, beside one
``SCHED_IDLE`` spinner a CPU, and beside a ``SCHED_IDLE`` process computing the console's answers
(the overview and every queue's page) as fast as it can. The three in rotating order, ``rounds``
times; reports each neighbour's drains against the drains alone of the same round, and the cores
the neighbour took during its drains. Why the console refreshes less often on a busy machine."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

import mqspark
from mqspark import QueueManager

from .console import PRODUCER, _cpu_s, _drain

SPINNER = """
import os
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while True:
    pass
"""
# The console reader's work, unpaced, at the reader's priority.
ANSWERS = """
import os, sys
os.nice(19)
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
from mqspark.console import answers
from mqspark.console.managers import Managers
managers, queues = Managers([sys.argv[1]]), int(sys.argv[2])
while True:
    answers.queues(managers, "BENCH")
    for number in range(queues):
        answers.queue(managers, "BENCH", f"Q{number:03d}")
"""
CONDITIONS = ("alone", "spinners", "answers")


def run(rounds: int = 8, queues: int = 20, messages: int = 200_000) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-"))
    processes: list[subprocess.Popen] = []
    spark = None
    try:
        qm = QueueManager.create(root / "qm", "BENCH")
        for number in range(queues):
            qm.define_queue(f"Q{number:03d}")
            qm.declare_consumer(f"Q{number:03d}", "app")
        qm.define_queue("GET")
        batch = pa.table({"payload": [b"m" * 1000] * (messages // 20)})
        for _ in range(20):
            qm.put("GET", batch)
        producer = [sys.executable, "-c", PRODUCER, qm.root, str(queues), "0"]
        processes.append(subprocess.Popen(producer, stdout=subprocess.DEVNULL))
        spark = mqspark.session(
            app_name="mqspark-bench", master="local[2]", **{"spark.ui.showConsoleProgress": "false"}
        )
        # Started after Spark, as the console is in its benchmark, and running through the first
        # drain (the answers' process reads every queue once).
        spinners = [subprocess.Popen([sys.executable, "-c", SPINNER]) for _ in range(os.cpu_count() or 1)]
        reader = subprocess.Popen([sys.executable, "-c", ANSWERS, qm.root, str(queues)])
        processes += [*spinners, reader]
        neighbours = {"alone": [], "spinners": spinners, "answers": [reader]}
        _drain(spark, qm.root, root / "warm", "warm", 1000)
        for process in [*spinners, reader]:
            os.kill(process.pid, signal.SIGSTOP)
        drains: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
        cores: dict[str, list[float]] = {condition: [] for condition in CONDITIONS[1:]}
        for n in range(rounds):
            _drain(spark, qm.root, root / f"warm{n}", f"warm{n}", messages)
            for condition in CONDITIONS[n % 3 :] + CONDITIONS[: n % 3]:
                beside = neighbours[condition]
                for process in beside:
                    os.kill(process.pid, signal.SIGCONT)
                used = sum(_cpu_s(process.pid) for process in beside)
                drained = _drain(spark, qm.root, root / f"drain{n}-{condition}", f"{condition}{n}", messages)
                used = sum(_cpu_s(process.pid) for process in beside) - used
                for process in beside:
                    os.kill(process.pid, signal.SIGSTOP)
                drains[condition].append(drained)
                if beside:
                    cores[condition].append(used / drained)
    finally:
        for process in processes:
            process.kill()
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    result: dict = {"benchmark": "idle_neighbour", "rounds": rounds, "queues": queues, "messages": messages}
    result["alone_drains_s"] = [round(drain, 2) for drain in drains["alone"]]
    for condition in CONDITIONS[1:]:
        ratios = [alone / beside for alone, beside in zip(drains["alone"], drains[condition], strict=True)]
        result[condition] = {
            "drains_s": [round(drain, 2) for drain in drains[condition]],
            "ratios": [round(ratio, 3) for ratio in ratios],
            "ratio_mean": round(statistics.mean(ratios), 3),
            "ratio_sd": round(statistics.stdev(ratios), 3) if len(ratios) > 1 else None,
            "neighbour_cores": [round(used, 2) for used in cores[condition]],
        }
    return result
