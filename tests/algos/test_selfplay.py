"""Games on the trainers: per-agent rewards, MARS turn-level advantages, self-play, opponent pools, evaluation."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from marft_algos.advantages import turn_level_advantages
from marft_algos.config import ConfigError
from marft_algos.reward_source import env_has_team_reward, resolve_reward_source

pytest.importorskip("marft_algos.models")
from helpers.tiny_digits import SAMPLING, digit_policy  # noqa: E402

import marft_envs  # noqa: E402
from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.ippo import IPPOConfig, IPPOTrainer  # noqa: E402
from marft_algos.evaluation.games import evaluate_vs_opponent, outcome_rates  # noqa: E402
from marft_algos.evaluation.report import wilson_interval  # noqa: E402
from marft_algos.records import Episode, RolloutBatch, Transition  # noqa: E402
from marft_algos.selfplay import OpponentPool, SelfPlaySettings, selfplay_trainer  # noqa: E402
from marft_envs.games import FixedPlayer, NimEnv, OptimalNimPlayer, RandomPlayer, match_outcomes  # noqa: E402

NIM = {"piles": [5, 9], "on_invalid": "default"}  # every game lasts >= 2 moves: both seats act


def nim_config(cls=GRPOConfig, **kw):
    base = dict(env_id="game-nim-v0", env_kwargs=NIM, model="tiny-random", mode="shared", num_envs=8, steps=2,
                progress=False, tensorboard=False, sampling_overrides=SAMPLING)
    if cls is GRPOConfig:
        base["group_size"] = 2
    base.update(kw)
    return cls(**base)


# ---------------------------------------------------------------- MARS turn-level advantages
def test_turn_level_advantages_closed_form():
    # one general-sum game, a b a b a; credited rewards a: 1, 0, 2 and b: 3, -1; gamma 0.5
    #   a: G = [1 + .5 * (0 + .5 * 2), 0 + .5 * 2, 2] = [1.5, 1, 2];  b: G = [3 + .5 * -1, -1] = [2.5, -1]
    r, agents = [1, 3, 0, -1, 2], ["a", "b", "a", "b", "a"]
    adv, G = turn_level_advantages(r, agents, gamma=0.5, normalize="none")
    assert G.tolist() == [1.5, 2.5, 1.0, -1.0, 2.0] and adv.tolist() == G.tolist()
    # per agent: a's mean 1.5, population std sqrt(1/6); b's mean .75, std 1.75
    adv, _ = turn_level_advantages(r, agents, gamma=0.5, normalize="agent")
    s = np.sqrt(1 / 6)
    np.testing.assert_allclose(adv, [0.0, 1.0, -0.5 / s, -1.0, 0.5 / s], atol=1e-5)
    # one statistic for everyone (batch) is a different estimator: b's +1 is no longer +1
    adv_b, _ = turn_level_advantages(r, agents, gamma=0.5, normalize="batch")
    assert not np.allclose(adv_b, adv)
    # chains never cross episodes; each (group, agent) cell has its own statistics
    adv, G = turn_level_advantages([1, -1, 0, 0], ["a", "b", "a", "b"], episode_ids=[0, 0, 1, 1], normalize="none")
    assert G.tolist() == [1.0, -1.0, 0.0, 0.0]
    adv, _ = turn_level_advantages([1, -1, 0, 0], ["a", "b", "a", "b"], group_ids=[0, 0, 1, 1])
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]  # cells of one action: no signal, never NaN
    with pytest.raises(ValueError, match="normalize"):
        turn_level_advantages([1.0], ["a"], normalize="group")


def test_grpo_turn_estimator_through_the_trainer():
    t = GRPOTrainer(nim_config(advantage_estimator="turn", turn_gamma=0.5, normalize_advantages="agent"),
                    policy=digit_policy(mode="shared"))
    eps = []
    for e, (ra, rb) in enumerate([((0.0, 1.0), (-1.0,)), ((0.0, -1.0), (1.0,))]):
        ep = Episode(episode_id=e, group_id=0, seed=0)
        for k, (agent, r) in enumerate([("player_0", ra[0]), ("player_1", rb[0]), ("player_0", ra[1])]):
            ep.transitions.append(Transition(e, 0, k, k, agent, [1], [2], [-1.0], credited_reward=r))
        eps.append(ep)
    batch = RolloutBatch(episodes=eps)
    t.estimate(batch)
    # player_0's G: [0.5, 1, -0.5, -1] (mean 0, std sqrt(.625)); player_1's: [-1, 1]
    p0 = [tr.advantage for tr in batch.transitions if tr.agent == "player_0"]
    np.testing.assert_allclose(p0, np.array([0.5, 1.0, -0.5, -1.0]) / np.sqrt(0.625), atol=1e-5)
    assert [tr.advantage for tr in batch.transitions if tr.agent == "player_1"] == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_ippo_turn_estimator_is_mars_over_the_batch():
    t = IPPOTrainer(nim_config(IPPOConfig, advantage_estimator="turn", gamma=0.5, normalize_advantages="agent"),
                    policy=digit_policy(mode="shared"))
    ep = Episode(episode_id=0, group_id=0, seed=0)
    for k, (agent, r) in enumerate([("player_0", 1.0), ("player_1", 3.0), ("player_0", 0.0), ("player_1", -1.0), ("player_0", 2.0)]):
        ep.transitions.append(Transition(0, 0, k, k, agent, [1], [2], [-1.0], credited_reward=r, value=0.0))
    batch = RolloutBatch(episodes=[ep])
    t.estimate(batch)
    s = np.sqrt(1 / 6)  # the closed form of test_turn_level_advantages_closed_form
    np.testing.assert_allclose([tr.advantage for tr in batch.transitions], [0.0, 1.0, -0.5 / s, -1.0, 0.5 / s], atol=1e-5)
    assert [tr.returns for tr in batch.transitions] == [1.5, 2.5, 1.0, -1.0, 2.0]  # the value heads' targets


# ---------------------------------------------------------------- per-agent rewards
def test_reward_source_auto_picks_agent_for_games_and_team_for_team_envs(caplog):
    nim, echo = marft_envs.make("game-nim-v0"), marft_envs.make("echo-duo-v0")
    assert (env_has_team_reward(nim), env_has_team_reward(echo)) == (False, True)
    with caplog.at_level(logging.INFO, logger="marft"):
        assert resolve_reward_source("auto", nim, "grpo") == "agent"
    assert "no team reward" in caplog.text
    assert resolve_reward_source("auto", echo) == "team"
    with pytest.raises(ConfigError, match="reward_source='agent'"):
        resolve_reward_source("team", nim, "grpo")
    with pytest.raises(ConfigError, match="reward_source='agent'"):
        GRPOTrainer(nim_config(reward_source="team"), policy=digit_policy(mode="shared"))
    assert GRPOTrainer(nim_config(), policy=digit_policy(mode="shared")).algorithm.reward_source == "agent"


def test_marft_refuses_games():
    from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer

    with pytest.raises(ConfigError, match="own reward"):
        MARFTActionTrainer(nim_config(MARFTActionConfig), policy=digit_policy(mode="shared"))


def test_zero_sum_per_agent_returns_sum_to_zero():
    """One agent's gain is the other's loss: the returns the advantages use sum to 0 in every game."""
    t = GRPOTrainer(nim_config(num_envs=8, normalize_advantages="agent"), policy=digit_policy(mode="shared"))
    batch = t.collect()
    assert len(batch.episodes) == 8
    for ep in batch.episodes:
        returns = {a: ep.agent_return(a) for a in t.agents}
        assert sorted(returns.values()) == [-1.0, 1.0], returns
        final = next(tr.info for tr in reversed(ep.transitions) if "payoffs" in tr.info)
        assert returns == final["payoffs"]  # what the env paid each seat
        # the reward read right after the agent's own step misses the loser's -1 (it arrives on
        # the winner's move): that bookkeeping would give +1 in total, not 0
        assert sum(tr.reward for tr in ep.transitions) == 1.0
    _, rewards, group_ids, _, _ = t.algorithm._units(batch.episodes)  # (transitions, reward, group, agent, turn)
    assert len(rewards) == 16 and sum(rewards) == 0.0
    per_episode = {}
    for ep in batch.episodes:
        per_episode[ep.episode_id] = sum(ep.agent_return(a) for a in t.agents)
    assert set(per_episode.values()) == {0.0}
    # IPPO reads the same credited rewards, per action: 0 per episode too
    ti = IPPOTrainer(nim_config(IPPOConfig), policy=digit_policy(mode="shared"))
    assert ti.algorithm.reward_source == "agent"
    ti.estimate(batch)
    for ep in batch.episodes:
        assert sum(tr.credited_reward for tr in ep.transitions) == 0.0
        assert all(tr.advantage is not None and np.isfinite(tr.advantage) for tr in ep.transitions)


# ---------------------------------------------------------------- evaluation
def test_evaluate_vs_opponent_matches_scripted_play():
    """A policy that can only say "1" scores exactly what a scripted take-1 player scores, per seat."""
    policy = digit_policy(mode="shared", digits="1")

    def env_fn():
        return NimEnv(split="test", piles=[4, 10])

    report = evaluate_vs_opponent(policy, env_fn, OptimalNimPlayer(), n=12, sampling={"max_new_tokens": 1})
    for seat, other in (("player_0", "player_1"), ("player_1", "player_0")):
        expected = match_outcomes(env_fn(), {seat: FixedPlayer("1"), other: OptimalNimPlayer()}, n=12)[seat]
        got = report["seats"][seat]
        assert {k: got[k] for k in ("win", "draw", "loss")} == expected
        assert got["win_ci"] == wilson_interval(expected["win"], 12) and got["invalid_moves"] == 0
    assert report["overall"]["n"] == 24 and report["rows"][-1]["seat"] == "all"
    assert outcome_rates({"win": 0, "draw": 0, "loss": 0})["n"] == 0


# ---------------------------------------------------------------- opponent pool
def test_opponent_pool_keeps_the_first_and_drops_the_oldest():
    pool = OpponentPool(max_size=3, seed=0)
    for step in range(5):
        pool.add(step, {"w": torch.full((2,), float(step))})
    assert pool.steps == [0, 3, 4]
    again = OpponentPool(max_size=1)
    again.load_state_dict(pool.state_dict())
    assert [again.draw()[0] for _ in range(6)] == [pool.draw()[0] for _ in range(6)]
    with pytest.raises(ConfigError):
        SelfPlaySettings(learner="player_0", opponent="player_0")


def test_opponent_pool_round_trips_through_checkpoints(tmp_path):
    cls = selfplay_trainer(GRPOTrainer)
    settings = SelfPlaySettings(snapshot_every=1, pool_size=3, seed=3)

    def make():
        return cls(nim_config(mode="lora", num_envs=4, out_dir=str(tmp_path / "run"), lr=0.05),
                   policy=digit_policy(mode="lora"), selfplay=settings)

    with pytest.raises(ConfigError, match="different adapters"):
        cls(nim_config(), policy=digit_policy(mode="shared"), selfplay=settings)
    t = make()
    frozen = t.policy.adapter_state_dict("player_1")
    t.train(steps=2)  # writes a checkpoint at the end
    assert t.selfplay.pool.steps == [0, 1, 2]
    # the opponent seat is never trained: it holds exactly the snapshot it was given
    state = dict(t.selfplay.pool.snapshots)[t.selfplay.opponent_step]
    assert all(torch.equal(v, state[k]) for k, v in t.policy.adapter_state_dict("player_1").items())
    assert not all(torch.equal(v, frozen[k]) for k, v in t.policy.adapter_state_dict("player_0").items())
    pool_at_save = [(s, {k: v.clone() for k, v in sd.items()}) for s, sd in t.selfplay.pool.snapshots]
    after = [t.train_step()["selfplay/opponent_step"] for _ in range(3)]
    resumed = make()
    resumed.load_checkpoint(tmp_path / "run")
    assert resumed.global_step == 2 and resumed.selfplay.pool.steps == [s for s, _ in pool_at_save]
    for (_, a), (_, b) in zip(pool_at_save, resumed.selfplay.pool.snapshots, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert [resumed.train_step()["selfplay/opponent_step"] for _ in range(3)] == after


# ---------------------------------------------------------------- learning
@pytest.mark.timeout(900)  # ~45 s of CPU: it runs in CI
def test_selfplay_improves_win_rate_against_a_fixed_opponent():
    """One adapter plays both Nim seats and trains by self-play (GRPO, own rewards, per-agent
    statistics, KL to the untrained policy); greedy, in both seats, on held-out start positions
    (the test split), it then beats a fixed random player clearly more often than before.

    Why it needs the KL term (measured on this set-up): the tiny
    model starts nearly state-blind (its move probabilities differ by < 0.01 between piles).
    For a state-blind policy the self-play gradients of BOTH seats point the same way, to the
    state-blind best response "take 2" (also the untrained greedy move: 0.578 here), so
    without a regulariser the policy collapses onto it within 5 to 25 steps (lr 5e-2 down
    to 3e-3; an entropy bonus of 0.05 does not stop it), the decisive move (take 3 from 3) is no longer sampled, every game of a group
    ends alike and the advantages vanish. ``beta`` keeps it exploring. Training starts from
    1 stone on add short games whose first move is the decisive one (there the group
    baseline is a baseline per position).
    After 75 steps it takes 3 from 3 and 2 elsewhere: 0.797 (that policy's expected win rate
    against the random player is 0.79, optimal play's 0.94).
    """
    torch.set_num_threads(1)
    train = {"piles": [1, 8], "on_invalid": "default"}
    held_out = {"piles": [5, 8], "on_invalid": "default"}  # evaluated on the test split's start positions
    t = GRPOTrainer(nim_config(env_kwargs=train, num_envs=32, group_size=8, lr=0.005, beta=0.1, steps=75, seed=0,
                               normalize_advantages="agent"),
                    policy=digit_policy(mode="shared"))

    def win_rate() -> float:
        report = evaluate_vs_opponent(t.policy, lambda: NimEnv(split="test", **held_out), RandomPlayer(1), n=32,
                                      sampling={"max_new_tokens": 1})
        return report["overall"]["win_rate"]

    before = win_rate()
    for _ in range(75):
        t.train_step()
    after = win_rate()
    assert after >= before + 0.15, (before, after)
