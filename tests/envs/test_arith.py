"""The procedural tasks: ArithTask and EchoTask."""

from __future__ import annotations

import pickle

import pytest
from helpers.timing import MARGIN

from marft_envs.tasks.arith import ArithTask, extract_final_number
from marft_envs.tasks.echo import EchoTask


def _expected(expr: str) -> int:
    return eval(expr)  # test oracle only: the expressions are digits and + - *


def test_default_level_is_enumerated_disjoint_and_complete():
    train, test = ArithTask("train"), ArithTask("test")
    assert len(train) + len(test) == 20_000  # 100 * 100 * 2 two-digit one-operator expressions
    train_q = {train.get(i).question for i in range(len(train))}
    test_q = {test.get(i).question for i in range(len(test))}
    assert len(train_q) == len(train) and len(test_q) == len(test)  # each problem exactly once
    assert not train_q & test_q
    ops = {train.get(i).meta["expression"].split()[1] for i in range(len(train))}
    assert ops == {"+", "-"}
    assert 0.2 < len(test) / 20_000 < 0.3


def test_easy_level_is_small_disjoint_and_complete():
    train, test = ArithTask("train", digits=1, ops="+-*"), ArithTask("test", digits=1, ops="+-*")
    assert len(train) + len(test) == 300  # 10 * 10 * 3 one-digit two-operand expressions
    train_q = {train.get(i).question for i in range(len(train))}
    test_q = {test.get(i).question for i in range(len(test))}
    assert len(train_q) == len(train) and len(test_q) == len(test)
    assert not train_q & test_q
    assert 0.15 < len(test) / 300 < 0.35


@pytest.mark.parametrize("kwargs", [{}, {"digits": 1, "ops": "+-*"}, {"digits": 2, "n_ops": 2, "ops": "+-*"}, {"digits": 3, "n_ops": 3, "ops": "+-"}, {"ops": "*"}])
def test_answers_follow_precedence_and_are_deterministic(kwargs):
    task = ArithTask("train", **kwargs)
    again = ArithTask("train", **kwargs)
    for i in range(0, min(len(task), 400), 7):
        p = task.get(i)
        assert p == again.get(i)
        assert int(p.answer) == _expected(p.meta["expression"])
        assert p.question == f"What is {p.meta['expression']}?"


def test_large_levels_are_disjoint_by_hash():
    train, test = ArithTask("train", digits=2, n_ops=2), ArithTask("test", digits=2, n_ops=2)
    assert len(train) == 10**9  # 100**3 * 2**2 expressions: drawn, not enumerated
    tr = {train.get(i).meta["expression"] for i in range(300)}
    te = {test.get(i).meta["expression"] for i in range(300)}
    assert not tr & te


def test_knobs_are_validated():
    for bad in ({"split": "val"}, {"digits": 0}, {"n_ops": 0}, {"ops": "/"}, {"test_fraction": 1.0}):
        with pytest.raises(ValueError):
            ArithTask(**bad)
    with pytest.raises(IndexError):
        ArithTask().get(len(ArithTask()))


@pytest.mark.parametrize(
    "response, extracted, correct",
    [
        ("\\boxed{48}", "48", True),
        ("8 * 6 = 48", "48", True),
        ("The answer is 48.", "48", True),
        ("\\boxed{48.0}", "48", True),
        ("\\boxed{ 4 8 }", "48", True),
        ("\\boxed{\\text{48}}", "48", True),
        ("48 is wrong, \\boxed{47}", "47", False),
        ("\\boxed{47} then 48", "47", False),  # a box beats a later bare number
        ("I think 48, no wait 49", "49", False),
        ("\\boxed{x}", None, False),
        ("no number at all", None, False),
        ("", None, False),
    ],
)
def test_grading(response, extracted, correct):
    task = ArithTask()
    problem = next(task.get(i) for i in range(len(task)) if task.get(i).answer == "48")
    g = task.grade(response, problem)
    assert (g.extracted, g.correct, g.score) == (extracted, correct, float(correct))
    assert g.format_ok == (extracted is not None)


def test_negative_answers():
    assert extract_final_number("so 3 - 5 = -2")[0] == "-2"
    assert extract_final_number("\\boxed{\u22122}") == ("-2", True)
    assert extract_final_number("3-5")[0] == "5"  # a minus between digits is an operator


def test_adversarial_grading_is_fast():
    import time

    task = ArithTask()
    p = task.get(0)
    for text in ["\\boxed{" * 100_000, "{" * 500_000, "1" * 1_000_000, "-" * 500_000, "\\boxed{1}" * 50_000, 123, None]:
        start = time.monotonic()
        g = task.grade(text, p)  # type: ignore[arg-type]
        assert time.monotonic() - start < MARGIN and isinstance(g.correct, bool)


def test_pickle_drops_the_cache():
    task = ArithTask()
    task.get(0)
    blob = pickle.dumps(task)
    assert len(blob) < 2000
    assert pickle.loads(blob).get(5) == task.get(5)


# --------------------------------------------------------------------------------- echo
def test_echo_task_known_values():
    task = EchoTask()
    assert len(task) == 24 and task.chance_level == 0.25
    p = task.get(3)
    assert all(w in p.question for w in task.vocabulary)
    assert task.grade_turn([("speaker", "Red"), ("listener", "red.")], "listener", p).correct
    assert not task.grade_turn([("speaker", "red"), ("listener", "blue")], "listener", p).correct
    assert not task.grade_turn([("speaker", "dog"), ("listener", "dog")], "listener", p).correct
    assert not task.grade_turn([], "listener", p).correct
    assert task.grade("green", p).correct and not task.grade("green light", p).correct


def test_echo_chance_level_matches_random_play():
    import numpy as np

    task = EchoTask()
    rng = np.random.default_rng(0)
    p = task.get(0)
    wins = sum(
        task.grade_turn([("s", rng.choice(task.vocabulary)), ("l", rng.choice(task.vocabulary))], "l", p).correct
        for _ in range(4000)
    )
    assert abs(wins / 4000 - task.chance_level) < 0.03


def test_echo_vocabulary_validation():
    with pytest.raises(ValueError):
        EchoTask(vocabulary=("one",))
    with pytest.raises(ValueError):
        EchoTask(vocabulary=("two words", "x"))
    assert len(EchoTask(vocabulary=("yes", "no"))) == 2
