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


def test_math_test_split_gold_agrees_with_math500(data_dir: Path) -> None:
    """MathTask("test") takes its gold from the solution's last box. MATH-500 gives an
    independently curated ``answer`` for 500 of the same problems (joined by problem
    text): the task's gold and that answer must grade equal both ways, and through
    the task's own ``grade`` the independent answer must score correct."""
    task = MathTask("test", data_dir=data_dir)
    problems = [task.get(i) for i in range(len(task))]
    by_text = {p.question.strip(): p for p in problems}
    rows = _read(data_dir / "math" / "test500.jsonl")
    joined = [(by_text[r["problem"].strip()], r["answer"]) for r in rows
              if r["problem"].strip() in by_text]
    assert len(joined) == 500, "every MATH-500 problem is a MATH test problem"
    pairs = [(rf"\boxed{{{p.answer}}}", answer) for p, answer in joined]
    pairs += [(rf"The answer is $\boxed{{{answer}}}$.", p.answer) for p, answer in joined]
    t0 = time.monotonic()
    results = V.grade_many(pairs, task="math")
    wrong = _report("MATH test gold vs MATH-500 answer (both ways)", results,
                    time.monotonic() - t0)
    assert not wrong, [pairs[i] for i in wrong[:20]]
    for p, answer in joined[::50]:  # the training code path, problem object and all
        assert task.grade(rf"So the answer is $\boxed{{{answer}}}$.", p).correct, (p.id, answer)


def test_math_test_split_gold_restated_and_swapped(data_dir: Path) -> None:
    """All 5000 MATH test golds restated without a box must grade correct; a solution
    graded against another problem's different integer gold must grade wrong (a grader
    that says yes to everything fails here, unlike a solution-vs-own-box check)."""
    task = MathTask("test", data_dir=data_dir)
    problems = [task.get(i) for i in range(len(task))]
    pairs = [(f"Putting it together, the final answer is ${p.answer}$.", p.answer)
             for p in problems]
    ints = [p for p in problems if re.fullmatch(r"-?\d+", p.answer)]
    assert len(ints) > 1000
    swapped = [(p.meta["solution"], q.answer) for p, q in zip(ints, ints[1:] + ints[:1], strict=True)
               if int(p.answer) != int(q.answer)]
    t0 = time.monotonic()
    results = V.grade_many(pairs + swapped, task="math")
    restated, crossed = results[:len(pairs)], results[len(pairs):]
    wrong = _report(f"MATH test golds restated ({len(pairs)})", restated, time.monotonic() - t0)
    assert not wrong, [pairs[i] for i in wrong[:20]]
    accepted = [swapped[i][1] for i, r in enumerate(crossed) if r.correct]
    print(f"swapped integer golds: {len(accepted)}/{len(swapped)} wrongly accepted")
    assert not accepted, accepted[:20]


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
