"""Queue manager and queue administration: create/open, define, alter, inquire, delete (spec sections 1 and 9)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from mqspark import MQError, MQValidationError, QueueDefinition, QueueManager, Reason, store
from mqspark.qmgr import engine

from .support.error_checks import refused, unchanged

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
ATTRIBUTES = [f.name for f in dataclasses.fields(QueueDefinition) if f.name != "name"]


def dead_letter_definition() -> QueueDefinition:
    return QueueDefinition(name=DLQ, description="dead-letter queue")


# Queue manager


def test_create_then_open_round_trip(qm: QueueManager, tmp_path: Path) -> None:
    assert (qm.name, engine(qm).dead_letter_queue, qm.root) == ("QM1", DLQ, str(tmp_path / "qm"))
    reopened = QueueManager.open(tmp_path / "qm")
    assert (reopened.name, engine(reopened).dead_letter_queue, reopened.root) == ("QM1", DLQ, str(tmp_path / "qm"))
    assert reopened.queues() == [dead_letter_definition()]
    assert reopened.inquire_queue(DLQ).type == "local"


def test_open_relative_root_is_made_absolute(qm: QueueManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert QueueManager.open("qm").root == str(tmp_path / "qm")


def test_dead_letter_queue_is_an_empty_local_queue(qm: QueueManager) -> None:
    assert DeltaTable(store.queue_location(qm.root, DLQ)).version() == 0
    assert qm.depth(DLQ) == 0
    assert qm.browse(DLQ).num_rows == 0
    assert qm.put(DLQ, [{"payload": "dead", "msg_id": "m1"}]) == ["m1"]
    assert qm.depth(DLQ) == 1


def test_open_absent_root_is_unknown_object(tmp_path: Path) -> None:
    root = tmp_path / "absent"
    with refused(
        MQError, f"MQRC_UNKNOWN_OBJECT_NAME (2085): no queue manager at {root}", Reason.MQRC_UNKNOWN_OBJECT_NAME
    ):
        QueueManager.open(root)
    assert not root.exists()


def test_open_directory_without_queue_manager_is_unknown_object(tmp_path: Path) -> None:
    with refused(
        MQError, f"MQRC_UNKNOWN_OBJECT_NAME (2085): no queue manager at {tmp_path}", Reason.MQRC_UNKNOWN_OBJECT_NAME
    ):
        QueueManager.open(tmp_path)


@pytest.mark.parametrize("name", ["QM1", "QM2"], ids=["same-name", "other-name"])
def test_create_twice_at_one_root_is_refused(qm: QueueManager, name: str) -> None:
    with unchanged(qm), refused(MQValidationError, f"queue manager QM1 already exists at {qm.root}"):
        QueueManager.create(qm.root, name)
    assert QueueManager.open(qm.root).name == "QM1"


def test_create_with_bad_name_writes_nothing(tmp_path: Path) -> None:
    with refused(MQValidationError, "queue manager name 'QM 1' may only use the characters A-Z a-z 0-9 . _ / %"):
        QueueManager.create(tmp_path / "qm", "QM 1")
    assert not (tmp_path / "qm").exists()


# Catalog round-trips

LOCAL_ALL_SET = QueueDefinition(
    name="ORDERS",
    default_priority=7,
    delivery_sequence="fifo",
    put_inhibited=True,
    get_inhibited=True,
    max_depth=1000,
    max_message_length=2048,
    default_bind="on_group",
    backout_threshold=3,
    backout_queue="ORDERS.BACKOUT",
    retry_count=5,
    retry_delay=2.5,
    error_queue="ORDERS.ERRORS",
    lock_duration=45.0,
    consumer_group_expiry=86400.0,
    duplicate_window=300.0,
    cluster=("C1", "C2"),
    description="incoming orders",
)
ALIAS_ALL_SET = dataclasses.replace(
    LOCAL_ALL_SET, name="ORDERS.ALIAS", type="alias", target_queue="TARGET", default_bind="not_fixed"
)


def attributes_of(definition: QueueDefinition) -> dict[str, Any]:
    return {attr: getattr(definition, attr) for attr in ATTRIBUTES}


@pytest.mark.parametrize(
    ("expected", "not_default"),
    [(LOCAL_ALL_SET, set(ATTRIBUTES) - {"type", "target_queue"}), (ALIAS_ALL_SET, set(ATTRIBUTES))],
    ids=["local", "alias"],
)
def test_define_then_inquire_round_trips_every_attribute(
    qm: QueueManager, expected: QueueDefinition, not_default: set[str]
) -> None:
    default = QueueDefinition(name=expected.name)
    assert {attr for attr in ATTRIBUTES if getattr(expected, attr) != getattr(default, attr)} == not_default
    for name in ("TARGET", "ORDERS.BACKOUT", "ORDERS.ERRORS"):
        qm.define_queue(name)
    given = {**attributes_of(expected), "cluster": list(expected.cluster)}
    assert qm.define_queue(expected.name, **given) == expected
    assert qm.inquire_queue(expected.name) == expected
    assert QueueManager.open(qm.root).inquire_queue(expected.name) == expected


def test_define_with_defaults(qm: QueueManager) -> None:
    qm.define_queue("PLAIN")
    assert QueueManager.open(qm.root).inquire_queue("PLAIN") == QueueDefinition(
        name="PLAIN",
        type="local",
        target_queue=None,
        default_priority=0,
        delivery_sequence="priority",
        put_inhibited=False,
        get_inhibited=False,
        max_depth=999_999_999,
        max_message_length=4 * 1024 * 1024,
        default_bind="on_open",
        backout_threshold=0,
        backout_queue=None,
        retry_count=0,
        retry_delay=0.0,
        error_queue=None,
        cluster=(),
        description="",
    )


def test_cluster_given_as_comma_separated_text(qm: QueueManager) -> None:
    assert qm.define_queue("Q", cluster="C1,C2").cluster == ("C1", "C2")
    assert qm.inquire_queue("Q").cluster == ("C1", "C2")


def test_alter_changes_only_given_attributes(qm: QueueManager) -> None:
    for name in ("TARGET", "ORDERS.BACKOUT", "ORDERS.ERRORS"):
        qm.define_queue(name)
    original = qm.define_queue(LOCAL_ALL_SET.name, **attributes_of(LOCAL_ALL_SET))
    other = qm.define_queue("OTHER", default_priority=2)
    altered = qm.alter_queue("ORDERS", default_priority=1, description="changed", put_inhibited=False)
    expected = dataclasses.replace(original, default_priority=1, description="changed", put_inhibited=False)
    assert altered == expected
    assert qm.inquire_queue("ORDERS") == expected
    assert QueueManager.open(qm.root).inquire_queue("ORDERS") == expected
    assert qm.inquire_queue("OTHER") == other
    assert qm.inquire_queue("TARGET") == QueueDefinition(name="TARGET")


def test_alter_alias_target(qm: QueueManager) -> None:
    qm.define_queue("T1")
    qm.define_queue("T2")
    qm.define_queue("A", type="alias", target_queue="T1")
    assert qm.alter_queue("A", target_queue="T2") == QueueDefinition(name="A", type="alias", target_queue="T2")
    qm.put("A", [{"payload": "x"}])
    assert (qm.depth("T1"), qm.depth("T2")) == (0, 1)


def test_alter_keeps_messages(qm: QueueManager) -> None:
    qm.define_queue("Q")
    ids = qm.put("Q", [{"payload": "a"}, {"payload": "b"}])
    qm.alter_queue("Q", max_depth=5)
    assert qm.browse("Q")["msg_id"].to_pylist() == ids


def test_queues_lists_sorted_by_name(qm: QueueManager) -> None:
    for name in ["b", "Z.1", "A", "a", "APP/IN"]:
        qm.define_queue(name)
    assert [q.name for q in qm.queues()] == ["A", "APP/IN", DLQ, "Z.1", "a", "b"]
    assert [q.name for q in QueueManager.open(qm.root).queues()] == ["A", "APP/IN", DLQ, "Z.1", "a", "b"]


def test_name_with_slash_and_percent_is_one_directory(qm: QueueManager) -> None:
    qm.define_queue("APP/IN%1")
    assert sorted(os.listdir(Path(qm.root) / "queues")) == ["APP~2FIN~251", DLQ]
    assert qm.put("APP/IN%1", [{"payload": "x", "msg_id": "m1"}]) == ["m1"]
    assert qm.browse("APP/IN%1")["msg_id"].to_pylist() == ["m1"]


def test_names_are_case_sensitive(qm: QueueManager) -> None:
    qm.define_queue("q", default_priority=1)
    qm.define_queue("Q", default_priority=2)
    qm.put("q", [{"payload": "x"}])
    assert (qm.inquire_queue("q").default_priority, qm.inquire_queue("Q").default_priority) == (1, 2)
    assert (qm.depth("q"), qm.depth("Q")) == (1, 0)


def test_alias_resolves_to_target_for_put_depth_and_browse(qm: QueueManager) -> None:
    qm.define_queue("TARGET")
    qm.define_queue("ALIAS", type="alias", target_queue="TARGET")
    assert not (Path(qm.root) / "queues" / "ALIAS").exists()
    ids = qm.put("ALIAS", [{"payload": "a"}, {"payload": "b"}])
    assert qm.depth("ALIAS") == qm.depth("TARGET") == 2
    assert qm.browse("TARGET")["msg_id"].to_pylist() == ids
    assert qm.browse("ALIAS").to_pylist() == qm.browse("TARGET").to_pylist()


def test_delete_empty_queue(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.delete_queue("Q")
    assert qm.queues() == [dead_letter_definition()]
    assert os.listdir(Path(qm.root) / "queues") == [DLQ]
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue Q is not defined in queue manager QM1",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        qm.inquire_queue("Q")


def test_a_queue_made_again_shows_its_own_messages_at_the_same_version(qm: QueueManager) -> None:
    # What a version's live files are is kept between reads; a queue deleted and defined again
    # reaches the same version numbers with other files.
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"a"}, {"payload": b"b"}, {"payload": b"c"}])
    version = engine(qm).queue_version("Q")
    assert (qm.depth("Q"), qm.backlog("Q").depth) == (3, 3)
    qm.delete_queue("Q", purge=True)
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"n"}])
    assert engine(qm).queue_version("Q") == version
    assert (qm.depth("Q"), qm.backlog("Q").depth) == (1, 1)
    assert qm.browse("Q")["payload"].to_pylist() == [b"n"]


def test_delete_alias_keeps_target_messages(qm: QueueManager) -> None:
    qm.define_queue("TARGET")
    qm.define_queue("ALIAS", type="alias", target_queue="TARGET")
    ids = qm.put("ALIAS", [{"payload": "a"}])
    qm.delete_queue("ALIAS")
    assert [q.name for q in qm.queues()] == [DLQ, "TARGET"]
    assert qm.browse("TARGET")["msg_id"].to_pylist() == ids


def test_delete_non_empty_queue_is_refused_then_purge_deletes(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "a"}, {"payload": "b"}])
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_Q_NOT_EMPTY (2055): queue Q holds 2 messages; delete with purge to discard them",
            Reason.MQRC_Q_NOT_EMPTY,
        ),
    ):
        qm.delete_queue("Q")
    qm.delete_queue("Q", purge=True)
    assert qm.queues() == [dead_letter_definition()]
    assert os.listdir(Path(qm.root) / "queues") == [DLQ]
    qm.define_queue("Q")
    assert qm.depth("Q") == 0
    assert qm.browse("Q").num_rows == 0


# Validation errors: each leaves catalog and tables as they were.

BAD_NAMES = [
    pytest.param("../x", "queue name '../x' must not be a path (no '..', no leading '/', not '.')", id="dotdot-path"),
    pytest.param("/x", "queue name '/x' must not be a path (no '..', no leading '/', not '.')", id="leading-slash"),
    pytest.param(".", "queue name '.' must not be a path (no '..', no leading '/', not '.')", id="dot"),
    pytest.param(
        "A/../B", "queue name 'A/../B' must not be a path (no '..', no leading '/', not '.')", id="inner-dotdot"
    ),
    pytest.param("", "queue name '' must be 1-48 characters, got 0", id="empty"),
    pytest.param("Q" * 49, f"queue name '{'Q' * 49}' must be 1-48 characters, got 49", id="49-chars"),
    pytest.param("A B", "queue name 'A B' may only use the characters A-Z a-z 0-9 . _ / %", id="space"),
    pytest.param("A~B", "queue name 'A~B' may only use the characters A-Z a-z 0-9 . _ / %", id="tilde"),
    pytest.param(5, "queue name must be a string, got int 5", id="non-string"),
    pytest.param(None, "queue name must be a string, got NoneType None", id="none"),
]


@pytest.mark.parametrize(("name", "text"), BAD_NAMES)
def test_define_bad_name(qm: QueueManager, name: Any, text: str) -> None:
    with unchanged(qm), refused(MQValidationError, text):
        qm.define_queue(name)


def test_48_char_name_is_accepted(qm: QueueManager) -> None:
    assert qm.define_queue("Q" * 48).name == "Q" * 48
    assert qm.depth("Q" * 48) == 0


@pytest.mark.parametrize(("name", "text"), BAD_NAMES[:3])
def test_inquire_bad_name(qm: QueueManager, name: Any, text: str) -> None:
    with unchanged(qm), refused(MQValidationError, text):
        qm.inquire_queue(name)


BAD_ATTRIBUTES = [
    pytest.param(
        {"default_priority": 10}, "attribute default_priority must be between 0 and 9, got 10", id="default_priority-10"
    ),
    pytest.param(
        {"default_priority": -1},
        "attribute default_priority must be between 0 and 9, got -1",
        id="default_priority-minus-1",
    ),
    pytest.param(
        {"default_priority": "5"},
        "attribute default_priority must be an integer, got str '5'",
        id="default_priority-text",
    ),
    pytest.param(
        {"default_priority": True},
        "attribute default_priority must be an integer, got bool True",
        id="default_priority-bool",
    ),
    pytest.param(
        {"delivery_sequence": "lifo"},
        "attribute delivery_sequence must be one of priority, fifo; got 'lifo'",
        id="delivery_sequence",
    ),
    pytest.param(
        {"default_bind": "as_q_def"},
        "attribute default_bind must be one of on_open, not_fixed, on_group; got 'as_q_def'",
        id="default_bind",
    ),
    pytest.param({"type": "remote"}, "attribute type must be one of local, alias; got 'remote'", id="type"),
    pytest.param(
        {"put_inhibited": "yes"},
        "attribute put_inhibited must be true or false, got str 'yes'",
        id="put_inhibited-text",
    ),
    pytest.param(
        {"put_inhibited": 1}, "attribute put_inhibited must be true or false, got int 1", id="put_inhibited-int"
    ),
    pytest.param(
        {"get_inhibited": None},
        "attribute get_inhibited must be true or false, got NoneType None",
        id="get_inhibited-none",
    ),
    pytest.param(
        {"max_depth": -1}, "attribute max_depth must be between 0 and 999999999, got -1", id="max_depth-negative"
    ),
    pytest.param(
        {"max_message_length": 0},
        "attribute max_message_length must be between 1 and 104857600, got 0",
        id="max_message_length-0",
    ),
    pytest.param(
        {"retry_delay": -0.5},
        "attribute retry_delay must be a number of seconds >= 0, got -0.5",
        id="retry_delay-negative",
    ),
    pytest.param(
        {"lock_duration": 0},
        "attribute lock_duration must be a number of seconds > 0, got 0",
        id="lock_duration-0",
    ),
    pytest.param(
        {"duplicate_window": 604801},
        "attribute duplicate_window must be a number of seconds from 0 to 604800, got 604801",
        id="duplicate_window-over-seven-days",
    ),
    pytest.param(
        {"duplicate_window": -1},
        "attribute duplicate_window must be a number of seconds from 0 to 604800, got -1",
        id="duplicate_window-negative",
    ),
    pytest.param(
        {"backout_queue": "../BO"},
        "backout_queue: name '../BO' must not be a path (no '..', no leading '/', not '.')",
        id="backout_queue-path",
    ),
    pytest.param(
        {"description": "d" * 65},
        f"attribute description must be text of at most 64 characters, got '{'d' * 65}'",
        id="description-65",
    ),
    pytest.param(
        {"colour": "red"},
        "unknown attribute 'colour'; known attributes are type, target_queue, default_priority, "
        "delivery_sequence, put_inhibited, get_inhibited, max_depth, max_message_length, default_bind, "
        "backout_threshold, backout_queue, retry_count, retry_delay, error_queue, lock_duration, "
        "consumer_group_expiry, duplicate_window, cluster, description",
        id="unknown-attribute",
    ),
    pytest.param({"target_queue": "T"}, "target_queue 'T' is only for alias queues", id="target-on-local"),
    pytest.param({"type": "alias"}, "an alias queue needs target_queue", id="alias-without-target"),
    pytest.param({"type": "alias", "target_queue": "Q"}, "an alias queue cannot target itself", id="alias-to-itself"),
]


@pytest.mark.parametrize(("attributes", "text"), BAD_ATTRIBUTES)
def test_define_bad_attribute(qm: QueueManager, attributes: dict[str, Any], text: str) -> None:
    qm.define_queue("T")
    with unchanged(qm), refused(MQValidationError, f"queue Q: {text}"):
        qm.define_queue("Q", **attributes)


ALTERABLE = {
    "default_priority-10",
    "put_inhibited-text",
    "max_depth-negative",
    "lock_duration-0",
    "unknown-attribute",
    "target-on-local",
    "description-65",
}


@pytest.mark.parametrize(("attributes", "text"), [p for p in BAD_ATTRIBUTES if p.id in ALTERABLE])
def test_alter_bad_attribute(qm: QueueManager, attributes: dict[str, Any], text: str) -> None:
    qm.define_queue("T")
    qm.define_queue("Q", description="before")
    with unchanged(qm), refused(MQValidationError, f"queue Q: {text}"):
        qm.alter_queue("Q", **attributes)


def test_define_existing_queue_is_refused(qm: QueueManager) -> None:
    qm.define_queue("Q", default_priority=3)
    qm.put("Q", [{"payload": "kept"}])
    with unchanged(qm), refused(MQValidationError, "queue Q already exists in queue manager QM1"):
        qm.define_queue("Q", default_priority=5)


def test_define_dead_letter_queue_again_is_refused(qm: QueueManager) -> None:
    with unchanged(qm), refused(MQValidationError, f"queue {DLQ} already exists in queue manager QM1"):
        qm.define_queue(DLQ)


def test_define_alias_to_unknown_queue_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue A: target_queue NOPE is not defined",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        qm.define_queue("A", type="alias", target_queue="NOPE")


def test_define_alias_to_alias_is_refused(qm: QueueManager) -> None:
    qm.define_queue("T")
    qm.define_queue("A1", type="alias", target_queue="T")
    with unchanged(qm), refused(MQValidationError, "queue A2: target_queue A1 must be a local queue"):
        qm.define_queue("A2", type="alias", target_queue="A1")


def test_alter_alias_to_unknown_queue_is_refused(qm: QueueManager) -> None:
    qm.define_queue("T")
    qm.define_queue("A", type="alias", target_queue="T")
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue A: target_queue NOPE is not defined",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        qm.alter_queue("A", target_queue="NOPE")


@pytest.mark.parametrize("new_type", ["alias", "local"])
def test_alter_type_is_refused(qm: QueueManager, new_type: str) -> None:
    qm.define_queue("Q")
    with (
        unchanged(qm),
        refused(MQValidationError, "queue Q: attribute type cannot be altered; delete and define the queue"),
    ):
        qm.alter_queue("Q", type=new_type, target_queue=DLQ)


def test_alter_unknown_queue_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        qm.alter_queue("NOPE", default_priority=1)


def test_inquire_unknown_queue_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        qm.inquire_queue("NOPE")


def test_delete_unknown_queue_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        qm.delete_queue("NOPE")


@pytest.mark.parametrize("purge", [False, True])
def test_delete_dead_letter_queue_is_refused(qm: QueueManager, purge: bool) -> None:
    qm.put(DLQ, [{"payload": "dead"}])
    with unchanged(qm), refused(MQValidationError, f"queue {DLQ} is the dead-letter queue of queue manager QM1"):
        qm.delete_queue(DLQ, purge=purge)


@pytest.mark.parametrize("purge", [False, True])
def test_delete_alias_target_is_refused(qm: QueueManager, purge: bool) -> None:
    qm.define_queue("T")
    qm.define_queue("B.ALIAS", type="alias", target_queue="T")
    qm.define_queue("A.ALIAS", type="alias", target_queue="T")
    with unchanged(qm), refused(MQValidationError, "queue T is the target of alias queue A.ALIAS"):
        qm.delete_queue("T", purge=purge)


def test_delete_bad_name_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(MQValidationError, "queue name '../_qmgr' must not be a path (no '..', no leading '/', not '.')"),
    ):
        qm.delete_queue("../_qmgr", purge=True)


@pytest.mark.parametrize("attribute", ["backout_queue", "error_queue"])
def test_backout_and_error_queues_must_be_defined_other_queues(qm: QueueManager, attribute: str) -> None:
    with pytest.raises(
        MQError, match=re.escape(f"MQRC_UNKNOWN_OBJECT_NAME (2085): queue Q: {attribute} NOPE is not defined")
    ):
        qm.define_queue("Q", **{attribute: "NOPE"})
    assert [q.name for q in qm.queues()] == [engine(qm).dead_letter_queue]
    qm.define_queue("Q")
    with pytest.raises(MQValidationError, match=re.escape(f"queue Q: {attribute} Q must be another queue")):
        qm.alter_queue("Q", **{attribute: "Q"})
    with pytest.raises(MQError, match=re.escape(f"queue Q: {attribute} NOPE is not defined")):
        qm.alter_queue("Q", **{attribute: "NOPE"})
    assert getattr(qm.inquire_queue("Q"), attribute) is None


def test_negative_backout_threshold_is_refused(qm: QueueManager) -> None:
    with pytest.raises(MQValidationError) as refused:
        qm.define_queue("Q", backout_threshold=-1)
    assert str(refused.value) == "queue Q: attribute backout_threshold must be between 0 and 999999999, got -1"
    assert [q.name for q in qm.queues()] == [engine(qm).dead_letter_queue]
