"""Instances of one consumer service: standby, takeover when the active instance's lease lapses,
fencing of an instance that lost the lease, and the registry that `mqspark instance list` shows."""

from __future__ import annotations

import json
import os
import socket
import threading
from datetime import timedelta

import pytest

from mqspark import MQError, QueueManager, Reason
from mqspark.clock import ManualClock
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.qmgr import engine
from mqspark.services.instances import STANDBY_POLL, Instance, instances

from .support.cli import mqspark

LEASE = timedelta(seconds=2)


@pytest.fixture
def qm(clocked_qm) -> QueueManager:
    return clocked_qm


def _lapse(clock: ManualClock) -> None:
    clock.advance(LEASE + timedelta(seconds=0.3))


def test_renewing_is_refused_once_another_owner_holds_the_lease(qm, clock):
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q", engine(qm).storage_options, clock=clock)
    state.acquire("G", "paused", LEASE)
    state.renew("G", "paused", LEASE)
    _lapse(clock)
    state.acquire("G", "standby", LEASE)
    with pytest.raises(MQError) as refused:
        state.renew("G", "paused", LEASE)
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert str(refused.value) == "MQRC_OBJECT_IN_USE (2042): queue Q: consumer group 'G' was taken over by standby"
    assert state.lease("G", LEASE).owner == "standby"


def test_a_standby_waits_while_the_active_instance_holds_the_lease_and_takes_over_once_it_lapses(qm, clock):
    qm.define_queue("Q")
    active, standby = (Instance(qm, "Q", "G", lease_timeout=LEASE) for _ in range(2))
    active.wait_until_active(timeout=5)
    leased = clock.monotonic()
    with pytest.raises(MQError) as waited:
        standby.wait_until_active(timeout=1.0)
    assert waited.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert str(waited.value).endswith(f"instance {standby.id} of consumer group 'G' did not become active within 1 s")
    listed = instances(qm, "Q", "G", LEASE)
    assert [(i.instance, i.role, i.active_since is not None) for i in listed] == [
        (active.id, "active", True),
        (standby.id, "standby", False),
    ]
    assert {(i.service, i.host, i.pid) for i in listed} == {("get", socket.gethostname(), os.getpid())}
    assert qm.backlog("Q", consumer="G").held_by == active.id
    assert qm.backlog("Q").held_by is None

    # The active instance stops renewing (it died): the standby becomes active after the lease timeout.
    # Its wait of 1 s above moved the clock too; it polls every STANDBY_POLL (or a third of the lease).
    standby.wait_until_active(timeout=10)
    poll = min(LEASE.total_seconds() / 3, STANDBY_POLL)
    assert LEASE.total_seconds() < clock.monotonic() - leased <= LEASE.total_seconds() + poll
    assert ConsumerState(qm.root, "Q", engine(qm).storage_options, clock=clock).lease("G", LEASE).owner == standby.id
    assert qm.backlog("Q", consumer="G").held_by == standby.id
    # The dead instance's entry is past its heartbeat: only the new active instance is listed.
    assert [(i.instance, i.role) for i in instances(qm, "Q", "G", LEASE)] == [(standby.id, "active")]


def test_a_fenced_batch_function_runs_only_while_its_instance_holds_the_lease(qm, clock):
    qm.define_queue("Q")
    first, second = (Instance(qm, "Q", "G", lease_timeout=LEASE) for _ in range(2))
    delivered = []
    first.wait_until_active(timeout=5)
    fenced = first.fence(lambda batch, batch_id: delivered.append(batch_id))
    fenced(None, 0)
    _lapse(clock)
    second.wait_until_active(timeout=5)
    with pytest.raises(MQError) as refused:
        fenced(None, 1)
    assert str(refused.value) == (
        f"MQRC_OBJECT_IN_USE (2042): queue Q: instance {first.id} no longer holds consumer group 'G' "
        f"(held by {second.id}); micro-batch 1 is not delivered"
    )
    assert delivered == [0]


def test_an_instance_that_lost_its_group_while_its_query_started_raises_2042_and_may_stand_by_again(qm, clock):
    qm.define_queue("Q")
    instance = Instance(qm, "Q", "G", lease_timeout=LEASE)
    state = ConsumerState(qm.root, "Q", engine(qm).storage_options, clock=clock)

    def start(instance_id: str):
        state.release("G", instance_id)
        state.acquire("G", "other", LEASE)
        raise RuntimeError("Multiple streaming queries are concurrently using metadata")

    with pytest.raises(MQError) as lost:
        instance.run(start, timeout=5)
    assert str(lost.value) == (
        f"MQRC_OBJECT_IN_USE (2042): queue Q: instance {instance.id} lost consumer group 'G' while its query started"
    )
    assert str(lost.value.__cause__) == "Multiple streaming queries are concurrently using metadata"
    assert state.lease("G", LEASE).owner == "other"
    _lapse(clock)
    instance.wait_until_active(timeout=5)
    assert state.lease("G", LEASE).owner == instance.id


def test_an_instance_whose_query_fails_to_start_gives_the_group_back_and_stops_renewing(qm, clock):
    qm.define_queue("Q")
    instance = Instance(qm, "Q", "STARTS", lease_timeout=LEASE)

    def start(instance_id: str):
        raise RuntimeError("no checkpoint")

    with pytest.raises(RuntimeError, match="^no checkpoint$"):
        instance.run(start, timeout=5)
    assert ConsumerState(qm.root, "Q", engine(qm).storage_options, clock=clock).lease("STARTS", LEASE) is None
    keeping = [thread for thread in threading.enumerate() if thread.name == "mqspark-instance-STARTS"]
    for thread in keeping:
        thread.join(timeout=30)
    assert [thread for thread in keeping if thread.is_alive()] == []


def test_cli_lists_the_instances(qm):
    qm.define_queue("Q")
    active, standby = (Instance(qm, "Q", "G", service="forward", lease_timeout=timedelta(seconds=30)) for _ in range(2))
    active.wait_until_active(timeout=5)
    with pytest.raises(MQError):
        standby.wait_until_active(timeout=0.1)
    result = mqspark(qm.root, "--json", "instance", "list", "Q", "--consumer", "G")
    assert (result.returncode, result.stderr) == (0, "")
    listed = json.loads(result.stdout)
    assert [(i["instance"], i["role"], i["service"], i["pid"]) for i in listed] == [
        (active.id, "active", "forward", os.getpid()),
        (standby.id, "standby", "forward", os.getpid()),
    ]
    table = mqspark(qm.root, "instance", "list", "Q", "--consumer", "G").stdout.splitlines()
    assert table[0].split() == ["instance", "service", "role", "host", "pid", "since", "active_since", "heartbeat"]
    assert [line.split()[:3] for line in table[1:]] == [
        [active.id, "forward", "active"],
        [standby.id, "forward", "standby"],
    ]


def test_an_unknown_queue_or_bad_group_is_refused(qm):
    with pytest.raises(MQError) as unknown:
        Instance(qm, "NOPE", "G")
    assert str(unknown.value) == "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1"
    qm.define_queue("Q")
    with pytest.raises(MQError, match="consumer group name 'a b' may only use the characters"):
        Instance(qm, "Q", "a b")
    result = mqspark(qm.root, "instance", "list", "NOPE")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1\n"
    )
