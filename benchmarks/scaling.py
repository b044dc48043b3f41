"""Data-parallel scaling: samples/s of GRPO on a duo at 1 vs N processes (1 thread each),
and the memory of sharded (FSDP2) vs replicated (DDP) training.

    python benchmarks/scaling.py --model smollm2-135m --env arith-duo-v0 --num-envs 8 --steps 4 --reps 3 --out runs/scaling
    python benchmarks/scaling.py --model tiny-random --env echo-duo-v0 --steps 2 --reps 1 --out /tmp/sc   # smoke
    python benchmarks/scaling.py --model smollm2-135m --env echo-duo-v0 --mode full --strategies ddp,fsdp \
        --worlds 1,2 --num-envs 4 --steps 2 --reps 1 --out runs/fsdp-memory   # full fine-tuning: FSDP2 vs DDP

Strong scaling: the global batch (``--num-envs`` episodes per step) is the same at every
world size, so N processes each play ``num_envs / N`` episodes and the gradients are
averaged (:mod:`marft_algos.distributed`). Every run is a fresh ``torchrun`` job with
``OMP_NUM_THREADS=1`` per process; the world sizes alternate within each repetition so that
each sees the same machine load. Reported per world size: the median step time over the
steps after the first (warm-up) one, samples/s (episodes / step time) and the ratio to one
process; the efficiency is that ratio / N. The 1-minute load average before and after is
written beside the figures (on a shared CPU only the ratios of one run mean anything).

``--strategies ddp,fsdp`` runs every world size > 1 once per strategy
(``distributed.strategy``); every row reports the peak resident memory (RSS) of each rank.
With ``--mode full`` that compares full fine-tuning with every rank holding the weights,
gradients and AdamW states (ddp) against FSDP2 shards of them (fsdp; the weights are
gathered whole for the rollouts). RSS counts the Python and PyTorch runtime too (~0.5 GB
per process), and the allocator may keep freed pages: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
                     progress=False, tensorboard=False, plot=False, seed=args.seed, mode=args.mode,
                     distributed={"strategy": args.strategy},
                     sampling_overrides={"speaker": tokens, "listener": tokens} if args.env == "echo-duo-v0" else {})
    t = GRPOTrainer(cfg)
    hist = t.train()
    peak_mb = t.dist.all_gather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # KiB on Linux
    if t.dist.is_main:
        Path(args.result).write_text(json.dumps({"world": t.dist.world_size, "step_s": [m["perf/step_s"] for m in hist],
                                                 "episodes": [m["rollout/episodes"] for m in hist],
                                                 "peak_rss_mb": [round(x, 1) for x in peak_mb]}))


def run(args: argparse.Namespace, nproc: int, result: Path, strategy: str = "ddp") -> dict:
    """One torchrun job of ``nproc`` ranks (``distributed.strategy=strategy``); returns what rank 0 wrote."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "localhost:0", __file__, "--worker", "--result", str(result)]
    for k in ("model", "env", "num_envs", "group_size", "steps", "max_new_tokens", "seed", "mode"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    cmd += ["--strategy", strategy]
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
    p.add_argument("--mode", default="lora", help="the policy's mode: lora, shared or full")
    p.add_argument("--strategies", default="ddp", help="distributed strategies for world sizes > 1 (ddp, fsdp)")
    p.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
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
    strategies = [s for s in args.strategies.split(",") if s]
    # one run per (world size, strategy); a single process has no strategy
    configs = [(w, s) for w in worlds for s in (strategies if w > 1 else ["-"])]
    load_before = os.getloadavg()[0]
    step_s: dict[tuple[int, str], list[float]] = {c: [] for c in configs}
    peak: dict[tuple[int, str], list[float]] = {c: [] for c in configs}
    t0 = time.time()
    for rep in range(args.reps):
        for w, s in configs if rep % 2 == 0 else list(reversed(configs)):  # alternate the order: same load for each
            res = run(args, w, out / f"rep{rep}-world{w}-{s}.json", "ddp" if s == "-" else s)
            step_s[(w, s)] += res["step_s"][1:] if len(res["step_s"]) > 1 else res["step_s"]
            peak[(w, s)].append(max(res.get("peak_rss_mb", [0.0])))
    load_after = os.getloadavg()[0]
    rows = []
    base = None
    for w, s in configs:
        med = statistics.median(step_s[(w, s)])
        sps = args.num_envs / med
        base = base or sps
        rows.append({"world": w, "strategy": s, "median_step_s": round(med, 4), "samples_per_s": round(sps, 3),
                     "ratio_to_1": round(sps / base, 3), "efficiency": round(sps / base / w, 3),
                     "peak_rss_mb_per_rank": round(max(peak[(w, s)]), 1), "steps_measured": len(step_s[(w, s)])})
    report = {"model": args.model, "env": args.env, "mode": args.mode, "num_envs": args.num_envs, "group_size": args.group_size,
              "cpu_count": os.cpu_count(), "load_avg_1min": [round(load_before, 2), round(load_after, 2)],
              "wall_s": round(time.time() - t0, 1), "rows": rows}
    (out / "scaling.json").write_text(json.dumps(report, indent=1))
    lines = ["| processes | strategy | median step s | samples/s | ratio to 1 | efficiency | peak RSS per rank (MB) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['world']} | {r['strategy']} | {r['median_step_s']} | {r['samples_per_s']} | {r['ratio_to_1']} | "
              f"{r['efficiency']} | {r['peak_rss_mb_per_rank']} |" for r in rows]
    lines.append(f"\n{args.model} (mode={args.mode}) on {args.env}, {args.num_envs} episodes/step, 1 thread per process, "
                 f"{os.cpu_count()} CPUs, load average {load_before:.1f} -> {load_after:.1f}")
    (out / "scaling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
