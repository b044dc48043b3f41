"""A tiny in-process model whose replies are restricted to a few one-token strings.

The tiny random model speaks bytes; a random byte sequence is almost never a valid
answer, so a team would never see a reward. Like an instruction-tuned model that
already answers in the requested format, the test model gets a fixed output prior: a
frozen bias on its LM head that leaves only the ``allowed`` tokens possible.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["restricted_model"]


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
