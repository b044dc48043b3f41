"""A tiny in-process model that can only answer one digit: a Nim player with an output prior.

Like ``tiny_echo``'s letter model: a frozen bias on the LM head leaves only the digits
``DIGITS`` possible, so with ``max_new_tokens=1`` every reply is a bare integer that
:func:`~marft_envs.games.nim.parse_take` reads as a move. What a trainer has to LEARN is
which number to take in which position.
"""

from __future__ import annotations

import torch
from torch import nn

DIGITS = "123"
SAMPLING = {"player_0": {"max_new_tokens": 1}, "player_1": {"max_new_tokens": 1}}


def digit_model(seed: int = 0, digits: str = DIGITS) -> tuple[nn.Module, object]:
    """``build_tiny_model`` whose replies are restricted (by a frozen head bias) to ``digits``."""
    from marft_algos.models import build_tiny_model

    model, tok = build_tiny_model(seed=seed)
    head = model.lm_head
    biased = nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.fill_(-30.0)
        for c in digits:
            biased.bias[tok.convert_tokens_to_ids(c)] = 0.0
    biased.requires_grad_(False)
    model.lm_head = biased
    return model, tok


def digit_policy(seed: int = 0, digits: str = DIGITS, **kw):
    """A ``TeamPolicy`` for the Nim seats on :func:`digit_model`."""
    from marft_algos.models import TeamPolicy

    return TeamPolicy(["player_0", "player_1"], base=digit_model(seed, digits), **kw)
