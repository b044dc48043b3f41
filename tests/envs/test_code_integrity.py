"""Code rewards cannot be earned without solving (issue 20, High 1b).

Tests of some HumanEval problems call helpers from the prompt; the helpers the
checker uses must be the prompt's, never the program's. And no test may take any
other name from the program than its entry point.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import symtable
from pathlib import Path

import pytest

from marft_envs.tasks.code import (
    HumanEvalTask,
    _he_units,
    _mbpp_entry,
    load_humaneval,
    prompt_helpers,
)

ATTACKS = {
    # problem index: a response that redefines the helper the tests call
    32: "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n",
    38: "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    50: "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
}


@pytest.mark.parametrize("index", sorted(ATTACKS))
def test_redefined_prompt_helper_scores_zero(index: int) -> None:
    """Before the fix each of these scored 1.0: the tests called the program's helper."""
    task = HumanEvalTask(timeout=20)
    problem = task.get(index)
    assert task.grade(problem.answer, problem).correct  # control
    res = task.grade("```python\n" + ATTACKS[index] + "```", problem)
    assert res.score == 0.0 and not res.correct, res.details.get("tests")


def _free_globals(source: str) -> set[str]:
    """Global names ``source`` reads but never binds at module level."""
    top = symtable.symtable(source, "<tests>", "exec")
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    read: set[str] = set()
    todo = [top]
    while todo:
        t = todo.pop()
        for s in t.get_symbols():
            if s.is_referenced() and (t is top or s.is_global()):
                read.add(s.get_name())
        todo += t.get_children()
    return read - bound - set(vars(builtins))


def test_humaneval_tests_take_only_the_entry_point_from_the_program() -> None:
    """For all 164 problems: what the checker's setup and units read and do not define
    themselves is at most ``candidate`` and the entry point."""
    offenders = {}
    for i, row in enumerate(load_humaneval()):
        setup, units = _he_units(i)
        free = _free_globals(setup + "\n" + "\n".join(units))
        extra = free - {"candidate", row["entry_point"]}
        if extra:
            offenders[i] = sorted(extra)
    assert offenders == {}, offenders


def test_canonical_solutions_pass_with_only_the_entry_point_exported() -> None:
    """Run each problem's checker setup and units in-process with nothing from the
    program but ``candidate`` (and the entry point by name): every canonical solution passes, so no test needs
    another of the program's names (and helpers come from the prompt)."""
    failures = {}
    for i, row in enumerate(load_humaneval()):
        program: dict = {}
        exec(row["prompt"] + row["canonical_solution"], program)
        # HumanEval/33 also calls its entry point by name: that is the candidate too.
        ns = {"candidate": program[row["entry_point"]],
              row["entry_point"]: program[row["entry_point"]]}
        setup, units = _he_units(i)
        try:
            exec(setup, ns)
            for unit in units:
                exec(unit, ns)
        except Exception as e:  # noqa: BLE001 - collected and reported
            failures[i] = f"{type(e).__name__}: {e}"
    assert failures == {}, failures


def test_prompt_helpers_keep_helpers_and_imports_but_not_the_entry_point() -> None:
    row = load_humaneval()[32]
    src = prompt_helpers(row["prompt"], "find_zero")
    names = {n.name for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)}
    assert names == {"poly"} and "import math" in src
    assert prompt_helpers("def f(x):\n    '''doc'''\n", "f") == ""
    assert prompt_helpers("def broken(:\n", "f") == ""


def _mbpp_rows() -> list[dict]:
    root = os.environ.get("MARFT_DATA_DIR")
    rows = []
    for split in ("train", "test", "validation", "prompt"):
        path = Path(root or "/nonexistent") / "mbpp" / f"{split}.jsonl"
        if path.is_file():
            rows += [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    return rows


def test_mbpp_tests_take_only_the_entry_point_from_the_program() -> None:
    """MBPP has no prompt code: a test may read only the entry point (and names its own
    ``test_setup_code`` defines) from the program. Problems whose tests use more (a
    class the solution must define, a second function) are listed here on purpose."""
    rows = _mbpp_rows()
    if not rows:
        pytest.skip("no MBPP files under $MARFT_DATA_DIR/mbpp (the check needs the data)")
    extra_names = {}
    for row in rows:
        units = list(row.get("test_list") or []) + list(row.get("challenge_test_list") or [])
        free = _free_globals((row.get("test_setup_code") or "") + "\n" + "\n".join(units))
        extra = free - {_mbpp_entry(row)}
        if extra:
            extra_names[row.get("task_id")] = sorted(extra)
    print(f"MBPP problems whose tests read other program names: {extra_names}")
    assert all(isinstance(k, int) for k in extra_names)
