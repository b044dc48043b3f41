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


@dataclass(frozen=True)
class DemoSeat:
    """Where ``agent`` stands in ``env`` this turn: what a task's scripted policy
    (``demo_action(env, agent)``, SFT warm starts) decides by.

    Attributes:
        tools: the agent's tool names.
        calls: tool calls it has made this turn (its earlier segments).
        budget: tool calls it may make per turn.
        answers: it writes the graded answer (its profile's ``with_answer``).
        sees_teammates: a teammate whose action it sees acted before it this turn.
    """

    tools: tuple[str, ...]
    calls: int
    budget: int
    answers: bool
    sees_teammates: bool


def demo_seat(env: Any, agent: str) -> DemoSeat:
    """``agent``'s :class:`DemoSeat` in ``env`` (a :class:`~marft_envs.text_env.TextTeamEnv`)."""
    loop = getattr(env, "tool_loop", None)
    tools = tuple(t.name for t in loop.tools.get(agent, ())) if loop is not None else ()
    calls = sum(m.get("role") == "tool" for m in loop.transcript(agent)) if tools else 0
    profile = env.team.profiles.get(agent)
    executed = list(env.executed)
    seen = bool(executed) and bool(env.team.topology.parents(agent, executed))
    return DemoSeat(tools, calls, loop.budget(agent) if tools else 0, bool(profile is not None and profile.with_answer), seen)


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


class DatasetTask(Task):
    """A task over the rows of a data set (GSM8K, MATH, HumanEval, MBPP).

    Subclasses implement :meth:`load_rows` (from the per-process cache of
    :mod:`marft_envs.data`) and ``get``/``grade``. The rows are loaded on first use and
    never pickled: a pickled task holds only its settings and reloads the rows (a cache
    hit) in the process that unpickles it. Attributes named in ``_transient`` are
    derived from the rows and dropped from pickles as well.
    """

    split: str = ""
    data_dir: str | None = None
    _rows: list[dict[str, Any]] | None = None
    #: Attributes recomputed after unpickling (set to None in the pickled state).
    _transient: tuple[str, ...] = ("_rows",)

    def _set_source(self, split: str, data_dir: Any) -> None:
        """Record ``split`` and ``data_dir`` (a path is kept as a string: pickles stay small)."""
        self.split = split
        self.data_dir = None if data_dir is None else str(data_dir)
        self._rows = None

    @abstractmethod
    def load_rows(self) -> list[dict[str, Any]]:
        """The split's rows (shared through the loader's cache: treat them read-only)."""

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The split's rows, loaded on first use."""
        if self._rows is None:
            self._rows = self.load_rows()
        return self._rows

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._transient:
            state[name] = None  # never pickle the data set; reload from the cache
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.rows)

    def _checked_index(self, index: int) -> int:
        """``index`` as an int, or an IndexError naming the valid range."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"problem index {index} out of range [0, {len(self)})")
        return index
