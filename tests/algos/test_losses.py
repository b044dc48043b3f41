"""Closed-form tests of the loss terms (counts and gradients computed by hand)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marft_algos.losses import (
    action_logprob,
    approx_kl,
    entropy_bonus,
    huber,
    kl_to_reference,
    masked_mean,
    masked_sum,
    ppo_policy_loss,
    value_loss,
)


def test_masked_mean_and_sum_ignore_padding_even_inf() -> None:
    x = torch.tensor([[1.0, 2.0, float("-inf")], [4.0, float("nan"), 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(masked_sum(x, m)) == 7.0
    assert float(masked_mean(x, m)) == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 4.0]))
    assert float(masked_mean(x, torch.zeros_like(m))) == 0.0  # empty mask: 0, not NaN


def test_action_logprob_normalisation_modes_against_hand_counts() -> None:
    # action 0: tokens (-1, -2, -3), 2 words; action 1: one token (-0.5), 1 word; padding = -inf
    lp = torch.tensor([[-1.0, -2.0, -3.0, float("-inf")], [-0.5, float("-inf"), 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    torch.testing.assert_close(action_logprob(lp, m, "sum"), torch.tensor([-6.0, -0.5]))
    torch.testing.assert_close(action_logprob(lp, m, "token"), torch.tensor([-2.0, -0.5]))
    torch.testing.assert_close(action_logprob(lp, m, "word", n_words=[2, 1]), torch.tensor([-3.0, -0.5]))
    # empty action: 0 for every mode (counts clamped to 1)
    e = action_logprob(torch.zeros(1, 2), torch.zeros(1, 2), "token")
    assert float(e) == 0.0
    with pytest.raises(ValueError):
        action_logprob(lp, m, "word")
    with pytest.raises(ValueError):
        action_logprob(lp, m, "chars")


def _grad_of(adv: float, ratio: float, eps_low: float, eps_high: float) -> tuple[float, float]:
    logp = torch.tensor([math.log(ratio)], requires_grad=True)
    loss, _ = ppo_policy_loss(logp, torch.zeros(1), torch.tensor([adv]), None, eps_low, eps_high)
    loss.backward()
    return float(loss.detach()), float(logp.grad)


def test_ppo_clip_asymmetric_eps_low_eps_high() -> None:
    # A > 0, ratio 1.5 > 1 + 0.28: clipped -> loss = -1.28, no gradient
    loss, g = _grad_of(1.0, 1.5, 0.2, 0.28)
    assert loss == pytest.approx(-1.28) and g == 0.0
    # A > 0, ratio 1.25: inside [0.8, 1.28] -> loss = -1.25, d/dlogp = -A*ratio = -1.25
    loss, g = _grad_of(1.0, 1.25, 0.2, 0.28)
    assert loss == pytest.approx(-1.25) and g == pytest.approx(-1.25)
    # ... the same ratio IS clipped with a symmetric eps 0.2 (clip-higher makes the difference)
    loss, g = _grad_of(1.0, 1.25, 0.2, 0.2)
    assert loss == pytest.approx(-1.2) and g == 0.0
    # A < 0, ratio 0.7 < 1 - 0.2: clipped at 0.8 -> loss = max(0.7, 0.8) = 0.8, no gradient
    loss, g = _grad_of(-1.0, 0.7, 0.2, 0.28)
    assert loss == pytest.approx(0.8) and g == 0.0
    # A < 0, ratio 1.5: the pessimistic (unclipped) term wins -> loss 1.5, gradient 1.5
    loss, g = _grad_of(-1.0, 1.5, 0.2, 0.28)
    assert loss == pytest.approx(1.5) and g == pytest.approx(1.5)
    # A > 0, ratio 0.5: unclipped (the surrogate may always go back up) -> gradient -0.5
    loss, g = _grad_of(1.0, 0.5, 0.2, 0.28)
    assert loss == pytest.approx(-0.5) and g == pytest.approx(-0.5)


def test_ppo_token_vs_sequence_aggregation_and_stats() -> None:
    # ratio 1 everywhere, advantages per token; seq 0 has 3 tokens of A=1, seq 1 one token A=-1
    lp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 5.0, 5.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    tok, stats = ppo_policy_loss(lp, lp, adv, m, agg="token")
    seq, _ = ppo_policy_loss(lp, lp, adv, m, agg="sequence")
    assert float(tok) == pytest.approx((-3 + 1) / 4)  # mean over 4 real tokens
    assert float(seq) == pytest.approx((-1 + 1) / 2)  # mean of per-sequence means
    assert float(stats["clip_frac"]) == 0.0 and float(stats["ratio_mean"]) == 1.0
    # clip fraction counts only active clips over real tokens
    new = torch.tensor([[math.log(1.5), 0.0, 0.0], [math.log(0.5), 0.0, 0.0]])
    _, stats = ppo_policy_loss(new, lp, adv, m, eps_low=0.2, eps_high=0.2)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 4)
    assert float(stats["clip_frac_high"]) == pytest.approx(1 / 4)
    assert float(stats["clip_frac_low"]) == pytest.approx(1 / 4)
    assert float(stats["ratio_max"]) == pytest.approx(1.5)


def test_symmetric_huber_gradient_on_both_sides() -> None:
    # e = R - V = +5 and -5, delta = 1: loss = 1*(5 - 0.5) each; dL/dV = -clip(e)/n = -+0.5
    v = torch.tensor([0.0, 10.0], requires_grad=True)
    R = torch.tensor([5.0, 5.0])
    loss = value_loss(v, R, kind="huber", delta=1.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(4.5)
    torch.testing.assert_close(v.grad, torch.tensor([-0.5, 0.5]))  # the reference gave 0 to the second
    # inside the quadratic zone: 0.5 e^2, gradient -e/n
    v2 = torch.tensor([0.0, 1.0], requires_grad=True)
    value_loss(v2, torch.tensor([0.5, 0.5]), kind="huber", delta=1.0).backward()
    torch.testing.assert_close(v2.grad, torch.tensor([-0.25, 0.25]))
    # the Huber function itself is even and continuous at +-delta
    e = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(huber(e, 1.0), huber(-e, 1.0))
    assert float(huber(torch.tensor(1.0), 1.0)) == pytest.approx(0.5)


def test_value_loss_mse_and_clipping() -> None:
    v = torch.tensor([2.0], requires_grad=True)
    R, old = torch.tensor([0.0]), torch.tensor([1.0])
    # mse: 0.5 * 4 = 2
    assert float(value_loss(v, R, kind="mse").detach()) == pytest.approx(2.0)
    # clip 0.5: V_clip = 1.5; max(0.5*4, 0.5*2.25) = 2 -> the unclipped term, gradient flows
    loss = value_loss(v, R, old, kind="mse", clip=0.5)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(2.0) and float(v.grad) == pytest.approx(2.0)
    # moving towards the target beyond the clip: V=0.2 (old 1, R 0), V_clip = 0.5 -> 0.125 wins, no grad
    v = torch.tensor([0.2], requires_grad=True)
    loss = value_loss(v, R, old, kind="mse", clip=0.5)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.125) and float(v.grad) == 0.0
    with pytest.raises(ValueError):
        value_loss(v, R, kind="mse", clip=0.5)


def test_kl_estimators() -> None:
    # log r = logp - old = log 2: k1 = -log 2, k3 = (2 - 1) - log 2
    lp, old = torch.tensor([math.log(2.0)]), torch.zeros(1)
    assert float(approx_kl(lp, old, kind="k1")) == pytest.approx(-math.log(2))
    assert float(approx_kl(lp, old)) == pytest.approx(1 - math.log(2))
    both = approx_kl(lp, old, kind="both")
    assert set(both) == {"k1", "k3"}
    # to the reference: d = ref - logp = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)
    ref = torch.zeros(1, 2)
    kl = kl_to_reference(logp, ref, torch.tensor([[1, 0]]))
    assert float(kl.detach()) == pytest.approx(0.5 + math.log(2) - 1)
    kl.backward()
    assert float(logp.grad[0, 0]) == pytest.approx(1 - 0.5)  # d/dlogp = 1 - exp(ref - logp)
    assert float(logp.grad[0, 1]) == 0.0


def test_entropy_bonus() -> None:
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    assert float(entropy_bonus(ent, torch.tensor([[1, 1, 0]]), coef=0.1)) == pytest.approx(0.2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=1, max_size=16))
def test_property_kl_estimates_are_non_negative(pairs) -> None:
    a = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    assert float(approx_kl(a, b)) >= -1e-12
    assert float(kl_to_reference(a, b)) >= -1e-12
    assert float(kl_to_reference(a, a)) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.floats(-3, 3), st.floats(-2, 2), st.floats(0, 0.5), st.floats(0, 0.5))
def test_property_ppo_loss_is_pessimistic(adv: float, log_ratio: float, eps_low: float, eps_high: float) -> None:
    # the clipped surrogate never exceeds the unclipped one as an objective: loss >= -A*rho
    loss, _ = ppo_policy_loss(torch.tensor([log_ratio]), torch.zeros(1), torch.tensor([adv]), None, eps_low, eps_high)
    assert float(loss) >= -adv * math.exp(log_ratio) - 1e-6
