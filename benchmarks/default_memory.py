"""Peak RSS and time of ONE default-settings training step, per algorithm.

    python benchmarks/default_memory.py                                   # arith-duo-v0, smollm2-135m, 4 algorithms
    python benchmarks/default_memory.py --algos marft-token --set micro_batch_tokens=0   # before the default cap
    python benchmarks/default_memory.py --model tiny-random --env echo-duo-v0 --algos grpo   # smoke

Each algorithm runs in a fresh process with the config's defaults (``--set key=value``
overrides them; values are parsed as JSON where they parse). The peak is the step's own
(``marft_algos.perf_stats``: the process's high-water mark reset after the model loads),
so it counts the collect, behaviour log-probs and the update, not the load. Issue 28 item
24's target: under 4 GB for every algorithm on a duo of the default model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import child_row, markdown_table, set_values  # noqa: E402

__all__ = ["main"]

ALGOS = ("grpo", "ippo", "marft-action", "marft-token")


def measure(algo: str, args: argparse.Namespace) -> dict[str, float | str]:
    """One training step of ``algo`` in this process."""
    import torch

    from marft_algos.perf_stats import PerfStats
    from marft_algos.registry import get_algorithm

    spec = get_algorithm(algo)
    kw = dict(env_id=args.env, model=args.model, steps=1, progress=False, tensorboard=False, plot=False)
    kw.update(set_values(args.set))
    with tempfile.TemporaryDirectory() as out:
        config = spec.config_cls(**{"out_dir": out, **kw})
        trainer = spec.trainer_cls(config)
        trainer.callbacks.append(PerfStats())  # resets the peak at the step's collect
        t0 = time.perf_counter()
        metrics = trainer.train_step()
        step_s = time.perf_counter() - t0
    return {
        "algo": algo,
        "peak_rss_mb": round(metrics["perf/peak_rss_mb"]),
        "step_s": round(step_s, 1),
        "update_s": round(metrics.get("perf/update_s", float("nan")), 1),  # micro-batches cost here only
        "threads": torch.get_num_threads(),
        "micro_batch_tokens": getattr(config, "micro_batch_tokens", ""),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run each algorithm in a fresh process (one at a time) and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="arith-duo-v0")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--algo", default="", help=argparse.SUPPRESS)  # in the child
    args = p.parse_args(argv)
    if args.algo:
        print(json.dumps(measure(args.algo, args)))
        return 0
    rows = []
    for algo in args.algos.split(","):
        try:
            rows.append(child_row(__file__, argv, "--algo", algo))
        except subprocess.CalledProcessError as e:
            rows.append({"algo": algo, "peak_rss_mb": "failed", "step_s": e.stderr.strip().splitlines()[-1][:80] if e.stderr.strip() else e.returncode})
            continue
        print(rows[-1], file=sys.stderr, flush=True)  # progress: a cut-off run keeps what it measured
    print(f"{args.env} on {args.model}, one step, overrides {set_values(args.set)}\n")
    print(markdown_table(rows, ["algo", "peak_rss_mb", "step_s", "update_s", "threads", "micro_batch_tokens"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
