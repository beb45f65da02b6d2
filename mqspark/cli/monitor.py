"""The ``mqspark monitor`` command: the OpenTP1 backlog monitor of a queue and consumer group, a line
(or a JSON object) printed per point until Ctrl-C or ``--points``, and :class:`Aborted` for its abort
verdict (exit code 2)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from mqspark.cli.parser import Commands, boolean, open_engine
from mqspark.services.backlog_judge import Verdict
from mqspark.services.monitor import Monitor


class Aborted(Exception):
    """The monitor's abort verdict: the command exits with code 2."""


def add_monitor(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``monitor``: its judging parameters, events and how long it runs."""
    monitor = commands.add_parser(
        "monitor",
        parents=[output],
        help="the OpenTP1 backlog monitor of a queue and consumer group: a line per point (JSON with "
        "--json); exit code 2 on an abort verdict",
    )
    monitor.add_argument("--queue", required=True, help="the queue watched (a queue name)")
    monitor.add_argument("--consumer", default="default", help="consumer group (default: default)")
    monitor.add_argument("--watch-interval", type=float, required=True, help="seconds between points")
    monitor.add_argument("--watch-count", type=int, required=True, help="backlog, in messages, at which judging starts")
    monitor.add_argument(
        "--expected-count", type=int, required=True, help="messages the group is expected to process per interval"
    )
    monitor.add_argument(
        "--abort",
        type=boolean,
        default=False,
        help="yes or no (default no): yes stops the group's query on falling behind",
    )
    monitor.add_argument(
        "--points", type=int, help="stop after this many points (default: run until interrupted with Ctrl-C)"
    )
    monitor.add_argument("--window", type=int, default=10, help="points the group's status is judged over (default 10)")
    monitor.add_argument(
        "--depth-high", type=float, default=80.0, help="depth high event, percent of max_depth (default 80)"
    )
    monitor.add_argument(
        "--depth-low", type=float, default=20.0, help="depth low event, percent of max_depth (default 20)"
    )
    monitor.add_argument(
        "--service-interval",
        type=float,
        help="seconds with nothing processed before the service interval event (default: no such event)",
    )
    monitor.set_defaults(handler=_monitor)


def _monitor(args: argparse.Namespace) -> None:
    """A point every ``--watch-interval`` seconds, printed as it is taken; :class:`Aborted` on an
    abort verdict."""
    monitor = Monitor(
        open_engine(args.root, args.clock),
        args.queue,
        args.consumer,
        watch_interval=args.watch_interval,
        watch_count=args.watch_count,
        expected_count=args.expected_count,
        abort=args.abort,
        window=args.window,
        depth_high=args.depth_high,
        depth_low=args.depth_low,
        service_interval=args.service_interval,
    )

    def show(point: Any) -> None:
        print(json.dumps(point.as_dict()) if args.json else point.line(), flush=True)

    # Ctrl-C ends it as it ends every command (mqspark.cli.main.entry).
    last = monitor.run(args.points, show)
    if last.verdict is Verdict.ABORT:
        raise Aborted(str(monitor.error))
    return None
