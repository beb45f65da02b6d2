"""The ``mqspark`` command's top-level parser (``--root``, ``--json`` and the commands) and the argument
types and options its commands share: booleans, durations, KEY=VALUE properties and the queue attributes."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeAlias, cast

from mqspark.model.definitions import ATTRIBUTE_NAMES, QueueDefinition

DEFAULT_ROOT = "./mq-data"

# The subparsers of the top-level parser, which each command module adds its commands to.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# A function that adds a command to the subparsers; the parser given is the parent of every command
# that prints a result, for the --json given after the command.
AddCommand: TypeAlias = Callable[[Commands, argparse.ArgumentParser], None]


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
        help=f"queue manager root (default: $MQSPARK_ROOT or {DEFAULT_ROOT})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    # --json is accepted after the command too (mqspark browse Q --json).
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    # The commands' parsers are _Parsers; the commands need only argparse's interface.
    subparsers = cast(Commands, parser.add_subparsers(dest="command", required=True))
    for add in commands:
        add(subparsers, output)
    return parser


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


def add_attribute_options(parser: argparse.ArgumentParser) -> None:
    """An option for every queue attribute (``--max-depth``...), typed by its default; options not
    given are absent from the parsed arguments."""
    defaults = QueueDefinition(name="DEFAULTS")
    for name in ATTRIBUTE_NAMES:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=_attribute_type(getattr(defaults, name)),
            default=argparse.SUPPRESS,
            metavar=name.upper(),
        )


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
