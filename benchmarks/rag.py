"""The offline RAG task: untrained vs trained team, accuracy with 95% CIs and tool use per agent.

    python benchmarks/rag.py --out runs/rag                                       # smollm2-135m, ~25 min CPU
    python benchmarks/rag.py --model tiny-random --steps 1 --eval-n 2 --max-new-tokens 4 --num-envs 4 --out /tmp/r  # smoke

The team ``--env`` (``rag-quartet-v0``: rewriter -> selector (``search`` tool) -> filter ->
generator) and the single-agent baseline ``--solo-env`` (``rag-solo-v0``: one generator
with ``search``; ``--solo-env ''`` skips it) each start from the base model with fresh
LoRA adapters (B = 0: exactly the base model, "untrained"), are evaluated, train with
``--algo`` (default GRPO, agent-wise advantage normalisation) for ``--steps`` steps or
until ``--train-minutes`` of training have passed, whichever comes first, and are
evaluated again on the same held-out questions.

Evaluation: questions 0..``--eval-n``-1 of the test split (a different generated world
from the training one), one greedy episode each, ``--max-new-tokens`` per step of an
agent. Team table: exact match (EM, with its 95% Wilson interval), answer F1 (with a 95%
percentile bootstrap interval over questions), team reward, tokens and LLM steps per
episode. Agent table: per episode, actions, generated steps (an action's tool segments),
tool calls, failed calls, tokens; the failed calls by kind. All of it comes from
:mod:`marft_algos.evaluation` (``run_samples``, ``summarize``, ``agent_tool_stats``).

Outputs in ``--out``: ``rag.md``, ``rag_team.csv``, ``rag_agents.csv``, ``rag.json``
(arguments, rows, versions, wall time, load average), rewritten after every stage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import StagedReport, json_option, load_text, set_values, train_within  # noqa: E402
from marft_algos.cli import TOOL_ROLE_MIN_TOKENS  # noqa: E402
from marft_algos.evaluation import agent_tool_stats, bootstrap_mean, run_samples, summarize  # noqa: E402

TEAM_COLUMNS = ("env_id", "system", "problems", "em", "em_lo", "em_hi", "f1", "f1_lo", "f1_hi", "reward",
                "tokens_per_episode", "steps_per_episode", "train_steps", "train_s", "eval_s")
AGENT_COLUMNS = ("env_id", "system", "agent", "actions", "steps", "tool_calls", "tool_errors", "tool_error_rate",
                 "errors_by_kind", "tokens")


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="rag-quartet-v0", help="The team env id.")
    p.add_argument("--solo-env", default="rag-solo-v0", help="Single-agent baseline env id ('' to skip).")
    p.add_argument("--env-kwargs", default='{"hops": [1], "k": 3, "max_doc_chars": 300}',
                   help="JSON task options of both envs (default: 1-hop questions, 3 documents of <= 300 characters per search).")
    p.add_argument("--algo", default="grpo", help="Registered algorithm that trains both teams.")
    p.add_argument("--steps", type=int, default=4, help="Training steps per system (0: untrained only).")
    p.add_argument("--train-minutes", type=float, default=3.0, help="Training wall-clock budget per system.")
    p.add_argument("--num-envs", type=int, default=8, help="Episodes per training step.")
    p.add_argument("--group-size", type=int, default=4, help="GRPO group size (episodes per question).")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--train-temperature", type=float, default=1.0)
    p.add_argument("--eval-n", type=int, default=64, help="Held-out questions (test split, indices 0..n-1).")
    p.add_argument("--eval-batch", type=int, default=32, help="Episodes played side by side at evaluation.")
    p.add_argument("--max-new-tokens", type=int, default=TOOL_ROLE_MIN_TOKENS,
                   help=f"Per step of an agent (training and evaluation); below {TOOL_ROLE_MIN_TOKENS} a search call (34 tokens) is cut.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Extra config field (JSON value), repeatable.")
    p.add_argument("--out", default="runs/rag")
    return p


def make_trainer(env_id: str, args: argparse.Namespace, env_kwargs: dict[str, Any], out: Path) -> Any:
    """A trainer of ``--algo`` on ``env_id`` (its fresh LoRA adapters are the untrained team)."""
    import marft_envs
    from marft_algos.registry import get_algorithm

    spec = get_algorithm(args.algo)
    agents = marft_envs.spec(env_id).agents_for(**env_kwargs)
    fields = {f for f in spec.config_cls.__dataclass_fields__}
    kwargs: dict[str, Any] = dict(
        env_id=env_id, env_kwargs=env_kwargs, model=args.model, num_envs=args.num_envs, steps=max(args.steps, 1), lr=args.lr,
        seed=args.seed, progress=False, tensorboard=False, plot=False, transcript_every=0, out_dir=str(out),
        sampling_overrides={a: {"max_new_tokens": args.max_new_tokens, "temperature": args.train_temperature} for a in agents},
    )
    if "group_size" in fields:
        kwargs["group_size"] = args.group_size
    if "normalize_advantages" in fields and args.algo == "grpo":
        kwargs["normalize_advantages"] = "agent"  # Dr. MAS: one baseline per agent
    kwargs.update(set_values(args.set))
    return spec.trainer_cls(spec.config_cls(**{k: v for k, v in kwargs.items() if k in fields}))


def evaluate(policy: Any, env_id: str, system: str, args: argparse.Namespace, env_kwargs: dict[str, Any],
             steps: int, train_s: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One held-out pass: the team row and the agent rows of ``system``."""
    import marft_envs

    t0 = time.perf_counter()
    records = run_samples(policy, env_id, split="test", env_kwargs=env_kwargs, problems=list(range(args.eval_n)), k=1,
                          temperature=0.0, max_new_tokens=args.max_new_tokens, num_envs=args.eval_batch, seed=args.seed)
    eval_s = time.perf_counter() - t0
    s = summarize(records)
    # Plain answer F1 from the grade details: ``score`` is the reward's hedge-penalised credit (issue 27).
    f1, f1_lo, f1_hi = bootstrap_mean([float(r.details.get("f1") or 0.0) for r in records], seed=args.seed)
    team = {"env_id": env_id, "system": system, "problems": s["problems"], "em": s["accuracy"], "em_lo": s["ci_low"],
            "em_hi": s["ci_high"], "f1": f1, "f1_lo": f1_lo, "f1_hi": f1_hi,
            "reward": sum(r.reward for r in records) / max(len(records), 1), "tokens_per_episode": s["tokens_per_episode"],
            "steps_per_episode": s["calls_per_episode"], "train_steps": steps, "train_s": round(train_s, 1), "eval_s": round(eval_s, 1)}
    agents = marft_envs.spec(env_id).agents_for(split="test", **env_kwargs)
    rows = []
    for row in agent_tool_stats(records, agents):
        kinds = ", ".join(f"{k} {v}" for k, v in row.pop("errors_by_kind").items()) or "-"
        rows.append({"env_id": env_id, "system": system, **row, "errors_by_kind": kinds})
    return team, rows


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every system, untrained then trained; returns the tables (also written to ``--out``)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = json_option("--env-kwargs", args.env_kwargs, '{"hops": [1, 2]}')
    report = StagedReport(out, "rag", args, {"team": ("rag_team.csv", TEAM_COLUMNS), "agents": ("rag_agents.csv", AGENT_COLUMNS)},
                          lambda wall_s: f"Model {args.model}, algorithm {args.algo}, {args.eval_n} held-out questions, greedy, "
                          f"max {args.max_new_tokens} new tokens per step; wall time {wall_s / 60:.1f} min, load average {load_text()}.")
    tables = report.tables
    label = {args.env: "team", args.solo_env: "solo"}
    for env_id in [e for e in (args.env, args.solo_env) if e]:
        trainer = make_trainer(env_id, args, env_kwargs, out / env_id)
        team, agents = evaluate(trainer.policy, env_id, f"untrained {label[env_id]}", args, env_kwargs, 0, 0.0)
        tables["team"].append(team)
        tables["agents"] += agents
        report.stage(f"{env_id} untrained")
        if args.steps > 0:
            steps, train_s = train_within(trainer, args.steps, args.train_minutes)
            team, agents = evaluate(trainer.policy, env_id, f"{label[env_id]} + {args.algo}", args, env_kwargs, steps, train_s)
            tables["team"].append(team)
            tables["agents"] += agents
            report.stage(f"{env_id} trained ({steps} steps, {train_s:.0f} s)")
        del trainer
    print(report.markdown())
    return tables


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python benchmarks/rag.py [options]``."""
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
