"""Branching rollouts and counterfactual credit (issue 30 section 1), against closed forms.

The collector and the estimators run for real; the echo duo is the toy env: the team
scores when the listener repeats the speaker's vocabulary word. A scripted policy makes
one agent's choice decide the outcome while the other's varies without effect (a
reformatted word), so the exact credit of each agent is known by hand.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from helpers.scripted import CharPolicy
from helpers.tiny_echo import ENV_KWARGS, SAMPLING, echo_config, letter_policy

import marft_envs
from marft_algos.advantages import grpo_advantages, turn_level_advantages
from marft_algos.branching import tree_paths
from marft_algos.config import ConfigError
from marft_algos.credit import (
    leaf_returns_to_go,
    observation_key,
    step_group_advantages,
    tree_credit,
)
from marft_algos.rollout import RolloutCollector

pytest.importorskip("marft_algos.models")


# ---- closed forms ------------------------------------------------------------------------


def test_tree_credit_by_hand_on_an_uneven_tree():
    # root r: actions a, b (agent 0). Under a: a1, a2, a3 (agent 1); under b: b1 only.
    # leaf returns: a1=1, a2=0, a3=0.5, b1=0
    # Q(a) = (1 + 0 + 0.5)/3 = 0.5 ; Q(b) = 0 ; V(r) = (0.5 + 0)/2 = 0.25 (mean over siblings, not leaves)
    # A(a) = 0.25, A(b) = -0.25 ; V(a) = 0.5: A(a1) = 0.5, A(a2) = -0.5, A(a3) = 0 ; A(b1) = 0 (no sibling)
    r = ("t", None)
    paths = [[(r, "a"), ("a", "a1")], [(r, "a"), ("a", "a2")], [(r, "a"), ("a", "a3")], [(r, "b"), ("b", "b1")]]
    tc = tree_credit(paths, [1.0, 0.0, 0.5, 0.0])
    assert tc.q == pytest.approx({"a": 0.5, "b": 0.0, "a1": 1.0, "a2": 0.0, "a3": 0.5, "b1": 0.0})
    assert tc.v == pytest.approx({r: 0.25, "a": 0.5, "b": 0.0})
    assert tc.advantage == pytest.approx({"a": 0.25, "b": -0.25, "a1": 0.5, "a2": -0.5, "a3": 0.0, "b1": 0.0})
    assert tc.leaves == {"a": 3, "b": 1, "a1": 1, "a2": 1, "a3": 1, "b1": 1}
    # scaled: siblings a, b have Q 0.5, 0 -> sample std 0.35355; a1..a3 have std 0.5
    sc = tree_credit(paths, [1.0, 0.0, 0.5, 0.0], scale=True, eps=0.0)
    assert sc.advantage["a"] == pytest.approx(0.25 / np.std([0.5, 0.0], ddof=1))
    assert sc.advantage["a1"] == pytest.approx(0.5 / 0.5) and sc.advantage["b1"] == 0.0


def test_tree_credit_per_step_returns_and_bad_input():
    # per-step returns (returns-to-go): a's leaves see 0.9 and 0.0 from a, 1 and 0 from their own step
    r = ("t", None)
    tc = tree_credit([[(r, "a"), ("a", "x")], [(r, "a"), ("a", "y")]], [[0.9, 1.0], [0.0, 0.0]])
    assert tc.q["a"] == pytest.approx(0.45) and tc.advantage["a"] == 0.0  # a has no sibling
    assert tc.advantage["x"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="one per leaf"):
        tree_credit([[(r, "a")]], [1.0, 2.0])
    with pytest.raises(ValueError, match="under two nodes"):
        tree_credit([[(r, "a")], [("other", "a")]], [1.0, 2.0])


def test_returns_to_go_and_step_groups_by_hand():
    assert leaf_returns_to_go([0.0, 0.0, 1.0], [0.5, 0.5, 0.0]) == [0.25, 0.5, 1.0]
    # step groups: s = {1, 0, 0.5} (mean 0.5), u = {1} alone, a second problem's "s" is its own group
    adv = step_group_advantages([1.0, 0.0, 0.5, 1.0, 3.0, 1.0], ["s", "s", "s", "u", "s", "s"], [0, 0, 0, 0, 1, 1], scale=False)
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0, 1.0, -1.0]
    scaled = step_group_advantages([1.0, 0.0], ["s", "s"], scale=True, eps=0.0)
    assert scaled.tolist() == pytest.approx([0.5 / np.std([1, 0], ddof=1), -0.5 / np.std([1, 0], ddof=1)])
    assert observation_key("a", [1, 2]) == observation_key("a", [1, 2]) != observation_key("b", [1, 2])


def test_agent_turn_grouping_by_hand():
    # one problem, agent 0 at turns 0 and 1, agent 1 at turn 0: three cells
    # cell (0,0): {1, 0} -> +-0.5 ; cell (0,1): {3, 1} -> +-1 ; cell (1,0): {2, 2} -> 0
    R = [1.0, 0.0, 3.0, 1.0, 2.0, 2.0]
    adv = grpo_advantages(R, [0] * 6, agent_ids=[0, 0, 0, 0, 1, 1], turn_ids=[0, 0, 1, 1, 0, 0], normalize="agent_turn", scale=False)
    assert adv.tolist() == [0.5, -0.5, 1.0, -1.0, 0.0, 0.0]
    agent_wise = grpo_advantages(R, [0] * 6, agent_ids=[0, 0, 0, 0, 1, 1], normalize="agent", scale=False)
    assert agent_wise.tolist() == [-0.25, -1.25, 1.75, -0.25, 0.0, 0.0]  # one baseline 1.25 over both turns
    with pytest.raises(ValueError, match="turn_ids"):
        grpo_advantages(R, [0] * 6, agent_ids=[0] * 6, normalize="agent_turn")
    # MARS turn-level returns, grouped per (agent, turn): episodes e0, e1 each "a" at turns 0 and 1
    adv, G = turn_level_advantages([0, 1, 0, 0], ["a"] * 4, [0, 0, 1, 1], normalize="agent_turn", turn_ids=[0, 1, 0, 1], eps=0.0)
    assert G.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert adv.tolist() == [1.0, 1.0, -1.0, -1.0]  # (1 - 0.5) / 0.5 (population std) in each cell


# ---- the collector ---------------------------------------------------------------------


class Decides(CharPolicy):
    """Siblings alternate between two replies; ``decider`` picks a word that scores or not,
    the other agent a reformatted copy that grades the same (noise)."""

    eos = True

    def __init__(self, decider: str) -> None:
        self.decider = decider
        self.count = itertools.count()

    def say(self, role: str, prompt: str) -> str:
        k = next(self.count) % 2
        if role == "speaker":
            return ("red", "zzz")[k] if self.decider == "speaker" else ("red", "RED")[k]
        said = re.search(r"\[speaker\]: (\w+)", prompt).group(1)
        return ("blue", said)[k] if self.decider == "listener" else (said, said.upper() + ".")[k]


#: the echo duo's default vocabulary (red, green, blue, yellow): the scripted words score
WORDS = {"env_kwargs": {}}


def echo_collector(policy, branching: int, *, num_envs: int = 2, group_size: int = 2, expand: str = "all", **kw) -> RolloutCollector:
    col = RolloutCollector(lambda: marft_envs.make("echo-duo-v0", **kw), policy, num_envs=num_envs, group_size=group_size, seed=0)
    col.set_branching(branching, expand)
    return col


def test_tree_shape_shadows_and_every_token_counted():
    batch = echo_collector(Decides("speaker"), 2).collect()
    # one group of G=2 root copies, 2 speaker siblings each, 2 listener siblings under each: 8 leaves
    assert len(batch.episodes) == 8 == batch.metrics["rollout/tree_leaves"]
    assert all(len(ep.transitions) == 2 for ep in batch.episodes)  # every leaf is a whole path
    # 4 speaker actions + 8 listener actions, each once; the shared speaker actions are shadows elsewhere
    trs = batch.transitions
    assert sorted(t.agent for t in trs) == ["listener"] * 8 + ["speaker"] * 4
    assert sum(t.shadow for ep in batch.episodes for t in ep.transitions) == 4
    assert len({t.action_key for t in trs}) == 12 and len({ep.episode_id for ep in batch.episodes}) == 8
    # every sampled token of every branch, + EOS: 4 speakers "red"/"zzz" (4), 4 listeners "red" (4), 4 "RED." (5)
    assert batch.metrics["rollout/tokens"] == 4 * 4 + 4 * 4 + 4 * 5 == sum(len(t.response_ids) for t in trs)
    assert batch.metrics["rollout/branch_points"] == 2 + 4 and batch.metrics["agent/speaker/actions"] == 4
    # siblings share the observation they were sampled from; leaves report their own path
    for node, kids in tree_credit(tree_paths(batch.episodes), [0.0] * 8).children.items():
        prompts = {tuple(t.prompt_ids) for t in trs if t.action_key in kids}
        assert len(prompts) == 1, node
    assert [ep.team_return for ep in batch.episodes] == [1.0, 1.0, 0.0, 0.0] * 2


def test_budgeted_tree_expands_one_random_branch():
    batch = echo_collector(Decides("speaker"), 3, num_envs=1, group_size=1, expand="random").collect()
    # 3 speaker siblings, only one of them branches into 3 listener actions: 1 + 2 * 2 leaves... = 5
    assert len(batch.episodes) == 5
    listeners_per_node = sorted(len(k) for n, k in tree_credit(tree_paths(batch.episodes), [0.0] * 5).children.items() if n[1] is not None)
    assert listeners_per_node == [1, 1, 3]
    with pytest.raises(ValueError, match="branch_expand"):
        echo_collector(Decides("speaker"), 2, expand="best")


def brute_force_q(batch, leaf_return):
    """Q(a) by brute force: the mean return of the episodes whose path holds action a."""
    out = {}
    for t in batch.transitions:
        below = [ep for ep in batch.episodes if any(s.action_key == t.action_key for s in ep.transitions)]
        out[t.action_key] = float(np.mean([leaf_return(ep) for ep in below]))
    return out


@pytest.fixture(scope="module")
def grpo_trainer():
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    cfg = echo_config(GRPOConfig, **WORDS, num_envs=2, group_size=2, branching=2, normalize_advantages="none", plot=False)
    return GRPOTrainer(cfg, policy=letter_policy())


@pytest.mark.parametrize("decider", ["speaker", "listener"])
def test_counterfactual_credit_goes_to_the_deciding_agent_exactly(grpo_trainer, decider):
    t = grpo_trainer
    t.collector.policy = Decides(decider)
    batch = t.collector.collect()
    t.estimate(batch)
    other = "listener" if decider == "speaker" else "speaker"
    adv = {a: sorted(tr.advantage for tr in batch.transitions if tr.agent == a) for a in ("speaker", "listener")}
    # the decider's siblings: Q = 1 or 0 around V = 0.5; the other agent's choices change nothing
    n = len(adv[decider])
    assert adv[decider] == [-0.5] * (n // 2) + [0.5] * (n // 2)
    assert adv[other] == [0.0] * len(adv[other])
    # tree statistics equal the means computed by brute force
    q = brute_force_q(batch, lambda ep: ep.team_return)
    for tr in batch.transitions:
        assert tr.returns == pytest.approx(q[tr.action_key])
    assert not t.algorithm.no_signal(batch.episodes)


def test_independent_episodes_blame_the_noise_agent_too():
    """The contrast: plain agent-wise GRPO (branching=1) gives the listener non-zero
    advantages although only the speaker decided the outcome."""
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    t = GRPOTrainer(echo_config(GRPOConfig, **WORDS, num_envs=4, group_size=4, normalize_advantages="agent", scale_rewards=False), policy=letter_policy())
    t.collector.policy = Decides("speaker")
    batch = t.collector.collect()
    t.estimate(batch)
    assert sorted(tr.advantage for tr in batch.transitions if tr.agent == "listener") == [-0.5, -0.5, 0.5, 0.5]


def test_marft_action_tree_values_replace_the_gae():
    from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer

    t = MARFTActionTrainer(echo_config(MARFTActionConfig, **WORDS, num_envs=2, branching=2, gamma_agent=0.9, plot=False), policy=letter_policy())
    t.collector.policy = Decides("speaker")
    batch = t.collector.collect()
    t.estimate(batch)
    # speaker: return-to-go = 0.9 * 1 (the listener's step scores) or 0. MARFT's group_size is 1, so each of the two env
    # copies is its own tree, with 2 speaker siblings: Q = 0.9 and 0, V(root) = 0.45 -> A = +-0.45; listener: A = 0, target Q = 1 or 0
    sp = [tr for tr in batch.transitions if tr.agent == "speaker"]
    li = [tr for tr in batch.transitions if tr.agent == "listener"]
    assert sorted(tr.advantage for tr in sp) == pytest.approx([-0.45, -0.45, 0.45, 0.45])
    assert all(tr.returns == pytest.approx(0.45) for tr in sp)  # the critic's target: V(node), the siblings' mean
    assert all(tr.advantage == 0.0 for tr in li)
    assert sorted(tr.returns for tr in li) == [0.0] * 4 + [1.0] * 4
    t.update(batch)  # trains on the tree batch


def test_marft_token_trains_on_tree_values():
    from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer

    t = MARFTTokenTrainer(echo_config(MARFTTokenConfig, **WORDS, num_envs=1, branching=2, plot=False), policy=letter_policy())
    t.collector.policy = Decides("speaker")
    batch = t.collector.collect()
    t.estimate(batch)
    est = batch.estimates
    for tr in batch.transitions:  # each action's last token is backed up from its tree value Q(a)
        assert est[tr].token_returns[-1] == pytest.approx({"speaker": 0.99, "listener": 1.0}[tr.agent] if "zzz" not in tr.text.lower() else 0.0)
    t.update(batch)


def test_branching_one_is_todays_collector_and_estimate():
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer
    from marft_algos.seeding import seed_everything

    runs = []
    for extra in ({}, {"branching": 1, "branch_expand": "random"}):
        seed_everything(0)
        t = GRPOTrainer(echo_config(GRPOConfig, num_envs=4, group_size=2, plot=False, **extra), policy=letter_policy())
        batch = t.collect()
        t.estimate(batch)
        runs.append([(tr.episode_id, tr.agent, tr.response_ids, tr.advantage) for tr in batch.transitions])
        assert t.collector.branching == 1
    assert runs[0] == runs[1]


def test_tiny_model_tree_counts_every_generated_token():
    from marft_algos.seeding import seed_everything

    seed_everything(0)
    policy = letter_policy()
    generated = []
    real = policy.generate

    def counting(requests, *a, **kw):
        out = real(requests, *a, **kw)
        generated.extend(len(r.token_ids) for r in out)
        return out

    policy.generate = counting
    col = RolloutCollector(lambda: marft_envs.make("echo-duo-v0", **ENV_KWARGS), policy, num_envs=2, group_size=2, seed=0,
                           sampling_overrides={a: dict(s, max_new_tokens=2) for a, s in SAMPLING.items()})
    col.set_branching(2)
    batch = col.collect()
    assert len(generated) == 12 and batch.metrics["rollout/tokens"] == sum(generated) > 0


def test_config_checks():
    from marft_algos.algos.grpo import GRPOConfig
    from marft_algos.algos.marft_action import MARFTActionConfig

    with pytest.raises(ConfigError, match="branching must be >= 1"):
        GRPOConfig(branching=0)
    with pytest.raises(ConfigError, match="branch_expand"):
        MARFTActionConfig(branching=2, branch_expand="best")
    with pytest.raises(ConfigError, match="replaces"):
        GRPOConfig(branching=2, advantage_estimator="turn")
    assert GRPOConfig(branching=2, group_size=1, num_envs=2).group_size == 1  # the siblings are the groups
    with pytest.raises(ConfigError, match="group_size >= 2"):
        GRPOConfig(group_size=1, num_envs=2)


def test_step_groups_share_a_baseline_across_episodes():
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    t = GRPOTrainer(echo_config(GRPOConfig, **WORDS, num_envs=4, group_size=4, step_group_weight=1.0, scale_rewards=False,
                                normalize_advantages="none"), policy=letter_policy())
    t.collector.policy = Decides("speaker")
    batch = t.collector.collect()
    t.estimate(batch)
    # episode level: returns 1,0,1,0 -> +-0.5 for both agents. Step level: the 4 speaker actions share the
    # root observation (returns 1,0,1,0 -> +-0.5); each listener saw its own speaker word: red x2 (1, 1) -> 0, zzz x2 -> 0
    sp = sorted(tr.advantage for tr in batch.transitions if tr.agent == "speaker")
    li = sorted(tr.advantage for tr in batch.transitions if tr.agent == "listener")
    assert sp == [-1.0, -1.0, 1.0, 1.0] and li == [-0.5, -0.5, 0.5, 0.5]


def test_cli_trains_with_branching(tmp_path):
    import json

    from marft_algos.cli import main

    out = tmp_path / "run"
    argv = ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--steps", "1", "--out", str(out), "--model", "tiny-random",
            "--set", "num_envs=2", "--set", "group_size=2", "--set", "branching=2", "--set", "progress=false",
            "--set", 'sampling_overrides={"speaker": {"max_new_tokens": 2}, "listener": {"max_new_tokens": 2}}']
    assert main(argv) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rollout/tree_leaves"] == 8 and row["rollout/episodes"] == 8 and row["rollout/actions"] == 12
    assert row["rollout/problems"] == 1  # one GRPO group: two trees of four leaves, all on one problem
    assert json.loads((out / "config.json").read_text())["branching"] == 2


def test_two_ranks_split_whole_trees_and_equal_one_rank(tmp_path):
    """DDP: every rank collects whole trees (a group's G root copies and all their leaves),
    and one update on each rank's trees of a fixed batch equals one process on all of them."""
    import pickle

    import test_distributed_worker as worker
    import torch
    from test_distributed import assert_tree_close, launch, ok

    t = worker.make_trainer("grpo", branching=2)
    batch = t.collect()
    groups = batch.groups()
    assert len(groups) == 4 and all(len(eps) == 8 for eps in groups.values())  # 2 roots x 2 speakers x 2 listeners
    for i, ep in enumerate(batch.episodes):  # a reward signal whatever the untrained team said
        ep.team_return = float(i % 3 == 0)
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(batch))
    before = {a: t.policy.adapter_state_dict(a) for a in t.agents}
    t.estimate(batch)
    t.update(batch)
    ref = worker.trainer_state(t)
    assert all(any(not torch.equal(before[a][k], ref["adapters"][a][k]) for k in before[a]) for a in t.agents)  # it moved
    ok(launch("tree-grpo", tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["leaves"] == {0: 8, 1: 8} and r1["leaves"] == {2: 8, 3: 8}  # whole trees, split by group
    assert r0["advantages"] + r1["advantages"] == pytest.approx([tr.advantage for tr in batch.transitions])
    for r in (r0, r1):
        assert_tree_close(r["adapters"], ref["adapters"])


@pytest.mark.parametrize("env_id", ["echo-duo-v0", "arith-duo-v0", "arith-calc-duo-v0"])
def test_text_envs_copy_exactly(env_id):
    """A branch point deep-copies the env: the copy continues exactly as the original."""
    import copy

    env = marft_envs.make(env_id)
    env.reset(seed=5)
    env.step("7")
    twin = copy.deepcopy(env)
    for e in (env, twin):
        e.step("The answer is 12. <calc>3*4</calc>")
    assert twin.agent_selection == env.agent_selection
    assert twin.messages(twin.agent_selection) == env.messages(env.agent_selection)
    assert twin.rewards == env.rewards and twin.infos == env.infos
    assert twin.terminations == env.terminations


def test_marft_budgeted_tree_uses_the_critic_only_where_there_are_no_siblings():
    from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer

    t = MARFTActionTrainer(echo_config(MARFTActionConfig, **WORDS, num_envs=1, branching=2, branch_expand="random",
                                       gamma_agent=0.9, plot=False), policy=letter_policy())
    t.collector.policy = Decides("speaker")
    batch = t.collector.collect()
    t.estimate(batch)
    assert len(batch.episodes) == 3  # 2 speakers; one of them branches into 2 listeners
    li = [tr for tr in batch.transitions if tr.agent == "listener"]
    by_speaker: dict = {}
    for ep in batch.episodes:
        by_speaker.setdefault(ep.transitions[0].action_key, []).append(ep.transitions[1])
    for kids in by_speaker.values():
        for tr in kids:
            q = float(tr.team_reward)  # the listener's step scores: its return-to-go is the team reward
            if len(kids) == 1:  # a single chain: the critic's V(o) is the baseline
                assert tr.advantage == pytest.approx(q - tr.value) and tr.returns == pytest.approx(q)
            else:
                assert tr.advantage == 0.0  # siblings agree (the listener's format is noise)
    assert sorted(len(k) for k in by_speaker.values()) == [1, 2] and len(li) == 3


def test_agent_turn_grouping_in_the_trainer_equals_agent_wise_on_one_turn():
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    out = {}
    for mode in ("agent", "agent_turn"):
        t = GRPOTrainer(echo_config(GRPOConfig, **WORDS, num_envs=4, group_size=4, normalize_advantages=mode), policy=letter_policy())
        t.collector.policy = Decides("speaker")
        batch = t.collector.collect()
        t.estimate(batch)
        out[mode] = [(tr.agent, tr.advantage) for tr in batch.transitions]
    assert out["agent"] == out["agent_turn"] and any(a for _, a in out["agent"])
