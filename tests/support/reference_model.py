"""A reference model of spec section 4, written straight from the text in plain Python.

It is deliberately slow and simple: a loop over messages in physical order, and a walk over each
group's items. The ordering engine (mqspark.engine.ordering) must agree with it on every input.
"""

from __future__ import annotations

from datetime import datetime


def delivered(
    rows: list[dict],
    delivery_sequence: str,
    now: datetime,
    order: str = "logical",
    all_messages_available: bool = False,
    complete_message: bool = False,
) -> list[dict]:
    """The messages a reader gets, in order. ``rows`` carry the message fields and commit_version."""
    present = [r for r in rows if not _expired(r, now) and not _waiting(r, now)]

    physical = _physical(present, delivery_sequence)
    if order == "physical":
        return physical
    result = []
    for row in physical:
        if row["group_id"] is None:
            result.append(row)
        elif (row["msg_seq_number"], row["offset"]) == (1, 0):
            # A group stands where its first item stands; its other items come along.
            items = [r for r in present if r["group_id"] == row["group_id"]]
            result.extend(_group(items, all_messages_available, complete_message))
    return result


def _physical(present: list[dict], delivery_sequence: str) -> list[dict]:
    """Place the messages one by one, in the order their puts committed (Tuxedo's ordering overrides)."""
    lanes: dict[int, list[dict]] = {}
    for row in sorted(present, key=lambda r: (r["commit_version"], r["put_seq"])):
        lane = -row["priority"] if delivery_sequence == "priority" else 0
        target = _placed_target(lanes, row["before_msg_id"], row["commit_version"])
        if target is not None:
            # Immediately before the named message, in its lane.
            lanes[target[0]].insert(target[1], row)
        elif row["top_of_queue"]:
            # At the head of the lane, after the tops of the same put.
            queue = lanes.setdefault(lane, [])
            same_put = 0
            while (
                same_put < len(queue)
                and queue[same_put]["top_of_queue"]
                and queue[same_put]["commit_version"] == row["commit_version"]
            ):
                same_put += 1
            queue.insert(same_put, row)
        else:
            lanes.setdefault(lane, []).append(row)
    return [row for lane in sorted(lanes) for row in lanes[lane]]


def _placed_target(lanes: dict[int, list[dict]], msg_id: str | None, version: int) -> tuple[int, int] | None:
    """Where the earliest message with ``msg_id`` (outside groups, not itself placed) stands, among those
    committed before ``version``: the put could only name a message already on the queue."""
    if msg_id is None:
        return None
    matches = [
        (row["commit_version"], row["put_seq"], lane, index)
        for lane, rows in lanes.items()
        for index, row in enumerate(rows)
        if row["msg_id"] == msg_id
        and row["group_id"] is None
        and row["before_msg_id"] is None
        and row["commit_version"] < version
    ]
    return min(matches)[2:] if matches else None


def expired_count(rows: list[dict], now: datetime) -> int:
    return sum(_expired(r, now) for r in rows)


def _expired(row: dict, now: datetime) -> bool:
    return row["expiry"] is not None and row["expiry"] <= now


def _waiting(row: dict, now: datetime) -> bool:
    return row["available_at"] is not None and row["available_at"] > now


def _group(items: list[dict], all_messages_available: bool, complete_message: bool) -> list[dict]:
    """The deliverable items of one group: the gap-free run from (1, 0)."""
    items = sorted(items, key=lambda r: (r["msg_seq_number"], r["offset"]))
    run: list[dict] = []
    expected, inside_message = (1, 0), False
    for item in items:
        if (item["msg_seq_number"], item["offset"]) != expected or (inside_message and not item["segmented"]):
            break
        run.append(item)
        if item["segmented"] and not item["last_segment"]:
            expected, inside_message = (item["msg_seq_number"], item["offset"] + len(item["payload"])), True
        elif item["last_in_group"]:
            break
        else:
            expected, inside_message = (item["msg_seq_number"] + 1, 0), False
    if not run:
        return []
    last = run[-1]
    last_message_whole = not last["segmented"] or last["last_segment"]
    if all_messages_available and not (last_message_whole and last["last_in_group"]):
        return []
    if not complete_message:
        return run
    if not last_message_whole:
        run = [r for r in run if r["msg_seq_number"] != last["msg_seq_number"]]
    whole: list[dict] = []
    for item in run:
        if item["segmented"] and item["offset"] > 0:
            whole[-1] = {
                **whole[-1],
                "payload": whole[-1]["payload"] + item["payload"],
                "last_in_group": item["last_in_group"],
            }
        else:
            whole.append({**item, "segmented": False, "last_segment": False})
    return whole
