"""The task contract: what an environment asks of a problem source and its grader.

A task is the single-agent part of an environment: it yields problems and grades
an answer. Teams, turn order (the dependency function) and rewards live in the
environment, so any task can be played by any team.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Problem:
    """One problem instance.

    Attributes:
        id: stable identifier (e.g. ``"gsm8k/test/17"``), used for grouping and logs.
        question: the task observation shown to every agent.
        answer: the gold answer in the form the task's grader expects.
        meta: free-form, JSON-safe extras (level, subject, tests, ...).
    """

    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class GradeResult:
    """The outcome of grading one response.

    ``correct`` is the outcome term; ``score`` is partial credit in [0, 1]
    (equal to ``float(correct)`` for binary tasks). ``timed_out`` and ``error``
    are set when the grader could not finish: such a response is graded wrong
    and the condition is counted, never hidden.
    """

    correct: bool
    score: float = 0.0
    extracted: str | None = None
    format_ok: bool = False
    timed_out: bool = False
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A source of problems plus a grader.

    Subclasses set ``name`` and ``instructions`` (appended to the answering
    agent's view, e.g. "put the final answer in \\boxed{}") and implement
    ``__len__``, ``get``, ``grade``. Procedural tasks may return a very large
    ``__len__`` and build problem ``i`` from ``i`` deterministically.
    """

    name: str = "task"
    instructions: str = ""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def get(self, index: int) -> Problem:
        """Problem number ``index`` (0 <= index < len(self)); deterministic."""

    def sample(self, rng: np.random.Generator) -> Problem:
        """A problem drawn with ``rng`` (the env's seeded generator)."""
        return self.get(int(rng.integers(len(self))))

    @abstractmethod
    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Grade ``response`` against ``problem``. Never raises, never hangs."""
