"""benchmarks/rag.py's F1 column is answer F1 (``details["f1"]``), not the graded reward score (issue 27)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import marft_envs
from tests.helpers.bench import load_benchmark
from tests.helpers.scripted import CharPolicy

REPO = Path(__file__).resolve().parents[2]


def _rag_bench():
    return load_benchmark("rag", "_bench_rag_f1")


class Hedger(CharPolicy):
    """Names the gold entity plus a wrong one: F1 2/3, the hedge-penalised score far less."""

    eos = True

    def __init__(self, golds: dict[str, str]) -> None:
        self.golds = golds

    def say(self, role: str, prompt: str) -> str:
        gold = next(a for q, a in self.golds.items() if q in prompt)
        return f"Answer: {gold}, Zorblax Quentin"


def test_f1_column_reads_answer_f1_not_the_graded_score() -> None:
    env = marft_envs.make("rag-solo-v0", split="test")
    golds = {}
    for i in range(2):
        env.reset(options={"problem_index": i})
        golds[env.problem.question] = env.problem.answer
    args = argparse.Namespace(eval_n=2, max_new_tokens=32, eval_batch=2, seed=0)
    team, _ = _rag_bench().evaluate(Hedger(golds), "rag-solo-v0", "scripted", args, {}, 0, 0.0)
    assert team["em"] == 0.0
    assert team["f1"] == pytest.approx(2 / 3, abs=1e-5)  # the graded score of this hedge is 1/2 * 1 / 2 = 0.25
    assert team["f1_lo"] <= team["f1"] <= team["f1_hi"]
