"""SFT warm start: tool-call rate and accuracy before SFT, after SFT, and after SFT + RL, with CIs.

    python benchmarks/sft_warmstart.py --out runs/sft_warmstart                  # smollm2-135m, CPU: about an hour
    python benchmarks/sft_warmstart.py --model tiny-random --envs arith-calc-duo-v0 --eval-n 2 \\
        --num-demos 2 --epochs 1 --steps 1 --num-envs 2 --group-size 2 --max-new-tokens 4 --out /tmp/s   # smoke

For each env of ``--envs`` (default: the calculator duo ``arith-calc-duo-v0`` and the RAG
generator with ``search`` ``rag-solo-v0``), the systems are

- ``base``: the base model with fresh adapters (B = 0: exactly the base model);
- ``sft``: after ``marft sft --demos scripted`` (``--num-demos`` episodes of the env's
  scripted policy, ``--epochs`` passes, :mod:`marft_algos.sft`);
- ``sft + rl``: GRPO (agent-wise normalisation) started from the SFT adapters
  (``init_from``) for ``--steps`` steps or ``--train-minutes``, whichever ends first;
- ``rl`` (with ``--cold-rl``): the same RL from fresh adapters, the cold-start control.

Each system plays the same held-out problems 0..``--eval-n``-1 of the test split, one greedy
episode each. Per system: accuracy (EM for RAG) with its 95% Wilson interval, tool-call rate
(episodes with at least one tool call) with its 95% Wilson interval, tool calls and tokens
per episode; per pair (``sft - base``, ``sft + rl - sft``, ``sft + rl - rl``) the paired
difference of accuracy and of tool-call rate over the same problems with a 95% percentile
bootstrap interval.

Outputs in ``--out``: ``sft_warmstart.md``, ``sft_warmstart.csv``, ``sft_warmstart_diffs.csv``,
``sft_warmstart.json`` (arguments, rows, versions, wall time, load average), rewritten after
every stage; the SFT run dirs are ``<out>/<env>/sft``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import StagedReport, json_option, load_text, train_within  # noqa: E402
from marft_algos.cli import TOOL_ROLE_MIN_TOKENS  # noqa: E402
from marft_algos.evaluation import bootstrap_mean, run_samples, summarize, wilson  # noqa: E402

ROWS = ("env_id", "system", "problems", "accuracy", "acc_lo", "acc_hi", "tool_rate", "tool_lo", "tool_hi",
        "tool_calls_per_episode", "tokens_per_episode", "reward", "demos", "sft_s", "train_steps", "train_s", "eval_s")
DIFFS = ("env_id", "difference", "accuracy", "acc_lo", "acc_hi", "tool_rate", "tool_lo", "tool_hi")
PAIRS = (("sft", "base"), ("sft + rl", "sft"), ("sft + rl", "rl"))


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--envs", default="arith-calc-duo-v0,rag-solo-v0", help="Comma-separated env ids with a scripted policy.")
    p.add_argument("--env-kwargs", default="{}", help='JSON: {env_id: {kwargs}} (e.g. {"rag-solo-v0": {"hops": [1]}}).')
    p.add_argument("--num-demos", type=int, default=64, help="Scripted episodes for SFT (train split).")
    p.add_argument("--epochs", type=int, default=3, help="SFT passes over the demos.")
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="RL steps after SFT (0: no RL).")
    p.add_argument("--train-minutes", type=float, default=10.0, help="RL wall-clock budget per system.")
    p.add_argument("--cold-rl", action="store_true", help="Also train RL from fresh adapters (the cold-start control).")
    p.add_argument("--num-envs", type=int, default=8, help="Episodes per RL step.")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4, help="RL learning rate.")
    p.add_argument("--eval-n", type=int, default=64, help="Held-out problems (test split, indices 0..n-1).")
    p.add_argument("--eval-batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=TOOL_ROLE_MIN_TOKENS, help="Per step of an agent (RL and evaluation): room for a tool call.")
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/sft_warmstart")
    return p


def evaluate(policy: Any, env_id: str, system: str, args: argparse.Namespace, env_kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[float], list[float]]:
    """One held-out pass: the row of ``system`` and its per-problem correct / tool-call vectors."""
    t0 = time.perf_counter()
    records = run_samples(policy, env_id, split="test", env_kwargs=env_kwargs, problems=list(range(args.eval_n)), k=1,
                          temperature=0.0, max_new_tokens=args.max_new_tokens, num_envs=args.eval_batch, seed=args.seed,
                          max_context=args.max_context)
    records = sorted(records, key=lambda r: r.problem)
    s = summarize(records)
    correct = [float(r.correct) for r in records]
    calls = [sum(int(a.get("tool_calls", 0)) for a in r.actions) for r in records]
    used = [float(c > 0) for c in calls]
    n = len(records)
    rate = sum(used) / n if n else float("nan")
    tool_lo, tool_hi = wilson(rate, n)
    row = {"env_id": env_id, "system": system, "problems": n, "accuracy": s["accuracy"], "acc_lo": s["ci_low"],
           "acc_hi": s["ci_high"], "tool_rate": rate, "tool_lo": tool_lo, "tool_hi": tool_hi,
           "tool_calls_per_episode": sum(calls) / n if n else float("nan"), "tokens_per_episode": s["tokens_per_episode"],
           "reward": s["team_reward"], "eval_s": round(time.perf_counter() - t0, 1)}
    return row, correct, used


def make_trainer(env_id: str, args: argparse.Namespace, env_kwargs: dict[str, Any], out: Path, init_from: str | None) -> Any:
    """A GRPO trainer (agent-wise normalisation) on ``env_id``, from ``init_from`` or fresh adapters."""
    import marft_envs
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    agents = marft_envs.spec(env_id).agents_for(**env_kwargs)
    config = GRPOConfig(
        env_id=env_id, env_kwargs=env_kwargs, model=args.model, num_envs=args.num_envs, group_size=args.group_size,
        steps=max(args.steps, 1), lr=args.lr, seed=args.seed, progress=False, tensorboard=False, plot=False,
        transcript_every=0, out_dir=str(out), max_context=args.max_context, normalize_advantages="agent",
        init_from=init_from, sampling_overrides={a: {"max_new_tokens": args.max_new_tokens} for a in agents},
    )
    return GRPOTrainer(config)


def paired(env_id: str, name: str, a: tuple[list[float], list[float]], b: tuple[list[float], list[float]], seed: int) -> dict[str, Any]:
    """The paired difference ``a - b`` of accuracy and tool-call rate over the same problems (bootstrap CI)."""
    acc = bootstrap_mean([x - y for x, y in zip(a[0], b[0], strict=True)], seed=seed)
    tool = bootstrap_mean([x - y for x, y in zip(a[1], b[1], strict=True)], seed=seed)
    return {"env_id": env_id, "difference": name, "accuracy": acc[0], "acc_lo": acc[1], "acc_hi": acc[2],
            "tool_rate": tool[0], "tool_lo": tool[1], "tool_hi": tool[2]}


def run_env(env_id: str, env_kwargs: dict[str, Any], args: argparse.Namespace, out: Path, report: StagedReport) -> None:
    """The systems of one env (rows and paired differences appended to ``report.tables``)."""
    from marft_algos.sft import SFTConfig, run_sft

    vectors: dict[str, tuple[list[float], list[float]]] = {}

    def record(system: str, policy: Any, **extra: Any) -> None:
        row, correct, used = evaluate(policy, env_id, system, args, env_kwargs)
        report.tables["rows"].append({**row, **extra})
        vectors[system] = (correct, used)
        report.stage(f"{env_id} {system}")

    cold = make_trainer(env_id, args, env_kwargs, out / env_id / "rl", None)
    record("base", cold.policy)
    if args.cold_rl and args.steps > 0:
        steps, secs = train_within(cold, args.steps, args.train_minutes)
        record("rl", cold.policy, train_steps=steps, train_s=round(secs, 1))
    del cold
    sft_dir = out / env_id / "sft"
    t0 = time.perf_counter()
    result = run_sft(SFTConfig(env_id=env_id, env_kwargs=env_kwargs, model=args.model, out_dir=str(sft_dir),
                               num_demos=args.num_demos, epochs=args.epochs, lr=args.sft_lr, batch_size=args.sft_batch,
                               max_context=args.max_context, seed=args.seed))
    sft_s = round(time.perf_counter() - t0, 1)
    demos = sum(result.demos.values())
    warm = make_trainer(env_id, args, env_kwargs, out / env_id / "sft_rl", str(sft_dir))
    record("sft", warm.policy, demos=demos, sft_s=sft_s)
    if args.steps > 0:
        steps, secs = train_within(warm, args.steps, args.train_minutes)
        record("sft + rl", warm.policy, demos=demos, sft_s=sft_s, train_steps=steps, train_s=round(secs, 1))
    del warm
    for a, b in PAIRS:
        if a in vectors and b in vectors:
            report.tables["diffs"].append(paired(env_id, f"{a} - {b}", vectors[a], vectors[b], args.seed))
    report.stage(f"{env_id} differences")


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every env and system; returns the tables (also written to ``--out``)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    all_kwargs = json_option("--env-kwargs", args.env_kwargs, '{"rag-solo-v0": {"hops": [1]}}')
    report = StagedReport(
        out, "sft_warmstart", args, {"rows": ("sft_warmstart.csv", ROWS), "diffs": ("sft_warmstart_diffs.csv", DIFFS)},
        lambda wall_s: f"Model {args.model}; SFT on {args.num_demos} scripted episodes x {args.epochs} epochs; RL: GRPO (agent-wise), "
        f"{args.steps} steps max; {args.eval_n} held-out problems, greedy, max {args.max_new_tokens} new tokens per step; "
        f"wall time {wall_s / 60:.1f} min, load average {load_text()}. Intervals: 95% Wilson (rates), 95% paired bootstrap (differences).")
    for env_id in [e.strip() for e in args.envs.split(",") if e.strip()]:
        run_env(env_id, dict(all_kwargs.get(env_id, {})), args, out, report)
    print(report.markdown())
    return report.tables


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python benchmarks/sft_warmstart.py [options]``."""
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
