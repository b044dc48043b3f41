"""ReMA's turn-level importance ratio (and the sequence-level one) against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marft_algos import losses
from marft_algos.buffer import grouped_minibatch_indices, minibatch_indices
from marft_algos.config import ConfigError
from marft_algos.records import Transition

# Three rows: rows 0 and 1 are two segments of one action (a tool call, then the answer),
# row 2 is another action. Token log-ratios (logp - old): [0.2, 0.0], [0.4, pad], [0.0, 0.5].
LOGP = [[-1.0, -2.0], [-0.5, 7.0], [-1.0, -1.0]]
OLD = [[-1.2, -2.0], [-0.9, 0.0], [-1.0, -1.5]]
MASK = [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
ADV = [-1.0, -1.0, 1.0]


def _loss(kind: str, **kw):
    logp = torch.tensor(LOGP, requires_grad=True)
    adv = torch.tensor(ADV)[:, None].expand(3, 2)
    args = (logp, torch.tensor(OLD), adv, torch.tensor(MASK))
    if kind == "token":
        loss, stats = losses.ppo_policy_loss(*args, **kw)
    else:
        loss, stats = losses.grouped_ratio_policy_loss(*args, [0, 0, 1] if kind == "turn" else [0, 1, 2], **kw)
    loss.backward()
    return loss.item(), logp.grad, stats


def test_turn_ratio_closed_form_and_gradient():
    loss, grad, stats = _loss("turn")
    s0 = math.exp((0.2 + 0.0 + 0.4) / 3)  # one ratio for the action's 3 tokens: e^0.2, not clipped (A < 0, s > 1)
    # the other action: e^0.25 = 1.284 > 1.2 with A > 0 -> clipped at 1.2
    assert loss == pytest.approx((3 * s0 - 2 * 1.2) / 5, abs=1e-6)
    # d/dlogp_k of (1/5) * 3 * s0 = s0 / 5 on every real token of the action; 0 where clipped or padded
    expected = torch.tensor([[s0 / 5, s0 / 5], [s0 / 5, 0.0], [0.0, 0.0]])
    assert torch.allclose(grad, expected, atol=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(2 / 5)


def test_sequence_and_token_ratios_closed_form():
    seq, _, _ = _loss("sequence")
    assert seq == pytest.approx((2 * math.exp(0.1) + math.exp(0.4) - 2 * 1.2) / 5, abs=1e-6)
    tok, _, _ = _loss("token")
    assert tok == pytest.approx((math.exp(0.2) + 1.0 + math.exp(0.4) - 1.0 - 1.2) / 5, abs=1e-6)


def test_turn_equals_sequence_when_every_action_has_one_segment():
    g = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(4, 5, generator=g), -torch.rand(4, 5, generator=g)
    adv, mask = torch.randn(4, 1, generator=g).expand(4, 5), (torch.rand(4, 5, generator=g) > 0.3).float()
    by_action = losses.grouped_ratio_policy_loss(logp, old, adv, mask, [7, 3, 9, 1])[0]  # distinct action ids
    by_row = losses.grouped_ratio_policy_loss(logp, old, adv, mask, [0, 1, 2, 3])[0]
    assert by_action.item() == pytest.approx(by_row.item(), abs=1e-7)
    merged = losses.grouped_ratio_policy_loss(logp, old, adv, mask, [0, 0, 2, 3])[0]
    assert merged.item() != pytest.approx(by_row.item(), abs=1e-4)  # two segments of one action do differ


def _tr(eid: int, index: int, action_index: int) -> Transition:
    return Transition(episode_id=eid, group_id=0, index=index, turn=0, agent="a", prompt_ids=[1],
                      response_ids=[2], sampler_logprobs=[0.0], action_index=action_index)


def test_minibatches_keep_the_segments_of_an_action_together():
    # episode 0: action (0, 1, 2 segments), action 3; episode 1: action 0, action (1, 2)
    items = [_tr(0, 0, 0), _tr(0, 1, 0), _tr(0, 2, 0), _tr(0, 3, 3), _tr(1, 0, 0), _tr(1, 1, 1), _tr(1, 2, 1)]
    for seed in range(5):
        chunks = grouped_minibatch_indices([t.action_key for t in items], 3, np.random.default_rng(seed))
        mbs = [[items[int(j)] for j in idx] for idx in chunks]
        assert sorted((t.episode_id, t.index) for mb in mbs for t in mb) == sorted((t.episode_id, t.index) for t in items)
        where = {t.action_key: k for k, mb in enumerate(mbs) for t in mb}
        for k, mb in enumerate(mbs):
            assert all(where[t.action_key] == k for t in mb)
    # one unit per index: exactly the plain shuffle
    plain = [int(j) for idx in minibatch_indices(len(items), 3, np.random.default_rng(0)) for j in idx]
    assert plain == np.random.default_rng(0).permutation(len(items)).tolist()


def test_importance_ratio_setting_is_checked():
    from marft_algos.algos.grpo import GRPOConfig
    from marft_algos.algos.marft import MARFTConfig

    assert GRPOConfig(importance_ratio="turn").importance_ratio == "turn"
    with pytest.raises(ConfigError, match="importance_ratio"):
        GRPOConfig(importance_ratio="action")
    with pytest.raises(ConfigError, match="importance_ratio"):
        MARFTConfig(importance_ratio="turn")
