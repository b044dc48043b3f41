"""Micro-batches: one minibatch's forward and backward in pieces, one optimizer step.

A training forward keeps every layer's activations for the backward, so its memory grows
with rows x padded length: one minibatch of 31 ReMA actions of ~280 tokens took 16 GB
with SmolLM2-135M. ``TrainConfig.micro_batch_tokens`` caps the padded tokens of one
forward (verl's ``ppo_max_token_len_per_gpu``, TRL's ``gradient_accumulation_steps``):
the trainer runs the pieces one after the other, scales each piece's loss by its share of
the minibatch's loss units (response tokens for a per-token mean, else actions: the same
weights that data-parallel ranks use, :func:`marft_algos.distributed.minibatch_weight`)
and accumulates the gradients before the one optimizer step. The gradient is the
whole minibatch's up to float summation order wherever the loss is a mean over those
units (the PPO surrogate, a per-token KL or entropy term with ``loss_agg="token"``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

__all__ = ["micro_batch_rows"]


def micro_batch_rows(lengths: Sequence[int], cap: int, groups: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Split rows into runs whose padded size ``rows x longest`` stays within ``cap`` tokens.

    ``lengths`` are the rows' prompt + response lengths, in minibatch order. ``groups``
    (optional) keeps rows with the same key in one piece (an action's tool segments share one
    importance ratio); a group is placed whole, in the order of its first row. A row or group
    longer than ``cap`` on its own gets a piece of its own (it cannot be split). ``cap <= 0``
    means no cap: one piece.

    Example:
        >>> micro_batch_rows([10, 10, 10, 30], cap=40)
        [[0, 1, 2], [3]]
        >>> micro_batch_rows([5, 5, 5], cap=10, groups=["a", "b", "a"])
        [[0, 2], [1]]
    """
    rows = list(range(len(lengths)))
    if not rows:
        return []
    if cap <= 0:
        return [rows]
    units: dict[Any, list[int]] = {}
    for i in rows:
        units.setdefault(groups[i] if groups is not None else i, []).append(i)
    pieces: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for unit in units.values():
        width = max(lengths[i] for i in unit)
        if current and (len(current) + len(unit)) * max(longest, width) > cap:
            pieces.append(current)
            current, longest = [], 0
        current += unit
        longest = max(longest, width)
    pieces.append(current)
    return pieces
