"""``python -m chaos --minutes N --seed S [--folder F] [--store local|azure]``: one chaos run; prints
the report as JSON and exits 1 on a violation (see :mod:`chaos.run`)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from chaos.run import run


def main() -> int:
    parser = argparse.ArgumentParser(prog="./dev.sh chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    parser.add_argument("--folder", type=Path, default=None, help="the run's folder (default: a new temporary one)")
    parser.add_argument("--mean-interval", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument(
        "--store", choices=("local", "azure"), default="local", help="the queue manager in a folder, or on Azurite"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    folder = args.folder or Path(tempfile.mkdtemp(prefix=f"mqspark-chaos-{seed}-")) / "run"
    print(f"chaos: seed {seed}, {args.minutes} min, {args.store} store, folder {folder}", file=sys.stderr, flush=True)
    report = run(folder, args.minutes, seed, args.mean_interval, store_kind=args.store)
    print(json.dumps(report.to_json(), indent=1))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
