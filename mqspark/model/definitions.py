"""Queue-manager and queue definitions: attribute names, defaults and validation (spec section 1)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mqspark.errors import MQValidationError
from mqspark.model.numbers import check_number

DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"
MAX_NAME_LENGTH = 48
MAX_DEPTH_LIMIT = 999_999_999
MAX_MESSAGE_LENGTH_LIMIT = 100 * 1024 * 1024
MAX_DESCRIPTION_LENGTH = 64
# The longest duplicate_window: seven days, as Service Bus's duplicate detection.
MAX_DUPLICATE_WINDOW = 7 * 24 * 3600.0

QUEUE_TYPES = ("local", "alias")
# DefRecon: the reconnect mode of clients that name none; ``disabled`` overrides every client's own.
RECONNECT_MODES = ("no", "yes", "qmgr", "disabled")
DELIVERY_SEQUENCES = ("priority", "fifo")
BINDS = ("on_open", "not_fixed", "on_group")

_NAME_PATTERN = re.compile(r"[A-Za-z0-9._/%]+")


def validate_name(name: Any, what: str = "queue") -> str:
    """Return ``name`` when it is a valid queue or queue-manager name, else raise."""
    if not isinstance(name, str):
        raise MQValidationError(f"{what} name must be a string, got {type(name).__name__} {name!r}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise MQValidationError(f"{what} name {name!r} must be 1-{MAX_NAME_LENGTH} characters, got {len(name)}")
    if not _NAME_PATTERN.fullmatch(name):
        raise MQValidationError(f"{what} name {name!r} may only use the characters A-Z a-z 0-9 . _ / %")
    if ".." in name or name.startswith("/") or name == ".":
        raise MQValidationError(f"{what} name {name!r} must not be a path (no '..', no leading '/', not '.')")
    return name


def int_in(low: int, high: int) -> Callable[[str, Any], int]:
    def check(attr: str, value: Any) -> int:
        check_number(value, f"attribute {attr} must be an integer, got {type(value).__name__} {value!r}", whole=True)
        check_number(
            value,
            f"attribute {attr} must be between {low} and {high}, got {value}",
            whole=True,
            at_least=low,
            at_most=high,
        )
        return value

    return check


def one_of(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(attr: str, value: Any) -> str:
        if value not in choices:
            raise MQValidationError(f"attribute {attr} must be one of {', '.join(choices)}; got {value!r}")
        return value

    return check


def _boolean(attr: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise MQValidationError(f"attribute {attr} must be true or false, got {type(value).__name__} {value!r}")
    return value


def seconds(*, zero: bool) -> Callable[[str, Any], float]:
    """A validator of a finite number of seconds, at least 0 (``zero``) or more than 0."""
    bound = ">= 0" if zero else "> 0"

    def check(attr: str, value: Any) -> float:
        error = f"attribute {attr} must be a number of seconds {bound}, got {value!r}"
        if zero:
            check_number(value, error, at_least=0, below=math.inf)
        else:
            check_number(value, error, above=0, below=math.inf)
        return float(value)

    return check


def _duplicate_window(attr: str, value: Any) -> float:
    error = f"attribute {attr} must be a number of seconds from 0 to {MAX_DUPLICATE_WINDOW:g}, got {value!r}"
    check_number(value, error, at_least=0, at_most=MAX_DUPLICATE_WINDOW)
    return float(value)


def _optional_queue_name(attr: str, value: Any) -> str | None:
    return None if value is None else validate_name(value, f"{attr}:")


def _cluster_names(attr: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part]
    if not isinstance(value, (list, tuple)):
        raise MQValidationError(f"attribute {attr} must be a list of cluster names, got {value!r}")
    return tuple(validate_name(name, f"{attr}:") for name in value)


def _description(attr: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_LENGTH:
        raise MQValidationError(
            f"attribute {attr} must be text of at most {MAX_DESCRIPTION_LENGTH} characters, got {value!r}"
        )
    return value


# Attribute name -> validator (each returns its attribute's own type). The dataclass below holds the defaults.
_VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "type": one_of(QUEUE_TYPES),
    "target_queue": _optional_queue_name,
    "default_priority": int_in(0, 9),
    "delivery_sequence": one_of(DELIVERY_SEQUENCES),
    "put_inhibited": _boolean,
    "get_inhibited": _boolean,
    "max_depth": int_in(0, MAX_DEPTH_LIMIT),
    "max_message_length": int_in(1, MAX_MESSAGE_LENGTH_LIMIT),
    "default_bind": one_of(BINDS),
    "backout_threshold": int_in(0, MAX_DEPTH_LIMIT),
    "backout_queue": _optional_queue_name,
    "retry_count": int_in(0, MAX_DEPTH_LIMIT),
    "retry_delay": seconds(zero=True),
    "error_queue": _optional_queue_name,
    "lock_duration": seconds(zero=False),
    "consumer_group_expiry": seconds(zero=False),
    "duplicate_window": _duplicate_window,
    "cluster": _cluster_names,
    "description": _description,
}


@dataclass(frozen=True)
class QueueDefinition:
    """A queue's attributes, as stored in the queue manager's catalog."""

    name: str
    type: str = "local"
    target_queue: str | None = None
    default_priority: int = 0
    delivery_sequence: str = "priority"
    put_inhibited: bool = False
    get_inhibited: bool = False
    max_depth: int = MAX_DEPTH_LIMIT
    max_message_length: int = 4 * 1024 * 1024
    default_bind: str = "on_open"
    backout_threshold: int = 0
    backout_queue: str | None = None
    retry_count: int = 0
    retry_delay: float = 0.0
    error_queue: str | None = None
    # How long a Python get's claim holds its messages without renewal (SQS's visibility timeout).
    lock_duration: float = 30.0
    # Seconds after which a consumer group with nothing recorded is deleted by maintenance, so a
    # forgotten or misspelt group never holds messages for good (Kafka's offsets.retention.minutes).
    consumer_group_expiry: float = 7 * 24 * 3600.0
    # Seconds in which a put of a msg_id that already landed is acknowledged and not stored again
    # (SQS FIFO's deduplication interval); 0: off.
    duplicate_window: float = 0.0
    cluster: tuple[str, ...] = field(default_factory=tuple)
    description: str = ""

    @classmethod
    def build(cls, name: str, base: QueueDefinition | None = None, **attributes: Any) -> QueueDefinition:
        """Validate ``attributes`` and return a definition, starting from ``base`` (alter) or the defaults."""
        validate_name(name)
        unknown = sorted(set(attributes) - set(_VALIDATORS))
        if unknown:
            raise MQValidationError(
                f"queue {name}: unknown attribute {unknown[0]!r}; known attributes are {', '.join(ATTRIBUTE_NAMES)}"
            )
        try:
            checked = {attr: _VALIDATORS[attr](attr, value) for attr, value in attributes.items()}
        except MQValidationError as error:
            raise MQValidationError(f"queue {name}: {error.detail}") from None
        definition = dataclasses.replace(base, **checked) if base else cls(name=name, **checked)
        if definition.type == "alias" and definition.target_queue is None:
            raise MQValidationError(f"queue {name}: an alias queue needs target_queue")
        if definition.type == "local" and definition.target_queue is not None:
            raise MQValidationError(f"queue {name}: target_queue {definition.target_queue!r} is only for alias queues")
        if definition.target_queue == name:
            raise MQValidationError(f"queue {name}: an alias queue cannot target itself")
        return definition

    def attributes(self) -> dict[str, Any]:
        """All attributes as a plain dict (JSON-friendly), name first."""
        values = dataclasses.asdict(self)
        values["cluster"] = list(self.cluster)
        return values

    @property
    def alias_target(self) -> str:
        """An alias queue's target_queue (:meth:`build` makes sure an alias names one)."""
        if self.target_queue is None:
            raise MQValidationError(f"queue {self.name}: an alias queue needs target_queue")
        return self.target_queue


ATTRIBUTE_NAMES = tuple(_VALIDATORS)


@dataclass(frozen=True)
class QueueManagerDefinition:
    """The queue manager's own attributes."""

    name: str
    dead_letter_queue: str = DEAD_LETTER_QUEUE
    cluster: tuple[str, ...] = field(default_factory=tuple)
    description: str = ""
    default_reconnect: str = "no"
    # QMID: the name and the catalog table's id, so a queue manager created again at the same root
    # under the same name is told apart (reconnect mode ``qmgr``).
    qmid: str = ""

    def altered(self, **attributes: Any) -> QueueManagerDefinition:
        """A copy with ``attributes`` changed; only ``description`` and ``default_reconnect`` may be."""
        checks: dict[str, Callable[[str, Any], Any]] = {
            "description": _description,
            "default_reconnect": one_of(RECONNECT_MODES),
        }
        unknown = sorted(set(attributes) - set(checks))
        if unknown:
            raise MQValidationError(
                f"queue manager {self.name}: attribute {unknown[0]!r} cannot be altered; "
                f"alterable attributes are {', '.join(checks)}"
            )
        try:
            checked = {attr: checks[attr](attr, value) for attr, value in attributes.items()}
        except MQValidationError as error:
            raise MQValidationError(f"queue manager {self.name}: {error.detail}") from None
        return dataclasses.replace(self, **checked)
