"""The rollout buffer: minibatch tensors are index slices equal to the old per-minibatch padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marft_algos.buffer import AgentBuffer, Minibatch, action_field, token_field
from marft_algos.rollout import Transition, iter_minibatches
from marft_algos.trainer import pad_sequences

H = 3


def ragged_transitions(n: int = 7, seed: int = 0, *, token_level: bool = True) -> list[Transition]:
    """Actions of 0..5 tokens with every field the estimators and prepare_update write."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(0, 6))
        t = Transition(i, i, i, 0, "speaker", [1, 2], list(rng.integers(3, 50, length)), list(rng.normal(size=length)))
        t.value, t.advantage, t.returns = (float(x) for x in rng.normal(size=3))
        t.extras["old_logp"] = [float(x) for x in rng.normal(size=length).astype(np.float32)]
        t.extras["ref_logp"] = [float(x) for x in rng.normal(size=length).astype(np.float32)]
        if token_level:  # an empty action keeps one virtual token value
            t.extras["token_values"] = [float(x) for x in rng.normal(size=max(length, 1))]
            t.extras["token_adv"] = [float(x) for x in rng.normal(size=max(length, 1))]
            t.extras["token_ret"] = [float(x) for x in rng.normal(size=max(length, 1))]
            t.extras["critic_feat"] = torch.randn(length, H)
        else:
            t.extras["critic_feat"] = torch.randn(H)
        out.append(t)
    return out


TOKEN_KEYS = {"old_logp": "old_logp", "ref_logp": "ref_logp", "token_values": "token_values",
              "token_advantages": "token_adv", "token_returns": "token_ret"}


@pytest.mark.parametrize("extra_width", [-1, 0, 2])
def test_minibatch_tensors_equal_the_old_per_minibatch_padding(extra_width):
    trs = ragged_transitions()
    buf = AgentBuffer.from_transitions("speaker", trs)
    rng_new, rng_old = np.random.default_rng(5), np.random.default_rng(5)
    new = list(buf.minibatches(3, rng_new))
    old = list(iter_minibatches(trs, 3, rng_old))
    assert [list(mb) for mb in new] == old  # same shuffle, same minibatches, same order
    for mb, ref in zip(new, old, strict=True):
        assert isinstance(mb, Minibatch)
        # the width the policy returns for this minibatch (its longest response), or a
        # narrower / wider one: the slice is cut or padded exactly like pad_sequences
        width = max(max(len(t.response_ids) for t in ref), 1) + extra_width
        for name, key in TOKEN_KEYS.items():
            expect = pad_sequences([t.extras[key] for t in ref], width)
            assert torch.equal(token_field(mb, name, width), expect), name
            assert torch.equal(token_field(ref, name, width), expect), name  # plain-list path
        for name, attr in (("values", "value"), ("advantages", "advantage"), ("returns", "returns")):
            expect = torch.tensor([getattr(t, attr) for t in ref], dtype=torch.float32)
            assert torch.equal(action_field(mb, name, torch.float32), expect), name
            assert torch.equal(action_field(ref, name, torch.float32), expect), name
        feats = torch.nn.utils.rnn.pad_sequence([t.extras["critic_feat"] for t in ref], batch_first=True)
        assert torch.equal(mb.critic_features[:, : feats.shape[1]], feats)
        assert not mb.critic_features[:, feats.shape[1]:].any()
        lengths = torch.tensor([len(t.response_ids) for t in ref])
        assert torch.equal(mb.response_mask.sum(1), lengths)
        for row, t in zip(mb.response_ids, ref, strict=True):
            assert row[: len(t.response_ids)].tolist() == [int(x) for x in t.response_ids]


def test_action_level_features_stack_and_subsets_slice():
    trs = ragged_transitions(5, seed=1, token_level=False)
    buf = AgentBuffer.from_transitions("speaker", trs)
    assert buf.critic_features.shape == (5, H) and buf.token_advantages is None
    mb = buf.minibatch([4, 0, 2])
    assert torch.equal(mb.critic_features, torch.stack([trs[i].extras["critic_feat"] for i in (4, 0, 2)]))
    sub = mb.subset([2, 0])
    assert list(sub) == [trs[2], trs[4]]
    assert torch.equal(sub.advantages, torch.tensor([trs[2].advantage, trs[4].advantage], dtype=torch.float64))
    assert token_field(sub, "token_advantages", 4) is None


def test_a_field_missing_on_one_action_is_absent_not_zero():
    trs = ragged_transitions(4, seed=2)
    del trs[1].extras["ref_logp"]
    buf = AgentBuffer.from_transitions("speaker", trs)
    assert buf.ref_logp is None and buf.old_logp is not None
    assert token_field(buf.minibatch([0, 1]), "ref_logp", 3) is None
