"""The TextArena adapter (optional extra ``textarena``): skipped when the package is absent."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

import marft_envs
from marft_envs.games.textarena_adapter import TEXTARENA_GAMES, textarena_available
from marft_envs.testing import check_env


def test_ids_registered_iff_installed():
    registered = {i for i in TEXTARENA_GAMES if i in marft_envs.registry}
    assert registered == (set(TEXTARENA_GAMES) if textarena_available() else set())


def test_missing_package_gives_a_clear_error():
    if textarena_available():
        pytest.skip("textarena is installed: the missing-package error cannot be shown")
    from marft_envs.games.textarena_adapter import TextArenaGameEnv

    with pytest.raises(ImportError, match=r"pip install 'marft\[textarena\]'"):
        TextArenaGameEnv("game-tictactoe-v0")


needs_textarena = pytest.mark.skipif(not textarena_available(),
                                     reason="optional package 'textarena' not installed (pip install 'marft[textarena]')")


@needs_textarena
@pytest.mark.parametrize("env_id", sorted(TEXTARENA_GAMES))
def test_conforms_and_leaves_global_random_alone(env_id):
    random.seed(123)
    before = random.getstate()
    check_env(env_id, n_episodes=3)
    assert random.getstate() == before


@needs_textarena
def test_tictactoe_win_is_zero_sum_through_last():
    env = marft_envs.make("game-tictactoe-v0")
    env.reset(seed=0)
    first = env.agent_selection
    # first player: 0, 1, 2 (top row); second: 3, 4
    script = {first: iter(["[0]", "[1]", "[2]"]), **{a: iter(["[3]", "[4]"]) for a in env.possible_agents if a != first}}
    got = dict.fromkeys(env.possible_agents, 0.0)
    for agent in env.agent_iter(50):
        _, reward, term, trunc, info = env.last()
        got[agent] += reward
        if term or trunc:
            assert info["outcome"] == ("win" if agent == first else "loss")
        env.step(None if term or trunc else next(script[agent]))
    assert got[first] == 1.0 and sum(got.values()) == 0.0


@needs_textarena
def test_invalid_move_is_retried_then_forfeits():
    env = marft_envs.make("game-tictactoe-v0")
    env.reset(seed=0)
    mover = env.agent_selection
    env.step("no move here")
    assert env.agent_selection == mover and "invalid_move" in env.infos[mover]["flags"]
    env.step("still nothing")
    assert env.infos[mover]["outcome"] == "loss" and env.infos[mover]["forfeit"] == mover


@needs_textarena
def test_kuhn_poker_is_reproducible_and_copyable():
    def play(env, seed):
        env.reset(seed=seed)
        trace = []
        for agent in env.agent_iter(100):
            obs, reward, term, trunc, _ = env.last()
            trace.append((agent, obs["prompt"], reward))
            env.step(None if term or trunc else "[check]")
        return trace

    a, b = marft_envs.make("game-kuhnpoker-v0"), marft_envs.make("game-kuhnpoker-v0")
    assert play(a, 5) == play(b, 5)
    a.reset(seed=7)
    a.step("[check]")
    c, d = copy.deepcopy(a), pickle.loads(pickle.dumps(a))
    for env in (c, d):
        assert env.observe(env.agent_selection) == a.observe(a.agent_selection)
