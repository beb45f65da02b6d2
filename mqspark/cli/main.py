"""The ``mqspark`` command's entry points: :func:`main` parses the arguments, runs the function the
command's parser names (its ``handler``), prints the result and turns errors into exit codes;
:func:`entry` is the console script, which also ends Ctrl-C and a closed stdout without a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
import tomllib
from collections.abc import Sequence

from mqspark.cli import cluster, console, messages, monitor, queues, services
from mqspark.cli.parser import AddCommand, build_parser
from mqspark.cli.render import render
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.errors import MQError

# Printed on stderr when Ctrl-C ends a command, which then exits like a shell's command killed by
# SIGINT (128 + 2).
INTERRUPTED = "mqspark: interrupted"
INTERRUPTED_EXIT = 130

# Every command, in the order ``mqspark --help`` lists them; each sets the handler that runs it.
COMMANDS: tuple[AddCommand, ...] = (
    queues.add_qmgr,
    queues.add_queue,
    messages.add_put,
    services.add_jars,
    services.add_job,
    services.add_submit,
    messages.add_browse,
    messages.add_get,
    queues.add_depth,
    monitor.add_monitor,
    queues.add_apply,
    messages.add_maintain,
    messages.add_purge,
    messages.add_redrive,
    queues.add_consumer,
    services.add_instance,
    cluster.add_cluster,
    console.add_console,
)


def main(argv: Sequence[str] | None = None, clock: Clock = SYSTEM_CLOCK) -> int:
    """Run one ``mqspark`` command on queue managers reading ``clock``; the exit code: 0, 1 on an
    error, 2 on the monitor's abort verdict (usage errors exit with 2 from argparse)."""
    parser = build_parser(COMMANDS)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after submit is spark-submit's, options included.
    if "submit" in argv:
        at = argv.index("submit") + 1
        args = parser.parse_args(argv[:at])
        if args.command == "submit":
            args.arguments = argv[at:]
            return _run(args, clock)
    # Payloads may follow put's options (put Q --priority 9 "rush"); argparse leaves those over.
    args, extras = parser.parse_known_args(argv)
    if extras:
        if args.command != "put" or any(extra.startswith("-") for extra in extras):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args.payloads = [*args.payloads, *extras]
    return _run(args, clock)


def _run(args: argparse.Namespace, clock: Clock) -> int:
    """Run the parsed command, its queue managers on ``clock``; its exit code (see :func:`main`).
    mqspark's warnings (a new consumer group, the monitor's verdicts) go to stderr as
    ``mqspark: warning: ...`` lines while it runs."""
    args.clock = clock
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setLevel(logging.WARNING)
    warnings.setFormatter(logging.Formatter("mqspark: warning: %(message)s"))
    logging.getLogger("mqspark").addHandler(warnings)
    try:
        result = args.handler(args)
    except monitor.Aborted as aborted:
        print(f"mqspark: error: {aborted}", file=sys.stderr)
        return 2
    except (MQError, OSError, tomllib.TOMLDecodeError) as error:
        if isinstance(error, BrokenPipeError) and _stdout_gone():
            raise  # the reader went away (monitor | head): no error; entry ends the command quietly
        print(f"mqspark: error: {error}", file=sys.stderr)
        return 1
    finally:
        logging.getLogger("mqspark").removeHandler(warnings)
    if result is not None:
        print(render(result, args.json))
    return 0


def _stdout_gone() -> bool:
    """True when stdout is a pipe whose reader has gone (poll says so with POLLERR)."""
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def entry() -> None:
    """The console command: run :func:`main`, then leave without running interpreter shutdown.
    Ctrl-C ends any command with one line, :data:`INTERRUPTED`, and exit code 130.

    delta-rs can abort the process at shutdown ("terminate called without an active exception",
    delta-io/delta-rs#2184) while its threads are torn down, turning a clean exit into SIGABRT.
    Everything is flushed and written by then, so the exit code is made final here.
    """
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        code = INTERRUPTED_EXIT
    except BrokenPipeError:
        # The reader stopped reading (``| head``): nothing more can be written, and nothing needs to be.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.stderr.flush()
    os._exit(code)
