"""A tiny in-process model that can only answer one digit: a Nim player with an output prior.

Like ``tiny_echo``'s letter model: a frozen bias on the LM head leaves only the digits
``DIGITS`` possible, so with ``max_new_tokens=1`` every reply is a bare integer that
:func:`~marft_envs.games.nim.parse_take` reads as a move. What a trainer has to LEARN is
which number to take in which position.
"""

from __future__ import annotations

from torch import nn

from helpers.restricted import restricted_model

DIGITS = "123"
SAMPLING = {"player_0": {"max_new_tokens": 1}, "player_1": {"max_new_tokens": 1}}


def digit_model(seed: int = 0, digits: str = DIGITS) -> tuple[nn.Module, object]:
    """``build_tiny_model`` whose replies are restricted (by a frozen head bias) to ``digits``."""
    return restricted_model(digits, seed)


def digit_policy(seed: int = 0, digits: str = DIGITS, **kw):
    """A ``TeamPolicy`` for the Nim seats on :func:`digit_model`."""
    from marft_algos.models import TeamPolicy

    return TeamPolicy(["player_0", "player_1"], base=digit_model(seed, digits), **kw)
