"""The benchmark suites and BENCHMARKS.md: ``python benchmarks/run.py --suite quick|paper|scaling [--tiny]``,
``--report`` to rewrite the page only. Needs ``pip install '.[bench]'``; the harness is in ``harness/``."""

import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
