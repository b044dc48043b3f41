"""Step time of each algorithm relative to GRPO, measured side by side in one process.

    python benchmarks/algo_steps.py --model smollm2-135m --reps 5 --out runs/algo-steps
    python benchmarks/algo_steps.py --model tiny-random --reps 1 --num-envs 4 --group-size 2 --max-new-tokens 4 --out /tmp/as  # smoke

The trainers of ``--algos`` (default: grpo, ippo, marft-action, marft-token) are built on
the same env (``arith-duo-v0``), base model, ``num_envs`` episodes per step, sampling
settings (temperature and ``max_new_tokens`` for every agent), LoRA (r, alpha, q/k/v/o),
learning rate and seed; each keeps its own defaults otherwise (``--set key=value``
changes a field of every algorithm that has it, e.g. ``--set recovery=false``). GRPO
plays ``num_envs / group_size`` problems ``group_size`` times each, the others
``num_envs`` problems once: the same number of episodes per step.

Their steps run INTERLEAVED: each repetition runs one step of every algorithm, the order
rotating between repetitions, so every algorithm sees the same machine load; the first
repetition is a warm-up and is dropped. Per step: ``wall_s`` (the whole ``train_step``
call, what a user waits for; it includes work outside the trainer's own step timer, such
as MARFT's collapse-recovery checkpoints), ``rollout_s`` (``perf/collect_s``: playing the
episodes), ``generate_s`` (``perf/generate_s``: the generate calls inside the rollout),
``update_s`` (``perf/update_s``: advantages, critic and policy updates), the generated
tokens and the episodes. Reported per algorithm: min / median / max over repetitions of
each time and of its ratio to GRPO's time in the same repetition. Sampled lengths differ
between algorithms (each samples its own problems with its own adapters), so the tokens
per step are reported next to the times.

Outputs in ``--out``: ``algo_steps.md``, ``algo_steps.csv`` (per repetition),
``algo_steps_summary.csv``, ``algo_steps.json`` (with versions and settings) and
``algo_steps.png``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import (  # noqa: E402
    algo_config,
    markdown_table,
    summary_stats,
    versions,
    write_csv,
    write_json,
)

__all__ = ["main", "build_parser", "build_trainers", "run_interleaved", "summarize_steps", "STEP_COLUMNS", "SUMMARY_COLUMNS", "METRICS"]

STEP_COLUMNS = ["rep", "order", "algo", "wall_s", "step_s", "rollout_s", "generate_s", "update_s", "tokens", "episodes", "team_reward"]
SUMMARY_COLUMNS = ["algo", "metric", "min", "median", "max", "ratio_min", "ratio_median", "ratio_max", "reps"]
#: The times summarised (and divided by the reference algorithm's time of the same repetition).
METRICS = ("wall_s", "rollout_s", "update_s", "generate_s")


def build_trainers(args: argparse.Namespace) -> dict[str, Any]:
    """One trainer per algorithm of ``args.algos`` with the shared settings (see the module doc)."""
    import marft_envs

    agents = marft_envs.make(args.env).possible_agents
    shared: dict[str, Any] = {
        "env_id": args.env, "model": args.model, "num_envs": args.num_envs, "seed": args.seed, "lr": args.lr,
        "lora_r": args.lora_r, "lora_alpha": args.lora_alpha, "steps": 1_000_000,
        "sampling_overrides": {a: {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature} for a in agents},
        "progress": False, "plot": False, "tensorboard": False, "transcript_every": 0, "save_every": 0,
        "group_size": args.group_size,
    }
    trainers: dict[str, Any] = {}
    for algo in args.algos:
        spec, config = algo_config(algo, shared, args.set, skip_unknown_sets=True)  # group_size is GRPO's alone
        t0 = time.perf_counter()
        trainers[algo] = spec.trainer_cls(config)
        print(f"[algo_steps] built {algo} in {time.perf_counter() - t0:.1f} s", flush=True)
    return trainers


def _row(rep: int, order: int, algo: str, wall: float, m: dict[str, float]) -> dict[str, Any]:
    return {
        "rep": rep, "order": order, "algo": algo, "wall_s": wall,
        "step_s": m["perf/step_s"], "rollout_s": m["perf/collect_s"], "generate_s": m.get("perf/generate_s", float("nan")),
        "update_s": m["perf/update_s"], "tokens": m.get("rollout/tokens", float("nan")),
        "episodes": m.get("rollout/episodes", float("nan")), "team_reward": m.get("team/reward", float("nan")),
    }


def run_interleaved(trainers: dict[str, Any], reps: int) -> list[dict[str, Any]]:
    """``reps + 1`` repetitions (repetition 0 = warm-up) of one step per trainer, order rotating."""
    algos = list(trainers)
    rows: list[dict[str, Any]] = []
    for rep in range(reps + 1):
        shift = rep % len(algos)
        for order, algo in enumerate(algos[shift:] + algos[:shift]):
            t0 = time.perf_counter()
            m = trainers[algo].train_step()
            rows.append(_row(rep, order, algo, time.perf_counter() - t0, m))
        print(f"[algo_steps] rep {rep}{' (warm-up)' if rep == 0 else ''}: "
              + ", ".join(f"{r['algo']} {r['wall_s']:.2f} s" for r in rows[-len(algos):]), flush=True)
    return rows


def summarize_steps(rows: list[dict[str, Any]], reference: str = "grpo") -> list[dict[str, Any]]:
    """min / median / max per algorithm and metric, and of the ratio to ``reference`` per repetition."""
    measured = [r for r in rows if r["rep"] > 0] or rows  # drop the warm-up unless it is all there is
    reps = sorted({r["rep"] for r in measured})
    by = {(r["rep"], r["algo"]): r for r in measured}
    out = []
    algos = list(dict.fromkeys(r["algo"] for r in rows))  # the --algos order (repetition 0 is not rotated)
    for algo in sorted(algos, key=lambda a: (a != reference, algos.index(a))):
        for metric in (*METRICS, "tokens"):
            values = [by[(k, algo)][metric] for k in reps if (k, algo) in by]
            ratios = [by[(k, algo)][metric] / by[(k, reference)][metric] for k in reps
                      if (k, algo) in by and (k, reference) in by and by[(k, reference)][metric]]
            st, rt = summary_stats(values), summary_stats(ratios)
            out.append({"algo": algo, "metric": metric, **st, "ratio_min": rt["min"], "ratio_median": rt["median"],
                        "ratio_max": rt["max"], "reps": len(values)})
    return out


def _plot(path: Path, rows: list[dict[str, Any]], reference: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["rep"] > 0] or rows
    algos = list(dict.fromkeys(r["algo"] for r in measured))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    med = {a: {m: summary_stats([r[m] for r in measured if r["algo"] == a])["median"] for m in ("rollout_s", "update_s", "wall_s")} for a in algos}
    xs = range(len(algos))
    a1.bar(xs, [med[a]["rollout_s"] for a in algos], label="rollout")
    a1.bar(xs, [med[a]["update_s"] for a in algos], bottom=[med[a]["rollout_s"] for a in algos], label="update")
    a1.plot(xs, [med[a]["wall_s"] for a in algos], "k_", markersize=20, label="whole step (wall)")
    a1.set_xticks(list(xs))
    a1.set_xticklabels(algos)
    a1.set_ylabel("seconds per step (median)")
    a1.legend(fontsize=8)
    a1.set_title("step time")
    ref = {r["rep"]: r["wall_s"] for r in measured if r["algo"] == reference}
    data = [[r["wall_s"] / ref[r["rep"]] for r in measured if r["algo"] == a and ref.get(r["rep"])] or [float("nan")] for a in algos]
    a2.boxplot(data)
    a2.set_xticks(range(1, len(algos) + 1))
    a2.set_xticklabels(algos)
    a2.axhline(1.0, color="k", linestyle=":")
    a2.set_ylabel(f"step time / {reference} (same repetition)")
    a2.set_title(f"ratio to {reference}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """Options of ``benchmarks/algo_steps.py``."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="arith-duo-v0")
    p.add_argument("--algos", default="grpo,ippo,marft-action,marft-token", type=lambda s: [a.strip() for a in s.split(",") if a.strip()],
                   help="comma list (must include --reference)")
    p.add_argument("--reference", default="grpo", help="the algorithm the ratios divide by")
    p.add_argument("--reps", type=int, default=5, help="measured repetitions (after one warm-up)")
    p.add_argument("--num-envs", type=int, default=8, help="episodes per step (every algorithm)")
    p.add_argument("--group-size", type=int, default=4, help="GRPO's group size (divides --num-envs)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="per agent action, every algorithm")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every algorithm that has the field")
    p.add_argument("--out", default="runs/algo-steps")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Build the trainers, run the interleaved steps and write the report; exit status 0."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.reference not in args.algos:
        raise SystemExit(f"--reference {args.reference!r} is not among --algos {args.algos}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    trainers = build_trainers(args)
    try:
        rows = run_interleaved(trainers, args.reps)
    finally:
        for tr in trainers.values():
            rec = getattr(tr, "recovery", None)
            if rec is not None:
                rec.close()  # removes its temporary recovery checkpoints
        del trainers
        gc.collect()
    summary = summarize_steps(rows, args.reference)
    meta = versions()
    write_csv(out / "algo_steps.csv", rows, STEP_COLUMNS)
    write_csv(out / "algo_steps_summary.csv", summary, SUMMARY_COLUMNS)
    write_json(out / "algo_steps.json", {"rows": rows, "summary": summary, "versions": meta, "settings": vars(args),
                                         "load_average_start": load_start, "load_average_end": os.getloadavg()})
    _plot(out / "algo_steps.png", rows, args.reference)
    text = (
        f"# Step time per algorithm, relative to {args.reference}\n\n"
        f"`{' '.join(['python', 'benchmarks/algo_steps.py', *(argv if argv is not None else sys.argv[1:])])}`\n\n"
        f"model `{args.model}`, env `{args.env}`, {args.num_envs} episodes per step (GRPO: groups of {args.group_size}), "
        f"<= {args.max_new_tokens} new tokens per action at temperature {args.temperature}, LoRA r={args.lora_r} "
        f"alpha={args.lora_alpha}, lr {args.lr}; {args.reps} interleaved repetitions after 1 warm-up (order rotating); "
        "ratio = the algorithm's time / the reference's time in the same repetition, min / median / max. "
        "versions: " + ", ".join(f"{k} {v}" for k, v in meta.items()) + "\n\n"
        + markdown_table(summary, SUMMARY_COLUMNS, digits=3)
        + "\n\nPer repetition:\n\n" + markdown_table(rows, STEP_COLUMNS, digits=3) + "\n"
    )
    (out / "algo_steps.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
