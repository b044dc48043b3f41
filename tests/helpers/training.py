"""Training-loop helpers shared by the learning tests."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["assert_learns_from_chance", "train_until_learned"]


def train_until_learned(t: Any, max_steps: int, target: float) -> list[float]:
    """Step until the mean accuracy of the last 3 steps reaches ``target`` (or max_steps)."""
    acc: list[float] = []
    for _ in range(max_steps):
        acc.append(t.train_step()["team/accuracy"])
        if len(acc) >= 3 and np.mean(acc[-3:]) >= target:
            break
    return acc


def assert_learns_from_chance(t: Any, chance: float, max_steps: int = 30, target: float = 0.8) -> list[float]:
    """Train ``t`` (:func:`train_until_learned`): it must start near ``chance`` and reach ``target``."""
    acc = train_until_learned(t, max_steps=max_steps, target=target)
    assert acc[0] <= chance + 0.2, acc  # the untrained team (the batch before any update) is near chance
    assert np.mean(acc[-3:]) >= target >= chance + 0.6, acc
    return acc
