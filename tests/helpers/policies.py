"""TeamPolicy set-ups shared by the policy and engine tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["perturb", "perturbed_policy"]


def perturb(policy: Any, scale: float = 0.1, seed: int = 0) -> None:
    """LoRA B starts at zero (adapter == base): make each adapter distinct."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for role in policy.roles:
            for p in policy.trainable_parameters(role):
                p.add_(torch.randn(p.shape, generator=g) * scale)


def perturbed_policy(roles: Sequence[str]) -> Any:
    """A ``TeamPolicy`` of ``roles`` on ``tiny-random`` (context 256), adapters perturbed."""
    from marft_algos.models import TeamPolicy

    policy = TeamPolicy(list(roles), base="tiny-random", max_context=256)
    perturb(policy)
    return policy
