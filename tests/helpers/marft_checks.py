"""Checks shared by the MARFT tests: the reference implementation's GAE loop, transcribed,
and the echo learning run of a MARFT trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["assert_learns_echo", "reference_action_gae"]


def reference_action_gae(r: np.ndarray, V: np.ndarray, masks: np.ndarray, g: float, lam: float):
    """The reference's loop, transcribed: r, V are [T, N]; V has a row T (next value); masks[T+1]."""
    T, N = r.shape
    adv, ret = np.zeros((T, N)), np.zeros((T, N))
    gae = 0.0
    for t in reversed(range(T)):
        for i in reversed(range(N)):
            if i == N - 1:
                delta = r[t, i] + g * V[t + 1, 0] * masks[t + 1] - V[t, i]
                gae = delta + g * lam * masks[t + 1] * gae
            else:
                delta = r[t, i] + g * V[t, i + 1] - V[t, i]
                gae = delta + g * lam * gae
            adv[t, i] = gae
            ret[t, i] = gae + V[t, i]
    return adv, ret


def assert_learns_echo(trainer_cls: type, config: Callable[..., Any]) -> None:
    """Team reward of ``trainer_cls`` on the bare echo task rises from chance (1/|V| = 0.25)
    to well above it in 16 steps (``config``: builds the config from keyword settings)."""
    from helpers.marft_echo import BARE, letter_policy  # the tiny models: only where a test trains

    torch.set_num_threads(2)
    # ~3 s of CPU per step on 2 idle cores; max_minutes only guards a badly overloaded machine
    cfg = config(env_kwargs=BARE, num_envs=16, steps=16, lr=0.02, seed=0, max_minutes=6.0)
    t = trainer_cls(cfg, policy=letter_policy())
    hist = t.train()
    rewards = [h["team/reward"] for h in hist]
    assert len(rewards) >= 12, f"only {len(rewards)} steps ran: machine overloaded"
    early, late = np.mean(rewards[:2]), np.mean(rewards[-4:])
    assert early < 0.45, rewards  # the untrained team is near chance
    assert late >= 0.7 and late >= early + 0.35, rewards
