"""Update and generate seconds of GRPO steps at several micro-batch caps, in one process.

    python benchmarks/micro_batch_update.py --device cuda --model tiny-random      # the H200 figure in docs/results.md
    python benchmarks/micro_batch_update.py --device cpu --model tiny-random --num-envs 4 --group-size 2 --steps 1 --caps 0,64

Each cap in ``--caps`` (``micro_batch_tokens``; 0 = one forward) builds a fresh trainer on
``arith-duo-v0`` and prints, per step, ``perf/update_s``, ``perf/generate_s`` and
``perf/step_s``. The first caps also carry the process's warm-up (CUDA kernels load on
first use), so read the later steps of each. bf16 on CUDA, fp32 on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks import gpu_check  # noqa: E402

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Run the steps and print one line per step; returns the rows."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--caps", default="1024,0,512", help="comma-separated micro_batch_tokens values, run in this order")
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    for cap in (int(c) for c in args.caps.split(",")):
        ns = argparse.Namespace(model=args.model, num_envs=args.num_envs, steps=args.steps, max_new_tokens=args.max_new_tokens,
                                group_size=args.group_size, cpu_dry_run=args.device == "cpu")
        trainer = gpu_check._train_config("grpo", ns, micro_batch_tokens=cap)
        for i in range(args.steps):
            m = trainer.train_step()
            rows.append({"micro_batch_tokens": cap, "step": i, **{k: round(m[k], 3) for k in ("perf/update_s", "perf/generate_s", "perf/step_s")}})
            print(rows[-1], flush=True)
        del trainer
        gpu_check._free()
    return rows


if __name__ == "__main__":
    main()
