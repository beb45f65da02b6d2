"""The group rules of a put (mqspark.model.groups.check_group_items) against a plain-Python statement of
each rule: the same items are refused with the same message and reason code, or accepted by both."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqspark.errors import MQValidationError, Reason
from mqspark.model.groups import check_group_items

ITEM = st.fixed_dictionaries(
    {
        "group_id": st.sampled_from(["a", "b", "c"]),
        "msg_seq_number": st.integers(1, 3),
        "offset": st.sampled_from([0, 10]),
        "last_in_group": st.booleans(),
        # Mostly whole messages, so that the rules checked after the segments' are reached often.
        "segmented": st.sampled_from([False, False, False, True]),
        "last_segment": st.sampled_from([False, False, False, True]),
        "priority": st.integers(0, 1),
    }
)
SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("msg_seq_number", pa.int32()),
        ("offset", pa.int64()),
        ("last_in_group", pa.bool_()),
        ("segmented", pa.bool_()),
        ("last_segment", pa.bool_()),
        ("priority", pa.int32()),
    ]
)


def _first(keys: list, bad) -> object | None:
    """The first key, in order of first appearance, that ``bad`` holds for."""
    return next((key for key in dict.fromkeys(keys) if bad(key)), None)


def reference(items: list[dict], with_priority: bool) -> tuple[str, Reason] | None:
    """The first rule ``items`` break, as the refusal's text after the queue name and its reason."""
    messages = [(item["group_id"], item["msg_seq_number"]) for item in items]

    def of(key: tuple) -> list[dict]:
        return [item for item in items if (item["group_id"], item["msg_seq_number"]) == key]

    for column, text, reason in (
        ("segmented", "is both a whole message and segments", Reason.MQRC_MSG_SEQ_NUMBER_ERROR),
        ("last_in_group", "has segments that disagree on last_in_group", Reason.MQRC_MSG_SEQ_NUMBER_ERROR),
    ):
        key = _first(messages, lambda key, column=column: len({item[column] for item in of(key)}) > 1)
        if key is not None:
            return f"group {key[0]}: message {key[1]} {text}", reason
    key = _first(messages, lambda key: sum(item["last_segment"] for item in of(key)) > 1)
    if key is not None:
        return f"group {key[0]}: message {key[1]} has more than one last segment", Reason.MQRC_OFFSET_ERROR

    def ends(key: tuple) -> list[int]:
        return [item["offset"] for item in of(key) if item["last_segment"]]

    key = _first(messages, lambda key: bool(ends(key)) and max(item["offset"] for item in of(key)) > min(ends(key)))
    if key is not None:
        highest = max(item["offset"] for item in of(key))
        return (
            f"group {key[0]}: message {key[1]} has a segment at offset {highest} after its last segment at "
            f"offset {min(ends(key))}",
            Reason.MQRC_OFFSET_ERROR,
        )
    triples = [(item["group_id"], item["msg_seq_number"], item["offset"]) for item in items]
    key = _first(triples, lambda key: triples.count(key) > 1)
    if key is not None:
        what = f"msg_seq_number {key[1]}" + (f" offset {key[2]}" if key[2] else "")
        return f"field msg_seq_number: group {key[0]} has {what} twice", Reason.MQRC_MSG_SEQ_NUMBER_ERROR
    groups = [item["group_id"] for item in items]

    def values(group: str, column: str, last_only: bool = False) -> list:
        return [
            item[column] for item in items if item["group_id"] == group and (item["last_in_group"] or not last_only)
        ]

    if with_priority:
        group = _first(groups, lambda group: len(set(values(group, "priority"))) > 1)
        if group is not None:
            priorities = values(group, "priority")
            return (
                f"field priority: group {group} mixes priorities {min(priorities)} and {max(priorities)}",
                Reason.MQRC_PRIORITY_ERROR,
            )
    group = _first(groups, lambda group: len(set(values(group, "msg_seq_number", True))) > 1)
    if group is not None:
        return f"field last_in_group: group {group} has more than one last message", Reason.MQRC_MSG_SEQ_NUMBER_ERROR

    def past_last(group: str) -> bool:
        last = values(group, "msg_seq_number", True)
        return bool(last) and max(values(group, "msg_seq_number")) > min(last)

    group = _first(groups, past_last)
    if group is not None:
        highest, last = max(values(group, "msg_seq_number")), min(values(group, "msg_seq_number", True))
        return (
            f"field msg_seq_number: group {group} has msg_seq_number {highest} after its last message {last}",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        )
    return None


@settings(max_examples=400, deadline=None)
@given(items=st.lists(ITEM, min_size=1, max_size=8), with_priority=st.booleans())
def test_the_group_rules_refuse_what_each_rule_says_naming_the_first_item_that_breaks_it(items, with_priority):
    table = pa.Table.from_pylist(items, schema=SCHEMA)
    if not with_priority:
        table = table.drop_columns(["priority"])
    expected = reference(items, with_priority)
    if expected is None:
        check_group_items("Q", table)
        return
    text, reason = expected
    with pytest.raises(MQValidationError) as refused:
        check_group_items("Q", table)
    assert str(refused.value) == f"{reason.name} ({reason.value}): queue Q: {text}"
    assert refused.value.reason is reason
