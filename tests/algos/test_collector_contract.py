"""The collector checks every env step against the AEC contract (issue 19 item 6, issue 20).

A third-party env whose rewards live only in ``env.rewards`` (``_accumulate_rewards()``
never called), or whose rewards are NaN, used to be trained on silently; the collector
now fails on the first such step, naming the env and the agent.
"""

from __future__ import annotations

import math
import re

import pytest

import marft_envs
from marft_algos.rollout import RolloutCollector
from marft_envs.testing import EnvContractError

models = pytest.importorskip("marft_algos.models")


class RepeatPolicy:
    """The speaker says "red", the listener repeats it: every episode earns reward 1."""

    def encode(self, role, messages):
        return [ord(c) for c in "\n".join(m["content"] for m in messages)]

    def generate(self, requests):
        out = []
        for r in requests:
            prompt = "".join(chr(i) for i in r.prompt_ids)
            m = re.search(r"\[speaker\]: (\w+)", prompt)
            text = "red" if r.role == "speaker" else (m.group(1) if m else "red")
            for _ in range(r.n):
                ids = [ord(c) for c in text] + [0]
                out.append(models.GenResult(token_ids=ids, text=text, logprobs=[-0.5] * len(ids), finish_reason="eos"))
        return out


class BrokenEnv:
    """Delegates to the echo env; ``step`` then breaks the reward bookkeeping one way."""

    def __init__(self, env, how: str):
        self.__dict__.update(_env=env, _how=how)

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, action):
        env = self._env
        before = dict(env._cumulative_rewards)
        env.step(action)
        if self._how == "rewards_only" and any(env.rewards.values()):
            env._cumulative_rewards = before  # as if _accumulate_rewards() were never called
        elif self._how == "nan" and action is not None:
            for a in env.rewards:
                env.rewards[a] = math.nan
                env._cumulative_rewards[a] = math.nan


def _collector(how: str) -> RolloutCollector:
    return RolloutCollector(lambda: BrokenEnv(marft_envs.make("echo-duo-v0"), how), RepeatPolicy(), num_envs=2, seed=0)


def test_a_healthy_env_passes_the_check():
    batch = _collector("none").collect()
    assert batch.metrics["team/reward"] == 1.0


def test_rewards_that_never_reach_the_cumulative_totals_fail_loudly():
    with pytest.raises(EnvContractError, match=r"TextTeamEnv after 'listener' stepped.*_cumulative_rewards"):
        _collector("rewards_only").collect()


def test_nan_rewards_fail_loudly():
    with pytest.raises(EnvContractError, match=r"after 'speaker' stepped.*finite"):
        _collector("nan").collect()
