"""The ``mqspark`` command's top-level parser (``--root``, ``--json``, ``--version`` and the commands),
the argument types and options its commands share (booleans, durations, KEY=VALUE properties and the
queue attributes, each with its help), and how a command opens the ``--root`` queue manager."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeAlias, cast

from mqspark import store
from mqspark.clock import Clock
from mqspark.engine.queues import Queues
from mqspark.errors import MQValidationError
from mqspark.model.definitions import (
    ATTRIBUTE_NAMES,
    BINDS,
    DELIVERY_SEQUENCES,
    MAX_DEPTH_LIMIT,
    MAX_DESCRIPTION_LENGTH,
    MAX_MESSAGE_LENGTH_LIMIT,
    QUEUE_TYPES,
    QueueDefinition,
)
from mqspark.qmgr import QueueManager

DEFAULT_ROOT = "./mq-data"

# The subparsers of the top-level parser, which each command module adds its commands to.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# A function that adds a command to the subparsers; the parser given is the parent of every command
# that prints a result, for the --json given after the command.
AddCommand: TypeAlias = Callable[[Commands, argparse.ArgumentParser], None]

# The help of each queue attribute's option: its unit and the values it takes (as
# docs/reference/attributes.md explains them).
_ATTRIBUTE_HELP = {
    "type": f"{' or '.join(QUEUE_TYPES)}; cannot be altered",
    "target_queue": "the local queue an alias queue stands for, a queue name",
    "default_priority": "priority 0-9 of a message put without one (DEFPRTY)",
    "delivery_sequence": f"{' or '.join(DELIVERY_SEQUENCES)}: higher priority first, or put order (MSGDLVSQ)",
    "put_inhibited": "true or false: refuse puts with 2051",
    "get_inhibited": "true or false: refuse gets with 2016",
    "max_depth": f"messages, 0-{MAX_DEPTH_LIMIT}: a put that would exceed it fails with 2053 (MAXDEPTH)",
    "max_message_length": f"bytes, 1-{MAX_MESSAGE_LENGTH_LIMIT}: a longer payload fails with 2030 unless put "
    "with --segmentation (MAXMSGL)",
    "default_bind": f"{', '.join(BINDS)}: how often cluster routing chooses a member",
    "backout_threshold": f"failed deliveries, 0-{MAX_DEPTH_LIMIT}, after which a message moves to the "
    "backout queue; 0: not set (BOTHRESH)",
    "backout_queue": "the queue a message moves to at backout_threshold, a queue name; none: the dead-letter queue",
    "retry_count": f"retries, 0-{MAX_DEPTH_LIMIT}, after which a failed message moves to the error queue; 0: not set",
    "retry_delay": "seconds (0 or more) before a failed message comes back",
    "error_queue": "the queue a message moves to after retry_count retries, a queue name; none: the dead-letter queue",
    "lock_duration": "seconds (more than 0) a Python get's claimed messages stay its own without renewal",
    "consumer_group_expiry": "seconds (more than 0): maintenance deletes a consumer group with nothing "
    "recorded for this long",
    "duplicate_window": "seconds (0 to 604800) in which a put of a msg_id that already landed is acknowledged "
    "and not stored again; 0: off",
    "cluster": "the clusters the queue is in: comma-separated cluster names",
    "description": f"text, up to {MAX_DESCRIPTION_LENGTH} characters",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, which also takes a negative duration (``--retention -1h``) as a value, not
    as an option, so that its own check names it; its commands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d*\.?\d+[smhd]?$")


def build_parser(commands: Iterable[AddCommand]) -> argparse.ArgumentParser:
    """The ``mqspark`` parser, with the commands added in the order given (the order ``--help`` lists)."""
    parser = _Parser(prog="mqspark", description="Message queues on Delta tables.")
    parser.add_argument(
        "--root",
        default=os.environ.get("MQSPARK_ROOT", DEFAULT_ROOT),
        help=f"queue manager root: a folder or an object-store URI (default: $MQSPARK_ROOT or {DEFAULT_ROOT})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}", help="print the version")
    # --json is accepted after the command too (mqspark browse Q --json).
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    # The commands' parsers are _Parsers; the commands need only argparse's interface.
    subparsers = cast(Commands, parser.add_subparsers(dest="command", required=True))
    for add in commands:
        add(subparsers, output)
    return parser


def _version() -> str:
    """The installed distribution's version: mqspark.__version__ when it was installed (pyproject reads
    it from there), which this layer may not import (tests/test_layers.py)."""
    try:
        return importlib.metadata.version("mqspark")
    except importlib.metadata.PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def checked_root(root: str) -> str:
    """``root``, refused in the same one line by every command when it is a local file."""
    if store.is_local_file(root):
        raise MQValidationError(f"--root {root} is a file, not a queue manager folder")
    return root


def open_root(root: str, clock: Clock) -> QueueManager:
    """The queue manager at ``--root``, reading ``clock``."""
    return QueueManager.open(checked_root(root), clock=clock)


def open_engine(root: str, clock: Clock) -> Queues:
    """The engine of the queue manager at ``--root``, reading ``clock``, for what the facade does not show."""
    return Queues.open(checked_root(root), clock=clock)


def boolean(text: str) -> bool:
    """An argument type: true or false (also yes/no, 1/0, on/off), in any case."""
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def duration(text: str) -> timedelta:
    """A duration: whole seconds, or a number with s, m, h or d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        return timedelta(seconds=float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a duration is seconds, or a number with s, m, h or d; got {text!r}"
        ) from None


def key_value(text: str) -> tuple[str, str]:
    """An argument type: a message property, KEY=VALUE."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_attribute_options(parser: argparse.ArgumentParser, defined: bool) -> None:
    """An option for every queue attribute (``--max-depth``...), typed by its default; options not
    given are absent from the parsed arguments. Their help shows the defaults when ``defined`` (a
    new queue's), else says an attribute not given stays as it is."""
    defaults = QueueDefinition(name="DEFAULTS")
    for name in ATTRIBUTE_NAMES:
        default = getattr(defaults, name)
        # An attribute without help gets none, which tests/test_cli_help.py reports.
        text = _ATTRIBUTE_HELP.get(name)
        if text and defined:
            text += f" (default: {_shown(default)})"
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=_attribute_type(default),
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=text,
        )


def _shown(default: Any) -> str:
    """An attribute's default as its option is written."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple):
        return ",".join(default) or "none"
    return "none" if default in (None, "") else str(default)


def _attribute_type(default: Any) -> Callable[[str], Any]:
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if isinstance(default, tuple):
        return _names
    return str


def _names(text: str) -> list[str]:
    """A comma-separated list of names (a queue's clusters)."""
    return [part.strip() for part in text.split(",") if part.strip()]
