"""GSM8K grade-school math word problems (Cobbe et al., 2021) as a :class:`Task`.

| property    | value                                                        |
| ----------- | ------------------------------------------------------------ |
| splits      | ``train`` (7473), ``test`` (1319)                            |
| gold answer | the number after ``####`` in the worked solution, normalized |
| grader      | :func:`marft_envs.verifiers.grade_gsm8k_result` (exact value)|
| data        | ``data_dir`` / ``$MARFT_DATA_DIR`` / Hub ``openai/gsm8k``    |

The task holds only its settings; rows come from the per-process cache of
:func:`marft_envs.data.load_split`, so it pickles small and re-creating it is cheap.
"""

from __future__ import annotations

import os
from typing import Any

from ..data import load_split
from ..verifiers import extract_gsm8k_gold, grade_gsm8k_result
from ..verifiers.graders import DEFAULT_TIMEOUT
from .base import DatasetTask, GradeResult, Problem

__all__ = ["GSM8KTask"]


class GSM8KTask(DatasetTask):
    """GSM8K problems; ``Problem.answer`` is the gold number (``"1600"``), ``meta["solution"]``
    the reference worked solution."""

    name = "gsm8k"
    instructions = (
        "Solve the problem step by step. Put your final answer (a number) within \\boxed{}."
    )

    def __init__(
        self,
        split: str = "train",
        data_dir: str | os.PathLike[str] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if split not in ("train", "test"):
            raise ValueError(f"GSM8K split must be 'train' or 'test', not {split!r}")
        self._set_source(split, data_dir)
        self.timeout = float(timeout)
        _ = self.rows  # load (or hit the cache) now: fail early on missing data

    def load_rows(self) -> list[dict[str, Any]]:
        """The split's rows from :func:`marft_envs.data.load_split`."""
        return load_split("gsm8k", self.split, self.data_dir)

    def get(self, index: int) -> Problem:
        """Problem ``index``; the answer is the number after ``####``, the solution is in meta."""
        index = self._checked_index(index)
        row = self.rows[index]
        return Problem(
            id=f"gsm8k/{self.split}/{index}",
            question=row["question"],
            answer=extract_gsm8k_gold(row["answer"]),
            meta={"solution": row["answer"], "split": self.split, "index": index},
        )

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Numeric equality with the gold, in a worker process with a hard timeout."""
        return grade_gsm8k_result(response, problem.answer, timeout=self.timeout)

    def __repr__(self) -> str:
        return f"GSM8KTask(split={self.split!r}, n={len(self)})"
