"""A GRPO update on a batch without signal (every group scored alike): the trainer's skipped
backward against the full path, side by side in one process on the same batch and weights.

    python benchmarks/zero_signal_update.py --env arith-calc-solo-v0 --num-envs 16 --repeats 3 --out runs/zero_signal
    python benchmarks/zero_signal_update.py --env rag-solo-v0 --env-kwargs '{"hops": [1], "k": 3, "max_doc_chars": 300}' --out runs/zero_signal_rag
    python benchmarks/zero_signal_update.py --model tiny-random --env echo-duo-v0 --num-envs 4 --group-size 2 --repeats 1 --out /tmp/z   # smoke

One batch of ``--num-envs`` episodes is collected with the untrained policy, and every episode's
reward is set to 1. Every advantage is then 0 and so are the loss and its gradient
(``beta`` and ``ent_coef`` 0). ``Trainer.update`` runs on a fresh copy of that batch ``--repeats`` times
with ``skip_vanishing_updates`` on and off, alternating which goes first. Before each run the
policy weights and AdamW state are restored. The AdamW state comes from one update on the same
batch with alternating rewards, so its moments are not 0. The timed update includes the
old-log-prob pass and the KL diagnostics. Reported: the median seconds of each path, their
ratio, and whether the two paths leave bit-identical weights. Table to stdout and
``<out>/zero_signal_update.{md,json}``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import json_option, markdown_table, versions, write_json  # noqa: E402
from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.optim import group_key  # noqa: E402

COLUMNS = ("env_id", "actions", "tokens", "full_s", "skip_s", "full_over_skip", "bitwise_equal")


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--env", default="arith-calc-solo-v0")
    p.add_argument("--env-kwargs", default="{}", help='JSON keyword arguments of the env, e.g. \'{"hops": [1], "k": 3}\'.')
    p.add_argument("--num-envs", type=int, default=16, help="Episodes in the batch.")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="Timed updates per path.")
    p.add_argument("--threads", type=int, default=1, help="torch threads.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/zero_signal")
    return p


def _rescored(batch, trainer: GRPOTrainer, rewards: list[float]):
    out = copy.deepcopy(batch)
    for ep, r in zip(out.episodes, rewards, strict=True):
        ep.team_return = r
        for tr in ep.transitions:
            tr.team_reward = r
    trainer.estimate(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """Collect, time both paths, print and write the table; 0 on success."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cfg = GRPOConfig(env_id=args.env, env_kwargs=json_option("--env-kwargs", args.env_kwargs, '{"hops": [1]}'), model=args.model, num_envs=args.num_envs, group_size=args.group_size, seed=args.seed,
                     progress=False, tensorboard=False, out_dir=str(out / "run"), kl_sample=args.num_envs)
    t = GRPOTrainer(cfg)
    with torch.no_grad():
        played = t.collect()
    n = len(played.episodes)
    t.update(_rescored(played, t, [float(i % 2) for i in range(n)]))  # AdamW's moments are not 0 from here on
    flat = _rescored(played, t, [1.0] * n)
    if any(tr.advantage for tr in flat.transitions):
        raise SystemExit("the batch still has non-zero advantages: this env's rewards are not the team return")
    keys = [group_key("policy", a) for a in t.trainable_agents()]
    start = {k: t.optim.snapshot(k) for k in keys}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    weights: dict[bool, list[torch.Tensor]] = {}
    for r in range(args.repeats):
        for skip in ((True, False) if r % 2 == 0 else (False, True)):
            for k in keys:
                t.optim.restore(k, start[k])
            t.skip_vanishing_updates = skip
            batch = copy.deepcopy(flat)
            t0 = time.perf_counter()
            t.update(batch)
            seconds[skip].append(time.perf_counter() - t0)
            weights[skip] = [p.detach().clone() for a in t.trainable_agents() for p in t.policy.trainable_parameters(a)]
    full, skipped = statistics.median(seconds[False]), statistics.median(seconds[True])
    row = {"env_id": args.env, "actions": len(flat.transitions), "tokens": sum(len(tr.response_ids) for tr in flat.transitions),
           "full_s": round(full, 2), "skip_s": round(skipped, 2), "full_over_skip": round(full / skipped, 2),
           "bitwise_equal": all(torch.equal(a, b) for a, b in zip(weights[True], weights[False], strict=True))}
    table = markdown_table([row], COLUMNS)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "zero_signal_update.md").write_text(f"`python benchmarks/zero_signal_update.py {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{table}\n")
    write_json(out / "zero_signal_update.json", {"args": vars(args), "row": row, "seconds": {"skip": seconds[True], "full": seconds[False]},
                                                 "versions": versions()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
