"""Rewards that a policy could game without solving the task (issue 27, items 2 and 3).

* RAG: plain answer F1 paid hedging (the gold plus a wrong entity earned 0.67, a wrong
  single guess 0; listing every candidate of the shown documents beat naming one).
* Doctor dialogue: a doctor that never asked and named the only candidate whose symptoms
  include the opening complaint was right ~0.8 of the time with 4 candidates.

Both are checked on the real generators, through ``benchmarks/reward_baselines.py`` (the
script that reports the figures in docs/rag.md and docs/dialogue.md).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marft_envs
from marft_envs.tasks.base import Problem
from marft_envs.tasks.rag import PARTIAL_CREDIT, RAGTask, answer_reward

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reward_baselines.py"


@pytest.fixture(scope="module")
def baselines() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reward_baselines", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ RAG
_RAG_ENV = marft_envs.make("rag-solo-v0")
_RESERVED = {"a", "an", "the", "and", "or"}  # articles vanish in normalisation; and/or separate
_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=8).filter(lambda w: w not in _RESERVED)
_name = st.lists(_word, min_size=1, max_size=3).map(lambda ws: " ".join(w.capitalize() for w in ws))
_SEPARATORS = [", ", "; ", " and ", " or ", " / ", " & ", ",", " | "]  # the answer is one line


def _reward(answer: str, gold: str) -> float:
    """The registered env's reward for ``Answer: <answer>`` (outcome + partial, no costs)."""
    problem = Problem(id="p", question="q?", answer=gold, meta={"answers": [gold]})
    grade = _RAG_ENV.task.grade(f"Answer: {answer}", problem)
    comps = _RAG_ENV.reward_config.components(grade, [])
    return comps["outcome"] + comps["partial"]


def _norm(name: str) -> str:
    return " ".join(name.lower().split())


@settings(max_examples=300, deadline=None)
@given(gold=_name, others=st.lists(_name, min_size=1, max_size=6), seps=st.data(), at=st.data())
def test_committing_to_the_gold_beats_every_hedge(gold, others, seps, at):
    """For any list holding the gold plus k >= 1 other answers: reward(gold alone) > reward(list),
    and the list earns no more than naming one of its entries at random (in expectation)."""
    others = [o for o in others if _norm(o) != _norm(gold)]
    if not others:
        return
    entries = list(others)
    entries.insert(at.draw(st.integers(0, len(others))), gold)
    text = entries[0]
    for e in entries[1:]:
        text += seps.draw(st.sampled_from(_SEPARATORS)) + e
    hedge = _reward(text, gold)
    assert _reward(gold, gold) == 1.0 > hedge
    assert hedge <= PARTIAL_CREDIT / len(entries) + 1e-12
    random_pick = sum(_reward(e, gold) for e in entries) / len(entries)
    assert hedge < random_pick  # before the fix: "Mira Kalven, Dax Stone" 0.67 > 0.5


@settings(max_examples=200, deadline=None)
@given(gold=_name, others=st.lists(_name, min_size=1, max_size=6))
def test_a_list_without_separators_does_not_pay_either(gold, others):
    """Names run together ("Mira Kalven Dax Stone") cannot be split; F1 prices them, and with
    PARTIAL_CREDIT <= 1/2 the gold among n names of its length scores below 1/n."""
    size = len(gold.split())
    others = [o for o in others if len(o.split()) == size and _norm(o) != _norm(gold)]
    if not others:
        return
    entries = [gold, *others]
    hedge = _reward(" ".join(entries), gold)
    assert hedge < 1.0 / len(entries)


def test_rag_reward_closed_forms():
    assert answer_reward("Mira Kalven", ["Mira Kalven"]) == 1.0
    assert answer_reward("Mira Kalven, Dax Stone", ["Mira Kalven"]) == pytest.approx(0.25)
    assert answer_reward("Dax Kalven", ["Mira Kalven"]) == pytest.approx(0.25)  # half of F1 0.5
    assert answer_reward("yes or no", ["yes"]) == pytest.approx(0.25)
    # a separator inside the gold itself does not split the prediction
    assert answer_reward("AC/DC band", ["AC/DC"]) == pytest.approx(PARTIAL_CREDIT * 2 / 3)
    assert answer_reward("Procter and Gamble Company", ["Procter and Gamble"]) == pytest.approx(PARTIAL_CREDIT * 6 / 7)
    assert answer_reward("1,000", ["1000"]) == 1.0  # a comma between digits is not a list
    grade = RAGTask(limit=1).grade("Answer: X, B, C", Problem(id="p", question="q", answer="B", meta={}))
    assert grade.details["answers"] == 3 and grade.details["f1"] == pytest.approx(0.5) and not grade.correct


def test_listing_every_candidate_does_not_beat_one_random_candidate(baselines):
    """On the real task generator (the offline KB, both worlds): before the fix 'all candidates'
    earned 0.23 and 'one random candidate' 0.16 (train)."""
    for split in ("train", "test"):
        r = baselines.rag_hedging(split, 120)
        assert r["questions"] >= 100 and r["gold_among_candidates"] >= 50
        assert r["all candidates"] < r["one random candidate"], r
        assert r["gold + one other"] < 0.5 < r["gold alone"] == 1.0, r


# ------------------------------------------------------------------------------ doctor
def test_doctor_zero_question_policy_is_at_chance(baselines):
    """The doctor that asks nothing and names the candidate listing the opening complaint
    (core first) is right 1 / n_candidates of the time, on the real case generator, over
    2000 cases per split (before the fix: 0.78 / 0.78 with 4 candidates)."""
    for split in ("train", "test"):
        d = baselines.doctor_zero_question(split, 2000)
        sd = math.sqrt(d["chance"] * (1 - d["chance"]) / d["cases"])
        assert abs(d["accuracy"] - d["chance"]) < 4 * sd, d
        assert d["all_candidates_explain_opening"] == 1.0, d


def test_doctor_posterior_is_uniform_for_any_opening_and_candidates():
    """Given what the doctor sees before asking (opening, candidates), the condition is
    spread evenly over the candidates: no zero-question rule beats chance."""
    from collections import Counter, defaultdict

    from marft_envs.dialogue import generate_case

    by_view: dict[tuple, Counter] = defaultdict(Counter)
    for k in range(6000):
        case = generate_case(k, n_candidates=2)
        by_view[(case.opening, case.candidates)][case.condition] += 1
    best = sum(max(c.values()) for c in by_view.values()) / 6000  # the best rule per view, in hindsight
    assert best < 0.5 + 0.06  # chance is 0.5; the in-hindsight max adds a little noise
