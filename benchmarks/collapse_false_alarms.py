"""How often does the collapse guard's reward test fire on noise, and how fast on a real collapse?

    python benchmarks/collapse_false_alarms.py                         # 16 episodes a step, levels 0.2 0.3 0.5
    python benchmarks/collapse_false_alarms.py --episodes 8 --runs 500
    python benchmarks/collapse_false_alarms.py --replay benchmarks/records/credit-arith   # recorded runs
    python benchmarks/collapse_false_alarms.py --replay benchmarks/records/credit-arith --unguarded

A binary team reward over ``--episodes`` episodes a step, from a policy that does not
change (level ``p``): every alarm is a false one. Then a real collapse: the level drops from
``--collapse-from`` to ``--collapse-to`` after ``--collapse-at`` steps; the delay is the
steps from the drop to the first alarm. Two rules side by side, each through a
:class:`marft_algos.recovery.CollapseDetector` fed the same reward streams:

- ``marft``: the library's reward test at its defaults (a fast EMA below half the slow
  reference level and more than ``reward_z`` standard errors below it);
- ``best-ema`` (the test before 2026-11-28, re-stated here for the comparison): the fast EMA
  below half the best fast EMA seen.

An alarm leaves the detector's state as a rollback does (the step is not learned from).
A run of the equal-budget harness's size (68 steps) stops at its fourth alarm
(``max_rollbacks=3``); the table gives the share of runs that would have.

``--replay DIR`` instead reads the equal-budget records under ``DIR`` (their per-step
``team/reward`` and ``recovery/rollbacks``) and, for each run the guard rolled back, feeds
both rules the run's rewards up to its first rollback (after it the run took another path):
the step at which each fires, beside the recorded one. The units per step are the run's
problems (``num_envs`` over ``group_size``).

``--unguarded`` with ``--replay`` asks the other question, for the recorded runs of an
algorithm without the guard (GRPO): where the library's rule would have fired over the
whole run, beside the run's rewards at its start and end and its held-out accuracy, so a
run that collapsed shows whether the guard would have seen it, and a healthy one whether
it would have fired on noise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from marft_algos.config import RecoveryConfig
from marft_algos.recovery import CollapseDetector

AGENTS = ["agent"]


class BestEmaRule:
    """The reward test before the noise test: the fast EMA below ``(1 - drop)`` x its best."""

    def __init__(self, s: RecoveryConfig) -> None:
        self.s, self.ema, self.best, self.healthy = s, None, -math.inf, 0

    def check(self, metrics: Mapping[str, float]) -> list[str]:
        """``["reward_collapse"]`` or ``[]``, as :meth:`CollapseDetector.check` answers."""
        r, s = metrics["team/reward"], self.s
        new = r if self.ema is None else s.reward_ema * r + (1 - s.reward_ema) * self.ema
        if self.healthy >= s.warmup and self.best >= s.reward_min and new < (1 - s.reward_drop) * self.best:
            return ["reward_collapse"]
        self.ema, self.best, self.healthy = new, max(self.best, new), self.healthy + 1
        return []


RULES: dict[str, Callable[[RecoveryConfig], object]] = {
    "marft": lambda s: CollapseDetector(s, AGENTS),
    "best-ema": BestEmaRule,
}


def rewards(levels: list[float], episodes: int, gen: torch.Generator) -> list[float]:
    """One team reward per step: the mean of ``episodes`` binary rewards at that step's level."""
    return [float((torch.rand(episodes, generator=gen) < p).float().mean()) for p in levels]


def alarms(rule: str, stream: list[float], units: int) -> list[int]:
    """The steps of ``stream`` at which ``rule`` (at the default settings) fires, ``units``
    independent problems a step."""
    detector = RULES[rule](RecoveryConfig())
    return [t for t, r in enumerate(stream) if detector.check({"team/reward": r, "rollout/problems": float(units)})]


def recorded_runs(records: Path) -> Iterator[tuple[str, dict[str, Any], list[dict[str, float]], int]]:
    """Each equal-budget record under ``records``: its name (``system/seedN``), the record,
    its per-step curve and its independent problems a step (``num_envs`` over ``group_size``)."""
    for path in sorted(records.glob("*/seed*.json")):
        rec = json.loads(path.read_text())
        cfg = rec.get("config") or {}
        yield f"{path.parent.name}/{path.stem}", rec, rec.get("curve") or [], cfg.get("num_envs", 1) // max(cfg.get("group_size") or 1, 1)


def replay(records: Path) -> list[dict[str, object]]:
    """For each recorded run with a rollback: where each rule fires on its rewards up to the first one."""
    print("| run | problems a step | recorded rollbacks at steps | best-ema fires (up to the first) | marft fires (up to the first) |")
    print("|---|---|---|---|---|")
    rows: list[dict[str, object]] = []
    for name, _rec, curve, units in recorded_runs(records):
        counts = [p.get("recovery/rollbacks", 0.0) for p in curve]
        rolled = [int(p["train/step"]) for i, p in enumerate(curve) if counts[i] > (counts[i - 1] if i else 0.0)]
        if not rolled:
            continue
        steps = [int(p["train/step"]) for p in curve]
        upto = curve[: steps.index(rolled[0]) + 1]  # after the first rollback the run took another path
        row: dict[str, object] = {"run": name, "units": units, "recorded": rolled}
        for rule in RULES:
            row[rule] = [steps[t] for t in alarms(rule, [p["team/reward"] for p in upto], units)]
        rows.append(row)
        print(f"| {row['run']} | {units} | {rolled} | {row['best-ema'] or 'none'} | {row['marft'] or 'none'} |")
    return rows


def replay_unguarded(records: Path) -> list[dict[str, object]]:
    """For each recorded run of an algorithm without the guard: where the library's rule fires."""
    print("| run | problems a step | steps | team reward, first 3 -> last 3 steps | marft fires at steps | held-out accuracy |")
    print("|---|---|---|---|---|---|")
    rows: list[dict[str, object]] = []
    for name, rec, curve, units in recorded_runs(records):
        if not curve or str(rec.get("algo", "")).startswith("marft"):
            continue
        steps, rs = [int(p["train/step"]) for p in curve], [p["team/reward"] for p in curve]
        fires = [steps[t] for t in alarms("marft", rs, units)]
        acc = (rec.get("eval") or {}).get("accuracy")
        row: dict[str, object] = {"run": name, "units": units, "steps": len(curve),
                                  "start": statistics.mean(rs[:3]), "end": statistics.mean(rs[-3:]), "marft": fires, "accuracy": acc}
        rows.append(row)
        print(f"| {row['run']} | {units} | {len(curve)} | {row['start']:.2f} -> {row['end']:.2f} | {fires or 'none'} | {acc} |")
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    """Print the table; return its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16, help="episodes a step (the team reward is their mean)")
    ap.add_argument("--levels", default="0.2,0.3,0.5", help="steady reward levels")
    ap.add_argument("--steps", type=int, default=68, help="steps a run")
    ap.add_argument("--runs", type=int, default=1000, help="runs per cell")
    ap.add_argument("--collapse-from", type=float, default=0.35)
    ap.add_argument("--collapse-to", type=float, default=0.02)
    ap.add_argument("--collapse-at", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replay", type=Path, help="replay the recorded runs under this records folder instead")
    ap.add_argument("--unguarded", action="store_true", help="with --replay: the runs of algorithms without the guard (GRPO), whole")
    args = ap.parse_args(argv)
    if args.replay is not None:
        return replay_unguarded(args.replay) if args.unguarded else replay(args.replay)
    levels = [float(x) for x in args.levels.split(",")]
    print(f"binary reward, {args.episodes} episodes a step, {args.runs} runs of {args.steps} steps per cell\n")
    print("| rule | steady level | false alarms per run | runs stopped (4+ alarms) | collapse: median delay | 90th pct | missed |")
    print("|---|---|---|---|---|---|---|")
    rows: list[dict[str, object]] = []
    for rule in RULES:
        gen = torch.Generator().manual_seed(args.seed)
        drop = [args.collapse_from] * args.collapse_at + [args.collapse_to] * (args.steps - args.collapse_at)
        delays = []
        for _ in range(args.runs):
            late = [t for t in alarms(rule, rewards(drop, args.episodes, gen), args.episodes) if t >= args.collapse_at]
            delays.append(late[0] - args.collapse_at if late else None)
        caught = sorted(d for d in delays if d is not None)
        med = statistics.median(caught) if caught else "-"
        p90 = caught[int(0.9 * (len(caught) - 1))] if caught else "-"
        missed = (len(delays) - len(caught)) / len(delays)
        for p in levels:
            counts = [len(alarms(rule, rewards([p] * args.steps, args.episodes, gen), args.episodes)) for _ in range(args.runs)]
            stopped = sum(c >= 4 for c in counts) / len(counts)
            print(f"| {rule} | {p} | {statistics.mean(counts):.2f} | {stopped:.1%} | {med} | {p90} | {missed:.1%} |")
            rows.append({"rule": rule, "level": p, "false_alarms": statistics.mean(counts), "stopped": stopped,
                         "delay_median": med, "delay_p90": p90, "missed": missed})
    return rows


if __name__ == "__main__":
    main()
