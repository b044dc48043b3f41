"""``frozen_agents``: an agent that acts but is never trained, in every algorithm (issue 19)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.config import ConfigError  # noqa: E402
from marft_algos.registry import get_algorithm  # noqa: E402


def _config(algo: str, **kw):
    spec = get_algorithm(algo)
    names = {f.name for f in dataclasses.fields(spec.config_cls)}
    data = {k: v for k, v in echo_kwargs(steps=2, num_envs=8, **kw).items() if k in names}
    if "group_size" in names:
        data["group_size"] = 4
    return spec, spec.config_cls(**data)


@pytest.mark.parametrize("algo", ["grpo", "ippo", "marft-action", "marft-token"])
def test_a_frozen_agent_stays_bit_identical_while_the_other_learns(algo):
    spec, cfg = _config(algo, frozen_agents=["speaker"])
    t = spec.trainer_cls(cfg, policy=letter_policy())
    before = {r: [p.detach().clone() for p in t.policy.trainable_parameters(r)] for r in t.agents}
    out = t.train()[-1]
    assert "speaker" not in t.optimizers and "speaker" not in t.schedulers
    assert all(torch.equal(b, p) for b, p in zip(before["speaker"], t.policy.trainable_parameters("speaker"), strict=True))
    moved = [not torch.equal(b, p) for b, p in zip(before["listener"], t.policy.trainable_parameters("listener"), strict=True)]
    assert any(moved), f"{algo}: the trained agent did not move"
    assert t.optimizer_steps["listener"] > 0 and t.optimizer_steps["speaker"] == 0
    assert "agent/speaker/lr" not in out and "agent/listener/lr" in out
    assert any(t.agent == "speaker" for t in t.last_batch.transitions)  # it still acts
    if algo.startswith("marft"):
        assert out["agent/speaker/policy_updated"] == 0.0 and out["agent/listener/policy_updated"] == 1.0


def test_a_frozen_agent_survives_agent_by_agent_schedules():
    spec, cfg = _config("marft-action", frozen_agents=["speaker"], agent_by_agent=True)
    t = spec.trainer_cls(cfg, policy=letter_policy())
    assert t.algorithm.scheduled_agents(0) == t.algorithm.scheduled_agents(1) == ["listener"]


def test_freezing_rules_and_the_lr_zero_hint():
    with pytest.raises(ConfigError, match="frozen_agents"):
        _config("grpo", lr=0.0)
    with pytest.raises(ConfigError, match="frozen_agents"):
        _config("grpo", lr_per_agent={"speaker": 0.0})
    spec, cfg = _config("grpo", frozen_agents="speaker,listener")
    assert cfg.frozen_agents == ["speaker", "listener"]
    with pytest.raises(ConfigError, match="freezes the whole team"):
        spec.trainer_cls(cfg, policy=letter_policy())
    spec, cfg = _config("grpo", frozen_agents=["speakr"])
    with pytest.raises(ConfigError, match="unknown agents"):
        spec.trainer_cls(cfg, policy=letter_policy())
    spec, cfg = _config("grpo", frozen_agents=["speaker"])
    with pytest.raises(ConfigError, match="share their parameters"):
        spec.trainer_cls(cfg, policy=letter_policy(mode="shared"))
