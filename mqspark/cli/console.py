"""The ``mqspark console`` command: the operator console and REST API (:mod:`mqspark.console`) over
one or more queue manager roots, until interrupted."""

from __future__ import annotations

import argparse
import os
import sys

from mqspark.cli.parser import Commands, checked_root
from mqspark.console.app import serve
from mqspark.console.security import TOKEN_VARIABLE, new_token


def add_console(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``console``: its roots, address, the host names it answers for, and the admin token."""
    console = commands.add_parser(
        "console", help="serve the operator console and the REST API (http://127.0.0.1:8080 by default)"
    )
    console.add_argument(
        "--root",
        action="append",
        dest="roots",
        metavar="ROOT",
        help="a queue manager root to serve (repeatable; default: mqspark's --root, given before console)",
    )
    console.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    console.add_argument("--port", type=int, default=8080, help="TCP port to listen on, 1-65535 (default 8080)")
    console.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        default=[],
        metavar="NAME",
        help="a host name clients reach the console by, besides localhost and --host (repeatable)",
    )
    console.add_argument("--admin", action="store_true", help="allow writes (put, get, redrive, admin) with the token")
    console.add_argument(
        "--token", help=f"the admin token (default: ${TOKEN_VARIABLE}, else generated and printed once)"
    )
    console.set_defaults(handler=_console)


def _console(args: argparse.Namespace) -> None:
    roots = [checked_root(root) for root in args.roots or [args.root]]
    token = args.token or os.environ.get(TOKEN_VARIABLE)
    if args.admin and not token:
        token = new_token()
        print(f"mqspark console: admin token {token}", file=sys.stderr, flush=True)
    print(f"mqspark console: serving {', '.join(roots)} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    serve(roots, args.host, args.port, args.admin, token, args.allowed_hosts)
    # uvicorn ends on Ctrl-C by returning: the command ends as every interrupted command does.
    raise KeyboardInterrupt
