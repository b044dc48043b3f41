"""The token layout shared by training forwards, the critic and decoding.

A batch of ``prompt + response`` rows is laid out the way the decode loop builds it:
prompts left-padded to a common width ``P``, responses right-padded to ``R`` after
them. Response token ``j`` of a row sits at column ``P + j`` and is predicted from
column ``P + j - 1``; position ids count real tokens only, so a row's positions do not
depend on how much padding its batch needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["Layout", "build_layout"]


class Layout(NamedTuple):
    """A left-padded prompt + right-padded response batch (unpacks like a tuple).

    Attributes:
        ids: ``[B, P+R]`` token ids (pad id in padding).
        attention_mask: ``[B, P+R]``, 1 on real tokens.
        position_ids: ``[B, P+R]``, the running count of real tokens minus one (0 on
            left padding).
        response: ``[B, R]`` response ids, left-aligned (0 past a response's end).
        response_mask: ``[B, R]`` float, 1 on response tokens (from lengths, so an EOS
            that equals the pad id stays in the mask).
        prompt_len: ``P``, the padded prompt width.
        response_len: ``R``, the longest response.
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response: torch.Tensor
    response_mask: torch.Tensor
    prompt_len: int
    response_len: int


def build_layout(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: str | torch.device = "cpu",
) -> Layout:
    """Lay out ``prompt_ids[i] + response_ids[i]`` rows as a :class:`Layout` on ``device``.

    >>> lay = build_layout([[5, 6], [7]], [[8], []], pad_id=0)
    >>> lay.ids.tolist(), lay.attention_mask.tolist(), lay.position_ids.tolist()
    ([[5, 6, 8], [0, 7, 0]], [[1, 1, 1], [0, 1, 0]], [[0, 1, 2], [0, 0, 0]])
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    n = len(prompt_ids)
    plen = max(len(p) for p in prompt_ids)
    rlen = max((len(r) for r in response_ids), default=0)
    ids = torch.full((n, plen + rlen), pad_id, dtype=torch.long)
    att = torch.zeros((n, plen + rlen), dtype=torch.long)
    resp = torch.zeros((n, rlen), dtype=torch.long)
    rmask = torch.zeros((n, rlen), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        ids[i, plen - len(p) : plen] = torch.as_tensor(list(p), dtype=torch.long)
        att[i, plen - len(p) : plen + len(r)] = 1
        if len(r):
            ids[i, plen : plen + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            resp[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            rmask[i, : len(r)] = 1.0  # from lengths: EOS == pad stays in the mask
    pos = (att.cumsum(-1) - 1).clamp_min(0)
    dev = torch.device(device)
    return Layout(ids.to(dev), att.to(dev), pos.to(dev), resp.to(dev), rmask.to(dev), plen, rlen)
