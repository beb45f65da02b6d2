"""The OpenTP1 backlog judge, point by point against spec section 6."""

from __future__ import annotations

import pytest

from mqspark import MQValidationError
from mqspark.services.backlog_judge import BacklogJudge, MonitorState, Verdict, validate_watch_interval


def _points(judge: BacklogJudge, observations: list[tuple[int, int | None]]) -> list[tuple]:
    return [
        (p.state.value, p.verdict.value, p.judged, p.A, p.B, p.C)
        for p in (judge.observe(backlog, waiting) for backlog, waiting in observations)
    ]


def test_watching_below_watch_count_never_judges():
    judge = BacklogJudge(watch_count=30, expected_count=24, abort=True)
    assert _points(judge, [(10, None), (29, 10), (0, 0)]) == [
        ("watching", "continue", False, None, 24, None),
        ("watching", "continue", False, 0, 24, 10),
        ("watching", "continue", False, 29, 24, 29),
    ]


def test_reaching_watch_count_switches_to_judging_without_a_judgement():
    # At the switch nothing was processed (A=0 < B and < C), yet no verdict is given.
    judge = BacklogJudge(watch_count=30, expected_count=24, abort=True)
    assert _points(judge, [(20, None), (30, 20)]) == [
        ("watching", "continue", False, None, 24, None),
        ("judging", "continue", False, 0, 24, 20),
    ]


def test_the_first_point_at_watch_count_switches_without_a_judgement():
    judge = BacklogJudge(watch_count=30, expected_count=24)
    point = judge.observe(backlog=32, still_waiting=None)
    assert (point.state, point.verdict, point.judged, point.A, point.C) == (
        MonitorState.JUDGING,
        Verdict.CONTINUE,
        False,
        None,
        None,
    )


def test_judging_keeps_up_when_a_reaches_b():
    judge = BacklogJudge(watch_count=30, expected_count=24)
    # C=40, 16 of them still wait: A=24 >= B=24 (A < C).
    assert _points(judge, [(40, None), (50, 16)])[1] == ("judging", "continue", True, 24, 24, 40)


def test_judging_keeps_up_when_a_reaches_c_though_below_b():
    # C=32, none of them still waits: A=32 < B=50, but A >= C.
    judge = BacklogJudge(watch_count=30, expected_count=50)
    assert _points(judge, [(32, None), (35, 0)])[1] == ("judging", "continue", True, 32, 50, 32)


def test_falling_behind_warns_with_abort_no_and_judging_goes_on():
    judge = BacklogJudge(watch_count=30, expected_count=24, abort=False)
    assert _points(judge, [(32, None), (40, 25), (45, 30), (50, 20)]) == [
        ("judging", "continue", False, None, 24, None),
        ("judging", "warn", True, 7, 24, 32),
        ("judging", "warn", True, 10, 24, 40),
        ("judging", "continue", True, 25, 24, 45),
    ]


def test_falling_behind_aborts_with_abort_yes():
    judge = BacklogJudge(watch_count=30, expected_count=24, abort=True)
    assert _points(judge, [(32, None), (40, 25)]) == [
        ("judging", "continue", False, None, 24, None),
        ("judging", "abort", True, 7, 24, 32),
    ]


def test_falling_below_watch_count_returns_to_watching_without_a_judgement():
    judge = BacklogJudge(watch_count=30, expected_count=24, abort=True)
    # A=2 would be an abort, but the backlog fell below watch_count.
    assert _points(judge, [(32, None), (29, 30), (31, 29), (40, 29)]) == [
        ("judging", "continue", False, None, 24, None),
        ("watching", "continue", False, 2, 24, 32),
        ("judging", "continue", False, 0, 24, 29),
        ("judging", "abort", True, 2, 24, 31),
    ]


def test_watch_count_zero_judges_from_the_second_point():
    judge = BacklogJudge(watch_count=0, expected_count=1, abort=True)
    assert _points(judge, [(0, None), (0, 0), (1, 0), (1, 1)]) == [
        ("judging", "continue", False, None, 1, None),
        # C=0: A=0 >= C, an empty queue keeps up.
        ("judging", "continue", True, 0, 1, 0),
        ("judging", "continue", True, 0, 1, 0),
        ("judging", "abort", True, 0, 1, 1),
    ]


def test_point_as_dict_names_every_number():
    judge = BacklogJudge(watch_count=1, expected_count=5, abort=True)
    judge.observe(3, None)
    assert judge.observe(4, 2).as_dict() == {
        "backlog": 4,
        "still_waiting": 2,
        "state": "judging",
        "verdict": "abort",
        "judged": True,
        "processed": 1,
        "expected": 5,
        "previous_backlog": 3,
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"watch_count": -1, "expected_count": 1}, "monitor parameter watch_count must be an integer >= 0, got -1"),
        ({"watch_count": 1.5, "expected_count": 1}, "monitor parameter watch_count must be an integer >= 0, got 1.5"),
        ({"watch_count": 0, "expected_count": 0}, "monitor parameter expected_count must be an integer >= 1, got 0"),
        (
            {"watch_count": 0, "expected_count": "3"},
            "monitor parameter expected_count must be an integer >= 1, got '3'",
        ),
        (
            {"watch_count": 0, "expected_count": 1, "abort": "yes"},
            "monitor parameter abort must be True or False, got 'yes'",
        ),
    ],
)
def test_parameter_errors(arguments, message):
    with pytest.raises(MQValidationError) as raised:
        BacklogJudge(**arguments)
    assert str(raised.value) == message


@pytest.mark.parametrize("value", [0, -1.0, "1", True, None])
def test_watch_interval_must_be_positive_seconds(value):
    with pytest.raises(MQValidationError) as raised:
        validate_watch_interval(value)
    assert str(raised.value) == f"monitor parameter watch_interval must be a number of seconds > 0, got {value!r}"


def test_watch_interval_accepts_fractions():
    assert validate_watch_interval(0.5) == 0.5


def test_point_errors_leave_the_judge_unchanged():
    judge = BacklogJudge(watch_count=10, expected_count=2)
    with pytest.raises(MQValidationError) as raised:
        judge.observe(5, 3)
    assert str(raised.value) == "monitor point still_waiting must be None at the first point, got 3"
    judge.observe(12, None)
    with pytest.raises(MQValidationError) as raised:
        judge.observe(12, None)
    assert str(raised.value) == "monitor point still_waiting must be given after the first point, got None"
    with pytest.raises(MQValidationError) as raised:
        judge.observe(12, 13)
    assert str(raised.value) == "monitor point still_waiting must be at most the previous backlog 12, got 13"
    with pytest.raises(MQValidationError) as raised:
        judge.observe(-1, 0)
    assert str(raised.value) == "monitor point backlog must be an integer >= 0, got -1"
    assert judge.observe(12, 12).as_dict()["verdict"] == "warn"
