"""Token log-probs and entropies from the LM head in chunks, recomputed in the backward pass.

A training forward of ``B`` rows of ``T`` response tokens materialises ``[B, T, vocab]``
logits, their log-softmax and the entropy terms: with SmolLM2's 49k vocabulary, 16 rows of
256 tokens are ~0.8 GB per copy, several copies at once, and as many again in the backward.
Under activation checkpointing (the decoder layers keep only their inputs) that is most of
a training step's peak. Here the model's output embedding hands back its input (the final
hidden states), and the head runs over chunks of tokens under ``torch.utils.checkpoint``:
only the hidden states are kept, and one chunk's vocab-sized tensors exist at a time, in the
forward and in the backward. The price is one more head matmul per chunk in the backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["token_stats", "supports_chunked_head", "hidden_instead_of_logits", "chunked_head_stats", "CHUNK_ELEMENTS"]

#: vocab-sized elements per chunk (128 MB in fp32): 682 tokens of a 49k vocabulary
CHUNK_ELEMENTS = 1 << 25


def token_stats(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0, entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log p(target), entropy)`` per position of ``softmax(logits / temperature)`` (fp32);
    ``entropy_grad=False`` computes the entropies without a graph (a metric, not a loss term)."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    with contextlib.nullcontext() if entropy_grad else torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[..., None]).squeeze(-1), entropy


def supports_chunked_head(model: Any) -> bool:
    """True when the logits are exactly ``output_embeddings(hidden)``: a plain linear head and
    no logit soft-capping or scaling after it (Gemma 2, Cohere): those models keep the full path."""
    head = model.get_output_embeddings()
    cfg = getattr(model, "config", None)
    post = any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in ("final_logit_softcapping", "logit_scale"))
    return type(head) is nn.Linear and not post


class _Passthrough(nn.Module):
    """Stands in for the output embedding: returns the hidden states it is given."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


@contextlib.contextmanager
def hidden_instead_of_logits(model: Any) -> Iterator[nn.Linear]:
    """Inside this block the model's ``logits`` are its final hidden states; yields the real head."""
    head = model.get_output_embeddings()
    model.set_output_embeddings(_Passthrough())
    try:
        yield head
    finally:
        model.set_output_embeddings(head)


def chunked_head_stats(
    head: nn.Linear,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    entropy_grad: bool = True,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log p(target), entropy)`` of ``softmax(head(hidden) / temperature)`` per token.

    ``hidden``: ``[B, T, H]``; ``targets``: ``[B, T]``. Each chunk of tokens is a checkpoint:
    its logits are recomputed in the backward pass rather than kept.
    """
    b, t, h = hidden.shape
    flat, flat_targets = hidden.reshape(b * t, h), targets.reshape(b * t)
    step = max(1, chunk_elements // head.out_features)

    def stats(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return token_stats(head(x), y, temperature=temperature, entropy_grad=entropy_grad)

    grad = torch.is_grad_enabled()
    parts = [
        checkpoint(stats, flat[i : i + step], flat_targets[i : i + step], use_reentrant=False) if grad else stats(flat[i : i + step], flat_targets[i : i + step])
        for i in range(0, b * t, step)
    ]
    logp = torch.cat([p[0] for p in parts]).reshape(b, t)
    entropy = torch.cat([p[1] for p in parts]).reshape(b, t)
    return logp, entropy
