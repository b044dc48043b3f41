"""Role names never collide with the trainers' internal names (issue 19, item 1).

A role named ``critic`` (or ``value``) used to share the optimizer key of MARFT's value
model: its LoRA stayed exactly zero, ``agent/critic/lr`` showed the critic's rate.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.ippo import IPPOConfig, IPPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.config import ConfigError  # noqa: E402

WRITER_CRITIC = {
    "vocabulary": ["a", "b", "c", "d"],
    "reward": {"outcome": 1.0, "format": 0.5},
    "profiles": [
        {"role": "writer", "prompt": "Say one word from the vocabulary.", "with_answer": False},
        {"role": "critic", "prompt": "Repeat the writer's word.", "with_answer": True},
    ],
}


def _kw(env=WRITER_CRITIC, **kw):
    roles = [p["role"] for p in env["profiles"]]
    return echo_kwargs(env_kwargs=env, sampling_overrides={r: {"max_new_tokens": 1} for r in roles}, **kw)


def _snap(policy, role):
    return [p.detach().clone() for p in policy.trainable_parameters(role)]


def _changed(before, policy, role):
    return any(not torch.equal(b, p) for b, p in zip(before, policy.trainable_parameters(role), strict=True))


def test_a_role_named_critic_is_trained_under_marft_action():
    roles = ("writer", "critic")
    cfg = MARFTActionConfig(**_kw(lr=0.01, critic_lr=0.003, normalize_advantages="none"))
    t = MARFTActionTrainer(cfg, policy=letter_policy(roles))
    assert t.agents == ["writer", "critic"]
    before = {r: _snap(t.policy, r) for r in roles}
    out = t.train()[-1]
    for r in roles:
        assert _changed(before[r], t.policy, r), f"role {r!r} was not trained"
        assert t.optimizer_steps[r] > 0
        assert out[f"agent/{r}/policy_updated"] == 1.0
        assert out[f"agent/{r}/lr"] == pytest.approx(0.01)  # its own rate, not the critic's 0.003
    # the role's optimizer and the value model's are different objects over different parameters
    role_params = {id(p) for p in t.policy.trainable_parameters("critic")}
    critic_params = {id(p) for g in t.optimizers["__critic__"].param_groups for p in g["params"]}
    assert t.optimizers["critic"] is not t.optimizers["__critic__"] and not role_params & critic_params
    assert "critic/grad_norm" in out and "agent/critic/grad_norm" in out


def test_a_role_named_critic_keeps_its_adapter_apart_from_the_critic_lora():
    cfg = MARFTActionConfig(**_kw(critic_lora=True))
    t = MARFTActionTrainer(cfg, policy=letter_policy(("writer", "critic")))
    role_params = {id(p) for p in t.policy.trainable_parameters("critic")}
    critic_params = {id(p) for p in t.algorithm.critic.parameters()}
    assert role_params and not role_params & critic_params


def test_ippo_value_heads_do_not_collide_with_a_role_named_value():
    env = dict(WRITER_CRITIC, profiles=[dict(WRITER_CRITIC["profiles"][0], role="value"), WRITER_CRITIC["profiles"][1]])
    kw = _kw(env, steps=1)
    kw.pop("recovery")
    cfg = IPPOConfig(**kw)
    t = IPPOTrainer(cfg, policy=letter_policy(("value", "critic")))
    assert len({id(t.optimizers[k]) for k in t.optimizers}) == 4  # 2 policies + 2 value heads
    out = t.train()[-1]
    assert out["agent/value/lr"] == pytest.approx(cfg.lr)


def test_roles_in_the_internal_namespace_are_refused_with_a_clear_error():
    env = dict(WRITER_CRITIC, profiles=[dict(WRITER_CRITIC["profiles"][0], role="__critic__"), WRITER_CRITIC["profiles"][1]])
    with pytest.raises(ConfigError, match="rename these roles"):
        MARFTActionTrainer(MARFTActionConfig(**_kw(env)), policy=letter_policy(("__critic__", "critic")))


@pytest.mark.parametrize("roles", [("solver.v2", "solver_v2"), ("role_a", "a"), ("x y", "x_y", "z")])
def test_roles_that_sanitise_to_one_adapter_name_are_refused(roles):
    """issue 28 item 19: ``solver.v2`` and ``solver_v2`` used to share one adapter (one saved)."""
    from marft_algos.models.policy import AdapterNameError

    with pytest.raises(AdapterNameError, match="collide after sanitising") as e:
        letter_policy(roles)
    assert repr(roles[0]) in str(e.value) and repr(roles[1]) in str(e.value)


def test_distinct_sanitised_names_and_an_explicitly_shared_adapter_still_work():
    from marft_algos.models.policy import adapter_names

    assert adapter_names(["solver.v2", "checker"]) == {"solver.v2": "solver_v2", "checker": "checker"}
    assert adapter_names(["a", "b"]) == {"a": "role_a", "b": "b"}
    # roles that name the same adapter share it on purpose
    assert adapter_names(["p", "q"], {"p": "team.x", "q": "team.x"}) == {"p": "team_x", "q": "team_x"}
    policy = letter_policy(("solver.v2", "checker"))
    assert policy._adapter_of == {"solver.v2": "solver_v2", "checker": "checker"}
