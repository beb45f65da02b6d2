"""The depth report (``mqspark depth`` and the console): what it shows of queues whose gets or puts
are inhibited, which is when an operator looks."""

from __future__ import annotations

from mqspark import QueueManager
from mqspark.services.monitor import Monitor
from mqspark.status import depths


def test_a_get_inhibited_queue_shows_its_depth_and_its_groups_health(qm: QueueManager) -> None:
    qm.define_queue("Q", backout_queue=None)
    qm.put("Q", [{"payload": b"a"}, {"payload": b"b"}])
    qm.declare_consumer("Q", "g")
    qm.alter_queue("Q", get_inhibited=True, put_inhibited=True)
    rows = [(row["queue"], row["consumer"], row["depth"], row["status"], row["held_by"]) for row in depths(qm, "Q")]
    assert rows == [("Q", None, 2, None, None), ("Q", "g", 2, "STOP", None)]
    # A monitor watches it too: its point says the group stopped.
    monitor = Monitor(qm, "Q", "g", watch_interval=1, watch_count=1, expected_count=1, history=False)
    point = monitor.point()
    assert (point.depth, point.status.value) == (2, "STOP")
