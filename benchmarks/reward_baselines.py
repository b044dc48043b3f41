"""Reward baselines that need no model: does a policy that games the reward beat an honest one?

    python benchmarks/reward_baselines.py                       # both parts, ~1 min CPU
    python benchmarks/reward_baselines.py --rag-n 200 --doctor-n 500 --out runs/reward-baselines

Part 1, **RAG hedging** (``rag-solo-v0``, the offline KB, train and test worlds). Per
question the generator is shown the documents retrieved for the question; the
*candidates* are the entities of the gold answer's type (person, city, company, country)
named in those documents. Strategies, scored with the env's own grader and reward weights
(token and tool costs left out, they are the same for everyone up to length):

* ``one random candidate``: the mean reward over the candidates (its expectation);
* ``all candidates``: one answer listing every candidate (``A, B, C``);
* ``gold + one other``: the gold answer plus one wrong candidate (a two-way hedge);
* ``gold alone``: the committed right answer.

A reward that pays hedging ranks ``all candidates`` above ``one random candidate``.

Part 2, **doctor zero-question baseline** (``dialogue-doctor-v0``, default knobs: 4
candidates, ``confusable=True``). A policy that asks nothing and diagnoses the candidate
whose symptom list holds the opening complaint (as a core symptom first, then as an optional
one; ties: the first in the shown order). Chance is ``1 / n_candidates``.

Outputs: a Markdown table on stdout and, with ``--out``, ``reward_baselines.md`` and
``reward_baselines.json`` in that folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # marft importable as a script

import marft_envs  # noqa: E402
from marft_envs.dialogue.cases import CONDITIONS  # noqa: E402
from marft_envs.tasks.base import GradeResult  # noqa: E402
from marft_envs.tasks.kb import KnowledgeBase  # noqa: E402


def _reward(env: Any, grade: GradeResult) -> float:
    """The env's outcome + partial components for ``grade`` (no cost terms)."""
    comps = env.reward_config.components(grade, [])
    return float(comps["outcome"] + comps["partial"])


def rag_hedging(split: str, n: int) -> dict[str, Any]:
    """Mean reward of the four strategies over the first ``n`` questions of ``split``."""
    env = marft_envs.make("rag-solo-v0", split=split)
    task = env.task
    kb = KnowledgeBase.generate(seed=0, split=split, n_people=40, distractors=1, hops=(1, 2, 3))
    sums = {"one random candidate": 0.0, "all candidates": 0.0, "gold + one other": 0.0, "gold alone": 0.0}
    counted = {k: 0 for k in sums}
    gold_in = 0
    for i in range(min(n, len(task))):
        problem = task.get(i)
        gold = problem.answer
        kind = kb.entities[gold]["type"]
        shown = " ".join(f"{d.title} {d.text}" for d in task.docs_for("generator", [], problem, []))
        cands = sorted(e for e, v in kb.entities.items() if v["type"] == kind and e in shown)
        if not cands:
            continue
        gold_in += gold in cands

        def score(answer: str, problem: Any = problem) -> float:
            return _reward(env, task.grade(f"Answer: {answer}", problem))

        sums["one random candidate"] += sum(score(c) for c in cands) / len(cands)
        sums["all candidates"] += score(", ".join(cands))
        sums["gold alone"] += score(gold)
        for k in ("one random candidate", "all candidates", "gold alone"):
            counted[k] += 1
        others = [c for c in cands if c != gold]
        if others:
            sums["gold + one other"] += score(f"{gold}, {others[0]}")
            counted["gold + one other"] += 1
    out = {k: round(sums[k] / counted[k], 4) if counted[k] else None for k in sums}
    out.update({"questions": counted["all candidates"], "gold_among_candidates": gold_in})
    return out


def _opening_guess(case: Any) -> str:
    """The zero-question guess: a candidate with the opening as a core, else optional, symptom."""
    for part in (0, 1):
        for c in case.candidates:
            if case.opening in CONDITIONS[c][part]:
                return c
    return case.candidates[0]


def doctor_zero_question(split: str, n: int) -> dict[str, Any]:
    """Accuracy of the opening-matching policy that asks no question, over ``n`` cases."""
    env = marft_envs.make("dialogue-doctor-v0", split=split)
    right = shared = 0
    for i in range(n):
        env.reset(options={"problem_index": i})
        case = env.case
        shared += all(case.opening in sum(CONDITIONS[c], ()) for c in case.candidates)
        env.step(f"DIAGNOSIS: {_opening_guess(case)}")
        right += bool(env.infos["doctor"]["grade"]["correct"])
    k = len(env.case.candidates)
    return {"cases": n, "accuracy": round(right / n, 4), "chance": round(1 / k, 4),
            "all_candidates_explain_opening": round(shared / n, 4)}


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print (and with ``--out`` write) the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rag-n", type=int, default=100_000, help="questions per split (RAG; default: all)")
    ap.add_argument("--doctor-n", type=int, default=2000, help="cases per split (doctor)")
    ap.add_argument("--out", default=None, help="folder for reward_baselines.md / .json")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"rag": {}, "doctor": {}}
    lines = ["| RAG split | questions | one random candidate | all candidates | gold + one other | gold alone |",
             "|---|---|---|---|---|---|"]
    for split in ("train", "test"):
        r = rag_hedging(split, args.rag_n)
        results["rag"][split] = r
        lines.append(f"| {split} | {r['questions']} | {r['one random candidate']} | {r['all candidates']} | "
                     f"{r['gold + one other']} | {r['gold alone']} |")
    lines += ["", "| doctor split | cases | zero-question accuracy | chance | all candidates explain the opening |",
              "|---|---|---|---|---|"]
    for split in ("train", "test"):
        d = doctor_zero_question(split, args.doctor_n)
        results["doctor"][split] = d
        lines.append(f"| {split} | {d['cases']} | {d['accuracy']} | {d['chance']} | {d['all_candidates_explain_opening']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "reward_baselines.md").write_text(table + "\n", encoding="utf-8")
        (out / "reward_baselines.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
