"""The ``mqspark`` command's help and version: every command and every option of every command has
help, saying the values it takes and the unit of a number, and ``--version`` prints the package's."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Iterator

import mqspark
from mqspark.cli.main import COMMANDS
from mqspark.cli.parser import boolean, build_parser, duration

# What the help of a number's option must say: its unit, or the range it takes.
UNIT = re.compile(
    r"\b(seconds|messages|bytes|percent|points|retries|deliveries|reason code|version number|numbered from 1)\b"
    r"|\b\d+-\d+\b"
)


def _walk(
    parser: argparse.ArgumentParser, command: str = "mqspark"
) -> Iterator[tuple[str, argparse.Action | None, str | None]]:
    """Every option of every command, and every command (its action None), with the command's name
    and the option's (or the command's) help. argparse keeps its commands and options private."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{command} {name}", None, helps.get(name)
                yield from _walk(sub, f"{command} {name}")
        elif action.option_strings:
            yield command, action, action.help


def test_every_command_and_every_option_has_help_naming_its_values_and_unit():
    walked = list(_walk(build_parser(COMMANDS)))
    options = [(command, action, text) for command, action, text in walked if action is not None]
    # Enough to know the walk went everywhere: queue define alone has 18 attribute options.
    assert len(options) > 150 and any(action.dest == "consumer_group_expiry" for _, action, _ in options)
    assert len([command for command, action, _ in walked if action is None]) > 40
    missing, unexplained = [], []
    for command, action, text in walked:
        name = command if action is None else f"{command} {'/'.join(action.option_strings)}"
        if not text or text == argparse.SUPPRESS:
            missing.append(name)
        elif action is None:
            continue
        elif action.choices is not None and not all(str(choice) in text for choice in action.choices):
            unexplained.append(f"{name}: {text!r} does not name every one of {list(action.choices)}")
        elif action.type in (int, float, duration) and not UNIT.search(text):
            unexplained.append(f"{name}: {text!r} names no unit or range")
        elif action.type is boolean and not re.search(r"\b(true or false|yes or no)\b", text):
            unexplained.append(f"{name}: {text!r} does not say true or false")
    assert missing == []
    assert unexplained == []


def test_version_prints_the_package_version():
    done = subprocess.run(
        [sys.executable, "-m", "mqspark.cli", "--version"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"mqspark {mqspark.__version__}\n", "")
    assert importlib.metadata.version("mqspark") == mqspark.__version__
