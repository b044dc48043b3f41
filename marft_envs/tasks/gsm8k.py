"""GSM8K grade-school math word problems (Cobbe et al., 2021) as a :class:`Task`.

| property    | value                                                        |
| ----------- | ------------------------------------------------------------ |
| splits      | ``train`` (7473), ``test`` (1319)                            |
| gold answer | the number after ``####`` in the worked solution, normalized |
| grader      | :func:`marft_envs.verifiers.grade_gsm8k_result` (exact value)|
| data        | ``data_dir`` / ``$MARFT_DATA_DIR`` / Hub ``openai/gsm8k``    |
| demos       | the worked solution; its ``<<48/2=24>>`` calculator annotations become ``calculator`` calls |

The task holds only its settings; rows come from the per-process cache of
:func:`marft_envs.data.load_split`, so it pickles small and re-creating it is cheap.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from ..data import load_split
from ..tools.calculator import CalculatorError, calculate
from ..verifiers import extract_gsm8k_gold, grade_gsm8k_result
from ..verifiers.graders import DEFAULT_TIMEOUT
from .base import DatasetTask, GradeResult, Problem, demo_seat

__all__ = ["GSM8KTask", "calculator_segments", "worked_solution"]

# GSM8K marks each computation of a worked solution for a calculator: ``48/2 = <<48/2=24>>24``
_ANNOTATION = re.compile(r"<<([^<>]*?)=([^<>]*)>>")


def _body(solution: str) -> str:
    return solution.rpartition("####")[0] if "####" in solution else solution


def worked_solution(solution: str) -> str:
    """A GSM8K worked solution as a reader sees it: without the ``<<expr=result>>``
    calculator annotations and the ``#### answer`` line."""
    return _ANNOTATION.sub("", _body(solution)).strip()


def _reproduces(expression: str, result: str) -> bool:
    """Whether the calculator tool evaluates ``expression`` to the number ``result``."""
    try:
        got, want = float(calculate(expression)), float(result.replace(",", ""))
    except (CalculatorError, ValueError, OverflowError):
        return False
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)


def calculator_segments(solution: str, calls: int) -> list[tuple[str, str | None]]:
    """The worked solution cut at its first ``calls`` annotations that the calculator
    reproduces: ``[(text, expression), ..., (rest, None)]``.

    Each text ends where its annotation stood (``"Natalia sold 48/2 = "``) and the next one
    begins with the annotated result (``"24 clips in May. ..."``), as a model continues after
    the tool's reply; the other annotations are dropped as in :func:`worked_solution`."""
    body, pieces, start = _body(solution), [], 0
    for m in _ANNOTATION.finditer(body):
        if len(pieces) == calls:
            break
        if _reproduces(m.group(1), m.group(2)):
            pieces.append((_ANNOTATION.sub("", body[start : m.start()]).strip(), m.group(1).strip()))
            start = m.end()
    return [*pieces, (_ANNOTATION.sub("", body[start:]).strip(), None)]


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

    def demo_action(self, env: Any, agent: str) -> str | None:
        """A scripted demonstration for ``agent`` of ``env`` (SFT warm starts, docs/sft.md),
        from the problem's worked solution.

        An agent with the ``calculator`` tool that sees no teammate solves with it: the
        solution up to each annotated computation, then a call on it (at most its call budget;
        the result comes back from the tool), then the rest and ``The answer is \\boxed{x}.``
        One that sees a teammate checks the final computation with one call, then answers.
        Otherwise an answering agent writes the worked solution and the answer line (only the
        answer line when it sees a teammate), and any other agent the worked solution."""
        problem = getattr(env, "problem", None)
        if problem is None:
            return None
        solution = str(problem.meta.get("solution") or "")
        answer = f"The answer is \\boxed{{{problem.answer}}}."
        seat = demo_seat(env, agent)
        call = lambda expr: env.tool_loop.parser.example("calculator", {"expression": expr})  # noqa: E731
        if "calculator" in seat.tools and not seat.sees_teammates:
            pieces = calculator_segments(solution, seat.budget)
            text, expr = pieces[min(seat.calls, len(pieces) - 1)]
            return f"{text}\n{call(expr) if expr is not None else answer}".strip()
        if "calculator" in seat.tools and not seat.calls:
            last = _ANNOTATION.findall(_body(solution))[-1:]
            if last and _reproduces(last[0][0], problem.answer):
                return call(last[0][0].strip())
        if not seat.answers:
            return worked_solution(solution)
        return answer if seat.sees_teammates else f"{worked_solution(solution)}\n{answer}".strip()

    def __repr__(self) -> str:
        return f"GSM8KTask(split={self.split!r}, n={len(self)})"
