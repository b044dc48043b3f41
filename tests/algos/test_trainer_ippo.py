"""Independent PPO: per-agent GAE (vs stable-baselines3), no cross-agent chaining, learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marft_algos.algos.ippo import IPPOConfig
from marft_algos.config import ConfigError
from marft_algos.records import Episode, RolloutBatch, Transition

pytest.importorskip("marft_algos.models")
from helpers.tiny_echo import CHANCE, echo_config, letter_policy  # noqa: E402
from helpers.training import assert_learns_from_chance  # noqa: E402

from marft_algos.algos.ippo import IPPOTrainer  # noqa: E402


def tiny_config(**kw) -> IPPOConfig:
    return echo_config(IPPOConfig, **kw)


def make(**kw) -> IPPOTrainer:
    return IPPOTrainer(tiny_config(**kw), policy=letter_policy())


@pytest.fixture(scope="module")
def trainer() -> IPPOTrainer:
    return make(gamma=0.9, lam=0.8, normalize_advantages="none")


def make_batch(chains: dict[str, list[list[tuple[float, float]]]]) -> RolloutBatch:
    """Episodes whose transitions alternate agents; chains[agent][e] = [(reward, value), ...]."""
    episodes = []
    n_eps = len(next(iter(chains.values())))
    for e in range(n_eps):
        ep = Episode(episode_id=e, group_id=e, seed=e)
        steps = max(len(chains[a][e]) for a in chains)
        for k in range(steps):
            for agent in chains:
                if k < len(chains[agent][e]):
                    r, v = chains[agent][e][k]
                    ep.transitions.append(
                        Transition(
                            episode_id=e, group_id=e, index=len(ep.transitions), turn=k, agent=agent,
                            prompt_ids=[1], response_ids=[2], sampler_logprobs=[-1.0], team_reward=r, reward=r, credited_reward=r, value=v,
                            done=k == len(chains[agent][e]) - 1,
                        )
                    )
        episodes.append(ep)
    return RolloutBatch(episodes=episodes)


def test_own_rewards_reach_agents_that_do_not_close_the_turn(trainer):
    # one graded turn per episode: the team reward lands at the listener's step, so
    # `reward` is 0 for the speaker; reward_source="agent" must use the rewards credited
    # to it (PettingZoo cumulative rewards), not starve it
    eps = []
    for e, team_r in enumerate([1.0, 0.0]):
        ep = Episode(episode_id=e, group_id=e, seed=e)
        for k, agent in enumerate(("speaker", "listener")):
            ep.transitions.append(Transition(e, e, k, 0, agent, [1], [2], [-1.0], reward=team_r if agent == "listener" else 0.0,
                                             credited_reward=team_r, team_reward=team_r, value=0.0, done=True))
        eps.append(ep)
    batch = RolloutBatch(episodes=eps)
    trainer.config.reward_source = "agent"
    try:
        trainer.estimate(batch)
    finally:
        trainer.config.reward_source = "team"
    for ep, team_r in zip(batch.episodes, [1.0, 0.0], strict=True):
        assert [t.returns for t in ep.transitions] == [team_r, team_r]


def sb3_gae(rewards, values, starts, gamma, lam):
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    n = len(rewards)
    buf = RolloutBuffer(n, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gamma=gamma, gae_lambda=lam, n_envs=1)
    for r, v, s in zip(rewards, values, starts, strict=True):
        buf.add(np.zeros((1, 1), np.float32), np.zeros((1, 1)), np.array([r]), np.array([s]), torch.tensor([v]), torch.tensor([0.0]))
    # the last episode ends at the end of the buffer
    buf.compute_returns_and_advantage(last_values=torch.tensor([0.0]), dones=np.array([1.0]))
    return buf.advantages.reshape(-1), buf.returns.reshape(-1)


def test_single_agent_gae_matches_stable_baselines3(trainer):
    rng = np.random.default_rng(0)
    lengths = [3, 5, 1, 4]
    chains = [[(float(rng.normal()), float(rng.normal())) for _ in range(L)] for L in lengths]
    batch = make_batch({"speaker": chains})
    trainer.estimate(batch)
    rewards = [r for c in chains for r, _ in c]
    values = [v for c in chains for _, v in c]
    starts = [float(k == 0) for c in chains for k in range(len(c))]
    adv_ref, ret_ref = sb3_gae(rewards, values, starts, gamma=0.9, lam=0.8)
    adv = np.array([t.advantage for t in batch.transitions])
    ret = np.array([t.returns for t in batch.transitions])
    np.testing.assert_allclose(adv, adv_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, ret_ref, rtol=1e-5, atol=1e-6)


def test_no_cross_agent_chaining(trainer):
    # two agents interleaved; each agent's advantages equal its own single-agent GAE,
    # whatever the other agent's rewards and values are
    rng = np.random.default_rng(1)
    sp = [[(float(rng.normal()), float(rng.normal())) for _ in range(3)]]
    li_a = [[(float(rng.normal()), float(rng.normal())) for _ in range(3)]]
    li_b = [[(100.0, -50.0)] * 3]
    adv_a = make_batch({"speaker": sp, "listener": li_a})
    adv_b = make_batch({"speaker": sp, "listener": li_b})
    trainer.estimate(adv_a)
    trainer.estimate(adv_b)
    sp_a = [t.advantage for t in adv_a.transitions if t.agent == "speaker"]
    sp_b = [t.advantage for t in adv_b.transitions if t.agent == "speaker"]
    np.testing.assert_allclose(sp_a, sp_b)
    ref, _ = sb3_gae([r for r, _ in sp[0]], [v for _, v in sp[0]], [1, 0, 0], 0.9, 0.8)
    np.testing.assert_allclose(sp_a, ref, rtol=1e-5, atol=1e-6)


def test_overlong_action_is_passed_through_in_the_agents_chain(trainer):
    # the speaker's 2nd action had no room in the context (not trainable; 9.9 is garbage):
    # its 1st action bootstraps from its 3rd (gamma 0.9, lam 0.8, fixture)
    batch = make_batch({"speaker": [[(0.0, 0.5), (0.2, 9.9), (1.0, 0.3)]]})
    batch.transitions[1].trainable = False
    trainer.estimate(batch)
    A2 = 1.0 - 0.3
    A1 = 0.72 * A2
    A0 = 0.9 * (0.2 + 0.9 * 0.3) - 0.5 + 0.72 * A1
    np.testing.assert_allclose([t.advantage for t in batch.transitions], [A0, A1, A2], atol=1e-12)


def test_config_validation():
    with pytest.raises(ConfigError, match="gamma"):
        tiny_config(gamma=1.5)
    with pytest.raises(ConfigError, match="eps_high"):
        tiny_config(eps_low=0.3, eps_high=0.1)
    with pytest.raises(ConfigError, match="value_loss"):
        tiny_config(value_loss="l1")
    with pytest.raises(ConfigError, match="unknown agents"):
        IPPOTrainer(tiny_config(lr_per_agent={"speaker": 1e-3, "narrator": 1e-3}), policy=object())
    tiny_config(beta=0.1, mode="full")  # as GRPO and MARFT: the reference is the frozen initial copy


def test_value_heads_train_and_are_per_agent():
    t = make(num_envs=4)
    before = {a: [p.detach().clone() for p in t.algorithm.value_parameters(a)] for a in t.agents}
    t.train_step()
    for a in t.agents:
        after = t.algorithm.value_parameters(a)
        assert any(not torch.equal(b, p) for b, p in zip(before[a], after, strict=True)), f"value head of {a} did not move"
    ids = {a: {id(p) for p in t.algorithm.value_parameters(a)} for a in t.agents}
    assert not (ids["speaker"] & ids["listener"])  # one head per agent


@pytest.mark.timeout(400)
def test_ippo_learns_echo():
    """The team goes from chance (1/|V| = 0.125) to >= 0.8 correct with per-agent critics."""
    torch.set_num_threads(2)
    t = make(num_envs=16, lr=0.05, critic_lr=0.01, seed=0)
    assert_learns_from_chance(t, CHANCE)


def tool_action_batch() -> RolloutBatch:
    """One graded turn: the speaker's action is three segments (two tool calls, then its
    reply; one action key), then the listener answers. The collector writes the turn's team
    reward (1.0) on every transition of the turn, segments included; values are 0."""
    ep = Episode(episode_id=0, group_id=0, seed=0, team_return=1.0)
    for k, (agent, seg) in enumerate([("speaker", 0), ("speaker", 1), ("speaker", 2), ("listener", 0)]):
        ep.transitions.append(Transition(0, 0, k, 0, agent, [1], [2], [-1.0], team_reward=1.0, segment=seg,
                                         action_index=0 if agent == "speaker" else k, value=0.0,
                                         reward=1.0 if agent == "listener" else 0.0,
                                         credited_reward=1.0 if k in (2, 3) else 0.0, done=k in (2, 3)))
    return RolloutBatch(episodes=[ep])


def test_team_reward_enters_once_per_tool_calling_action(trainer):
    # the speaker's three segments are links of its chain (gamma 0.9, lam 0.8, fixture): the
    # team reward enters at the last segment only, as "agent" credit and the other trainers
    # have it; before, every segment got +1 and the tool calls alone were worth 1 + 0.72 ...
    batch = tool_action_batch()
    assert trainer.algorithm.reward_source == "team"
    trainer.estimate(batch)
    np.testing.assert_allclose([t.returns for t in batch.transitions], [0.72**2, 0.72, 1.0, 1.0], atol=1e-12)
    team = [t.returns for t in batch.transitions]
    old, trainer.config.reward_source = trainer.config.reward_source, "agent"
    try:
        batch = tool_action_batch()
        trainer.estimate(batch)
    finally:
        trainer.config.reward_source = old
    assert [t.returns for t in batch.transitions] == pytest.approx(team)  # the two sources agree here
