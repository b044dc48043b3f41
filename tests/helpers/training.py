"""Training-loop helpers shared by the learning tests."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["train_until_learned"]


def train_until_learned(t: Any, max_steps: int, target: float) -> list[float]:
    """Step until the mean accuracy of the last 3 steps reaches ``target`` (or max_steps)."""
    acc: list[float] = []
    for _ in range(max_steps):
        acc.append(t.train_step()["team/accuracy"])
        if len(acc) >= 3 and np.mean(acc[-3:]) >= target:
            break
    return acc
