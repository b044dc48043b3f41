"""The seeds' team designs as envs: MALT, ReMA and the multi-hop planner."""

from __future__ import annotations

import pytest

import marft_envs
from marft_envs.testing import check_env


def play(env, replies):
    """Step the env with ``replies`` (a list, or {agent: [replies...]}) until it ends."""
    per_agent = {a: list(v) for a, v in replies.items()} if isinstance(replies, dict) else None
    seq = iter(replies) if per_agent is None else None
    order = []
    for agent in env.agent_iter(100):
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        order.append(agent)
        env.step(next(seq) if seq is not None else per_agent[agent].pop(0))
    return order


def test_malt_refiner_sees_solution_and_critique_and_is_graded():
    env = marft_envs.make("arith-malt-v0")
    env.reset(seed=3)
    answer = env.problem.answer
    env.step("I think it is \\boxed{0}")
    assert "[generator]: I think it is \\boxed{0}" in env.observe("verifier")["prompt"]
    env.step("Step 2 is wrong.")
    view = env.observe("refiner")["prompt"]
    assert "[generator]: I think it is" in view and "[verifier]: Step 2 is wrong." in view
    assert "\\boxed{}" in view  # the answering agent gets the task's instructions
    env.step(f"\\boxed{{{answer}}}")
    info = env.infos["refiner"]
    assert info["answer_agent"] == "refiner" and info["team_reward"] == 1.0
    assert info["executed"] == ["generator", "verifier", "refiner"]


def test_rema_is_multi_turn_and_the_meta_thinker_guides_each_turn():
    env = marft_envs.make("arith-rema-v0")
    assert env.horizon == 2
    env.reset(seed=0)
    assert env.observe("meta_thinker")["turn"] == 0
    env.step("Plan: subtract.")
    env.step("\\boxed{123456}")  # wrong: a second turn follows
    assert env.agent_selection == "meta_thinker" and env.turn == 1
    obs = env.observe("meta_thinker")
    assert obs["turn"] == 1  # what a turn-level loss groups by
    assert "Turn 1:" in obs["prompt"] and "[reasoner]: \\boxed{123456}" in obs["prompt"]
    env.step("Plan: check the sign.")
    assert "[meta_thinker]: Plan: check the sign." in env.observe("reasoner")["prompt"]
    env.step(f"\\boxed{{{env.problem.answer}}}")
    assert env.infos["reasoner"]["team_reward"] == 1.0 and env.infos["reasoner"]["turn"] == 1


def test_planner_routes_over_several_hops_in_the_env():
    env = marft_envs.make("arith-planner-v0")
    env.reset(seed=1)
    answer = env.problem.answer
    order = play(env, {"planner": ["Solve it. ROUTE: solver", "Check it. ROUTE: checker",
                                   f"\\boxed{{{answer}}} ROUTE: done"],
                       "solver": [f"\\boxed{{{answer}}}"], "checker": ["Correct."]})
    assert order == ["planner", "solver", "planner", "checker", "planner"]
    info = env.infos if env.agents else None
    assert info is None  # every agent took its dead step
    env.reset(seed=1)
    env.step("Solve it. ROUTE: solver")
    env.step("work")
    view = env.observe("planner")["prompt"]
    assert "The team's exchange so far:\n[planner]: Solve it. ROUTE: solver\n\n[solver]: work" in view
    assert "Routing hops left: 2." in view
    env.step("ROUTE: checker")
    assert "[solver]: work" in env.observe("checker")["prompt"]  # a later specialist sees earlier work
    env.step("ok")
    env.step(f"\\boxed{{{answer}}}")
    info = env.infos["planner"]
    assert info["executed"] == ["planner", "solver", "planner", "checker", "planner"]
    assert info["routes"] == ["solver", "checker", "done"] and info["hops"] == 2
    assert info["route_counts"] == {"solver": 1, "checker": 1} and info["handoff_loops"] == 0
    assert info["team_reward"] == 1.0 and info["answer_agent"] == "planner"
    assert sum(info["attribution"].values()) == pytest.approx(1.0)


def test_planner_hop_budget_and_unparsed_routes_are_flagged_and_counted():
    env = marft_envs.make("arith-planner-v0")
    env.reset(seed=0)
    order = play(env, {"planner": ["ROUTE: solver"] * 4, "solver": ["w"] * 3, "checker": []})
    assert order == ["planner", "solver"] * 3 + ["planner"]
    assert env.stats["hop_budget_exhausted"] == 1
    env.reset(seed=0)
    env.step("ROUTE: astrology")
    assert not env.agents or all(env.terminations[a] or env.truncations[a] for a in env.agents)
    assert env.stats["route_unparsed"] == 1


def test_planner_observation_space_holds_a_full_turn():
    env = marft_envs.make("arith-planner-v0", max_action_chars=64)
    env.reset(seed=0)
    for _ in range(6):
        env.step("ROUTE: solver " + "x" * 200)
    obs = env.observe("planner")
    assert env.observation_space("planner").contains(obs) and obs["prompt"].endswith("inside \\boxed{}.")


@pytest.mark.parametrize("env_id", ["arith-malt-v0", "arith-rema-v0", "arith-planner-v0"])
def test_seed_teams_conform_multi_turn(env_id):
    check_env(env_id, n_episodes=3, seed=2, horizon=3, feedback=True)


def test_a_repeating_topology_that_never_ends_its_turn_is_an_error():
    from marft_envs import MultiHopRouted, Team

    class Endless(MultiHopRouted):
        def next_agent(self, executed):
            return self.orchestrator if len(executed) % 2 == 0 else self.specialists[0]

    team = Team.load("planner")
    team = Team(team.profiles, Endless("planner", ["solver", "checker"], max_hops=1), "endless")
    env = marft_envs.TextTeamEnv("arith", team)
    env.reset(seed=0)
    env.step("x")
    env.step("x")
    with pytest.raises(RuntimeError, match="scheduled action 4 of a turn, over its max_actions_per_turn=3"):
        env.step("x")  # the third action would hand the turn to a fourth
