"""The KL reference after a warm start (``reference="init"``): ``freeze_reference`` keeps the
weights of that moment as the reference policy, frozen and never saved, while the role
adapters train on; ``"base"`` (the default) stays the base with the adapters off."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import SHAPED  # noqa: E402
from helpers.policies import perturb, perturbed_policy  # noqa: E402

from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.config import ConfigError  # noqa: E402

ROLES = ["reasoner", "actor"]


def _scores(policy, role, *, reference):
    prompt = policy.encode(role, [{"role": "user", "content": "2+3?"}])
    with torch.no_grad():
        return policy.sequence_logprobs(role, [prompt, prompt[:-2]], [[5, 9, 11], [7, 3]], reference=reference).logprobs


@pytest.mark.parametrize("mode", ["lora", "shared"])
def test_frozen_reference_is_the_policy_of_that_moment_not_the_base(tmp_path, mode):
    policy = perturbed_policy(ROLES) if mode == "lora" else None
    if policy is None:
        from marft_algos.models import TeamPolicy

        policy = TeamPolicy(ROLES, base="tiny-random", mode=mode, max_context=256)
        perturb(policy)
    base = {r: _scores(policy, r, reference=True) for r in ROLES}
    at_init = {r: _scores(policy, r, reference=False) for r in ROLES}
    trainable = {r: {id(p) for p in policy.trainable_parameters(r)} for r in ROLES}
    policy.freeze_reference()
    perturb(policy, seed=1)  # "RL" moves the role adapters on
    policy.set_train_role(None)
    for r in ROLES:
        assert not torch.allclose(at_init[r], base[r])  # the test needs a policy away from the base
        torch.testing.assert_close(_scores(policy, r, reference=True), at_init[r], rtol=0, atol=1e-6)
        assert not torch.allclose(_scores(policy, r, reference=False), at_init[r])
        assert {id(p) for p in policy.trainable_parameters(r)} == trainable[r]  # the copy is not trained
    frozen = [p for b in policy.loaded_bases for n, ps in b.adapter_params.items() if n.startswith("__ref__") for p in ps]
    assert frozen and not any(p.requires_grad for p in frozen)
    saved = policy.save(tmp_path / "p")
    assert not any(d.name.startswith("__ref__") for d in (saved / "adapters").iterdir())
    assert set(json.loads((saved / "policy.json").read_text())["adapters"].values()) <= {"reasoner", "actor", "shared"}


def test_full_mode_freezes_a_new_copy():
    from marft_algos.models import TeamPolicy

    policy = TeamPolicy(ROLES, base="tiny-random", mode="full", max_context=256)
    perturb(policy, scale=0.01)
    at_init = _scores(policy, "actor", reference=False)
    assert not torch.allclose(_scores(policy, "actor", reference=True), at_init)  # still the construction-time copy
    policy.freeze_reference()
    perturb(policy, scale=0.01, seed=1)
    torch.testing.assert_close(_scores(policy, "actor", reference=True), at_init, rtol=0, atol=1e-6)


def test_reference_init_needs_init_from():
    with pytest.raises(ConfigError, match="set init_from"):
        GRPOConfig(env_id="echo-duo-v0", model="tiny-random", reference="init")
    with pytest.raises(ConfigError, match="'base' or 'init'"):
        GRPOConfig(env_id="echo-duo-v0", model="tiny-random", reference="sft")


def _warm_run(tmp_path, reference):
    """A GRPO step from a saved, moved policy (a stand-in for an SFT run dir: ``init_from``
    takes any TeamPolicy.save dir), with a KL penalty; its metrics."""
    src = perturbed_policy(["speaker", "listener"])
    src.save(tmp_path / "init")
    cfg = GRPOConfig(env_id="echo-duo-v0", model="tiny-random", device="cpu", init_from=str(tmp_path / "init"), reference=reference,
                     beta=0.1, num_envs=2, group_size=2, steps=1, progress=False, tensorboard=False, plot=False, env_kwargs=SHAPED,
                     sampling_overrides={a: {"max_new_tokens": 3} for a in ("speaker", "listener")}, out_dir=str(tmp_path / reference))
    return GRPOTrainer(cfg).train_step()


def test_a_warm_run_measures_its_kl_from_the_init_weights(tmp_path):
    # first batch: the rollout policy IS the init weights, so KL to an "init" reference is 0
    # exactly, while KL to the base is the distance the init run moved
    init = _warm_run(tmp_path, "init")
    base = _warm_run(tmp_path, "base")
    for a in ("speaker", "listener"):
        assert init[f"agent/{a}/rollout_ref_kl"] == pytest.approx(0.0, abs=1e-6)
        assert init[f"agent/{a}/ref_kl"] == pytest.approx(0.0, abs=1e-6)
        assert base[f"agent/{a}/rollout_ref_kl"] > 1e-3
