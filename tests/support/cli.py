"""Running the ``mqspark`` command in tests, two ways with the same arguments and result (exit code,
stdout and stderr as text, in a :class:`subprocess.CompletedProcess`).

:func:`mqspark` runs :func:`mqspark.cli.main.main` in this process, as a child would run it: stdin
that is the given text or empty, never a terminal; stdout and stderr of its own; the working
directory a child gets; argparse's exits turned into exit codes. It owns what it swaps for the call
(``sys.stdin``, ``sys.stdout``, ``sys.stderr``, the working directory, the ``mqspark`` logger's
handlers) and puts each back after it, whatever the command did. It saves the interpreter start and
the imports of pyarrow and deltalake, about 0.8 s, that each process costs.

:func:`mqspark_process` runs ``python -m mqspark.cli``, for what only a process shows: what
:func:`mqspark.cli.main.entry` adds (its exit codes for Ctrl-C and a reader gone, ``os._exit``), the
installed command end to end, real pipes and terminals, and commands that serve or start Spark.
"""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
from pathlib import Path

from mqspark.cli.main import main
from mqspark.clock import SYSTEM_CLOCK, Clock


def mqspark(
    root: str | Path, *args: str, input: str | None = None, clock: Clock = SYSTEM_CLOCK
) -> subprocess.CompletedProcess[str]:
    """Run ``mqspark --root ROOT ARGS...`` in this process, its queue managers on ``clock``; stdin is
    ``input`` or empty, the working directory ``root``'s parent, as in :func:`mqspark_process`."""
    argv = ["--root", str(root), *args]
    # Text over bytes, like a child's sys.stdin: put reads the text, sys.stdin.buffer gives the
    # bytes, and it is not a terminal (isatty() is False), as a pipe or DEVNULL is not.
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    stdout, stderr = io.StringIO(), io.StringIO()
    logger = logging.getLogger("mqspark")
    handlers = list(logger.handlers)
    streams = sys.stdin, sys.stdout, sys.stderr
    try:
        with contextlib.chdir(Path(root).parent):
            sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
            code = main(argv, clock)
    except SystemExit as exited:
        # argparse exits with 2 on a usage error, with 0 after --help and --version.
        assert exited.code is None or isinstance(exited.code, int), exited.code
        code = exited.code or 0
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        # main adds a handler for its warnings on the captured stderr and removes it; whatever ended
        # the call, no handler of it is left to write into a later call's output.
        logger.handlers[:] = handlers
    return subprocess.CompletedProcess(["mqspark", *argv], code, stdout.getvalue(), stderr.getvalue())


def mqspark_process(root: str | Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mqspark.cli --root ROOT ARGS...`` in ``root``'s parent; stdin is ``input``
    or empty."""
    return subprocess.run(
        [sys.executable, "-m", "mqspark.cli", "--root", str(root), *args],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        cwd=Path(root).parent,
        timeout=120,
    )
