"""Data-parallel scaling: samples/s of GRPO on a duo at 1 vs N processes (1 thread each).

    python benchmarks/scaling.py --model smollm2-135m --env arith-duo-v0 --num-envs 8 --steps 4 --reps 3 --out runs/scaling
    python benchmarks/scaling.py --model tiny-random --env echo-duo-v0 --steps 2 --reps 1 --out /tmp/sc   # smoke

Strong scaling: the global batch (``--num-envs`` episodes per step) is the same at every
world size, so N processes each play ``num_envs / N`` episodes and the gradients are
averaged (:mod:`marft_algos.distributed`). Every run is a fresh ``torchrun`` job with
``OMP_NUM_THREADS=1`` per process; the world sizes alternate within each repetition so that
each sees the same machine load. Reported per world size: the median step time over the
steps after the first (warm-up) one, samples/s (episodes / step time) and the ratio to one
process; the efficiency is that ratio / N. The 1-minute load average before and after is
written beside the figures (on a shared CPU only the ratios of one run mean anything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    """One rank of one run: train ``--steps`` steps and (rank 0) write the step times."""
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    tokens = {"max_new_tokens": args.max_new_tokens}
    cfg = GRPOConfig(env_id=args.env, model=args.model, num_envs=args.num_envs, group_size=args.group_size, steps=args.steps,
                     progress=False, tensorboard=False, plot=False, seed=args.seed,
                     sampling_overrides={"speaker": tokens, "listener": tokens} if args.env == "echo-duo-v0" else {})
    t = GRPOTrainer(cfg)
    hist = t.train()
    if t.dist.is_main:
        Path(args.result).write_text(json.dumps({"world": t.dist.world_size, "step_s": [m["perf/step_s"] for m in hist],
                                                 "episodes": [m["rollout/episodes"] for m in hist]}))


def run(args: argparse.Namespace, nproc: int, result: Path) -> dict:
    """One torchrun job of ``nproc`` ranks; returns what rank 0 wrote."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "localhost:0", __file__, "--worker", "--result", str(result)]
    for k in ("model", "env", "num_envs", "group_size", "steps", "max_new_tokens", "seed"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    subprocess.run(cmd, env=env, check=True, timeout=args.timeout, capture_output=not args.verbose)
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    """Parse the options; run the worker (``--worker``) or the whole comparison."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="arith-duo-v0")
    p.add_argument("--num-envs", type=int, default=8, help="global episodes per step (a multiple of group size x max world)")
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=4, help="steps per run (the first is warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=4, help="echo-duo only: tokens per action")
    p.add_argument("--worlds", default="1,2", help="world sizes to compare")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default="runs/scaling")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worlds = [int(w) for w in args.worlds.split(",")]
    load_before = os.getloadavg()[0]
    step_s: dict[int, list[float]] = {w: [] for w in worlds}
    t0 = time.time()
    for rep in range(args.reps):
        for w in worlds if rep % 2 == 0 else list(reversed(worlds)):  # alternate the order: same load for each
            res = run(args, w, out / f"rep{rep}-world{w}.json")
            step_s[w] += res["step_s"][1:] if len(res["step_s"]) > 1 else res["step_s"]
    load_after = os.getloadavg()[0]
    rows = []
    base = None
    for w in worlds:
        med = statistics.median(step_s[w])
        sps = args.num_envs / med
        base = base or sps
        rows.append({"world": w, "median_step_s": round(med, 4), "samples_per_s": round(sps, 3),
                     "ratio_to_1": round(sps / base, 3), "efficiency": round(sps / base / w, 3), "steps_measured": len(step_s[w])})
    report = {"model": args.model, "env": args.env, "num_envs": args.num_envs, "group_size": args.group_size,
              "cpu_count": os.cpu_count(), "load_avg_1min": [round(load_before, 2), round(load_after, 2)],
              "wall_s": round(time.time() - t0, 1), "rows": rows}
    (out / "scaling.json").write_text(json.dumps(report, indent=1))
    lines = ["| processes | median step s | samples/s | ratio to 1 | efficiency |", "|---|---|---|---|---|"]
    lines += [f"| {r['world']} | {r['median_step_s']} | {r['samples_per_s']} | {r['ratio_to_1']} | {r['efficiency']} |" for r in rows]
    lines.append(f"\n{args.model} on {args.env}, {args.num_envs} episodes/step, 1 thread per process, "
                 f"{os.cpu_count()} CPUs, load average {load_before:.1f} -> {load_after:.1f}")
    (out / "scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
