"""Shared prompt prefixes: compute a prefix once for every row that starts with it.

The rows of one step share long prompt prefixes: a GRPO group is G copies of one
prompt, and every agent's prompt starts with its system prompt and the problem text
before the (row-specific) actions of its predecessors. Running the shared prefix once
and continuing each row from its key/value cache gives the same log-probs (the same
attention inputs; only float summation order differs) for a fraction of the tokens.

:func:`plan_prefixes` groups rows into clusters with a common prefix;
:func:`two_stage_forward` runs the prefix per cluster, then each row's suffix on the
cluster's cache: for prefills in the ``hf`` generation engine
(:mod:`marft_algos.engines.hf`) and for training log-probs in
:meth:`~marft_algos.models.policy.TeamPolicy.sequence_logprobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PrefixPlan", "left_pad", "plan_prefixes", "two_stage_forward"]


def left_pad(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as one left-padded batch ``(ids [B, W], attention_mask [B, W])``.

    >>> ids, mask = left_pad([[5, 6], [7]], pad=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, x in enumerate(seqs):
        if len(x):
            ids[i, width - len(x) :] = torch.as_tensor(list(x), dtype=torch.long)
            mask[i, width - len(x) :] = 1
    return ids, mask


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class PrefixPlan:
    """Rows grouped by a shared prefix.

    Attributes:
        cluster_of: cluster index of each row.
        prefix_len: shared prefix length of each cluster (>= 1; every row of the cluster
            starts with it and has at least one token after it).
        first_row: a row of each cluster (its prompt holds the prefix tokens).
    """

    cluster_of: list[int]
    prefix_len: list[int]
    first_row: list[int]

    @property
    def num_clusters(self) -> int:
        """Number of clusters (rows of the prefix forward)."""
        return len(self.prefix_len)

    def tokens(self, prompts: Sequence[Sequence[int]]) -> int:
        """Prompt tokens run under this plan (prefixes once, then every suffix)."""
        return sum(self.prefix_len) + sum(len(p) - self.prefix_len[c] for p, c in zip(prompts, self.cluster_of, strict=True))

    def prefix_batch(self, prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prefixes ``(ids [C, L], attention_mask [C, L])``."""
        return left_pad([prompts[row][:n] for row, n in zip(self.first_row, self.prefix_len, strict=True)], pad)

    def suffix_batch(self, prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt suffixes after each row's prefix ``(ids [B, S], mask [B, S])``."""
        return left_pad([p[self.prefix_len[c] :] for p, c in zip(prompts, self.cluster_of, strict=True)], pad)


def plan_prefixes(
    prompts: Sequence[Sequence[int]],
    keys: Sequence[Hashable] | None = None,
    *,
    min_shared: int = 16,
    min_saving: float = 0.2,
) -> PrefixPlan | None:
    """Group rows that share a prompt prefix of at least ``min_shared`` tokens.

    Rows sort by ``(key, prompt)``; consecutive rows with the same key (e.g. the adapter:
    different adapters give different caches) and a common prefix of ``min_shared`` or
    more tokens join a cluster, whose prefix is the longest one common to all its rows,
    shortened so every row keeps at least one token after it (that token's logits
    predict the first response token). A row with no partner is a cluster of its own
    (its prompt minus the last token is its prefix), so no token runs twice.

    Returns None when the plan would save less than ``min_saving`` of the prompt tokens
    (two forwards are not worth it) or some prompt is shorter than 2 tokens.

    >>> plan = plan_prefixes([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8, 7], [5, 6]], min_shared=3)
    >>> plan.cluster_of, plan.prefix_len
    ([0, 0, 1], [4, 1])
    >>> plan.tokens([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8, 7], [5, 6]])  # 13 tokens without sharing
    9
    """
    n = len(prompts)
    if n < 2 or any(len(p) < 2 for p in prompts):
        return None
    keys = list(keys) if keys is not None else [None] * n
    order = sorted(range(n), key=lambda i: (repr(keys[i]), list(prompts[i])))
    groups: list[list[int]] = [[order[0]]]
    for prev, cur in zip(order, order[1:], strict=False):
        same = keys[prev] == keys[cur] and _lcp(prompts[prev], prompts[cur]) >= min_shared
        if same:
            groups[-1].append(cur)
        else:
            groups.append([cur])
    cluster_of = [0] * n
    prefix_len: list[int] = []
    first_row: list[int] = []
    for c, rows in enumerate(groups):
        # sorted order: the prefix common to all rows is the one of the first and last
        common = _lcp(prompts[rows[0]], prompts[rows[-1]])
        prefix_len.append(min(common, min(len(prompts[r]) for r in rows) - 1))
        first_row.append(rows[0])
        for r in rows:
            cluster_of[r] = c
    plan = PrefixPlan(cluster_of, prefix_len, first_row)
    total = sum(len(p) for p in prompts)
    if total - plan.tokens(prompts) < min_saving * total:
        return None
    return plan


def two_stage_forward(
    run: Callable[..., Any],
    cache: Any,
    prompts: Sequence[Sequence[int]],
    plan: PrefixPlan,
    cluster_adapters: list[str | None],
    row_adapters: list[str | None],
    pad: int,
    device: torch.device,
    tail_ids: torch.Tensor | None = None,
    tail_mask: torch.Tensor | None = None,
    keep: int = 1,
) -> tuple[Any, torch.Tensor]:
    """Prefixes once per cluster, then each row's suffix (+ ``tail``) on their cache.

    ``run(ids=, mask=, position=, adapters=, keep=)`` is one forward that extends
    ``cache``. Returns the second forward's output and the attention mask of the
    whole row (prefix, suffix, tail) for a continued decode.
    """
    pid, pmask = plan.prefix_batch(prompts, pad)
    pid, pmask = pid.to(device), pmask.to(device)
    run(ids=pid, mask=pmask, position=(pmask.cumsum(-1) - 1).clamp_min(0), adapters=cluster_adapters, keep=1)
    rows = torch.tensor(plan.cluster_of, dtype=torch.long, device=device)
    cache.batch_select_indices(rows)
    sid, smask = plan.suffix_batch(prompts, pad)
    cur, cur_mask = sid.to(device), smask.to(device)
    if tail_ids is not None and tail_mask is not None:
        cur, cur_mask = torch.cat([cur, tail_ids], 1), torch.cat([cur_mask, tail_mask], 1)
    full = torch.cat([pmask[rows], cur_mask], 1)
    position = (full.cumsum(-1) - 1).clamp_min(0)[:, pid.shape[1] :]
    out = run(ids=cur, mask=full, position=position, adapters=row_adapters, keep=keep)
    return out, full
