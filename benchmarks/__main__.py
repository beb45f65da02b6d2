"""Run the benchmarks and print one JSON object per line: python -m benchmarks [NAME ...]"""

from __future__ import annotations

import json
import sys

from . import python_put

BENCHMARKS = {
    "python_put_10k": lambda: python_put.run(put_size=10_000),
    "python_put_100": lambda: python_put.run(messages=20_000, put_size=100),
}


def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        sys.exit(f"unknown benchmark {unknown[0]}; known: {', '.join(BENCHMARKS)}")
    for name in names or BENCHMARKS:
        print(json.dumps(BENCHMARKS[name]()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
