"""Composable team rewards.

The team reward of a graded turn is a weighted sum of components, each reported
separately in ``info["reward_components"]``:

============  ===================================================  =======
component     value                                                weight
============  ===================================================  =======
``outcome``   ``outcome * correct`` (binary)                       1.0
``format``    ``format * format_ok`` (an answer could be extracted) 0.0
``partial``   ``partial * score`` (partial credit in [0, 1])        0.0
``chars``     ``-cost_per_char * characters in the turn's actions`` 0.0
``tokens``    ``-cost_per_token * approx. tokens in the actions``   0.0
``turn``      ``-cost_per_turn`` (every graded turn)                0.0
============  ===================================================  =======

Costs are given as non-negative numbers and enter the reward negated. Tokens
are approximated as words and punctuation marks (the env has no tokenizer);
trainers that need exact token costs can compute them from ``reward_components``
with their own tokenizer. Configure per env id (registry ``kwargs``) or at
``make(id, reward={...})``; unknown keys are rejected with the list of valid ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from marft_envs.configs import check_weights, config_from_any
from marft_envs.tasks.base import GradeResult

__all__ = ["RewardConfig", "approx_tokens"]

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """Words plus punctuation marks: a tokenizer-free stand-in for a token count."""
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward components (see the module docstring)."""

    outcome: float = 1.0
    format: float = 0.0
    partial: float = 0.0
    cost_per_char: float = 0.0
    cost_per_token: float = 0.0
    cost_per_turn: float = 0.0

    def __post_init__(self) -> None:
        check_weights(self, "reward")

    @classmethod
    def from_any(cls, value: RewardConfig | Mapping[str, Any] | None) -> RewardConfig:
        """Accept a config, a dict of weights (unknown keys rejected) or ``None`` (defaults)."""
        return config_from_any(cls, value, name="reward", expected="a dict of weights or a RewardConfig")

    def to_dict(self) -> dict[str, float]:
        """The weights as a plain dict (JSON-safe, e.g. for run configs)."""
        return asdict(self)

    def components(self, grade: GradeResult, actions: Sequence[str]) -> dict[str, float]:
        """Every component's value for one graded turn (``actions``: all actions of the turn)."""
        chars = sum(len(a) for a in actions)
        tokens = sum(approx_tokens(a) for a in actions) if self.cost_per_token else 0
        score = grade.score if isinstance(grade.score, (int, float)) and math.isfinite(grade.score) else 0.0
        return {
            "outcome": self.outcome * float(bool(grade.correct)),
            "format": self.format * float(bool(grade.format_ok)),
            "partial": self.partial * min(max(float(score), 0.0), 1.0),
            # "+ 0.0" turns -0.0 (a zero cost) into 0.0
            "chars": -(self.cost_per_char * chars) + 0.0,
            "tokens": -(self.cost_per_token * tokens) + 0.0,
            "turn": -self.cost_per_turn + 0.0,
        }

    @staticmethod
    def total(components: Mapping[str, float]) -> float:
        """The team reward: the sum of the components (``+ 0.0`` turns -0.0 into 0.0)."""
        return float(sum(components.values())) + 0.0
