"""A tiny in-process model whose replies are restricted to a few one-token strings.

The tiny random model speaks bytes; a random byte sequence is almost never a valid
answer, so a team would never see a reward. Like an instruction-tuned model that
already answers in the requested format, the test model gets a fixed output prior: a
frozen bias on its LM head that leaves only the ``allowed`` tokens possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from marft_envs.tasks.base import Problem

__all__ = ["TWO_TOKENS", "TWO_TOKEN_PROBLEMS", "restricted_model", "two_token_policy"]

#: The replies a :func:`two_token_policy` can give, and problems whose answers they are.
TWO_TOKENS = ("1", "2")
TWO_TOKEN_PROBLEMS = [Problem(f"toy/{k}", q, a) for k, (q, a) in enumerate(
    [("What is 0 + 1?", "1"), ("What is 1 + 1?", "2"), ("What is 3 - 2?", "1"), ("What is 4 - 2?", "2")])]


def restricted_model(allowed: Iterable[str], seed: int = 0) -> tuple[nn.Module, object]:
    """``build_tiny_model(seed)`` whose LM head has a frozen bias leaving only ``allowed``."""
    from marft_algos.models import build_tiny_model

    model, tok = build_tiny_model(seed=seed)
    head = model.lm_head
    biased = nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.fill_(-30.0)
        for c in allowed:
            biased.bias[tok.convert_tokens_to_ids(c)] = 0.0
    biased.requires_grad_(False)
    model.lm_head = biased
    return model, tok


def two_token_policy(roles: Sequence[str], **policy_options: Any) -> Any:
    """A ``TeamPolicy`` over ``roles`` on the tiny model restricted to ``1`` and ``2``.

    The two tokens' head rows are brought close, so that both replies are likely in every
    context (a GRPO group whose samples all agree cancels its own gradient) but still
    learnable: a one-token reply to :data:`TWO_TOKEN_PROBLEMS` is right about half the time.
    """
    from marft_algos.models import TeamPolicy

    model, tok = restricted_model(TWO_TOKENS)
    with torch.no_grad():
        one, two = (tok.convert_tokens_to_ids(c) for c in TWO_TOKENS)
        weight = model.lm_head.weight
        weight[two] = weight[one] + 0.05 * (weight[two] - weight[one])
    return TeamPolicy(list(roles), base=(model, tok), **policy_options)
