"""The rollout buffer: minibatch tensors are index slices equal to the old per-minibatch padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marft_algos.buffer import AgentBuffer, Minibatch, action_field, minibatch_indices, token_field
from marft_algos.records import TOKEN_ESTIMATES, BatchEstimates, Transition

H = 3


def pad_sequences(seqs, length, value=0.0):
    """Right-pad float sequences to ``length`` (extra elements are cut) -> [B, length]."""
    out = torch.full((len(seqs), length), value, dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = min(len(s), length)
        if n:
            out[i, :n] = torch.as_tensor(list(s[:n]), dtype=torch.float32)
    return out


def ragged_transitions(n: int = 7, seed: int = 0, *, token_level: bool = True) -> tuple[list[Transition], BatchEstimates]:
    """Actions of 0..5 tokens, and every field the estimators and prepare_update write for them."""
    rng = np.random.default_rng(seed)
    out, est = [], BatchEstimates()
    for i in range(n):
        length = int(rng.integers(0, 6))
        t = Transition(i, i, i, 0, "speaker", [1, 2], list(rng.integers(3, 50, length)), list(rng.normal(size=length)))
        t.value, t.advantage, t.returns = (float(x) for x in rng.normal(size=3))
        e = est[t]
        e.old_logp = [float(x) for x in rng.normal(size=length).astype(np.float32)]
        e.ref_logp = [float(x) for x in rng.normal(size=length).astype(np.float32)]
        if token_level:  # an empty action keeps one virtual token value
            e.token_values = [float(x) for x in rng.normal(size=max(length, 1))]
            e.token_advantages = [float(x) for x in rng.normal(size=max(length, 1))]
            e.token_returns = [float(x) for x in rng.normal(size=max(length, 1))]
            e.critic_features = torch.randn(length, H)
        else:
            e.critic_features = torch.randn(H)
        out.append(t)
    return out, est


@pytest.mark.parametrize("extra_width", [-1, 0, 2])
def test_minibatch_tensors_equal_the_old_per_minibatch_padding(extra_width):
    trs, est = ragged_transitions()
    buf = AgentBuffer.from_transitions("speaker", trs, est)
    rng_new, rng_old = np.random.default_rng(5), np.random.default_rng(5)
    new = list(buf.minibatches(3, rng_new))
    old = [[trs[int(j)] for j in idx] for idx in minibatch_indices(len(trs), 3, rng_old)]
    assert [list(mb) for mb in new] == old  # same shuffle, same minibatches, same order
    for mb, ref in zip(new, old, strict=True):
        assert isinstance(mb, Minibatch)
        # the width the policy returns for this minibatch (its longest response), or a
        # narrower / wider one: the slice is cut or padded exactly like pad_sequences
        width = max(max(len(t.response_ids) for t in ref), 1) + extra_width
        for name in TOKEN_ESTIMATES:
            expect = pad_sequences([getattr(est[t], name) for t in ref], width)
            assert torch.equal(token_field(mb, name, width), expect), name
            assert token_field(ref, name, width) is None, name  # a plain list carries no estimates
        for name, attr in (("values", "value"), ("advantages", "advantage"), ("returns", "returns")):
            expect = torch.tensor([getattr(t, attr) for t in ref], dtype=torch.float32)
            assert torch.equal(action_field(mb, name, torch.float32), expect), name
            assert torch.equal(action_field(ref, name, torch.float32), expect), name
        feats = torch.nn.utils.rnn.pad_sequence([est[t].critic_features for t in ref], batch_first=True)
        assert torch.equal(mb.critic_features[:, : feats.shape[1]], feats)
        assert not mb.critic_features[:, feats.shape[1]:].any()
        lengths = torch.tensor([len(t.response_ids) for t in ref])
        assert torch.equal(mb.response_mask.sum(1), lengths)
        for row, t in zip(mb.response_ids, ref, strict=True):
            assert row[: len(t.response_ids)].tolist() == [int(x) for x in t.response_ids]


def test_action_level_features_stack_and_subsets_slice():
    trs, est = ragged_transitions(5, seed=1, token_level=False)
    buf = AgentBuffer.from_transitions("speaker", trs, est)
    assert buf.critic_features.shape == (5, H) and buf.token_advantages is None
    mb = buf.minibatch([4, 0, 2])
    assert torch.equal(mb.critic_features, torch.stack([est[trs[i]].critic_features for i in (4, 0, 2)]))
    sub = mb.subset([2, 0])
    assert list(sub) == [trs[2], trs[4]]
    assert torch.equal(sub.advantages, torch.tensor([trs[2].advantage, trs[4].advantage], dtype=torch.float64))
    assert token_field(sub, "token_advantages", 4) is None


def test_a_field_missing_on_one_action_is_absent_not_zero():
    trs, est = ragged_transitions(4, seed=2)
    est[trs[1]].ref_logp = None
    buf = AgentBuffer.from_transitions("speaker", trs, est)
    assert buf.ref_logp is None and buf.old_logp is not None
    assert token_field(buf.minibatch([0, 1]), "ref_logp", 3) is None


def test_the_store_is_keyed_by_the_transition_and_no_estimates_means_none():
    trs, est = ragged_transitions(3, seed=3)
    twin = Transition(**{f: getattr(trs[0], f) for f in Transition.__dataclass_fields__})  # equal, not the same
    assert twin == trs[0] and twin not in est and est.get(twin) is None
    assert est.get(trs[0]) is est[trs[0]] and len(est) == 3 and list(est) == trs
    with pytest.raises(KeyError, match="token_advantages"):
        token_field(trs, "token_adv", 3)
    bare = AgentBuffer.from_transitions("speaker", trs)  # no store: only the transitions' own fields
    assert bare.old_logp is None and bare.critic_features is None and bare.advantages.shape == (3,)
