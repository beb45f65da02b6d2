"""The check of a number a caller gives mqspark (an attribute, an option, a parameter): an integer,
or with fractions allowed a float too, never a bool (``True`` is an int to Python, not a count to a
person), within the bounds the field allows. Every such check in the package is this one; the error
text is each caller's own, naming the field and the value as its users know them.
"""

from __future__ import annotations

from typing import Any

from mqspark.errors import MQError, MQValidationError, Reason


def check_number(
    value: Any,
    error: str,
    *,
    whole: bool = False,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    reason: Reason | None = None,
) -> None:
    """Raise :class:`MQValidationError` with ``error`` as its text (an :class:`MQError` with
    ``reason``, when given) unless ``value`` is an int, or when not ``whole`` an int or a float, but
    not a bool, and it is within the bounds given: ``at_least`` <= value, ``above`` < value,
    value <= ``at_most``, value < ``below``. A NaN is within no bound."""
    kinds = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not _within(value, at_least, above, at_most, below):
        raise MQValidationError(error) if reason is None else MQError(error, reason)


def _within(
    value: float, at_least: float | None, above: float | None, at_most: float | None, below: float | None
) -> bool:
    # A comparison with a NaN is false: a NaN is within no bound.
    return (
        (at_least is None or value >= at_least)
        and (above is None or value > above)
        and (at_most is None or value <= at_most)
        and (below is None or value < below)
    )
