"""Closed-form tests of the advantage estimators (SB3 ``tests/test_gae.py`` style).

Every expected number is derived by hand in the comments; the reference
implementation's recursions (the MARFT paper's released code) are transcribed literally where the
test says so, so a change of semantics shows up as a failed equality.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.marft_checks import reference_action_gae
from hypothesis import given, settings
from hypothesis import strategies as st

from marft_algos.advantages import (
    action_level_gae,
    chain_gae,
    episode_segments,
    grpo_advantages,
    per_agent_gae,
    token_level_backup,
)

# --------------------------------------------------------------------------------------
# chain_gae
# --------------------------------------------------------------------------------------


def test_chain_gae_three_links_by_hand() -> None:
    # r = [0, 0, 1], V = [0.5, 0.2, 0.4], gamma = 0.9, lam = 0.8, the episode ends at link 2.
    # delta2 = 1 - 0.4                         = 0.6          A2 = 0.6
    # delta1 = 0 + 0.9*0.4 - 0.2               = 0.16         A1 = 0.16 + 0.72*0.6   = 0.592
    # delta0 = 0 + 0.9*0.2 - 0.5               = -0.32        A0 = -0.32 + 0.72*0.592 = 0.10624
    # returns = A + V = [0.60624, 0.792, 1.0]
    adv, ret = chain_gae([0, 0, 1], [0.5, 0.2, 0.4], [0.2, 0.4, 123.0], 0.9, 0.8, [0, 0, 1])
    np.testing.assert_allclose(adv, [0.10624, 0.592, 0.6], atol=1e-12)
    np.testing.assert_allclose(ret, [0.60624, 0.792, 1.0], atol=1e-12)
    assert isinstance(adv, np.ndarray)


def test_chain_gae_torch_in_torch_out_and_batched() -> None:
    r = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.4], [0.0, 0.0, 0.0]])
    nv = torch.tensor([[0.2, 0.4, 0.0], [0.0, 0.0, 0.0]])
    term = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]])  # row 1: episode of one link, then padding
    adv, ret = chain_gae(r, v, nv, 0.9, 0.8, term)
    assert torch.is_tensor(adv) and adv.shape == (2, 3)
    torch.testing.assert_close(adv[0], torch.tensor([0.10624, 0.592, 0.6]))
    assert float(adv[1, 0]) == pytest.approx(1.0)  # padding after a terminal link never leaks in


def test_chain_gae_concatenated_episodes_reset_at_terminal() -> None:
    # two episodes in one chain: [a0 a1 | b0 b1]; a1 is terminal.
    r = np.array([0.0, 1.0, 0.0, 5.0])
    v = np.array([0.3, 0.6, 0.1, 0.2])
    nv = np.append(v[1:], 0.0)
    term = np.array([0, 1, 0, 1])
    adv, _ = chain_gae(r, v, nv, 0.99, 0.95, term)
    alone, _ = chain_gae(r[:2], v[:2], [0.6, 0.0], 0.99, 0.95, [0, 1])
    np.testing.assert_allclose(adv[:2], alone)
    # changing the second episode does not move the first one
    adv2, _ = chain_gae(np.array([0, 1, 7, -3.0]), np.array([0.3, 0.6, 9, 9.0]), np.array([0.6, 9, 9, 0.0]), 0.99, 0.95, term)
    np.testing.assert_allclose(adv2[:2], adv[:2])


# --------------------------------------------------------------------------------------
# action level
# --------------------------------------------------------------------------------------


def test_action_level_two_agents_two_turns_matches_reference_recursion() -> None:
    r = np.array([[0.0, 0.3], [0.0, 1.0]])  # team reward on the last agent
    V = np.array([[0.2, 0.5], [0.4, 0.7], [0.0, 0.0]])  # row 2: after the episode
    masks = np.array([1.0, 1.0, 0.0])  # the episode terminates after turn 1
    ref_adv, ref_ret = reference_action_gae(r, V, masks, 0.99, 0.95)
    adv, ret = action_level_gae(r.reshape(-1), V[:2].reshape(-1), turns=[0, 0, 1, 1])
    np.testing.assert_allclose(adv, ref_adv.reshape(-1), atol=1e-12)
    np.testing.assert_allclose(ret, ref_ret.reshape(-1), atol=1e-12)
    # and by hand, turn 1: A[1,1] = 1 - 0.7 = 0.3;  A[1,0] = 0.99*0.7 - 0.4 + 0.9405*0.3 = 0.59515
    assert adv[3] == pytest.approx(0.3)
    assert adv[2] == pytest.approx(0.99 * 0.7 - 0.4 + 0.99 * 0.95 * 0.3)


def test_action_level_truncated_episode_bootstraps_like_reference() -> None:
    # the reference bootstraps the last turn from next_value (a truncated rollout window)
    r = np.array([[0.0, 0.0], [0.0, 1.0]])
    V = np.array([[0.2, 0.5], [0.4, 0.7], [0.25, 0.0]])
    masks = np.array([1.0, 1.0, 1.0])
    ref_adv, _ = reference_action_gae(r, V, masks, 0.99, 0.95)
    adv, _ = action_level_gae(r.reshape(-1), V[:2].reshape(-1), [0, 0, 1, 1], [7, 7, 7, 7], last_values={7: 0.25})
    np.testing.assert_allclose(adv, ref_adv.reshape(-1), atol=1e-12)


def test_action_level_separate_agent_and_turn_discounts() -> None:
    # V = 0, lam = 1: A is the discounted reward-to-go. gamma_agent = 1, gamma_turn = 0.5.
    # r = [t0a0: 0, t0a1: 1, t1a0: 0, t1a1: 4]
    # A3 = 4; A2 = 0 + 1*4 = 4; A1 = 1 + 0.5*4 = 3; A0 = 0 + 1*3 = 3
    adv, ret = action_level_gae([0, 1, 0, 4], [0, 0, 0, 0], [0, 0, 1, 1], gamma_agent=1.0, lam_agent=1.0, gamma_turn=0.5, lam_turn=1.0)
    np.testing.assert_allclose(adv, [3, 3, 4, 4])
    np.testing.assert_allclose(ret, adv)


def test_action_level_dynamic_route_successor_is_next_executed() -> None:
    # A routed episode: turn 0 runs a then b, turn 1 only b, turn 2 a then c.
    # links: 0:(0,a) 1:(0,b) 2:(1,b) 3:(2,a) 4:(2,c); hops: agent, turn, turn, agent.
    # gamma_agent = lam_agent = lam_turn = 1, gamma_turn = 0.5, reward 1 on the last link:
    # discounted returns G = [0.25, 0.25, 0.5, 1, 1]; A = G - V
    V = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    adv, _ = action_level_gae([0, 0, 0, 0, 1], V, [0, 0, 1, 2, 2], gamma_agent=1.0, lam_agent=1.0, gamma_turn=0.5, lam_turn=1.0)
    np.testing.assert_allclose(adv, [0.15, 0.05, 0.2, 0.6, 0.5], atol=1e-12)
    # the same with GAE lambdas != 1, against chain_gae with the hops written out
    adv2, _ = action_level_gae([0, 0.2, 0, 0, 1], V, [0, 0, 1, 2, 2], gamma_agent=0.9, lam_agent=0.7, gamma_turn=0.5, lam_turn=0.6)
    exp, _ = chain_gae([0, 0.2, 0, 0, 1], V, [0.2, 0.3, 0.4, 0.5, 0.0], [0.9, 0.5, 0.5, 0.9, 0.9], [0.7, 0.6, 0.6, 0.7, 0.7], [0, 0, 0, 0, 1])
    np.testing.assert_allclose(adv2, exp)


def test_action_level_dag_trio_chains_in_execution_order() -> None:
    # arith-trio-v0's DAG: solver_a and solver_b (parallel, no parents) -> aggregator.
    # The chain is the executed order; solver_b is solver_a's successor although it does
    # not see solver_a's action. One turn, reward 1 on the aggregator, gamma .99, lam .95:
    # A2 = 1 - 0.6 = 0.4
    # A1 = (0.99*0.6 - 0.4) + 0.9405*0.4 = 0.194 + 0.3762 = 0.5702
    # A0 = (0.99*0.4 - 0.2) + 0.9405*0.5702 = 0.196 + 0.5362731 = 0.7322731
    import marft_envs

    topo = marft_envs.make("arith-trio-v0").team.topology
    order = topo.topological_order()
    assert order == ["solver_a", "solver_b", "aggregator"]
    assert topo.parents("solver_b") == [] and set(topo.parents("aggregator")) == {"solver_a", "solver_b"}
    adv, ret = action_level_gae([0, 0, 1], [0.2, 0.4, 0.6], turns=[0, 0, 0])
    np.testing.assert_allclose(adv, [0.7322731, 0.5702, 0.4], atol=1e-9)
    np.testing.assert_allclose(ret, np.array([0.7322731, 0.5702, 0.4]) + [0.2, 0.4, 0.6], atol=1e-9)


def test_action_level_terminated_episode_inside_batch_does_not_leak() -> None:
    # episode 3 (2 links, terminated) followed by episode 4 (4 links): each equals its own run
    r = np.array([0, 1, 0, 0, 0, 2.0])
    V = np.array([0.1, 0.9, 0.3, 0.3, 0.3, 0.3])
    turns = [0, 0, 0, 0, 1, 1]
    eids = [3, 3, 4, 4, 4, 4]
    adv, _ = action_level_gae(r, V, turns, eids)
    a3, _ = action_level_gae(r[:2], V[:2], turns[:2])
    a4, _ = action_level_gae(r[2:], V[2:], turns[2:])
    np.testing.assert_allclose(adv, np.concatenate([a3, a4]))
    # hand: episode 3: A1 = 1 - 0.9 = 0.1; A0 = 0.99*0.9 - 0.1 + 0.9405*0.1 = 0.88505
    np.testing.assert_allclose(a3, [0.99 * 0.9 - 0.1 + 0.99 * 0.95 * 0.1, 0.1])


def test_action_level_passthrough_link_by_hand() -> None:
    # a -> b -> c in one turn, team reward 1 on c (terminal); b's prompt did not fit (no
    # value: 7.0 is garbage that must not matter) but its step paid r_b = 0.1
    g, lam = 0.99, 0.95
    r, v = [0.0, 0.1, 1.0], [0.2, 7.0, 0.6]
    adv, ret = action_level_gae(r, v, [0, 0, 0], passthrough=[0, 1, 0])
    A_c = 1.0 - 0.6
    V_b = 0.1 + g * 0.6  # its one-step target: b's own TD error is 0
    A_b = g * lam * A_c
    A_a = 0.0 + g * V_b - 0.2 + g * lam * A_b  # = r_a + g r_b + g^2 V_c - V_a + (g lam)^2 A_c
    np.testing.assert_allclose(adv, [A_a, A_b, A_c], atol=1e-12)
    np.testing.assert_allclose(A_a, 0.1 * g + g * g * 0.6 - 0.2 + (g * lam) ** 2 * A_c, atol=1e-12)
    np.testing.assert_allclose(ret[[0, 2]], [A_a + 0.2, 1.0], atol=1e-12)
    # without the pass-through the predecessor bootstrapped from the garbage value
    assert abs(action_level_gae(r, v, [0, 0, 0])[0][0] - A_a) > 0.1


def test_action_level_passthrough_at_the_end_and_in_a_row() -> None:
    g, lam = 0.9, 0.5
    kw = dict(gamma_agent=g, lam_agent=lam, gamma_turn=g, lam_turn=lam)
    # the last (terminal) action passes through: its value is its reward, no bootstrap
    adv, _ = action_level_gae([0.0, 1.0], [0.3, 0.0], [0, 1], passthrough=[0, 1], **kw)
    np.testing.assert_allclose(adv, [g * 1.0 - 0.3, 0.0], atol=1e-12)
    # two skipped links in a row: the first real link bootstraps from the last, over 3 hops
    adv, _ = action_level_gae([0.0, 0.0, 0.0, 1.0], [0.4, 5.0, 5.0, 0.2], [0, 0, 0, 0], passthrough=[0, 1, 1, 0], **kw)
    np.testing.assert_allclose(adv[0], g**3 * 0.2 - 0.4 + (g * lam) ** 3 * 0.8, atol=1e-12)
    # truncated episode: a skipped last link bootstraps from the given last value
    adv, _ = action_level_gae([0.0, 0.5], [0.3, 9.0], [0, 0], episode_ids=[4, 4], last_values={4: 2.0}, passthrough=[0, 1], **kw)
    np.testing.assert_allclose(adv[0], g * (0.5 + g * 2.0) - 0.3, atol=1e-12)


def test_token_and_per_agent_passthrough_by_hand() -> None:
    # token level: speaker 2 tokens, listener skipped (placeholder value), speaker again
    adv, _ = token_level_backup(
        [0.0, 0.0, 1.0], [[0.1, 0.2], [3.0], [0.5]], [0, 0, 1], gamma_agent=0.9, lam_agent=0.5, passthrough=[0, 1, 0]
    )
    A_last = 1.0 - 0.5
    A_skip = 0.99 * 0.95 * A_last
    A_sp1 = 0.9 * (0.99 * 0.5) - 0.2 + 0.45 * A_skip
    np.testing.assert_allclose(adv[0], [0.2 - 0.1 + A_sp1, A_sp1], atol=1e-12)
    np.testing.assert_allclose(adv[2], [A_last], atol=1e-12)
    # per agent: agent a's middle action is skipped; its first bootstraps from its third
    adv, _ = per_agent_gae([0.0, 0.2, 1.0], [0.5, 9.9, 0.3], ["a", "a", "a"], gamma=0.9, lam=0.8, passthrough=[0, 1, 0])
    np.testing.assert_allclose(adv, [0.9 * (0.2 + 0.9 * 0.3) - 0.5 + 0.72 * 0.72 * 0.7, 0.72 * 0.7, 0.7], atol=1e-12)


def test_episode_segments_rejects_non_contiguous() -> None:
    assert episode_segments([1, 1, 2], 3) == [(1, 0, 2), (2, 2, 3)]
    with pytest.raises(ValueError, match="contiguous"):
        episode_segments([1, 2, 1], 3)


# --------------------------------------------------------------------------------------
# token level
# --------------------------------------------------------------------------------------


def test_token_level_two_agents_three_tokens_by_hand() -> None:
    # one turn; agent 0 tokens V = [.1 .2 .3], agent 1 tokens V = [.4 .5 .6]; team reward 1 on
    # agent 1. gamma_token = lam_token = 1, gamma_agent = 0.9, lam_agent = 0.5; terminal.
    # agent 1: j2: 1 - .6 = .4; j1: (.6 - .5) + .4 = .5; j0: (.5 - .4) + .5 = .6
    # agent 0: j2: 0 + .9*.4 - .3 = .06, A = .06 + .9*.5*.6 = .33; j1: .1 + .33 = .43; j0: .53
    adv, ret = token_level_backup([0, 1], [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], [0, 0], gamma_agent=0.9, lam_agent=0.5)
    np.testing.assert_allclose(adv[0], [0.53, 0.43, 0.33], atol=1e-12)
    np.testing.assert_allclose(adv[1], [0.6, 0.5, 0.4], atol=1e-12)
    np.testing.assert_allclose(ret[1], [1.0, 1.0, 1.0], atol=1e-12)


def reference_token_gae(r, tv, V_next_first, mask_next, g, lam):
    """The reference's token loop, transcribed for one rollout thread.

    r: [T, N]; tv: [T, N, L] token values (a list per action); V_next_first: value of the
    first token of agent 0 at step T; mask_next: masks[T] (0 if terminated).
    """
    T, N = r.shape
    adv = [[None] * N for _ in range(T)]
    gae = 0.0
    for step in reversed(range(T)):
        for agent in reversed(range(N)):
            vals = tv[step][agent]
            last = len(vals) - 1
            out = np.zeros(len(vals))
            for token in reversed(range(last + 1)):
                v = vals[token]
                if token == last:
                    if agent == N - 1:
                        v_next = tv[step + 1][0][0] if step + 1 < T else V_next_first
                        m = 1.0 if step + 1 < T else mask_next
                    else:
                        v_next, m = tv[step][agent + 1][0], 1.0
                    delta = r[step, agent] + g * v_next * m - v
                    gae = delta + g * lam * m * gae
                else:
                    delta = g * vals[token + 1] - v
                    gae = delta + g * lam * gae
                out[token] = gae
            adv[step][agent] = out
    return adv


def test_token_level_reproduces_reference_with_per_token_gamma() -> None:
    rng = np.random.default_rng(0)
    r = np.array([[0.0, 0.0], [0.0, 1.0]])
    tv = [[rng.normal(size=3), rng.normal(size=2)], [rng.normal(size=4), rng.normal(size=1)]]
    ref = reference_token_gae(r, tv, 0.0, 0.0, 0.99, 0.95)
    adv, _ = token_level_backup(r.reshape(-1), [x for row in tv for x in row], [0, 0, 1, 1], gamma_token=0.99, lam_token=0.95)
    for k, (t, i) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        np.testing.assert_allclose(adv[k], ref[t][i], atol=1e-12)


def test_token_level_one_token_per_action_equals_action_level() -> None:
    r, V, turns = [0, 0.5, 0, 1], [0.2, 0.1, 0.4, 0.3], [0, 0, 1, 1]
    a_tok, _ = token_level_backup(r, [[v] for v in V], turns, gamma_agent=0.9, lam_agent=0.8, gamma_turn=0.7, lam_turn=0.6)
    a_act, _ = action_level_gae(r, V, turns, gamma_agent=0.9, lam_agent=0.8, gamma_turn=0.7, lam_turn=0.6)
    np.testing.assert_allclose(np.concatenate(a_tok), a_act)


def test_token_level_episodes_do_not_leak_and_empty_action_rejected() -> None:
    tv = [[0.1, 0.2], [0.3], [0.5, 0.5], [0.0]]
    adv, _ = token_level_backup([0, 1, 0, 3], tv, [0, 0, 0, 0], [1, 1, 2, 2])
    alone, _ = token_level_backup([0, 1], tv[:2], [0, 0])
    for a, b in zip(adv[:2], alone, strict=True):
        np.testing.assert_allclose(a, b)
    with pytest.raises(ValueError, match="no token values"):
        token_level_backup([0, 1], [[0.1], []], [0, 0])


# --------------------------------------------------------------------------------------
# per-agent (IPPO) GAE, against stable-baselines3
# --------------------------------------------------------------------------------------


def test_per_agent_gae_single_agent_matches_sb3() -> None:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    rewards = np.array([0.0, 1.0, 0.0, 0.5, 0.0, 2.0, 1.0])
    values = np.array([0.3, 0.8, 0.1, 0.4, 0.6, 0.9, 0.2])
    starts = np.array([1, 0, 1, 0, 0, 1, 0])  # episodes [0,1] [2,3,4] [5,6 ... truncated]
    last_value, gamma, lam = 0.7, 0.97, 0.9
    buf = RolloutBuffer(len(rewards), spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gae_lambda=lam, gamma=gamma, n_envs=1)
    for k in range(len(rewards)):
        buf.add(np.zeros((1, 1)), np.zeros((1, 1)), np.array([rewards[k]]), np.array([starts[k]]), torch.tensor([values[k]]), torch.zeros(1))
    buf.compute_returns_and_advantage(last_values=torch.tensor([last_value]), dones=np.array([0]))
    eids = np.cumsum(starts)
    adv, ret = per_agent_gae(rewards, values, np.zeros(len(rewards)), eids, gamma=gamma, lam=lam, last_values={int(eids[-1]): last_value})
    np.testing.assert_allclose(adv, buf.advantages.reshape(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, buf.returns.reshape(-1), rtol=1e-5, atol=1e-6)


def test_per_agent_gae_never_chains_across_agents() -> None:
    # agents alternate a b a b; each agent's chain is its own two actions
    r = np.array([0.0, 0.0, 1.0, 2.0])
    V = np.array([0.1, 0.2, 0.3, 0.4])
    adv, _ = per_agent_gae(r, V, ["a", "b", "a", "b"], gamma=0.9, lam=0.5)
    a_a, _ = chain_gae(r[[0, 2]], V[[0, 2]], [0.3, 0.0], 0.9, 0.5, [0, 1])
    a_b, _ = chain_gae(r[[1, 3]], V[[1, 3]], [0.4, 0.0], 0.9, 0.5, [0, 1])
    np.testing.assert_allclose(adv[[0, 2]], a_a)
    np.testing.assert_allclose(adv[[1, 3]], a_b)
    # hand: agent a: A2 = 1 - .3 = .7; A0 = .9*.3 - .1 + .45*.7 = .485
    np.testing.assert_allclose(a_a, [0.485, 0.7])


# --------------------------------------------------------------------------------------
# GRPO
# --------------------------------------------------------------------------------------


def test_grpo_global_normalisation() -> None:
    # group 0: [1, 0, 1, 0] -> mean .5, unbiased std sqrt(1/3); A = +-0.5/0.57735 = +-0.8660
    adv = grpo_advantages([1, 0, 1, 0], [0, 0, 0, 0], eps=0.0)
    np.testing.assert_allclose(adv, [0.8660254, -0.8660254, 0.8660254, -0.8660254], atol=1e-6)
    # Dr. GRPO: centred only
    np.testing.assert_allclose(grpo_advantages([1, 0, 1, 0], [0] * 4, scale_by_std=False), [0.5, -0.5, 0.5, -0.5])
    np.testing.assert_allclose(grpo_advantages([1, 0, 1, 0], [0] * 4, scale=False), [0.5, -0.5, 0.5, -0.5])
    np.testing.assert_allclose(grpo_advantages([3, 1], [0, 0], normalize="none"), [1, -1])


def test_grpo_agent_wise_vs_global() -> None:
    # one group, agents [0, 1, 0, 1]; agent 1's reward scale is 10x-20x agent 0's
    r = [1.0, 10.0, 0.0, 20.0]
    a = grpo_advantages(r, [0] * 4, agent_ids=[0, 1, 0, 1], normalize="agent", eps=0.0)
    # per agent: [1, 0] -> [+, -] and [10, 20] -> [-, +], each +-0.5*d / (0.7071*d) = +-0.7071
    np.testing.assert_allclose(a, [0.70710678, -0.70710678, -0.70710678, 0.70710678], atol=1e-6)
    g = grpo_advantages(r, [0] * 4, eps=0.0)
    # globally both of agent 0's actions sit below the mean 7.75: both negative
    assert g[0] < 0 and g[2] < 0


def test_grpo_all_equal_groups_give_zero_not_nan() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.is_tensor(adv)
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv[:4], torch.zeros(4))
    a = grpo_advantages([5.0, 5.0, 5.0, 5.0], [0, 0, 0, 0], agent_ids=[0, 1, 0, 1], normalize="agent")
    np.testing.assert_array_equal(a, np.zeros(4))
    # a cell of one sample (agent-wise) is centred to 0
    np.testing.assert_array_equal(grpo_advantages([1.0, 0.0], [0, 0], agent_ids=[0, 1], normalize="agent"), [0.0, 0.0])
    with pytest.raises(ValueError):
        grpo_advantages([1.0], [0], normalize="agent")


# --------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------

floats = st.floats(-10, 10, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.lists(floats, min_size=1, max_size=12))
def test_property_undiscounted_monte_carlo_is_reward_to_go(rewards: list[float]) -> None:
    n = len(rewards)
    adv, ret = chain_gae(rewards, np.zeros(n), np.zeros(n), 1.0, 1.0, np.eye(n)[-1])
    np.testing.assert_allclose(adv, np.cumsum(rewards[::-1])[::-1], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ret, adv)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(floats, floats), min_size=1, max_size=10),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_property_gae_is_the_lambda_return_and_td0_at_lam0(pairs, gamma: float, lam: float) -> None:
    r = np.array([p[0] for p in pairs], dtype=np.float64)
    v = np.array([p[1] for p in pairs], dtype=np.float64)
    n = len(r)
    nv = np.append(v[1:], 0.0)
    d = np.eye(n)[-1]
    adv, ret = chain_gae(r, v, nv, gamma, lam, d)
    assert adv.shape == ret.shape == (n,)
    # A_n = sum_k (gamma*lam)^k delta_{n+k}
    delta = r + gamma * nv * (1 - d) - v
    expected = [sum((gamma * lam) ** k * delta[m + k] for k in range(n - m)) for m in range(n)]
    np.testing.assert_allclose(adv, expected, rtol=1e-7, atol=1e-7)
    adv0, _ = chain_gae(r, v, nv, gamma, 0.0, d)
    np.testing.assert_allclose(adv0, delta, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.integers(0, 1000))
def test_property_token_level_shapes_and_returns(lengths: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    tv = [rng.normal(size=t) for t in lengths]
    r = rng.normal(size=len(lengths))
    turns = np.arange(len(lengths)) // 2
    adv, ret = token_level_backup(r, tv, turns)
    assert [a.shape[0] for a in adv] == lengths
    for a, rt, v in zip(adv, ret, tv, strict=True):
        np.testing.assert_allclose(rt, a + v)
    # gamma = lam = 1 everywhere and terminal at the end: the first token's return is the
    # undiscounted reward-to-go of the episode from that action on
    adv1, ret1 = token_level_backup(r, tv, turns, gamma_agent=1, lam_agent=1, gamma_turn=1, lam_turn=1)
    np.testing.assert_allclose([x[0] for x in ret1], np.cumsum(r[::-1])[::-1], atol=1e-9)


# --------------------------------------------------------------------------------------
# frac_zero_std_groups (issue 28 item 18): the share of GRPO groups with no signal
# --------------------------------------------------------------------------------------


def test_frac_zero_std_groups_closed_form() -> None:
    from marft_algos.advantages import frac_zero_std_groups, grpo_advantages

    # groups: a = [1, 0] (signal), b = [1, 1] (none), c = [0.5] (one sample: none), d = [2, 2, 2] (none)
    rewards = [1.0, 0.0, 1.0, 1.0, 0.5, 2.0, 2.0, 2.0]
    groups = ["a", "a", "b", "b", "c", "d", "d", "d"]
    assert frac_zero_std_groups(rewards, groups) == 3 / 4
    # each group counts once whatever its size; torch in, same answer
    assert frac_zero_std_groups(torch.tensor(rewards), torch.tensor([0, 0, 1, 1, 2, 3, 3, 3])) == 3 / 4
    # agrees with grpo_advantages: exactly the zero-std groups have all-zero advantages
    adv = grpo_advantages(rewards, group_ids=groups)
    zero_groups = {g for g in set(groups) if all(adv[k] == 0 for k, h in enumerate(groups) if h == g)}
    assert zero_groups == {"b", "c", "d"}
    assert frac_zero_std_groups([0.0, 1.0], [0, 0]) == 0.0
    assert frac_zero_std_groups([0.3, 0.3 + 1e-12], [0, 0]) == 1.0  # float noise is no signal
    assert frac_zero_std_groups([], []) == 0.0
    with pytest.raises(ValueError, match="one group id per reward"):
        frac_zero_std_groups([1.0, 2.0], [0])
