"""The leaderboard's former module, kept importable: everything now lives in
:mod:`marft_algos.evaluation` (``leaderboard`` for the run and the CLI, ``compare`` for the
regression view, ``report`` / ``policies`` / ``suites`` / ``samples`` / ``majority`` /
``plots`` for the rest). New code imports from there; this module only re-exports.
"""

from __future__ import annotations

import sys

from marft_algos.evaluation import *  # noqa: F403  (the former names of this module)
from marft_algos.evaluation import __all__  # noqa: F401
from marft_algos.evaluation.leaderboard import eval_kwargs as _eval_kwargs  # noqa: F401  (its former private name)
from marft_algos.evaluation.leaderboard import main

if __name__ == "__main__":
    sys.exit(main())
