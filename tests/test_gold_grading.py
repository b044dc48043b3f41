"""Gold tests on the real data: every reference solution must grade correct.

A gold answer graded wrong would be a silent reward bug (the reference
implementation scored 6-33% of correct answers as wrong), so these assertions
are exact: all items, no allow-list. Grading runs through the same worker
pool as training (``grade_many``); accuracy and time are printed (``-s``).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from marft_envs import verifiers as V
from marft_envs.tasks.gsm8k import GSM8KTask
from marft_envs.tasks.math import MathTask


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _report(label: str, results: list, seconds: float) -> list[int]:
    wrong = [i for i, r in enumerate(results) if not r.correct]
    timeouts = sum(r.timed_out for r in results)
    errors = sum(r.error is not None for r in results)
    worst = max((r.details.get("seconds", 0.0) for r in results), default=0.0)
    acc = 1 - len(wrong) / max(1, len(results))
    print(
        f"\n{label}: {len(results) - len(wrong)}/{len(results)} correct ({acc:.2%}), "
        f"{timeouts} timeouts, {errors} errors, {seconds:.1f}s total, slowest call {worst:.2f}s"
    )
    return wrong


def test_math500_solution_box_matches_answer_field(data_dir: Path) -> None:
    rows = _read(data_dir / "math" / "test500.jsonl")
    assert len(rows) == 500
    t0 = time.monotonic()
    results = V.grade_many([(r["solution"], r["answer"]) for r in rows], task="math")
    wrong = _report("MATH-500 solution vs answer", results, time.monotonic() - t0)
    assert not wrong, [(i, results[i].extracted, rows[i]["answer"]) for i in wrong[:20]]


def test_math500_answer_in_other_forms(data_dir: Path) -> None:
    """The answer restated as a model would (phrase, no box; ``\\dfrac``; ``a/b``;
    a decimal): exercises extraction, normalization and math-verify, not just
    string identity."""
    rows = _read(data_dir / "math" / "test500.jsonl")
    pairs: list[tuple[str, str]] = []
    for r in rows:
        a = r["answer"]
        pairs.append((f"Putting it together, the final answer is ${a}$.", a))
        pairs.append(
            (rf"So we get $\boxed{{{a.replace(chr(92) + 'frac', chr(92) + 'dfrac')}}}$", a)
        )
        m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", a)
        if m:
            sign, num, den = m.groups()
            pairs.append((rf"\boxed{{{sign}{num}/{den}}}", a))
            value = int(num) / int(den)
            if V.normalize_number(f"{num}/{den}") and "/" not in V.normalize_number(f"{num}/{den}"):
                pairs.append((rf"\boxed{{{sign}{V.normalize_number(f'{num}/{den}')}}}", a))
            assert value > 0
    t0 = time.monotonic()
    results = V.grade_many(pairs, task="math")
    wrong = _report(
        f"MATH-500 answers restated ({len(pairs)} forms)", results, time.monotonic() - t0
    )
    assert not wrong, [(pairs[i], results[i].details) for i in wrong[:20]]


def test_math500_answers_parse_and_verify_with_math_verify_alone(data_dir: Path) -> None:
    """math-verify alone (no string/numeric shortcut) must accept every MATH-500
    answer against its own normalized form: it is the check that decides every
    answer written differently from the gold."""
    from concurrent.futures import ThreadPoolExecutor

    from marft_envs.verifiers.graders import _run_hook
    from marft_envs.verifiers.mathcore import normalize_latex

    rows = _read(data_dir / "math" / "test500.jsonl")

    def one(row: dict) -> object:
        reply = rf"\boxed{{{row['answer']}}}"
        return _run_hook("math", reply, normalize_latex(row["answer"]), 20_000, ("math_verify",))

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(one, rows))
    wrong = _report("MATH-500 via math-verify only", results, time.monotonic() - t0)
    assert not wrong, [rows[i]["answer"] for i in wrong[:20]]


def test_gsm8k_test_gold_answers(data_dir: Path) -> None:
    rows = _read(data_dir / "gsm8k" / "test.jsonl")
    assert len(rows) == 1319
    pairs: list[tuple[str, str]] = []
    for r in rows:
        written = r["answer"].rsplit("####", 1)[1].strip()  # as written, e.g. "1,600"
        pairs.append((r["answer"], r["answer"]))  # the full worked solution, gold = full field
        pairs.append((f"The answer is {written}.", V.extract_gsm8k_gold(r["answer"])))
        pairs.append((rf"Step by step... so the total is $\boxed{{{written}}}$.", written))
    t0 = time.monotonic()
    results = V.grade_many(pairs, task="gsm8k")
    wrong = _report(f"GSM8K test gold ({len(pairs)} forms of 1319)", results, time.monotonic() - t0)
    assert not wrong, [(pairs[i], results[i].extracted) for i in wrong[:20]]


def test_math_test_split_gold_via_task(data_dir: Path) -> None:
    """Every MATH test problem: the task's gold answer vs the full reference solution."""
    task = MathTask("test", data_dir=data_dir)
    problems = [task.get(i) for i in range(len(task))]
    t0 = time.monotonic()
    results = V.grade_many([(p.meta["solution"], p.answer) for p in problems], task="math")
    wrong = _report("MATH test (5000) solution vs task gold", results, time.monotonic() - t0)
    assert not wrong, [
        (problems[i].id, results[i].extracted, problems[i].answer) for i in wrong[:20]
    ]


def test_gsm8k_task_grades_its_own_solutions(data_dir: Path) -> None:
    task = GSM8KTask("test", data_dir=data_dir)
    for i in (0, 1, 500, len(task) - 1):
        p = task.get(i)
        assert task.grade(p.meta["solution"], p).correct
        assert not task.grade("The answer is 123456789.", p).correct


@pytest.mark.parametrize("split", ["train"])
def test_gsm8k_train_gold_answers_parse(data_dir: Path, split: str) -> None:
    """All 7473 train gold answers normalize to a number (no grading needed)."""
    task = GSM8KTask(split, data_dir=data_dir)
    bad = [i for i in range(len(task)) if V.normalize_number(task.get(i).answer) is None]
    assert not bad
