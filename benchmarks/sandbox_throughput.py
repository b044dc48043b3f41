"""Sandbox throughput: programs graded per second on HumanEval's 164 canonical solutions.

    python benchmarks/sandbox_throughput.py                 # pool of os.cpu_count() workers
    python benchmarks/sandbox_throughput.py --workers 1 4 8 --isolation unshare-net

Prints, per worker count, programs/s, the pass count (must be 164/164) and the
isolation level in force. Absolute numbers depend on the machine and its load:
compare settings measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from marft_envs.sandbox import available_levels, isolation_level, run_many
from marft_envs.tasks.code import _he_units, load_humaneval

__all__ = ["main"]


def _jobs() -> list[dict]:
    jobs = []
    for i, row in enumerate(load_humaneval()):
        setup, units = _he_units(i)
        jobs.append({"program": row["prompt"] + row["canonical_solution"], "tests": list(units),
                     "entry_point": row["entry_point"], "setup": setup})
    return jobs


def main(argv: list[str] | None = None) -> int:
    """Grade HumanEval's canonical solutions per worker count; exit 1 if any failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[os.cpu_count() or 1])
    ap.add_argument("--isolation", default=None, help="force a level (default: strongest usable)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the 164 programs")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--json", action="store_true", help="also print one JSON line per setting")
    args = ap.parse_args(argv)
    level = args.isolation or isolation_level()
    print(f"isolation: {level}  (levels here: {available_levels()})")
    jobs = _jobs() * args.repeat
    run_many(jobs[:4], max_workers=2, isolation=level, timeout=args.timeout)  # warm caches
    ok = True
    for w in args.workers:
        t0 = time.perf_counter()
        res = run_many(jobs, max_workers=w, isolation=level, timeout=args.timeout)
        dt = time.perf_counter() - t0
        n_pass = sum(r.passed for r in res)
        ok &= n_pass == len(jobs)
        print(f"workers={w:3d}  {len(jobs) / dt:7.1f} programs/s  {dt:6.2f}s  "
              f"passed {n_pass}/{len(jobs)}  isolation={level}  cpus={os.cpu_count()}")
        if args.json:
            print(json.dumps({"workers": w, "programs_per_s": len(jobs) / dt, "seconds": dt,
                              "passed": n_pass, "n": len(jobs), "isolation": level}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
