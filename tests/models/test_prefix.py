"""Shared prompt prefixes: the plan, and that sharing changes no log-prob, gradient or sample."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marft_algos.models import GenRequest, SamplingParams, TeamPolicy
from marft_algos.models.prefix import plan_prefixes

# --------------------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------------------

prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=2, max_size=30), min_size=2, max_size=12)


@given(prompts_st, st.lists(st.integers(0, 1), min_size=12, max_size=12), st.integers(1, 6))
@settings(max_examples=300, deadline=None)
def test_plan_invariants(prompts, key_bits, min_shared):
    keys = key_bits[: len(prompts)]
    plan = plan_prefixes(prompts, keys, min_shared=min_shared, min_saving=0.0)
    assert plan is not None
    assert len(plan.cluster_of) == len(prompts)
    assert plan.tokens(prompts) <= sum(len(p) for p in prompts)
    for row, c in enumerate(plan.cluster_of):
        n = plan.prefix_len[c]
        first = plan.first_row[c]
        assert 1 <= n < len(prompts[row])  # a real prefix, and a suffix token to predict from
        assert prompts[row][:n] == prompts[first][:n]
        assert keys[row] == keys[first]  # different keys (adapters) never share a cache
        if n < len(prompts[first]) - 1:  # a cluster of several rows shares >= min_shared
            assert n >= min_shared or plan.cluster_of.count(c) == 1


def test_plan_declines_small_savings_and_tiny_prompts():
    assert plan_prefixes([[1, 2, 3], [4, 5, 6]]) is None  # nothing shared
    assert plan_prefixes([[1], [1]]) is None  # no suffix token possible
    assert plan_prefixes([[7] * 40 + [1], [7] * 40 + [2]]) is not None


def test_plan_counts_tokens_and_builds_left_padded_batches():
    prompts = [[1, 2, 3, 4, 9], [1, 2, 3, 4, 8, 7], [5, 6]]
    plan = plan_prefixes(prompts, min_shared=3)
    assert plan.cluster_of == [0, 0, 1] and plan.prefix_len == [4, 1]
    ids, mask = plan.prefix_batch(prompts, pad=0)
    assert ids.tolist() == [[1, 2, 3, 4], [0, 0, 0, 5]] and mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 1]]
    ids, mask = plan.suffix_batch(prompts, pad=0)
    assert ids.tolist() == [[0, 9], [8, 7], [0, 6]] and mask.tolist() == [[0, 1], [1, 1], [0, 1]]


# --------------------------------------------------------------------------------------
# the policy: identical numbers with and without sharing
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy() -> TeamPolicy:
    pol = TeamPolicy(["a", "b"], base="tiny-random", max_context=512)
    with torch.no_grad():  # make the adapters matter (B starts at 0)
        g = torch.Generator().manual_seed(1)
        for role in ("a", "b"):
            for p in pol.trainable_parameters(role):
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return pol


def _rows(policy: TeamPolicy) -> tuple[list[list[int]], list[list[int]]]:
    system = "You are the second agent of a team; read the problem and your teammate's text carefully."
    group = policy.encode("a", [{"role": "system", "content": system}, {"role": "user", "content": "What is 7 * 8?"}])
    shared = [
        policy.encode("a", [{"role": "system", "content": system}, {"role": "user", "content": f"What is 7 * 8? teammate: {t}"}])
        for t in ("56", "it is fifty-six", "7 times 8")
    ]
    lone = policy.encode("a", [{"role": "user", "content": "unrelated"}])
    prompts = [group] * 4 + shared + [lone]
    responses = [[65, 66, 67], [70], [], [71, 72, 73, 74, 75], [80, 81], [82], [83, 84, 85], [90, 91]]
    return prompts, responses


def _logprobs_and_grads(policy: TeamPolicy, share: bool, prompts, responses, **kw):
    policy.share_prefixes = share
    try:
        for p in policy.trainable_parameters("a"):
            p.grad = None
        st_ = policy.sequence_logprobs("a", prompts, responses, **kw)
        if st_.logprobs.requires_grad:
            (-(st_.logprobs.sum() + 0.1 * st_.entropy.sum())).backward()
        grads = [p.grad.clone() if p.grad is not None else None for p in policy.trainable_parameters("a")]
        return st_, grads
    finally:
        policy.share_prefixes = True


def test_shared_prefix_logprobs_entropies_and_gradients_match(policy):
    prompts, responses = _rows(policy)
    assert plan_prefixes(prompts) is not None  # the case really takes the shared path
    saved = policy.stats["train_prefix_saved"]
    shared, g_shared = _logprobs_and_grads(policy, True, prompts, responses, temperature=0.7)
    assert policy.stats["train_prefix_saved"] > saved
    plain, g_plain = _logprobs_and_grads(policy, False, prompts, responses, temperature=0.7)
    assert torch.equal(shared.mask, plain.mask)
    assert torch.allclose(shared.logprobs, plain.logprobs, atol=1e-5)
    assert torch.allclose(shared.entropy, plain.entropy, atol=1e-5)
    assert all(a is not None for a in g_shared)
    for a, b in zip(g_shared, g_plain, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prefix_reference_logprobs_match(policy):
    prompts, responses = _rows(policy)
    shared, _ = _logprobs_and_grads(policy, True, prompts, responses, reference=True)
    plain, _ = _logprobs_and_grads(policy, False, prompts, responses, reference=True)
    assert not shared.logprobs.requires_grad
    assert torch.allclose(shared.logprobs, plain.logprobs, atol=1e-5)


def test_shared_prefix_prefill_gives_the_same_samples(policy, assert_fast_path_exact):
    prompts, _ = _rows(policy)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    # two adapters in one batch: clusters never mix them
    reqs = [GenRequest("a" if i % 3 else "b", p, sp) for i, p in enumerate(prompts)]
    saved = policy.stats["prefill_prefix_saved"]
    fast = assert_fast_path_exact(policy, "share_prefixes", reqs, seed=11)
    assert policy.stats["prefill_prefix_saved"] > saved
    # and the sampled log-probs are the training log-probs of the same tokens
    for role in ("a", "b"):
        mine = [(q, r) for q, r in zip(reqs, fast, strict=True) if q.role == role]
        with torch.no_grad():
            st_ = policy.sequence_logprobs(role, [q.prompt_ids for q, _ in mine], [r.token_ids for _, r in mine])
        for k, (_, r) in enumerate(mine):
            n = len(r.token_ids)
            assert (st_.logprobs[k, :n] - torch.tensor(r.logprobs)).abs().max() < 1e-4
