"""The envs' scripted policies (``marft sft --demos scripted``): how often each is graded correct, and
how long its demonstrations are in the model's tokens (what RL's ``max_new_tokens`` must leave room for).

    MARFT_DATA_DIR=../shared/data python benchmarks/scripted_demos.py \\
        --envs gsm8k-calc-solo-v0,gsm8k-calc-duo-v0,math-solo-v0 --episodes 300 --out runs/scripted_demos
    python benchmarks/scripted_demos.py --model tiny-random --envs arith-calc-duo-v0 --episodes 2 --out /tmp/s   # smoke

Each env plays ``--episodes`` train episodes with its scripted policy through the RL collector
(:func:`marft_algos.sft.scripted_demos`, every episode kept). Per env and role: the episodes and
how many were graded correct, the role's samples (one per segment: a tool call and the answer
after it are two), and the 50th / 90th percentile and maximum of their response lengths in
tokens, end-of-turn token included (:func:`marft_algos.sft.demo_lengths`). No model weights
are used beyond the tokenizer; the table goes to stdout and ``<out>/scripted_demos.{md,json}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

import marft_envs  # noqa: E402
from benchmarks._common import markdown_table, untrained_policy, versions, write_json  # noqa: E402
from marft_algos.sft import demo_lengths, scripted_demos  # noqa: E402

COLUMNS = ("env_id", "role", "episodes", "correct", "samples", "tokens_p50", "tokens_p90", "tokens_max")


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="Whose tokenizer counts the tokens.")
    p.add_argument("--envs", default="gsm8k-calc-solo-v0,gsm8k-calc-duo-v0,math-solo-v0", help="Comma-separated env ids with a scripted policy.")
    p.add_argument("--episodes", type=int, default=300, help="Scripted train episodes per env.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/scripted_demos")
    return p


def main(argv: list[str] | None = None) -> int:
    """Play, measure, print and write the table; 0 on success."""
    args = build_parser().parse_args(argv)
    rows = []
    for env_id in [e for e in args.envs.split(",") if e]:
        agents = list(marft_envs.make(env_id).possible_agents)
        policy = untrained_policy(agents, args.model)
        demos, stats = scripted_demos(policy, lambda env_id=env_id: marft_envs.make(env_id), args.episodes, seed=args.seed, only_correct=False)
        for role, q in demo_lengths(demos).items():
            rows.append({"env_id": env_id, "role": role, "episodes": stats["episodes"], "correct": stats["correct"],
                         "samples": sum(d.role == role for d in demos), "tokens_p50": q["p50"], "tokens_p90": q["p90"], "tokens_max": q["max"]})
    table = markdown_table(rows, COLUMNS)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scripted_demos.md").write_text(f"`python benchmarks/scripted_demos.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{table}\n")
    write_json(out / "scripted_demos.json", {"args": vars(args), "rows": rows, "versions": versions()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
