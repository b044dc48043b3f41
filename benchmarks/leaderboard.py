"""Leaderboard: systems x env suites with fixed seeds -> Markdown table, CSV and plot.

A thin script around :mod:`marft_algos.evaluation.leaderboard` (installed with marft, also
``marft leaderboard``); both take the same options:

    python benchmarks/leaderboard.py --suite arith --k 1 --temperature 0.7 --max-new-tokens 128 --out runs/leaderboard-arith
    python benchmarks/leaderboard.py --suite gsm8k --suite math500 --limit 100 --checkpoint duo-grpo=runs/duo-grpo
    python benchmarks/leaderboard.py --compare untrained runs/duo-grpo --limit 200
    python benchmarks/leaderboard.py --model tiny-random --limit 2 --max-new-tokens 4 --out /tmp/lb   # smoke

See ``benchmarks/README.md`` (systems, metrics, seeds, suites, regression view).
"""

from __future__ import annotations

import sys

from marft_algos.evaluation import *  # noqa: F403  (the script's names, for `import benchmarks.leaderboard`)
from marft_algos.evaluation import __all__, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main(prog="benchmarks/leaderboard.py"))
