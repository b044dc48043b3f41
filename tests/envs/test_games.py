"""Games with per-agent rewards: PettingZoo bookkeeping, zero-sum play, optimal play, fuzzing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marft_envs
from marft_envs.games import (
    MATRIX_GAMES,
    FixedPlayer,
    MatrixGameEnv,
    NimEnv,
    OptimalNimPlayer,
    RandomPlayer,
    match_outcomes,
    optimal_take,
    play_episode,
)
from marft_envs.games.nim import parse_take
from marft_envs.testing import BAD_ACTIONS, check_env

GAME_IDS = ["game-nim-v0", "game-matrix-v0"]


@pytest.mark.parametrize("kwargs", [{"on_invalid": "default", "piles": [1, 9], "max_take": 2},
                                    {"max_take": 1}, {"ask_move": True}])
def test_nim_variants_conform(kwargs):
    check_env(NimEnv(**kwargs), n_episodes=3, seed=2)


@pytest.mark.parametrize("game", sorted(MATRIX_GAMES))
def test_matrix_variants_conform(game):
    check_env(MatrixGameEnv(game=game, rounds=3), n_episodes=3, seed=1)


def test_registered_ids_make_the_games():
    assert isinstance(marft_envs.make("game-nim-v0"), NimEnv)
    assert isinstance(marft_envs.make("game-matrix-v0", rounds=2), MatrixGameEnv)
    import pettingzoo

    assert isinstance(pettingzoo.make("aec", "marft/game-nim-v0"), NimEnv)


# ------------------------------------------------------------ per-agent reward bookkeeping
def _play_collecting(env, players, seed, options=None):
    """Play a game through the AEC loop; return what last() paid each agent, summed."""
    env.reset(seed=seed, options=options)
    got = dict.fromkeys(env.possible_agents, 0.0)
    for agent in env.agent_iter(500):
        _, reward, term, trunc, info = env.last()
        got[agent] += reward
        # the dict PettingZoo keeps: what last() returns is _cumulative_rewards
        assert reward == env._cumulative_rewards[agent]
        env.step(None if term or trunc else players[agent](env, agent))
    assert not env.agents
    return got


@pytest.mark.parametrize("seed", range(25))
def test_nim_is_zero_sum_through_cumulative_rewards(seed):
    env = NimEnv(on_invalid="forfeit")
    players = {"player_0": RandomPlayer(seed), "player_1": RandomPlayer(seed + 100)}
    got = _play_collecting(env, players, seed)
    assert sorted(got.values()) == [-1.0, 1.0]  # one agent's gain is the other's loss
    assert got["player_0"] + got["player_1"] == 0.0


def test_nim_rewards_reach_the_agent_that_did_not_move_last():
    env = NimEnv()
    env.reset(seed=0, options={"pile": 2})
    env.step("MOVE: 1")  # player_0 leaves 1
    env.step("MOVE: 1")  # player_1 takes the last stone and wins
    assert env.rewards == {"player_0": -1.0, "player_1": 1.0}
    assert env.terminations == {"player_0": True, "player_1": True}
    # player_0 did not act in the final step: last() pays it at its dead step
    assert env.agent_selection == "player_0" and env.last()[1] == -1.0
    assert env.infos["player_0"]["outcome"] == "loss" and env.infos["player_1"]["outcome"] == "win"
    env.step(None)
    assert env.agent_selection == "player_1" and env.last()[1] == 1.0
    env.step(None)
    assert env.agents == []
    with pytest.raises(ValueError):  # a dead agent may only step None
        env.reset(seed=0, options={"pile": 1})
        env.step("MOVE: 1")
        env.step("MOVE: 1")


def test_nim_forfeit_and_default_move():
    env = NimEnv(on_invalid="forfeit")
    env.reset(seed=0, options={"pile": 5})
    env.step("I take four")  # unparsable
    info = env.infos["player_0"]
    assert info["forfeit"] == "player_0" and info["outcome"] == "loss"
    assert {"invalid_move", "move_unparsed"} <= set(info["flags"])
    assert env.rewards == {"player_0": -1.0, "player_1": 1.0}
    env = NimEnv(on_invalid="default")
    env.reset(seed=0, options={"pile": 5})
    env.step("MOVE: 4")  # illegal (max 3): takes 1 instead
    assert env.pile == 4 and {"invalid_move", "illegal_move"} <= set(env.infos["player_0"]["flags"])
    assert env.infos["player_0"]["parsed"] is None and env.agent_selection == "player_1"


def test_matrix_payoffs_are_each_players_own():
    env = MatrixGameEnv("prisoners_dilemma", rounds=3)
    moves = iter(["MOVE: C", "MOVE: D", "defect", "D", "C", "cooperate"])
    got = _play_collecting(env, {"player_0": lambda e, a: next(moves), "player_1": lambda e, a: next(moves)}, 0)
    # rounds: CD -> (0, 5); DD -> (1, 1); CC -> (3, 3)
    assert got == {"player_0": 4.0, "player_1": 9.0}
    assert env.history == [("C", "D"), ("D", "D"), ("C", "C")]


def test_matrix_hides_the_pending_move():
    env = MatrixGameEnv("prisoners_dilemma")
    env.reset(seed=0)
    before = env.observe("player_1")
    env.step("MOVE: D")
    assert env.observe("player_1") == before and env.moves == [("player_0", "D")]
    env.step("MOVE: C")
    info = env.infos["player_1"]
    assert info["payoffs"] == {"player_0": 5.0, "player_1": 0.0} and info["outcome"] == "loss"
    assert env.infos["player_0"]["winner"] == "player_0"


def test_matrix_unparsable_plays_the_first_move_flagged():
    env = MatrixGameEnv("stag_hunt")
    env.reset(seed=0)
    env.step(None)
    assert "invalid_move" in env.infos["player_0"]["flags"] and env.moves == [("player_0", "S")]


def test_bad_matrix_tables_are_refused():
    with pytest.raises(ValueError, match="unknown matrix game"):
        MatrixGameEnv("chess")
    with pytest.raises(ValueError, match="payoffs must give"):
        MatrixGameEnv({"moves": {"A": "a", "B": "b"}, "payoffs": {"AA": [1, 1]}})
    with pytest.raises(ValueError, match="piles"):
        NimEnv(piles=[5, 2])


# ------------------------------------------------------------------------ optimal play
@pytest.mark.parametrize("max_take", [1, 2, 3, 5])
def test_optimal_take_closed_form(max_take):
    for pile in range(1, 40):
        take = optimal_take(pile, max_take)
        if pile % (max_take + 1) == 0:
            assert take is None
        else:
            assert 1 <= take <= max_take and (pile - take) % (max_take + 1) == 0


@pytest.mark.parametrize("max_take", [1, 2, 3, 4])
def test_optimal_player_never_loses_from_a_winning_position(max_take):
    env = NimEnv(piles=[1, 30], max_take=max_take)
    for pile in range(1, 31):
        for seed in range(3):
            for seat in ("player_0", "player_1"):
                other = "player_1" if seat == "player_0" else "player_0"
                players = {seat: OptimalNimPlayer(), other: RandomPlayer(seed)}
                final = play_episode(env, players, seed=seed, options={"pile": pile})
                # the mover (player_0) is winning iff pile % (k+1) != 0
                seat_winning = (pile % (max_take + 1) != 0) == (seat == "player_0")
                if seat_winning:
                    assert final[seat]["outcome"] == "win", (pile, seat)
                assert final[seat]["return"] == final[seat]["payoff"]


def test_optimal_vs_optimal_follows_the_closed_form():
    env = NimEnv(piles=[1, 40], max_take=3)
    for pile in range(1, 41):
        final = play_episode(env, {"player_0": OptimalNimPlayer(), "player_1": OptimalNimPlayer()},
                             options={"pile": pile})
        expected = "win" if pile % 4 else "loss"
        assert final["player_0"]["outcome"] == expected


def test_match_outcomes_counts():
    env = NimEnv(piles=[8, 8], max_take=3)  # 8 % 4 == 0: player_0 is lost against optimal play
    counts = match_outcomes(env, {"player_0": RandomPlayer(0), "player_1": OptimalNimPlayer()}, n=10)
    assert counts["player_1"] == {"win": 10, "draw": 0, "loss": 0}
    assert counts["player_0"] == {"win": 0, "draw": 0, "loss": 10}
    pd = MatrixGameEnv()
    counts = match_outcomes(pd, {"player_0": FixedPlayer("D"), "player_1": FixedPlayer("D")}, n=3)
    assert counts["player_0"] == {"win": 0, "draw": 3, "loss": 0}


def test_start_positions_are_seeded_per_split():
    a, b = NimEnv(split="train"), NimEnv(split="test")
    piles_a, piles_b = [], []
    for k in range(30):
        a.reset(options={"problem_index": k})
        b.reset(options={"problem_index": k})
        piles_a.append(a.pile)
        piles_b.append(b.pile)
    assert piles_a != piles_b
    a.reset(options={"problem_index": 3})
    first = a.pile
    a.reset(seed=9)
    a.reset(options={"problem_index": 3})
    assert a.pile == first


def test_parse_take():
    assert parse_take("MOVE: 2 ... actually MOVE: 3") == 3
    assert parse_take("move=1") == 1
    assert parse_take("9" * 5000) is None  # no huge-int conversion
    assert parse_take("") is None
    # plain moves count only at the reply's start: an echo of the rules or state stays unreadable
    assert parse_take("You take 2 stones.\n\nThe correct answer is: 2.") == 2
    assert parse_take("I'll take 3") == 3 and parse_take("take 1") == 1
    assert parse_take("You take 1 to 3 stones") is None
    assert parse_take("The answer: I take 2") is None


@given(st.sampled_from([1, 5, 8, 12]), st.sampled_from([1, 2, 3]), st.booleans())
def test_the_prompt_itself_is_never_read_as_a_move(pile, max_take, ask_move):
    """A model that parrots its prompt (rules or state) must not make a move by it."""
    env = NimEnv(piles=(pile, pile), max_take=max_take, ask_move=ask_move)
    env.reset(seed=0)
    for message in env.messages("player_0"):
        assert parse_take(message["content"]) is None
    assert parse_take(env.rules("player_0")) is None and parse_take(env.state_text("player_0")) is None


# ------------------------------------------------------------------------------ fuzzing
_ENVS = {i: marft_envs.make(i, max_action_chars=512) for i in GAME_IDS}
moves = st.sampled_from(["MOVE: 1", "MOVE: 2", "MOVE: 3", "MOVE: C", "MOVE: D", "D", "3", "\\boxed{2}",
                         "MOVE: -1", "MOVE: 99999999", "MOVE:", "MOVE: C D"])
actions = st.one_of(moves, st.none(), st.text(max_size=200), st.binary(max_size=100), st.integers(),
                    st.floats(allow_nan=True), st.sampled_from(list(BAD_ACTIONS)))


@pytest.mark.parametrize("env_id", GAME_IDS)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), episode=st.lists(actions, min_size=1, max_size=30))
def test_hostile_actions_never_raise(env_id, seed, episode):
    env = _ENVS[env_id]
    env.reset(seed=seed)
    it = iter(episode)
    got = dict.fromkeys(env.possible_agents, 0.0)
    for agent in env.agent_iter(200):
        obs, reward, term, trunc, info = env.last()
        assert env.observation_space(agent).contains(obs) and np.isfinite(reward)
        got[agent] += reward
        env.step(None if term or trunc else next(it, "MOVE: 1"))
        if agent in env.infos:
            assert isinstance(env.infos[agent]["flags"], list)
    assert not env.agents
    if env_id == "game-nim-v0":
        assert sum(got.values()) == 0.0
