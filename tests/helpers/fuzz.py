"""The episode loop of the env fuzz tests."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from helpers.timing import MARGIN

__all__ = ["fuzz_steps"]


def fuzz_steps(env: Any, episode: Iterable[Any], max_iter: int) -> Iterator[tuple[str, Any]]:
    """Step a reset ``env`` with ``episode``'s actions (``""`` once they run out; a dead
    agent steps ``None``), yielding ``(agent, action)`` after each step. Every
    observation is in its space, every reward finite, and no step takes 20 s."""
    moves = iter(episode)
    for agent in env.agent_iter(max_iter):
        obs, reward, term, trunc, info = env.last()
        assert env.observation_space(agent).contains(obs)
        assert np.isfinite(reward)
        action = None if term or trunc else next(moves, "")
        start = time.monotonic()
        env.step(action)
        assert time.monotonic() - start < 20.0 + MARGIN, "a step hung"
        yield agent, action
