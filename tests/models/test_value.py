"""ValueModel: shapes, token alignment, frozen shared base, heads, critic adapter, persistence."""

from __future__ import annotations

import pytest
import torch

from marft_algos.models import TeamPolicy, ValueModel, build_tiny_model

PROMPTS = [[257, 10, 65, 66, 67], [257, 10, 68]]
RESPONSES = [[70, 71, 72], [73]]


def _randomize_heads(vm: ValueModel, seed: int = 0) -> None:
    """The last head layer starts at zero (V = 0 everywhere): make values informative."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for h in vm.heads.values():
            h.net[2].weight.copy_(torch.randn(h.net[2].weight.shape, generator=g))


@pytest.fixture(scope="module")
def policy() -> TeamPolicy:
    pol = TeamPolicy(["a", "b"], base="tiny-random")
    with torch.no_grad():
        for r in pol.roles:
            for p in pol.trainable_parameters(r):
                p.add_(0.1 * torch.randn_like(p))
    return pol


def test_shapes_and_initial_zero(policy):
    vm = ValueModel(policy)
    v = vm.values("a", PROMPTS)
    assert v.shape == (2,) and torch.all(v == 0)
    tv = vm.token_values("a", PROMPTS, RESPONSES)
    assert tv.shape == (2, 3)
    assert vm.values("a", PROMPTS, token_level=True, response_ids=RESPONSES).shape == (2, 3)
    assert all(p.dtype == torch.float32 for p in vm.trainable_parameters())


def test_token_values_are_aligned_with_the_state_before_each_token(policy):
    vm = ValueModel(policy, per_agent=True)
    _randomize_heads(vm)
    with torch.no_grad():
        tv = vm.token_values("b", PROMPTS, RESPONSES)
        v0 = vm.values("b", PROMPTS)
        assert torch.allclose(tv[:, 0], v0, atol=1e-5)  # first token: value of the observation
        for j in range(3):
            vj = vm.values("b", [PROMPTS[0] + RESPONSES[0][:j]])
            assert torch.allclose(tv[0, j], vj[0], atol=1e-5)
        assert torch.all(tv[1, 1:] == 0)  # past the end of a response


def test_base_is_shared_and_frozen(policy):
    vm = ValueModel(policy)
    base = policy.base_model("a")
    backbone = getattr(base, base.base_model_prefix)
    assert vm._owner("a") is base  # the policy's object, not a copy
    policy_storages = {p.untyped_storage().data_ptr() for p in base.parameters()}
    head_storages = {p.untyped_storage().data_ptr() for p in vm.trainable_parameters()}
    assert policy_storages.isdisjoint(head_storages)
    assert sum(p.numel() for p in vm.trainable_parameters()) < sum(p.numel() for p in backbone.parameters())
    _randomize_heads(vm)
    loss = vm.values("a", PROMPTS).pow(2).sum()
    loss.backward()
    assert all(p.grad is not None for p in vm.trainable_parameters())
    assert all(p.grad is None for p in base.parameters())  # base frozen, adapters untouched


def test_policy_adapters_do_not_change_values(policy):
    vm = ValueModel(policy)
    _randomize_heads(vm)
    with torch.no_grad():
        before = vm.values("a", PROMPTS)
        saved = [p.detach().clone() for p in policy.trainable_parameters("a")]
        for p in policy.trainable_parameters("a"):
            p.add_(1.0)
        after = vm.values("a", PROMPTS)
        for p, s in zip(policy.trainable_parameters("a"), saved, strict=True):
            p.copy_(s)
    assert torch.allclose(before, after)  # the critic reads the base with adapters disabled


def test_per_agent_heads_are_separate(policy):
    shared = ValueModel(policy)
    per = ValueModel(policy, per_agent=True)
    assert len(shared.heads) == 1 and set(per.heads) == {"a", "b"}
    ids_a = {id(p) for p in per.trainable_parameters("a")}
    assert ids_a.isdisjoint(id(p) for p in per.trainable_parameters("b"))
    assert [id(p) for p in shared.trainable_parameters("a")] == [id(p) for p in shared.trainable_parameters("b")]


def test_heterogeneous_team_gets_one_shared_head_per_base():
    # bases of different hidden sizes (64 and 32): one head each, shared by the roles on it
    m2, t2 = build_tiny_model(seed=7, hidden=32, heads=2, kv_heads=1)
    pol = TeamPolicy(["a", "b", "c"], base={"a": "tiny-random", "b": (m2, t2), "c": "tiny-random"})
    vm = ValueModel(pol)
    assert len(vm.heads) == 2
    assert vm.head("a") is vm.head("c") and vm.head("a") is not vm.head("b")
    assert vm.head("a").net[0].in_features == 64 and vm.head("b").net[0].in_features == 32
    _randomize_heads(vm)
    for role in "abc":
        assert vm.values(role, PROMPTS).shape == (2,)
        assert vm.token_values(role, PROMPTS, RESPONSES).shape == (2, 3)
    assert len(ValueModel(pol, per_agent=True).heads) == 3


def test_critic_lora_adapter_trains_and_keeps_policy_flags():
    pol = TeamPolicy(["a", "b"], base="tiny-random")
    pol.set_train_role("a")
    vm = ValueModel(pol, critic_lora=True)
    _randomize_heads(vm)
    # adding the critic adapter did not touch the policy's requires_grad flags
    assert all(p.requires_grad for p in pol.trainable_parameters("a"))
    assert not any(p.requires_grad for p in pol.trainable_parameters("b"))
    pol.set_train_role(None)
    critic = vm._critic_params
    assert critic and all(p.requires_grad for p in critic)
    assert {id(p) for p in critic}.isdisjoint(id(p) for r in pol.roles for p in pol.trainable_parameters(r))
    vm.values("a", PROMPTS).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in critic)
    assert all(p.grad is None for r in pol.roles for p in pol.trainable_parameters(r))
    # the policy's generation never sees the critic adapter (its roles keep their own)
    assert pol.adapter_of("a") not in (None, "critic")


def test_save_load_round_trip(policy, tmp_path):
    vm = ValueModel(policy, per_agent=True)
    _randomize_heads(vm, seed=5)
    vm.save(tmp_path)
    fresh = ValueModel(policy, per_agent=True, seed=1)
    fresh.load(tmp_path)
    with torch.no_grad():
        assert torch.allclose(vm.values("a", PROMPTS), fresh.values("a", PROMPTS))
    assert all(p.requires_grad for p in fresh.trainable_parameters())
    with pytest.raises(ValueError, match="per_agent"):
        ValueModel(policy).load(tmp_path)


def test_standalone_critic_on_a_bare_model():
    model, tok = build_tiny_model()
    vm = ValueModel((model, tok), per_agent=True, roles=["x"])
    assert vm.values("x", PROMPTS).shape == (2,)
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="roles"):
        ValueModel(model, per_agent=True)


def test_full_mode_critic_uses_the_frozen_reference():
    pol = TeamPolicy(["a"], base="tiny-random", mode="full")
    vm = ValueModel(pol)
    assert vm._owner("a") is pol._base("a").reference
    with pytest.raises(ValueError, match="critic_lora"):
        ValueModel(pol, critic_lora=True)
