"""Agent-by-agent (sequential) updates: only the scheduled agent's adapter moves; the critic always trains."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer  # noqa: E402


def weights(t, agent):
    return [p.detach().clone() for p in t.policy.trainable_parameters(agent)]


def moved(before, t, agent) -> bool:
    return any(not torch.equal(b, p) for b, p in zip(before, t.policy.trainable_parameters(agent), strict=True))


def test_schedule_cycles_with_interval_and_warmup():
    t = MARFTActionTrainer(MARFTActionConfig(**echo_kwargs(agent_by_agent=True, agent_interval=2, critic_warmup_steps=1)), policy=letter_policy())
    sched = [t.algorithm.scheduled_agents(k) for k in range(7)]
    # step 0 is critic warm-up; then (k - 1) // 2 % 2: speaker, speaker, listener, listener, speaker, speaker
    assert sched == [[], ["speaker"], ["speaker"], ["listener"], ["listener"], ["speaker"], ["speaker"]]
    t.config.agent_by_agent = False
    assert t.algorithm.scheduled_agents(3) == ["speaker", "listener"]


@pytest.mark.parametrize("algo", ["action", "token"])
def test_only_the_scheduled_adapter_moves(algo):
    cls, cfg_cls = (MARFTActionTrainer, MARFTActionConfig) if algo == "action" else (MARFTTokenTrainer, MARFTTokenConfig)
    t = cls(cfg_cls(**echo_kwargs(agent_by_agent=True, agent_interval=1, lr=0.05)), policy=letter_policy())
    assert t.policy.mode == "lora"  # one adapter per agent on one base
    for step, agent in enumerate(["speaker", "listener", "speaker"]):
        other = "listener" if agent == "speaker" else "speaker"
        w_agent, w_other = weights(t, agent), weights(t, other)
        critic = [p.detach().clone() for p in t.algorithm.critic.parameters()]
        m = t.train_step()
        assert moved(w_agent, t, agent), f"step {step}: scheduled {agent} did not move"
        assert not moved(w_other, t, other), f"step {step}: {other} moved although not scheduled"
        assert any(not torch.equal(b, p) for b, p in zip(critic, t.algorithm.critic.parameters(), strict=True)), "critic must always train"
        assert m[f"agent/{agent}/policy_updated"] == 1.0 and m[f"agent/{other}/policy_updated"] == 0.0
        # the critic trained on BOTH agents' data
        assert f"agent/{other}/value_loss" in m


def test_routed_team_schedules_among_the_agents_that_acted():
    # arith-routed-v0: the orchestrator routes each problem to ONE of three specialists, so a
    # batch holds only some of the four agents. The schedule cycles over those present:
    # an update whose scheduled agent sat out would otherwise train no policy at all.
    agents = ["orchestrator", "algebra", "number_theory", "geometry"]
    cfg = MARFTActionConfig(**echo_kwargs(
        env_id="arith-routed-v0", env_kwargs={}, num_envs=2, agent_by_agent=True,
        sampling_overrides={a: {"max_new_tokens": 2} for a in agents},
    ))
    t = MARFTActionTrainer(cfg)
    assert t.agents == agents
    for step in range(4):
        m = t.train_step()
        present = [a for a in agents if t.last_batch.agent_transitions(a)]
        assert len(present) < len(agents), "the test needs a batch that misses some agent"
        updated = [a for a in agents if m[f"agent/{a}/policy_updated"] == 1.0]
        assert updated == [present[step % len(present)]], (step, present, updated)
    assert t.algorithm.scheduled_agents(2, present=["algebra", "orchestrator"]) == ["orchestrator"]  # team order
    assert t.algorithm.scheduled_agents(2) == ["number_theory"]  # without a batch: all agents
