"""MATH competition problems (Hendrycks et al., 2021) and MATH-500 as a :class:`Task`.

| property    | value                                                              |
| ----------- | ------------------------------------------------------------------ |
| splits      | ``train`` (7500), ``test`` (5000), ``test500`` (MATH-500)          |
| filters     | ``levels`` (1-5), ``subjects`` ("Algebra" or "algebra", ...)       |
| gold answer | the last ``\\boxed{}`` of the solution (``answer`` for test500)    |
| dropped     | rows with no gold answer (2 train rows with an empty ``\\boxed{}``) |
| grader      | :func:`marft_envs.verifiers.grade_math_result` (math-verify+sympy) |
| data        | ``data_dir`` / ``$MARFT_DATA_DIR`` / Hub ``EleutherAI/hendrycks_math``, ``HuggingFaceH4/MATH-500`` |

About 0.3% of MATH solutions box several different values (multi-part
answers, or an intermediate result boxed first); the gold is the LAST box,
as in the reference implementation and MATH-500.

Problem ids keep the index in the unfiltered split (``math/test/17``), so ids
are stable whatever the filters.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from ..data import load_split
from ..verifiers import extract_boxed, grade_math_result
from ..verifiers.graders import DEFAULT_TIMEOUT
from .base import DatasetTask, GradeResult, Problem, demo_seat

__all__ = ["MathTask"]

_SPLITS = ("train", "test", "test500")
# (id(rows), levels, subjects) -> (rows, kept row numbers); rows held to pin the id.
_INDEX_CACHE: dict[tuple[Any, ...], tuple[list[dict[str, Any]], list[int]]] = {}


def _subject_key(name: str) -> str:
    """ "Counting & Probability" == "counting_and_probability" == "counting-and-probability"."""
    return re.sub(r"[^a-z]+", "_", name.lower().replace("&", "and")).strip("_")


def _gold(row: dict[str, Any]) -> str:
    """The gold final answer: MATH-500's ``answer`` field, else the solution's last box."""
    answer = row.get("answer")
    if answer:
        return str(answer)
    return extract_boxed(row.get("solution", "")) or ""


def _level(value: Any) -> int | None:
    m = re.search(r"\d+", str(value))
    return int(m.group(0)) if m else None


class MathTask(DatasetTask):
    """MATH problems; ``Problem.answer`` is the gold final answer (LaTeX)."""

    _transient = ("_rows", "_index")

    name = "math"
    instructions = "Solve the problem step by step. Put your final answer within \\boxed{}."

    def __init__(
        self,
        split: str = "train",
        data_dir: str | os.PathLike[str] | None = None,
        levels: Iterable[int] | None = None,
        subjects: Iterable[str] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if split not in _SPLITS:
            raise ValueError(f"MATH split must be one of {_SPLITS}, not {split!r}")
        self._set_source(split, data_dir)
        self.levels = None if levels is None else tuple(sorted({int(v) for v in levels}))
        self.subjects = (
            None if subjects is None else tuple(sorted({_subject_key(s) for s in subjects}))
        )
        self.timeout = float(timeout)
        self._index: list[int] | None = None
        if not len(self):
            raise ValueError(f"no MATH {split} problems match levels={levels} subjects={subjects}")

    def load_rows(self) -> list[dict[str, Any]]:
        """The split's rows from :func:`marft_envs.data.load_split` (unfiltered)."""
        return load_split("math", self.split, self.data_dir)

    @property
    def index(self) -> list[int]:
        """Row numbers (in the unfiltered split) of the problems that pass the filters."""
        if self._index is None:
            # Cached per process (keyed by the loaded rows): re-creating a task is O(1).
            key = (id(self.rows), self.levels, self.subjects)
            cached = _INDEX_CACHE.get(key)
            if cached is not None and cached[0] is self.rows:
                self._index = cached[1]
                return self._index
            keep = []
            for i, row in enumerate(self.rows):
                if self.levels is not None and _level(row.get("level")) not in self.levels:
                    continue
                subject = row.get("subject") or row.get("type") or ""
                if self.subjects is not None and _subject_key(subject) not in self.subjects:
                    continue
                if not _gold(row):
                    continue  # 2 train rows have an empty \boxed{}: ungradable, dropped
                keep.append(i)
            self._index = keep
            _INDEX_CACHE[key] = (self.rows, keep)
        return self._index

    def __len__(self) -> int:
        return len(self.index)

    def get(self, index: int) -> Problem:
        """Problem ``index`` of the filtered split; the answer is the boxed gold."""
        index = self._checked_index(index)
        row_no = self.index[index]
        row = self.rows[row_no]
        solution = row.get("solution", "")
        answer = _gold(row)
        meta = {
            "split": self.split,
            "index": row_no,
            "level": _level(row.get("level")),
            "subject": row.get("subject") or row.get("type"),
            "solution": solution,
        }
        if row.get("unique_id"):
            meta["unique_id"] = row["unique_id"]
        return Problem(
            id=f"math/{self.split}/{row_no}", question=row["problem"], answer=answer, meta=meta
        )

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """math-verify (sympy fallback) equivalence with the gold, in a worker process
        with a hard timeout."""
        return grade_math_result(response, problem.answer, timeout=self.timeout)

    def demo_action(self, env: Any, agent: str) -> str | None:
        """A scripted demonstration for ``agent`` of ``env`` (SFT warm starts, docs/sft.md):
        the problem's reference solution (it ends with the boxed answer), or only
        ``\\boxed{answer}`` for an answering agent that sees a teammate; None for a row
        without a solution."""
        problem = getattr(env, "problem", None)
        solution = str(problem.meta.get("solution") or "") if problem is not None else ""
        if not solution:
            return None
        seat = demo_seat(env, agent)
        return f"\\boxed{{{problem.answer}}}" if seat.answers and seat.sees_teammates else solution

    def __repr__(self) -> str:
        return (
            f"MathTask(split={self.split!r}, levels={self.levels}, subjects={self.subjects}, "
            f"n={len(self)})"
        )
