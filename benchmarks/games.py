"""Games and dialogue: untrained vs trained, with 95% confidence intervals.

    python benchmarks/games.py --out runs/games                                  # smollm2-135m, ~1 h CPU
    python benchmarks/games.py --steps 4 --eval-n 16 --dialogue-steps 2 --out runs/games-small
    python benchmarks/games.py --model tiny-random --steps 1 --eval-n 2 --dialogue-steps 1 --max-new-tokens 4 --out /tmp/g  # smoke

Part 1, **Nim** (``game-nim-v0``): one LoRA adapter plays both seats (``mode="shared"``)
and trains by self-play with GRPO (each seat credited with its own +1/-1:
``reward_source`` resolves to ``"agent"`` for games). Before and after training the
policy plays ``--eval-n`` games in EACH seat against fixed opponents (a seeded random
legal-move player and the optimal player) on held-out start positions (test split,
indices 0..n-1); win/draw/loss rates with Wilson intervals, and the invalid-move rate.

Part 2, **dialogue** (``dialogue-doctor-v0``, scripted patient): GRPO on the doctor;
accuracy (Wilson interval) and mean questions asked (normal-approximation interval) on
held-out cases, before and after. ``--dialogue-steps 0`` skips the training (and the
"trained" rows).

Decoding at evaluation: greedy, ``--max-new-tokens`` per reply. Outputs in ``--out``:
``games.md``, ``games.csv``, ``games.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` importable as a script

from benchmarks._common import markdown_table, versions, write_csv, write_json  # noqa: E402
from marft_algos.evaluation import evaluate_vs_opponent, wilson_interval  # noqa: E402

COLUMNS = ("part", "system", "opponent", "seat", "n", "win_rate", "win_lo", "win_hi", "draw_rate", "loss_rate",
           "invalid_moves", "accuracy", "acc_lo", "acc_hi", "turns", "turns_lo", "turns_hi", "train_steps", "train_s")


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=30, help="Nim self-play training steps.")
    p.add_argument("--dialogue-steps", type=int, default=20, help="Dialogue training steps (0: evaluate untrained only).")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-n", type=int, default=50, help="Held-out games per seat and opponent / dialogue cases.")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--piles", default="5,12", help="Nim start piles low,high.")
    p.add_argument("--ask-move", action=argparse.BooleanOptionalAction, default=True,
                   help="Nim asks the mover 'how many stones do you take?' (NimEnv ask_move; SmolLM2 answers it "
                        "with a plain move, and echoes the rules without it).")
    p.add_argument("--parts", default="nim,dialogue", help="Comma-separated parts to run: nim, dialogue.")
    p.add_argument("--micro-batch-tokens", type=int, default=2048,
                   help="Training forwards in pieces of at most this many padded tokens (0: one forward per minibatch). "
                        "The doctor's growing transcripts needed over 18 GB in one forward with SmolLM2-135M.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/games")
    return p


def _config(args: argparse.Namespace, env_id: str, env_kwargs: dict[str, Any], agents: list[str], steps: int, out: Path) -> Any:
    from marft_algos.algos.grpo import GRPOConfig

    sampling = {a: {"max_new_tokens": args.max_new_tokens} for a in agents}
    return GRPOConfig(env_id=env_id, env_kwargs=env_kwargs, model=args.model, mode="shared", num_envs=args.num_envs,
                      group_size=args.group_size, steps=max(steps, 1), lr=args.lr, seed=args.seed, progress=False,
                      tensorboard=False, normalize_advantages="agent", sampling_overrides=sampling, out_dir=str(out),
                      micro_batch_tokens=args.micro_batch_tokens)


def _game_rows(policy: Any, args: argparse.Namespace, env_kwargs: dict[str, Any], system: str, steps: int, train_s: float) -> list[dict[str, Any]]:
    from marft_envs.games import NimEnv, OptimalNimPlayer, RandomPlayer

    rows = []
    for name, opponent in (("random", RandomPlayer(args.seed + 1)), ("optimal", OptimalNimPlayer())):
        report = evaluate_vs_opponent(policy, lambda: NimEnv(split="test", **env_kwargs), opponent, args.eval_n,
                                      seed=args.seed, sampling={"max_new_tokens": args.max_new_tokens})
        for r in report["rows"]:
            rows.append({"part": "nim", "system": system, "opponent": name, **r, "train_steps": steps, "train_s": round(train_s, 1)})
    return rows


def _dialogue_row(policy: Any, args: argparse.Namespace, system: str, steps: int, train_s: float) -> dict[str, Any]:
    import marft_envs
    from marft_algos.rollout import RolloutCollector

    n = args.eval_n
    collector = RolloutCollector(lambda: marft_envs.make("dialogue-doctor-v0", split="test"), policy, num_envs=min(n, 32),
                                 mode="eval", sampling_overrides={"doctor": {"greedy": True, "max_new_tokens": args.max_new_tokens}})
    batch = collector.run([{"seed": args.seed + k, "options": {"problem_index": k}, "group_id": k} for k in range(n)])
    correct = sum(bool(ep.correct) for ep in batch.episodes)
    turns = [float(ep.transitions[-1].info.get("questions", len(ep.transitions))) if ep.transitions else 0.0 for ep in batch.episodes]
    mean = sum(turns) / n
    sd = math.sqrt(sum((t - mean) ** 2 for t in turns) / max(n - 1, 1))
    lo, hi = wilson_interval(correct, n)
    return {"part": "dialogue", "system": system, "opponent": "-", "seat": "doctor", "n": n, "accuracy": correct / n,
            "acc_lo": lo, "acc_hi": hi, "turns": mean, "turns_lo": mean - 1.96 * sd / math.sqrt(n),
            "turns_hi": mean + 1.96 * sd / math.sqrt(n), "train_steps": steps, "train_s": round(train_s, 1)}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both parts; returns the table rows (also written to ``--out``)."""
    from marft_algos.algos.grpo import GRPOTrainer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    low, high = (int(x) for x in args.piles.split(","))
    nim_kwargs = {"piles": [low, high], "ask_move": args.ask_move}
    rows: list[dict[str, Any]] = []
    start = time.time()

    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if parts - {"nim", "dialogue"}:
        raise SystemExit(f"--parts: unknown part(s) {sorted(parts - {'nim', 'dialogue'})}; use nim and/or dialogue")
    if "nim" in parts:
        t = GRPOTrainer(_config(args, "game-nim-v0", nim_kwargs, ["player_0", "player_1"], args.steps, out / "nim"))
        rows += _game_rows(t.policy, args, nim_kwargs, "untrained", 0, 0.0)  # LoRA B = 0: the base model
        _stage(out, args, rows, "nim untrained", start)
        if args.steps > 0:
            t0 = time.time()
            t.train(steps=args.steps)
            rows += _game_rows(t.policy, args, nim_kwargs, "self-play GRPO", args.steps, time.time() - t0)
            _stage(out, args, rows, "nim trained", start)
        del t

    if "dialogue" in parts:
        d = GRPOTrainer(_config(args, "dialogue-doctor-v0", {}, ["doctor"], args.dialogue_steps, out / "dialogue"))
        rows.append(_dialogue_row(d.policy, args, "untrained", 0, 0.0))
        _stage(out, args, rows, "dialogue untrained", start)
        if args.dialogue_steps > 0:
            t0 = time.time()
            d.train(steps=args.dialogue_steps)
            rows.append(_dialogue_row(d.policy, args, "GRPO", args.dialogue_steps, time.time() - t0))

    _write(out, args, rows)
    print(markdown_table([{k: r.get(k, "") for k in COLUMNS} for r in rows], COLUMNS))
    return rows


def _write(out: Path, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """games.csv / .json / .md with the rows so far (rewritten after every stage)."""
    table = [{k: r.get(k, "") for k in COLUMNS} for r in rows]
    write_csv(out / "games.csv", table, COLUMNS)
    write_json(out / "games.json", {"args": vars(args), "rows": table, "versions": versions()})
    (out / "games.md").write_text(markdown_table(table, COLUMNS) + "\n")


def _stage(out: Path, args: argparse.Namespace, rows: list[dict[str, Any]], what: str, t0: float) -> None:
    _write(out, args, rows)
    print(f"[games] {what} done at {time.time() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python benchmarks/games.py [options]``."""
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
