"""Loss terms and diagnostics shared by all trainers (pure torch functions).

Shapes: per-token quantities are ``[B, T]`` with a ``mask`` of the same shape (1 on real
response tokens, 0 on padding); per-action quantities are ``[B]`` (``mask=None``).
Padded positions may hold anything, even inf/NaN: they are selected away with
``torch.where`` (never multiplied by 0, since ``0 * inf = NaN``).

Contents
--------
- :func:`masked_sum`, :func:`masked_mean`
- :func:`action_logprob`: whole-action log-prob with sum | token | word normalisation
- :func:`ppo_policy_loss`: clipped surrogate with asymmetric clip (DAPO clip-higher)
- :func:`grouped_ratio_policy_loss`: the same surrogate with one ratio per sequence or per
  turn (ReMA's turn-level ratio: all segments of one action share it)
- :func:`value_loss`: symmetric Huber or MSE, optional PPO-style value clipping
- :func:`approx_kl` (k1 / k3), :func:`kl_to_reference` (k3, >= 0), :func:`entropy_bonus`
- :func:`regularize`: a policy loss plus its entropy bonus and KL penalty to the reference,
  with their metrics (every algorithm's policy term ends with it)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "action_logprob",
    "ppo_policy_loss",
    "grouped_ratio_policy_loss",
    "group_log_ratio",
    "truncated_is_weights",
    "huber",
    "value_loss",
    "approx_kl",
    "kl_to_reference",
    "entropy_bonus",
    "explained_variance",
    "regularize",
]

# exp() of a log-ratio above this overflows in fp16/bf16 and is meaningless anyway
_MAX_LOG_RATIO = 20.0


def _mask_like(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(x, dtype=torch.bool)
    return mask.to(device=x.device).bool().expand_as(x)


def masked_sum(x: torch.Tensor, mask: torch.Tensor | None, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """``sum(x * mask)`` over ``dim`` (all dims if None), ignoring whatever sits under mask = 0.

    Example (the padded 99 is ignored)::

        >>> masked_sum(torch.tensor([[1.0, 2.0, 99.0]]), torch.tensor([[1.0, 1.0, 0.0]])).item()
        3.0
    """
    m = _mask_like(x, mask)
    z = torch.where(m, x, torch.zeros_like(x))
    return z.sum() if dim is None else z.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """``sum(x * mask) / sum(mask)`` over ``dim``; an empty mask gives 0, not NaN.

    Example::

        >>> masked_mean(torch.tensor([[1.0, 2.0, 99.0]]), torch.tensor([[1.0, 1.0, 0.0]])).item()
        1.5
    """
    m = _mask_like(x, mask)
    total = masked_sum(x, m, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp_min(1).to(total.dtype)


def action_logprob(
    token_logp: torch.Tensor,
    mask: torch.Tensor,
    norm: str = "sum",
    n_words: torch.Tensor | list[int] | None = None,
) -> torch.Tensor:
    """Log-prob of whole actions from per-token log-probs ``[B, T]`` -> ``[B]``.

    ``norm`` (the reference implementation's three modes)::

        "sum":   log pi(a) = sum_j log pi(a_j | ...)           (the true action log-prob)
        "token": sum_j log pi(a_j | ...) / (number of tokens)  (per-token average)
        "word":  sum_j log pi(a_j | ...) / (number of words)   (n_words, e.g. len(text.split()))

    The action-level ratio is ``exp(action_logprob(new) - action_logprob(old))``: with
    "sum" a long action's ratio moves much more per update than a short one's; "token"
    and "word" temper that (a geometric mean per token / per word). Counts are clamped
    to >= 1 so an empty action gives 0, not NaN.

    Example: a 2-token action of 3 words::

        >>> lp, mask = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
        >>> [action_logprob(lp, mask, n).item() for n in ("sum", "token")], action_logprob(lp, mask, "word", n_words=[3]).item()
        ([-3.0, -1.5], -1.0)
    """
    total = masked_sum(token_logp, mask, dim=-1)
    if norm == "sum":
        return total
    if norm == "token":
        return total / _mask_like(token_logp, mask).sum(-1).clamp_min(1).to(total.dtype)
    if norm == "word":
        if n_words is None:
            raise ValueError("norm='word' needs n_words (words per action)")
        w = torch.as_tensor(n_words, dtype=total.dtype, device=total.device)
        return total / w.clamp_min(1)
    raise ValueError(f"norm must be 'sum', 'token' or 'word', got {norm!r}")


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher when eps_high > eps_low).

    ::

        rho  = exp(logp - old_logp)
        L_k  = max(-A_k * rho_k, -A_k * clip(rho_k, 1 - eps_low, 1 + eps_high))

    The clip is active (zero gradient) where ``A > 0 and rho > 1 + eps_high`` or
    ``A < 0 and rho < 1 - eps_low``. Aggregation over the masked entries:

    - ``agg="token"``: mean over all real tokens of the batch (long answers weigh more);
    - ``agg="sequence"``: mean per sequence (row), then mean over sequences.

    Works per token (``[B, T]`` with a mask) and per action (``[B]``, ``mask=None``:
    action-level MARFT passes whole-action log-probs).

    Returns:
        ``(loss, stats)`` with detached stats: ``clip_frac`` (fraction of entries where the
        clip is active), ``clip_frac_low``, ``clip_frac_high``, ``ratio_mean``,
        ``ratio_max``, ``ratio_min``.

    Example: ratios 1.5 and 0.5, both with advantage 1; the first is clipped at 1.2::

        >>> loss, stats = ppo_policy_loss(torch.log(torch.tensor([1.5, 0.5])), torch.zeros(2), torch.ones(2))
        >>> round(loss.item(), 4), stats["clip_frac"].item()     # mean(-1.2, -0.5)
        (-0.85, 0.5)
    """
    if agg not in ("token", "sequence"):
        raise ValueError(f"agg must be 'token' or 'sequence', got {agg!r}")
    m = _mask_like(logp, mask)
    log_ratio = (logp - old_logp.to(logp.dtype)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(torch.where(m, log_ratio, torch.zeros_like(log_ratio)))
    adv = advantages.to(logp.dtype).expand_as(ratio)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per = torch.maximum(pg1, pg2)
    if agg == "token" or per.dim() < 2:
        loss = masked_mean(per, m)
    else:
        per_seq = masked_mean(per, m, dim=-1)
        has = m.any(dim=-1)
        loss = masked_mean(per_seq, has)
    with torch.no_grad():
        high = (adv > 0) & (ratio > 1.0 + eps_high) & m
        low = (adv < 0) & (ratio < 1.0 - eps_low) & m
        mf = m.float()
        n = mf.sum().clamp_min(1)
        r_sel = ratio[m] if m.any() else torch.ones(1, device=ratio.device, dtype=ratio.dtype)
        stats = {
            "clip_frac": (high | low).float().sum() / n,
            "clip_frac_high": high.float().sum() / n,
            "clip_frac_low": low.float().sum() / n,
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": r_sel.max(),
            "ratio_min": r_sel.min(),
        }
    return loss, stats


def group_log_ratio(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor | list[int],
) -> torch.Tensor:
    """Per row ``[B]``: the mean token log-ratio of the row's GROUP (all real tokens of
    all rows with the same group id, each token weighing the same)::

        log s_g = sum_{rows r in g} sum_j (logp_rj - old_rj) / (tokens of g)

    A group without real tokens gives 0 (ratio 1). Differentiable in ``logp``.

    Example: rows 0 and 1 form one group (3 tokens, log-ratios 0.3, 0.0, 0.6), row 2 its own::

        >>> lp = torch.tensor([[0.3, 0.0], [0.6, 9.0], [0.2, 0.0]])
        >>> m = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
        >>> [round(x, 4) for x in group_log_ratio(lp, torch.zeros(3, 2), m, [0, 0, 1]).tolist()]
        [0.3, 0.3, 0.2]
    """
    m = _mask_like(logp, mask)
    lr = (logp - old_logp.to(logp.dtype)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    row_sum = masked_sum(lr, m, dim=-1)
    row_n = m.sum(dim=-1).to(lr.dtype)
    g = torch.as_tensor(groups, device=lr.device)
    _, idx = torch.unique(g, return_inverse=True)
    k = int(idx.max()) + 1 if idx.numel() else 0
    total = torch.zeros(k, dtype=lr.dtype, device=lr.device).index_add(0, idx, row_sum)
    count = torch.zeros(k, dtype=lr.dtype, device=lr.device).index_add(0, idx, row_n)
    return (total / count.clamp_min(1))[idx]


def grouped_ratio_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor | list[int],
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate of :func:`ppo_policy_loss` with ONE ratio per group of rows::

        s_g = exp(group_log_ratio)       (geometric mean of the group's token ratios)
        L_k = max(-A_k * s_g, -A_k * clip(s_g, 1 - eps_low, 1 + eps_high))   for every token k of g

    ``groups`` = the row index gives a sequence-level ratio (one per transition, as in
    GSPO); the id of the action a row belongs to gives ReMA's turn-level ratio (the
    segments of one tool-calling action share one ratio; see ``importance_ratio`` in
    :class:`~marft_algos.config.PPOLossConfig`). The gradient of ``s_g`` reaches every
    real token of the group; the clip zeroes it for the whole group at once. ``agg`` and
    the stats are those of :func:`ppo_policy_loss` (per token).

    Example: one group of two tokens with log-ratios log 1.5 and log 1.5 (s = 1.5), A = 1:
    clipped at 1.2 on both tokens::

        >>> lp = torch.log(torch.tensor([[1.5, 1.5]]))
        >>> loss, st = grouped_ratio_policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), [0])
        >>> round(loss.item(), 4), st["clip_frac"].item()
        (-1.2, 1.0)
    """
    log_s = group_log_ratio(logp, old_logp, mask, groups)
    per_token = log_s[:, None].expand_as(logp)
    return ppo_policy_loss(per_token, torch.zeros_like(per_token), advantages, mask, eps_low=eps_low, eps_high=eps_high, agg=agg)


def truncated_is_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor | None = None,
    cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance-sampling weights (TIS, Yao et al. 2025) for actions sampled by
    an engine whose log-probs differ from the trainer's (vLLM's kernels, bf16)::

        w = min(exp(old_logp - sampler_logp), cap)          (no gradient)

    ``old_logp`` are the trainer's log-probs of the behaviour policy, ``sampler_logp`` the
    engine's for the same tokens. Multiplying the PPO policy-gradient term by ``w``
    corrects for the engine having sampled from a slightly different distribution; the cap
    bounds the variance. Since ``w >= 0``, ``w * max(-A rho, -A clip(rho))`` equals the
    clipped surrogate with advantages ``w * A``, which is how the trainers apply it.
    Per token (``[B, T]`` with a mask) or per action (``[B]``, ``mask=None``).

    Returns:
        ``(weights, stats)``: weights like ``old_logp`` (1 at masked-out entries), and
        detached ``engine_logp_gap`` (mean ``|old_logp - sampler_logp|`` over the real
        entries) and ``tis_clipped_frac`` (fraction of real entries whose ratio exceeds ``cap``).

    Example: log-ratios 0.5 and 1.0 with the cap 2: ``e^0.5 = 1.65`` stays, ``e^1 = 2.72`` is cut::

        >>> w, st = truncated_is_weights(torch.tensor([0.0, 0.0]), torch.tensor([-0.5, -1.0]))
        >>> [round(x, 4) for x in w.tolist()], st["engine_logp_gap"].item(), st["tis_clipped_frac"].item()
        ([1.6487, 2.0], 0.75, 0.5)
    """
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    with torch.no_grad():
        m = _mask_like(old_logp, mask)
        diff = (old_logp - sampler_logp.to(old_logp.dtype)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        diff = torch.where(m, diff, torch.zeros_like(diff))
        ratio = torch.exp(diff)
        weights = ratio.clamp(max=cap)
        n = m.float().sum().clamp_min(1)
        stats = {
            "engine_logp_gap": masked_mean(diff.abs(), m),
            "tis_clipped_frac": ((ratio > cap) & m).float().sum() / n,
        }
    return weights, stats


def huber(error: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Symmetric Huber: ``0.5 e^2`` if ``|e| <= delta`` else ``delta * (|e| - 0.5 delta)``.

    Its gradient is ``clip(e, -delta, delta)`` on BOTH sides (the reference's version gave
    zero gradient to errors below -delta).

    Example::

        >>> huber(torch.tensor([-3.0, 0.5, 3.0]), delta=1.0).tolist()
        [2.5, 0.125, 2.5]
    """
    a = error.abs()
    return torch.where(a <= delta, 0.5 * error**2, delta * (a - 0.5 * delta))


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor | None = None,
    *,
    kind: str = "huber",
    delta: float = 10.0,
    clip: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Critic loss, masked mean over entries: ``mean l(returns - values)``.

    ``kind="mse"``: ``l(e) = 0.5 e^2``; ``kind="huber"``: :func:`huber` with ``delta``
    (the default 10 matches the usual PPO critic setting; rewards here are O(1), so it
    only caps outliers). With ``clip`` (PPO value clipping) and ``old_values`` (the
    values at rollout time)::

        V_clip = old + clip(V - old, -clip, clip)
        loss   = mean max(l(R - V), l(R - V_clip))

    Note the argument order: ``(values, returns, old_values)``.

    Example::

        >>> value_loss(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), kind="mse").item()   # mean(0.5, 0)
        0.25
    """
    if kind not in ("huber", "mse"):
        raise ValueError(f"kind must be 'huber' or 'mse', got {kind!r}")
    returns = returns.to(values.dtype)

    def ell(e: torch.Tensor) -> torch.Tensor:
        return huber(e, delta) if kind == "huber" else 0.5 * e**2

    per = ell(returns - values)
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        old = old_values.to(values.dtype)
        v_clip = old + (values - old).clamp(-clip, clip)
        per = torch.maximum(per, ell(returns - v_clip))
    return masked_mean(per, mask)


def approx_kl(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor | None = None,
    kind: str = "k3",
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Estimate KL(pi_old || pi) from samples of pi_old (the rollout), masked mean.

    With ``log r = logp - old_logp`` (Schulman's estimators)::

        k1 = -log r                  (unbiased, can be negative)
        k3 = (r - 1) - log r         (unbiased, always >= 0, lower variance)

    ``kind="both"`` returns a dict ``{"k1": ..., "k3": ...}``. This is the quantity the
    KL hard cut compares with its threshold.

    Example: ratios 0.5 and 2 (k1 cancels, k3 does not)::

        >>> kl = approx_kl(torch.log(torch.tensor([0.5, 2.0])), torch.zeros(2), kind="both")
        >>> round(kl["k1"].item(), 6), round(kl["k3"].item(), 4)
        (0.0, 0.25)
    """
    m = _mask_like(logp, mask)
    lr = (logp - old_logp.to(logp.dtype)).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    k1 = masked_mean(-lr, m)
    k3 = masked_mean(torch.expm1(lr) - lr, m)
    if kind == "k1":
        return k1
    if kind == "k3":
        return k3
    if kind == "both":
        return {"k1": k1, "k3": k3}
    raise ValueError(f"kind must be 'k1', 'k3' or 'both', got {kind!r}")


def kl_to_reference(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor | None = None,
    agg: str = "token",
) -> torch.Tensor:
    """KL(pi || pi_ref) on samples of pi, k3 estimator (non-negative), differentiable in logp.

    ::

        kl_j = exp(ref_j - logp_j) - (ref_j - logp_j) - 1   >= 0

    (as in GRPO). ``pi_ref`` is the base model with the adapters disabled. ``agg`` as in
    :func:`ppo_policy_loss`.

    Example::

        >>> round(kl_to_reference(torch.tensor([-1.0]), torch.tensor([-2.0])).item(), 4)   # e^-1 - (-1) - 1
        0.3679
    """
    m = _mask_like(logp, mask)
    d = (ref_logp.to(logp.dtype) - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    per = torch.expm1(d) - d
    if agg == "sequence" and per.dim() >= 2:
        return masked_mean(masked_mean(per, m, dim=-1), m.any(dim=-1))
    return masked_mean(per, m)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor | None = None, coef: float = 1.0) -> torch.Tensor:
    """``coef * masked_mean(entropy)``: the bonus to SUBTRACT from the loss (``loss - bonus``).

    Example::

        >>> round(entropy_bonus(torch.tensor([[1.0, 3.0]]), None, coef=0.1).item(), 6)
        0.2
    """
    return coef * masked_mean(entropy, mask)


def regularize(
    loss: torch.Tensor,
    stats: Any,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None,
    beta: float,
    ent_coef: float,
    metrics: dict[str, float],
    prefix: str,
) -> torch.Tensor:
    """``loss - ent_coef * H + beta * KL(pi || pi_ref)`` on the tokens of ``mask``.

    ``stats`` holds the policy's ``logprobs`` and ``entropy`` ``[B, T]``; ``ref_logp`` the
    reference's log-probs (None: no penalty). Writes ``<prefix>/entropy`` (always) and
    ``<prefix>/ref_kl`` (with a reference) into ``metrics``.
    """
    metrics[f"{prefix}/entropy"] = float(masked_mean(stats.entropy.detach(), mask))
    if ent_coef > 0:
        loss = loss - entropy_bonus(stats.entropy, mask, ent_coef)
    if ref_logp is not None and beta > 0:
        kl = kl_to_reference(stats.logprobs, ref_logp, mask)
        loss = loss + beta * kl
        metrics[f"{prefix}/ref_kl"] = float(kl.detach())
    return loss


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """1 - Var[target - pred] / Var[target] (NaN when undefined)."""
    if mask is not None:
        sel = mask.bool()
        pred, target = pred[sel], target[sel]
    if target.numel() < 2:
        return float("nan")
    var = float(torch.var(target))
    if var < 1e-12:
        return float("nan")
    return 1.0 - float(torch.var(target - pred)) / var
