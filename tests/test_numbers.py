"""The one check of a number a caller gives: its type, its bounds, and the caller's own error."""

from __future__ import annotations

import math

import pytest

from mqspark import MQError, MQValidationError, Reason
from mqspark.model.numbers import check_number


@pytest.mark.parametrize("value", [True, False, "1", None, 1.5, math.nan])
def test_a_whole_number_is_an_int_and_never_a_bool(value):
    with pytest.raises(MQValidationError, match=r"^count must be whole, got"):
        check_number(value, f"count must be whole, got {value!r}", whole=True)


@pytest.mark.parametrize(
    ("value", "bounds", "passes"),
    [
        (0, {"at_least": 0}, True),
        (-1, {"at_least": 0}, False),
        (0, {"above": 0}, False),
        (0.5, {"above": 0}, True),
        (100, {"at_most": 100}, True),
        (101, {"at_most": 100}, False),
        (math.inf, {"at_least": 0}, True),
        (math.inf, {"at_least": 0, "below": math.inf}, False),
        (math.nan, {"at_least": 0}, False),
        (math.nan, {"below": math.inf}, False),
    ],
)
def test_a_number_is_within_every_bound_given(value, bounds, passes):
    if passes:
        check_number(value, "refused", **bounds)
    else:
        with pytest.raises(MQValidationError, match="^refused$"):
            check_number(value, "refused", **bounds)


def test_a_reason_makes_the_refusal_an_mq_error_with_it():
    with pytest.raises(MQError) as refused:
        check_number(7, "no version 7", whole=True, at_most=3, reason=Reason.MQRC_UNKNOWN_OBJECT_NAME)
    assert refused.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME
    assert not isinstance(refused.value, MQValidationError)
