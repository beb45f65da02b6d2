"""The OpenTP1 backlog judge (spec section 6): the watch/judge rules.

`BacklogJudge` is the pure part of backlog monitoring: it is given one judgement point at a time
(the backlog now, and how many messages of the previous point's backlog still wait) and says whether
the consumer keeps up. It holds no clock and reads no table, so it can be checked point by point against the
spec's rules.

- **Depth watching**: a point only compares the backlog with ``watch_count``. At or above it, the
  judge switches to capacity judging, with no judgement at that switch.
- **Capacity judging**: a point whose backlog fell below ``watch_count`` returns to watching.
  Otherwise it judges with A (processed: the previous point's backlog minus what of it still
  waits), B (``expected_count``) and C (the previous point's backlog): the consumer keeps up when
  A >= B or A >= C. When it does not, the verdict is ``warn`` (abort=no, judging goes on) or
  ``abort`` (abort=yes: the consuming stream is to be stopped).

:class:`~mqspark.services.monitor.Monitor` feeds it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from mqspark.errors import MQValidationError
from mqspark.model.numbers import check_number


class MonitorState(StrEnum):
    """The judge's state after a point."""

    WATCHING = "watching"
    JUDGING = "judging"


class Verdict(StrEnum):
    """What a point asks of the consumer's stream."""

    CONTINUE = "continue"
    WARN = "warn"
    ABORT = "abort"


@dataclass(frozen=True)
class JudgementPoint:
    """One point of the judge: the state after it and its verdict, with the numbers behind them.

    ``processed`` (A) is known from the second point on; ``previous_backlog`` (C) likewise.
    ``judged`` tells whether the rule A >= B or A >= C was applied at this point.
    """

    backlog: int
    still_waiting: int | None
    state: MonitorState
    verdict: Verdict
    judged: bool
    processed: int | None
    expected: int
    previous_backlog: int | None

    @property
    def A(self) -> int | None:  # noqa: N802 - the spec's name
        return self.processed

    @property
    def B(self) -> int:  # noqa: N802 - the spec's name
        return self.expected

    @property
    def C(self) -> int | None:  # noqa: N802 - the spec's name
        return self.previous_backlog

    def as_dict(self) -> dict[str, Any]:
        point = asdict(self)
        point["state"], point["verdict"] = self.state.value, self.verdict.value
        return point


def count_parameter(name: str, value: Any, least: int, what: str = "monitor parameter") -> int:
    check_number(value, f"{what} {name} must be an integer >= {least}, got {value!r}", whole=True, at_least=least)
    return value


def validate_watch_interval(value: Any) -> float:
    """``watch_interval`` in seconds: a number > 0."""
    check_number(value, f"monitor parameter watch_interval must be a number of seconds > 0, got {value!r}", above=0)
    return float(value)


class BacklogJudge:
    """The OpenTP1 backlog judge for one queue and consumer group (see the module docstring)."""

    def __init__(self, watch_count: int, expected_count: int, abort: bool = False) -> None:
        self.watch_count = count_parameter("watch_count", watch_count, 0)
        self.expected_count = count_parameter("expected_count", expected_count, 1)
        if not isinstance(abort, bool):
            raise MQValidationError(f"monitor parameter abort must be True or False, got {abort!r}")
        self.abort = abort
        self.state = MonitorState.WATCHING
        self.previous_backlog: int | None = None

    def observe(self, backlog: int, still_waiting: int | None) -> JudgementPoint:
        """Judge one point: ``backlog`` now, and how many messages of the previous point's backlog
        are still waiting (``None`` only at the first point)."""
        backlog = count_parameter("backlog", backlog, 0, "monitor point")
        previous = self.previous_backlog
        if previous is None:
            if still_waiting is not None:
                raise MQValidationError(
                    f"monitor point still_waiting must be None at the first point, got {still_waiting!r}"
                )
            processed = None
        else:
            if still_waiting is None:
                raise MQValidationError("monitor point still_waiting must be given after the first point, got None")
            still_waiting = count_parameter("still_waiting", still_waiting, 0, "monitor point")
            if still_waiting > previous:
                raise MQValidationError(
                    f"monitor point still_waiting must be at most the previous backlog {previous}, got {still_waiting}"
                )
            processed = previous - still_waiting
        judged = False
        verdict = Verdict.CONTINUE
        if self.state is MonitorState.WATCHING:
            if backlog >= self.watch_count:
                self.state = MonitorState.JUDGING
        elif backlog < self.watch_count:
            self.state = MonitorState.WATCHING
        else:
            judged = True
            assert processed is not None and previous is not None  # judging starts after a first point
            if processed < self.expected_count and processed < previous:
                verdict = Verdict.ABORT if self.abort else Verdict.WARN
        self.previous_backlog = backlog
        return JudgementPoint(
            backlog, still_waiting, self.state, verdict, judged, processed, self.expected_count, previous
        )
