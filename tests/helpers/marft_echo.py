"""Shared set-up of the MARFT trainer tests: the echo env on a tiny model that prefers letters.

Unlike :mod:`helpers.tiny_echo` (whose head allows only the vocabulary letters), the letters
here get a finite logit bonus: other tokens stay possible, the team starts near the prior.
"""

from __future__ import annotations

import torch

from marft_algos.models import TeamPolicy, build_tiny_model

__all__ = ["AGENTS", "BARE", "ONE_TOKEN", "SHAPED", "VOCAB", "echo_kwargs", "letter_model", "letter_policy"]

VOCAB = ["a", "b", "c", "d"]
# unit tests: a format reward (listener said a vocabulary word) makes every batch carry signal,
# so "the weights moved" never depends on a lucky rollout; learning tests use the bare task
SHAPED = {"vocabulary": VOCAB, "reward": {"outcome": 1.0, "format": 0.5}}
BARE = {"vocabulary": VOCAB}
ONE_TOKEN = {"speaker": {"max_new_tokens": 1}, "listener": {"max_new_tokens": 1}}
AGENTS = ("speaker", "listener")


def letter_model(bias: float = 8.0, seed: int = 0, **model_kw):
    """Tiny random Llama whose lm_head adds ``bias`` to the logits of the vocabulary letters."""
    model, tok = build_tiny_model(seed=seed, **model_kw)
    head = model.lm_head
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.zero_()
        for w in VOCAB:
            new.bias[tok.convert_tokens_to_ids(w)] = bias
    model.lm_head = new
    return model, tok


def letter_policy(roles=AGENTS, bias: float = 8.0, seed: int = 0, **kw) -> TeamPolicy:
    """A team on one :func:`letter_model` (``kw``: TeamPolicy options, e.g. ``mode``)."""
    return TeamPolicy(list(roles), base=letter_model(bias, seed), seed=seed, **kw)


def echo_kwargs(**kw):
    """Config kwargs of a small echo-duo run (``kw`` overrides them)."""
    base = dict(
        env_id="echo-duo-v0",
        env_kwargs=SHAPED,
        model="tiny-random",
        num_envs=4,
        steps=2,
        progress=False,
        tensorboard=False,
        plot=False,
        sampling_overrides=ONE_TOKEN,
        lr=0.01,
        critic_lr=0.01,
        recovery=False,
    )
    base.update(kw)
    return base
