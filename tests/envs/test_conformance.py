"""Every registered env passes check_env (our AEC/space/seeding/pickling checks plus PettingZoo's)."""

from __future__ import annotations

import random

import pytest

import marft_envs
from marft_envs import TextTeamEnv
from marft_envs.testing import check_env


def _needs_data(env_id: str) -> bool:
    kwargs = marft_envs.spec(env_id).kwargs
    return kwargs.get("task") in ("gsm8k", "math") or kwargs.get("dataset") == "mbpp"


@pytest.mark.parametrize("env_id", sorted(marft_envs.registry))
def test_registered_env_conforms(env_id, monkeypatch, request):
    if _needs_data(env_id):
        # conftest's data_dir: fails in CI when the data is missing, skips locally.
        monkeypatch.setenv("MARFT_DATA_DIR", str(request.getfixturevalue("data_dir")))
    check_env(env_id, n_episodes=3, seed=0)


@pytest.mark.parametrize("kwargs", [{"horizon": 3}, {"horizon": 2, "feedback": True, "max_action_chars": 64}])
@pytest.mark.parametrize("env_id", ["arith-duo-v0", "arith-routed-v0", "arith-trio-v0", "echo-duo-v0", "arith-planner-v0"])
def test_multi_turn_variants_conform(env_id, kwargs):
    check_env(env_id, n_episodes=4, seed=1, **kwargs)


def test_check_env_accepts_an_instance():
    env = marft_envs.make("arith-trio-v0", horizon=2)
    check_env(env, n_episodes=2)


# ---------------------------------------------------------- the checker catches bugs
class _NoClear(TextTeamEnv):
    def _clear_rewards(self):  # rewards leak into the next step: accumulated twice
        pass


class _StrObs(TextTeamEnv):
    def observe(self, agent):
        return super().observe(agent)["prompt"]


class _Unseeded(TextTeamEnv):
    def reset(self, seed=None, options=None):
        super().reset(seed=seed, options={"problem_index": random.randrange(self.num_problems)})


class _KeepsDead(TextTeamEnv):
    def _was_dead_step(self, action):  # never removes the dead agent
        self.agent_selection = self.agents[(self.agents.index(self.agent_selection) + 1) % len(self.agents)]


@pytest.mark.parametrize(
    "cls, match",
    [
        (_NoClear, "accumulated reward"),
        (_StrObs, "outside its"),
        (_Unseeded, "differ"),
        (_KeepsDead, "acted again|did not end|accumulated reward"),
    ],
)
def test_check_env_catches_broken_envs(cls, match):
    with pytest.raises(AssertionError, match=match):
        check_env(cls("arith", "duo"), n_episodes=2, pettingzoo_checks=False)

