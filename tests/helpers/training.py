"""Training-loop helpers shared by the learning tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from helpers.restricted import two_token_policy
from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

__all__ = ["assert_learns_from_chance", "train_until_learned", "grpo_two_steps"]


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


def grpo_two_steps(env_id: str, env_fn: Callable[[], Any], roles: Sequence[str], *, num_envs: int = 8,
                   **policy_options: Any) -> tuple[Any, list[dict[str, Any]], dict[str, bool]]:
    """Two GRPO steps of a :func:`helpers.restricted.two_token_policy` team on ``env_fn``'s env:
    ``(trainer, history, {role: whether its adapter changed})``."""
    sampling = {r: {"max_new_tokens": 1, "temperature": 1.0} for r in roles}
    config = GRPOConfig(env_id=env_id, model="tiny-random", num_envs=num_envs, group_size=4, steps=2, progress=False,
                        tensorboard=False, sampling_overrides=sampling, lr=0.05, seed=0)
    trainer = GRPOTrainer(config, policy=two_token_policy(roles, **policy_options), env_fn=env_fn)
    before = {r: [p.detach().clone() for p in trainer.policy.trainable_parameters(r)] for r in roles}
    history = trainer.train()
    changed = {r: any(not torch.equal(b, p) for b, p in zip(before[r], trainer.policy.trainable_parameters(r), strict=True))
               for r in roles}
    return trainer, history, changed
