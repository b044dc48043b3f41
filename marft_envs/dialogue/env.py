"""The doctor dialogue env: one trained agent questions a simulated patient, then diagnoses.

See the package docstring (:mod:`marft_envs.dialogue`) for the docs page.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from marft_envs.dialogue.cases import Case, generate_case, load_cases
from marft_envs.dialogue.respondent import Respondent, ScriptedRespondent
from marft_envs.games.base import TextGameEnv, last_tagged
from marft_envs.tasks.base import GradeResult

__all__ = ["DoctorDialogueEnv", "grade_diagnosis", "parse_diagnosis"]

_CASE_SOURCES = ("procedural", "symptom_to_diagnosis")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9 ]", " ", text.lower())).strip()


def parse_diagnosis(text: str) -> str | None:
    """The text after the last ``DIAGNOSIS:`` (case-insensitive), or None when there is none.

    Example:
        >>> parse_diagnosis("Any fever?"), parse_diagnosis("OK. DIAGNOSIS: Influenza.")
        (None, 'Influenza.')
    """
    return last_tagged(text, "DIAGNOSIS")


def grade_diagnosis(diagnosis: str | None, case: Case) -> GradeResult:
    """Correct iff the diagnosis names exactly one candidate and it is the case's condition.

    ``details["flags"]``: ``no_diagnosis``, ``unknown_diagnosis`` (no candidate named) or
    ``ambiguous_diagnosis`` (several named).

    Example:
        >>> from marft_envs.dialogue.cases import generate_case
        >>> case = generate_case(0)
        >>> grade_diagnosis(f"probably {case.condition}", case).correct
        True
    """
    if diagnosis is None or not diagnosis.strip():
        return GradeResult(correct=False, details={"flags": ["no_diagnosis"], "expected": case.condition})
    said = f" {_norm(diagnosis)} "
    named = [c for c in case.candidates if f" {_norm(c)} " in said]
    if len(named) > 1:  # "flu" inside "influenza" cannot happen: whole words only
        named = [c for c in named if not any(c != o and _norm(c) in _norm(o) for o in named)]
    flags = [] if len(named) == 1 else (["unknown_diagnosis"] if not named else ["ambiguous_diagnosis"])
    chosen = named[0] if len(named) == 1 else None
    correct = chosen == case.condition
    return GradeResult(correct=correct, score=float(correct), extracted=chosen, format_ok=chosen is not None,
                       details={"flags": flags, "expected": case.condition})


def _resolve_respondent(respondent: Any) -> Respondent:
    if respondent is None or respondent == "scripted":
        return ScriptedRespondent()
    if isinstance(respondent, str):
        if respondent.count(":") != 1:
            raise ValueError(f"respondent must be 'scripted', 'module:callable' or a callable, got {respondent!r}")
        module, attr = respondent.split(":")
        obj = getattr(importlib.import_module(module), attr)
        respondent = obj() if isinstance(obj, type) else obj
    if not callable(respondent):
        raise TypeError(f"respondent must be callable(question, case, history) -> str, got {type(respondent).__name__}")
    return respondent


class DoctorDialogueEnv(TextGameEnv):
    """A doctor questions a simulated patient holding a hidden case card (see the package docstring)."""

    metadata = {**TextGameEnv.metadata, "name": "dialogue_doctor_v0"}
    game_agents = ("doctor",)
    default_profiles = "doctor"

    def __init__(self, *, cases: str = "procedural", cases_path: str | None = None, data_dir: str | None = None,
                 n_candidates: int = 4, noise: float = 0.3, confusable: bool = True, max_turns: int = 6,
                 turn_cost: float = 0.05, respondent: Any = "scripted", **kwargs: Any):
        if cases not in _CASE_SOURCES:
            raise ValueError(f"cases must be one of {_CASE_SOURCES}, got {cases!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, (int, np.integer)) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if not (isinstance(turn_cost, (int, float)) and np.isfinite(turn_cost) and turn_cost >= 0):
            raise ValueError(f"turn_cost must be a finite number >= 0, got {turn_cost!r}")
        split = kwargs.get("split", "train")
        self.case_source = cases
        self.case_kwargs = {"n_candidates": n_candidates, "noise": noise, "confusable": confusable}
        generate_case(0, "train", **self.case_kwargs)  # validate the knobs now, not at reset
        self._cases: list[Case] | None = None
        if cases == "symptom_to_diagnosis" or cases_path:
            self._cases = load_cases(split, path=cases_path, data_dir=data_dir,
                                     n_candidates=n_candidates if n_candidates else None)
        self.max_turns = int(max_turns)
        self.turn_cost = float(turn_cost)
        self.respondent = _resolve_respondent(respondent)
        self._matcher = ScriptedRespondent()
        self.case: Case | None = None
        self.dialogue: list[tuple[str, str]] = []
        self.elicited: list[str] = []
        self.statuses: list[str] = []
        super().__init__(horizon=self.max_turns, **kwargs)

    @property
    def num_problems(self) -> int:
        """Cases addressable by ``problem_index`` (the loaded file's size, or 100000 procedural ones)."""
        return len(self._cases) if self._cases is not None else super().num_problems

    def _start(self, rng: np.random.Generator, options: Mapping[str, Any]) -> None:
        k = int(self.problem_index or 0)
        if self._cases is not None:
            self.case = self._cases[k % len(self._cases)]
        else:
            self.case = generate_case(k, self.split, **self.case_kwargs)
        self.dialogue = []
        self.elicited = []
        self.statuses = []

    def rules(self, agent: str) -> str:
        """The task, the candidate conditions and the answer syntax."""
        assert self.case is not None
        return (
            f"Find the patient's condition. Ask one question per turn (at most {self.max_turns}; "
            f"each costs {self.turn_cost:g}; a correct diagnosis earns 1). Conditions: "
            f"{', '.join(self.case.candidates)}. To finish, reply 'DIAGNOSIS: <condition>'."
        )

    def state_text(self, agent: str) -> str:
        """The patient's opening words and the dialogue so far."""
        assert self.case is not None
        lines = [f"Patient: Hello doctor. {self.case.facts[self.case.opening].rstrip('.')}."]
        for q, a in self.dialogue:
            lines += [f"Doctor: {q}", f"Patient: {a}"]
        left = self.max_turns - len(self.dialogue)
        lines.append(f"({left} question(s) left.)" if left else "(No questions left: give your diagnosis now.)")
        return "\n".join(lines)

    def legal_moves(self, agent: str) -> list[str]:
        """One ``DIAGNOSIS: <c>`` per candidate plus a few generic questions (for random players)."""
        assert self.case is not None
        return [f"DIAGNOSIS: {c}" for c in self.case.candidates] + ["Do you have a fever?", "Do you cough?"]

    @property
    def facts_available(self) -> int:
        """Card facts the doctor can elicit (the opening complaint is given, so it does not count)."""
        return max(0, len(self.case.facts) - 1) if self.case else 0

    def metrics(self) -> dict[str, Any]:
        """Information-gathering metrics of the dialogue so far."""
        n = self.facts_available
        return {
            "questions": len(self.dialogue),
            "facts_elicited": len(self.elicited),
            "facts_available": n,
            "elicited_fraction": len(self.elicited) / n if n else 0.0,
            "negatives": self.statuses.count("negative"),
            "unanswered": self.statuses.count("unknown") + self.statuses.count("empty"),
            "repeated": self.statuses.count("repeat"),
        }

    def _play(self, agent: str, text: str, flags: list[str]) -> dict[str, Any]:
        assert self.case is not None
        diagnosis = parse_diagnosis(text)
        if diagnosis is None and len(self.dialogue) < self.max_turns:
            return self._ask(text, flags)
        grade = grade_diagnosis(diagnosis, self.case)
        flags += list(grade.details.get("flags", []))
        self._finish(grade, truncated=diagnosis is None)
        return {}

    def _ask(self, question: str, flags: list[str]) -> dict[str, Any]:
        assert self.case is not None
        key = self._matcher.match(question, self.case) if question.strip() else None
        try:
            reply = str(self.respondent(question, self.case, list(self.dialogue)))
        except Exception as e:  # a plugged-in respondent failed: the turn is spent, flagged
            reply, flags[:] = DONT_KNOW_FALLBACK, [*flags, f"respondent_error:{type(e).__name__}"]
        _, _, status = self._matcher.answer(question, self.case)
        if status == "fact":
            if key in self.elicited or key == self.case.opening:  # the opening fact is given
                status = "repeat"
            else:
                self.elicited.append(key)  # type: ignore[arg-type]
        self.statuses.append(status)
        self.dialogue.append((question, reply))
        self.moves.append(("doctor", question))
        self.turn += 1
        return {"reply": reply, "asked_about": key, "answer_status": status, **self.metrics()}

    def _finish(self, grade: GradeResult, *, truncated: bool) -> None:
        assert self.case is not None
        agent = self.possible_agents[0]
        components = {"outcome": 1.0 if grade.correct else 0.0, "turn_cost": -self.turn_cost * len(self.dialogue)}
        total = float(sum(components.values()))
        self.game_over = True
        self.rewards[agent] = total
        self.payoffs[agent] = total
        self.infos[agent] = {
            "turn": self.turn,
            "flags": [] if not truncated else ["no_diagnosis"],
            "team_reward": total,
            "reward_components": components,
            "attribution": {agent: 1.0},
            "grade": dataclasses.asdict(grade),
            "outcome": "win" if grade.correct else "loss",
            "case_id": self.case.id,
            **self.metrics(),
        }
        self.terminations[agent] = not truncated
        self.truncations[agent] = truncated
        self._deads_step_first()


DONT_KNOW_FALLBACK = "I don't know."
