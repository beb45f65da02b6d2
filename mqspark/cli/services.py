"""The ``mqspark`` commands for running services: ``instance`` (a consumer group's active and standby
instances, and switchover), and ``jars``, ``job`` and ``submit`` for ``spark-submit``."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from mqspark import jobs
from mqspark.cli.parser import Commands, open_engine
from mqspark.errors import MQValidationError
from mqspark.services.instances import instances, switchover

# Job files under mqspark/jobs, for spark-submit.
JOBS = ("forward",)


def add_jars(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``jars``: Delta's jars for ``spark-submit --jars``."""
    jars = commands.add_parser(
        "jars", help="print Delta's jars (resolved once) for spark-submit --jars, comma-separated"
    )
    jars.set_defaults(handler=_jars)


def _jars(args: argparse.Namespace) -> str:
    from mqspark.spark.session import delta_jars

    return ",".join(delta_jars())


def add_submit(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``submit``: ``spark-submit`` with Delta and this interpreter."""
    submit = commands.add_parser(
        "submit",
        help="run spark-submit with Delta's jars and extension, and this Python for the driver and workers",
        description="Runs pyspark's spark-submit with the given arguments, after --jars (Delta's jars) and "
        "the Delta extension and catalog; PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON default to this Python. "
        "A later --jars replaces Delta's.",
    )
    # Filled by main: everything after ``submit``, options included (argparse would take them).
    submit.set_defaults(arguments=[])
    submit.set_defaults(handler=_submit)


def _submit(args: argparse.Namespace) -> None:
    from mqspark.spark.session import submit_command

    if not args.arguments:
        raise MQValidationError("submit: give the job file to run (mqspark submit [OPTIONS] JOB [ARGS])")
    command, environment = submit_command(args.arguments, os.environ)
    sys.stdout.flush()
    os.execve(command[0], command, environment)


def add_job(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``job``: the path of a job file for ``spark-submit``."""
    job = commands.add_parser("job", help="print the path of a job file to run with spark-submit")
    job.add_argument("name", choices=JOBS, help="forward: the forwarding service")
    job.set_defaults(handler=_job)


def _job(args: argparse.Namespace) -> str:
    return str(Path(jobs.__file__).with_name(f"{args.name}.py"))


def add_instance(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``instance list`` and ``instance switchover``."""
    instance = commands.add_parser(
        "instance", help="the instances of a consumer group's service: active and standby"
    ).add_subparsers(dest="action", required=True)
    listing = instance.add_parser("list", parents=[output], help="each instance: role, host, pid, since, heartbeat")
    listing.add_argument("queue")
    listing.add_argument("--consumer", default="default", help="consumer group (default: default)")
    listing.add_argument(
        "--lease-timeout", type=float, default=30.0, help="the service's lease timeout in seconds (default 30)"
    )
    listing.set_defaults(handler=_list_instances)
    handover = instance.add_parser(
        "switchover", parents=[output], help="ask the active instance to hand over to a standby (endmqm -s)"
    )
    handover.add_argument("queue")
    handover.add_argument("--consumer", default="default", help="consumer group (default: default)")
    handover.set_defaults(handler=_switchover)


def _list_instances(args: argparse.Namespace) -> list[dict[str, Any]]:
    timeout = timedelta(seconds=args.lease_timeout)
    queues = open_engine(args.root, args.clock)
    return [info.as_dict() for info in instances(queues, args.queue, args.consumer, timeout)]


def _switchover(args: argparse.Namespace) -> dict[str, Any]:
    switchover(open_engine(args.root, args.clock), args.queue, args.consumer)
    return {"queue": args.queue, "consumer": args.consumer, "switchover": "requested"}
