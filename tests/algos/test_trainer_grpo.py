"""GRPO trainer: advantages through the trainer, dynamic sampling, NaN guard, config checks, learning."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from marft_algos.algos.grpo import GRPOConfig
from marft_algos.config import ConfigError
from marft_algos.optim import OptimizerSet, group_key
from marft_algos.records import Episode, RolloutBatch, Transition

pytest.importorskip("marft_algos.models")
from helpers.tiny_echo import CHANCE, echo_config, letter_policy  # noqa: E402
from helpers.training import assert_learns_from_chance  # noqa: E402

from marft_algos.algos.grpo import GRPO, GRPOTrainer  # noqa: E402


def tiny_config(**kw) -> GRPOConfig:
    return echo_config(GRPOConfig, **{"group_size": 2, **kw})


def make(**kw) -> GRPOTrainer:
    return GRPOTrainer(tiny_config(**kw), policy=letter_policy())


@pytest.fixture(scope="module")
def trainer() -> GRPOTrainer:
    return make()


def batch_from_returns(returns_by_group: list[list[float]], agents=("speaker", "listener")) -> RolloutBatch:
    episodes, eid = [], 0
    for g, returns in enumerate(returns_by_group):
        for R in returns:
            ep = Episode(episode_id=eid, group_id=g, seed=g, team_return=R)
            for k, a in enumerate(agents):
                ep.transitions.append(Transition(eid, g, k, 0, a, [1], [2], [-1.0], team_reward=R))
            episodes.append(ep)
            eid += 1
    return RolloutBatch(episodes=episodes)


def test_group_relative_advantages_closed_form(trainer):
    batch = batch_from_returns([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, 0.5]])
    trainer.config.normalize_advantages = "group"
    trainer.estimate(batch)
    for ep in batch.episodes:
        group = [e.team_return for e in batch.episodes if e.group_id == ep.group_id]
        mu, sd = np.mean(group), np.std(group, ddof=1)
        expected = (ep.team_return - mu) / (sd + 1e-6)
        for t in ep.transitions:  # every agent's action carries its episode's advantage
            assert t.advantage == pytest.approx(expected, abs=1e-6)
    # an all-equal group carries no signal: exactly 0
    assert all(t.advantage == 0.0 for ep in batch.episodes if ep.group_id == 1 for t in ep.transitions)


def test_agentwise_normalization_uses_agent_statistics(trainer):
    # reward_source="agent": agents see different reward scales; Dr. MAS normalises per agent
    batch = batch_from_returns([[1.0, 0.0, 1.0, 0.0]])
    for ep in batch.episodes:
        sp, li = ep.transitions
        sp.credited_reward, li.credited_reward = 10.0 * ep.team_return, ep.team_return + 0.5 * (ep.episode_id % 2 == 0)
    trainer.config.reward_source, trainer.config.normalize_advantages = "agent", "agent"
    try:
        trainer.estimate(batch)
    finally:
        trainer.config.reward_source, trainer.config.normalize_advantages = "team", "group"
    for agent in ("speaker", "listener"):
        adv = np.array([t.advantage for t in batch.transitions if t.agent == agent])
        assert abs(adv.mean()) < 1e-6 and np.std(adv, ddof=1) == pytest.approx(1.0, rel=1e-4)


def duo_episode(eid: int, group: int, team_r: float) -> Episode:
    """A graded duo turn as the collector records it: the team reward is set for both agents
    at the actor's step, so ``reward`` (read right after each agent's own step) is 0 for the
    reasoner, while ``credited_reward`` (PettingZoo's cumulative rewards up to its next
    action) credits it to both agents' last actions."""
    ep = Episode(episode_id=eid, group_id=group, seed=group, team_return=team_r)
    ep.transitions = [
        Transition(eid, group, 0, 0, "speaker", [1], [2], [-1.0], reward=0.0, credited_reward=team_r, team_reward=team_r),
        Transition(eid, group, 1, 0, "listener", [1], [2], [-1.0], reward=team_r, credited_reward=team_r, team_reward=team_r),
    ]
    return ep


def test_own_rewards_credit_every_agent_not_only_the_last(trainer):
    # reward_source="agent" with a shared team reward: each agent's own return is the team
    # return, so both agents' advantages equal the team-reward ones (before, the speaker's
    # own return was 0 in every episode and it got negative advantages when the team won)
    batch = RolloutBatch(episodes=[duo_episode(0, 0, 1.0), duo_episode(1, 0, 0.0), duo_episode(2, 0, 1.0), duo_episode(3, 0, 0.0)])
    trainer.config.reward_source = "agent"
    try:
        trainer.estimate(batch)
    finally:
        trainer.config.reward_source = "team"
    for ep in batch.episodes:
        sp, li = ep.transitions
        assert sp.returns == li.returns == ep.team_return
        assert sp.advantage == pytest.approx(li.advantage) and np.sign(sp.advantage) == (1 if ep.team_return else -1)
    assert batch.episodes[0].agent_return("speaker") == 1.0


def test_dynamic_sampling_drops_all_equal_groups(monkeypatch):
    t = make(num_envs=4, group_size=2, dynamic_sampling=True, max_resample_tries=2)
    rounds = iter([
        batch_from_returns([[1.0, 1.0], [0.0, 1.0]]),  # group 0 all-equal: dropped
        batch_from_returns([[0.0, 0.0]]),  # dropped again
        batch_from_returns([[1.0, 0.0]]),  # fills the batch
    ])

    def fake_collect(num_groups=None):
        b = next(rounds)
        b.metrics = {"team/reward": float(np.mean([e.team_return for e in b.episodes])), "rollout/tokens": 4.0, "perf/rollout_s": 1.0}
        return b

    monkeypatch.setattr(t.collector, "collect", fake_collect)
    batch = t.collect()
    assert len(batch.groups()) == 2 and len(batch.episodes) == 4
    for g in batch.groups().values():
        assert len({e.team_return for e in g}) > 1
    assert batch.metrics["rollout/groups_dropped"] == 2 and batch.metrics["rollout/dynamic_tries"] == 2
    assert batch.metrics["team/reward"] == 0.75  # reward of the first (unfiltered) round


def test_dynamic_sampling_judges_groups_by_the_rewards_the_advantages_use(monkeypatch):
    t = make(num_envs=4, group_size=2, dynamic_sampling=True, max_resample_tries=1, reward_source="agent")
    first = batch_from_returns([[0.0, 0.0], [1.0, 0.0]])
    # group 0: equal team returns, but the speaker's own rewards differ: signal, kept
    first.episodes[0].transitions[0].credited_reward = 1.0
    # group 1: team returns differ, but every agent's own rewards are equal (all 0): dropped
    rounds = iter([first, batch_from_returns([[0.0, 0.0]])])

    def fake_collect(num_groups=None):
        b = next(rounds)
        b.metrics = {"team/reward": 0.0}
        return b

    monkeypatch.setattr(t.collector, "collect", fake_collect)
    batch = t.collect()
    assert [e.episode_id for e in batch.episodes] == [0, 1]
    assert batch.metrics["rollout/groups_dropped"] == 2  # group 1, then the all-zero resample
    t.estimate(batch)
    assert any(tr.advantage != 0 for tr in batch.transitions)
    # with team rewards the same first round keeps group 1 and drops group 0
    t.config.reward_source = "team"
    assert [t.algorithm._all_equal(g) for g in first.groups().values()] == [True, False]


def _snapshot(t):
    return [p.detach().clone() for a in t.agents for p in t.policy.trainable_parameters(a)]


def test_nonfinite_loss_and_gradient_are_skipped_and_counted(monkeypatch):
    t = make()
    real_loss = GRPO.policy_loss
    calls = {"n": 0}

    def nan_loss(self, agent, mb, stats):
        loss, m = real_loss(self, agent, mb, stats)
        calls["n"] += 1
        return loss * float("nan"), m

    batch = t.collect()
    batch.episodes[0].team_return = 1.0  # make sure advantages are non-zero
    t.estimate(batch)
    before = _snapshot(t)
    monkeypatch.setattr(GRPO, "policy_loss", nan_loss)
    t.update(batch)
    assert calls["n"] == 2  # both agents tried
    assert t.counters["train/nonfinite_skips"] == 2
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(t), strict=True))
    monkeypatch.setattr(GRPO, "policy_loss", real_loss)
    # a NaN gradient (finite loss) is caught too
    t.policy.set_train_role("speaker")
    param = next(iter(t.policy.trainable_parameters("speaker")))
    handle = param.register_hook(lambda g: g * float("nan"))
    try:
        t.update(batch)
    finally:
        handle.remove()
    assert t.counters["train/nonfinite_skips"] == 3
    assert t.counters["agent/speaker/nonfinite_skips"] == 2
    assert all(torch.isfinite(p).all() for p in _snapshot(t))
    m = t.train_step()  # a clean step still trains and reports the counter
    assert m["train/nonfinite_skips"] == 3
    assert not all(torch.equal(a, b) for a, b in zip(before, _snapshot(t), strict=True))


def test_config_validation():
    with pytest.raises(ConfigError, match="group_size >= 2"):
        tiny_config(group_size=1, num_envs=4)
    with pytest.raises(ConfigError, match="eps_high"):
        tiny_config(eps_low=0.3, eps_high=0.2)
    with pytest.raises(ConfigError, match="multiple of group_size"):
        tiny_config(num_envs=5, group_size=2)
    with pytest.raises(ConfigError, match="loss_agg"):
        tiny_config(loss_agg="episode")
    with pytest.raises(ConfigError, match="unknown sampling"):
        tiny_config(sampling_overrides={"speaker": {"temprature": 0.5}})
    with pytest.raises(ConfigError, match="unknown agents"):
        GRPOTrainer(tiny_config(sampling_overrides={"reasoner": {"temperature": 0.5}}), policy=object())
    with pytest.raises(ConfigError, match="unknown dtype"):
        tiny_config(dtype="fp8")
    with pytest.raises(ConfigError, match="init_loss_scale"):
        tiny_config(dtype="float16", init_loss_scale=0.0)
    tiny_config(dtype="float16")  # fp16 trains with dynamic loss scaling (tests/algos/test_fp16.py)
    tiny_config(eps_low=0.2, eps_high=0.28, dynamic_sampling=True)  # DAPO settings are fine
    tiny_config(beta=0.1, mode="full")  # the reference is the frozen initial copy


def test_kl_to_reference_is_logged_when_beta_positive():
    t = make(beta=0.1, ppo_epochs=2, num_minibatches=2)
    m = t.train_step()
    for a in t.agents:
        assert m[f"agent/{a}/ref_kl"] >= 0
        for key in ("kl", "entropy", "clip_frac", "grad_norm", "response_len", "reward"):
            assert f"agent/{a}/{key}" in m, key


@pytest.mark.timeout(400)
def test_grpo_learns_echo():
    """The team goes from chance (1/|V| = 0.125) to >= 0.8 correct: the listener learns the speaker's word."""
    torch.set_num_threads(2)
    t = make(num_envs=16, group_size=4, lr=0.05, seed=0)
    assert_learns_from_chance(t, CHANCE)


def test_turn_estimator_counts_the_team_reward_once_per_tool_calling_action():
    # MARS turn-level returns with the team reward: the speaker's action is two segments (a
    # tool call, then its reply; one action key), and the collector writes the turn's team
    # reward on both. Its return is the team reward once (as a one-segment action's and as
    # the outcome estimator's team_return), not once per segment.
    t = make(advantage_estimator="turn", normalize_advantages="none")
    assert t.algorithm.reward_source == "team"
    ep = Episode(episode_id=0, group_id=0, seed=0, team_return=1.0)
    for k, (agent, seg) in enumerate([("speaker", 0), ("speaker", 1), ("listener", 0)]):
        ep.transitions.append(Transition(0, 0, k, 0, agent, [1], [2], [-1.0], team_reward=1.0, segment=seg,
                                         action_index=0 if agent == "speaker" else k))
    t.estimate(RolloutBatch(episodes=[ep]))
    assert [tr.returns for tr in ep.transitions] == [1.0, 1.0, 1.0]  # turn_gamma 1: the reply's reward reaches the call


@pytest.mark.parametrize("dynamic", [False, True])
def test_train_step_collects_the_groups_asked_for(dynamic):
    """train_step(num_groups=n) plays n groups this step only (a last step fitted to a token budget)."""
    t = make(num_envs=6, group_size=2, dynamic_sampling=dynamic, max_resample_tries=1)
    t.train_step(1)
    first = len(t.last_batch.episodes)
    assert (first <= 2 if dynamic else first == 2) and t.groups_this_step() == 3  # dynamic sampling keeps at most the 1 group
    t.train_step()
    assert len(t.last_batch.episodes) <= 6 if dynamic else len(t.last_batch.episodes) == 6
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_groups"):
            t.train_step(bad)
    assert t.groups_this_step() == 3 and t.global_step == 2  # a refused step changes nothing


@pytest.mark.parametrize("epochs,minibatches", [(1, 1), (2, 2)])
def test_a_step_without_signal_skips_the_backward_and_steps_exactly_as_the_full_path(monkeypatch, epochs, minibatches):
    """Every group scored alike and no KL or entropy term: the policy loss and its gradient are
    identically 0, so the trainer runs the forward (its metrics) but not the backward, and AdamW
    steps on zero gradients. Its momentum (from a step with signal) moves the weights exactly
    as the full path does, bit for bit, and every metric is logged."""
    t = make(ppo_epochs=epochs, num_minibatches=minibatches, weight_decay=0.01)

    def scored(returns):
        b = t.collect()
        for ep, r in zip(b.episodes, returns, strict=True):
            ep.team_return = r
            for tr in ep.transitions:
                tr.team_reward = r
        t.estimate(b)
        return b

    t.update(scored([1.0, 0.0, 0.0, 1.0]))  # a step with signal: AdamW's moments are non-zero from here on
    batch = scored([1.0] * 4)  # every episode of every group scores alike
    assert all(tr.advantage == 0 for tr in batch.transitions)
    keys = {a: group_key("policy", a) for a in t.agents}
    snaps = {a: t.optim.snapshot(k) for a, k in keys.items()}
    backwards = {"n": 0}
    real_backward = OptimizerSet.backward

    def counted(self, *a, **kw):
        backwards["n"] += 1
        return real_backward(self, *a, **kw)

    monkeypatch.setattr(OptimizerSet, "backward", counted)
    m = t.update(copy.deepcopy(batch))
    fast = _snapshot(t)
    assert backwards["n"] == 0
    for a in t.agents:
        assert m[f"agent/{a}/backward_skipped"] == 1.0 and m[f"agent/{a}/policy_loss"] == 0.0 and m[f"agent/{a}/grad_norm"] == 0.0
    for a, k in keys.items():
        t.optim.restore(k, snaps[a])
    t.skip_vanishing_updates = False
    m_full = t.update(batch)
    assert backwards["n"] > 0 and m_full[f"agent/{t.agents[0]}/backward_skipped"] == 0.0
    assert set(m) == set(m_full)
    for k, v in m_full.items():
        if not k.endswith("backward_skipped") and not k.startswith("perf/"):  # perf/: timings
            assert m[k] == pytest.approx(v, rel=1e-5, abs=1e-4), k  # a no-grad forward may round log-probs otherwise (~1e-5)
    full = _snapshot(t)
    assert all(torch.equal(a, b) for a, b in zip(fast, full, strict=True))
    before = [p for a in t.agents for p in snaps[a][0]]
    assert not all(torch.equal(a, b) for a, b in zip(before, full, strict=True))  # the step moved the weights


def test_terms_without_advantages_keep_the_backward():
    t = make()
    mb = batch_from_returns([[1.0, 1.0]]).agent_transitions("speaker")
    for tr in mb:
        tr.advantage = 0.0
    assert t.algorithm.policy_term_vanishes(mb)
    for name in ("beta", "ent_coef"):
        setattr(t.config, name, 0.01)
        assert not t.algorithm.policy_term_vanishes(mb), name  # the KL / entropy term has a gradient
        setattr(t.config, name, 0.0)
    mb[0].advantage = 0.5
    assert not t.algorithm.policy_term_vanishes(mb)


def test_a_snapshot_restores_the_same_state_twice():
    """OptimizerSet.restore copies the saved AdamW state: steps after one restore leave the snapshot as it was."""
    t = make()
    key = group_key("policy", "speaker")
    params = list(t.policy.trainable_parameters("speaker"))

    def step():
        for p in params:
            p.grad = torch.ones_like(p)
        t.optim.optimizers[key].step()

    step()
    snap = t.optim.snapshot(key)
    after = []
    for _ in range(2):
        t.optim.restore(key, snap)
        step()
        after.append([p.detach().clone() for p in params] + [s["exp_avg"].clone() for s in t.optim.optimizers[key].state.values()])
    assert all(torch.equal(a, b) for a, b in zip(*after, strict=True))
