"""check_step_output: the reward/info contract a collector can check on any AEC env."""

from __future__ import annotations

import math

import pytest
from gymnasium.spaces import Discrete
from hypothesis import given, settings
from hypothesis import strategies as st
from pettingzoo import AECEnv

import marft_envs
from marft_envs.testing import EnvContractError, check_step_output, random_episode


class _TwoStep(AECEnv):
    """A minimal third-party AEC env: ``a`` then ``b`` act once; the last step pays ``reward``.

    ``accumulate=False`` forgets ``_accumulate_rewards()`` (the reward stays in env.rewards).
    """

    metadata = {"name": "two_step_v0", "render_modes": []}

    def __init__(self, reward=1.0, accumulate=True, drop_info=False):
        super().__init__()
        self.reward, self.accumulate, self.drop_info = reward, accumulate, drop_info
        self.possible_agents = ["a", "b"]
        self._spaces = {a: Discrete(1) for a in self.possible_agents}

    def observation_space(self, agent):
        return self._spaces[agent]

    def action_space(self, agent):
        return self._spaces[agent]

    def observe(self, agent):
        return 0

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "a"

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        if agent == "b":
            for x in self.agents:
                self.rewards[x] = self.reward
                self.terminations[x] = True
            if self.drop_info:
                del self.infos["a"]
        self.agent_selection = "b" if agent == "a" else "a"
        if self.accumulate:
            self._accumulate_rewards()


def _play(env):
    env.reset(seed=0)
    for agent in env.agent_iter(10):
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        before = dict(env._cumulative_rewards)
        env.step(0)
        check_step_output(env, agent, previous_cumulative=before)


def test_a_well_behaved_env_passes():
    _play(_TwoStep())
    env = marft_envs.make("arith-duo-v0")
    random_episode(env, seed=0, oracle=1.0)  # calls check_step_output after every step


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_fail_loudly(reward):
    with pytest.raises(EnvContractError, match=r"_TwoStep after 'b' stepped: env.rewards\['a'\] = .* is not finite"):
        _play(_TwoStep(reward=reward))


@given(reward=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)))
@settings(max_examples=50, deadline=None)
def test_only_finite_real_rewards_pass(reward):
    if math.isfinite(reward):
        _play(_TwoStep(reward=reward))
    else:
        with pytest.raises(EnvContractError, match="is not finite"):
            _play(_TwoStep(reward=reward))


@pytest.mark.parametrize("reward", [True, "1", None])
def test_rewards_that_are_not_numbers_fail(reward):
    with pytest.raises(EnvContractError, match="is not a real number"):
        _play(_TwoStep(reward=reward, accumulate=isinstance(reward, bool)))


def test_reward_left_only_in_env_rewards_fails():
    with pytest.raises(EnvContractError, match=r"env._cumulative_rewards\['a'\] = 0.0 is not the accumulated reward.*_accumulate_rewards"):
        _play(_TwoStep(accumulate=False))
    with pytest.raises(AssertionError, match="_accumulate_rewards"):
        random_episode(_TwoStep(accumulate=False), 0, actions=[0, 0, None, None])  # as check_env plays


def test_missing_info_and_cumulative_entries_fail():
    with pytest.raises(EnvContractError, match="live agent 'a' has no info dict"):
        _play(_TwoStep(drop_info=True))
    env = _TwoStep()
    env.reset()
    del env._cumulative_rewards["b"]
    with pytest.raises(EnvContractError, match="env.rewards has 'b', env._cumulative_rewards has not"):
        check_step_output(env)
