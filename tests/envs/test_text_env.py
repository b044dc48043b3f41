"""TextTeamEnv semantics: observations follow D, shared rewards, multi-turn, flags."""

from __future__ import annotations

import copy
import logging
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marft_envs
from marft_envs import AgentProfile, GradeResult, Independent, Problem, Task, Team, TextTeamEnv
from marft_envs.text_env import ResetNeededError


def play(env, policy, seed=0, options=None):
    """Run an episode; ``policy(env, agent) -> action`` for live agents. Returns the last() log."""
    env.reset(seed=seed, options=options)
    log = []
    for agent in env.agent_iter(200):
        obs, reward, term, trunc, info = env.last()
        log.append((agent, obs, reward, term, trunc, info))
        env.step(None if term or trunc else policy(env, agent))
    assert not env.agents
    return log


def right(env, agent):
    return f"{agent}: so the answer is \\boxed{{{env.problem.answer}}}"


def wrong(env, agent):
    return f"{agent}: \\boxed{{{int(env.problem.answer) + 1}}}"


# ------------------------------------------------------------------------ observations
def test_duo_actor_sees_reasoner_and_instructions():
    env = marft_envs.make("arith-duo-v0")
    env.reset(seed=3)
    q = env.problem.question
    reasoner_obs = env.observe("reasoner")["prompt"]
    assert q in reasoner_obs and env.task.instructions not in reasoner_obs  # not the answering agent
    assert reasoner_obs.startswith(env.team.profiles["reasoner"].prompt)
    env.step("REASONER-SECRET-42")
    actor = env.observe("actor")
    assert env.agent_selection == "actor" and actor["turn"] == 0
    assert "[reasoner]: REASONER-SECRET-42" in actor["prompt"] and env.task.instructions in actor["prompt"]
    assert "REASONER-SECRET-42" not in env.observe("reasoner")["prompt"]  # no self-echo within a turn
    msgs = env.messages("actor")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == env.team.profiles["actor"].prompt
    assert actor["prompt"] == msgs[0]["content"] + "\n\n" + msgs[1]["content"]


def test_trio_parallel_branches_do_not_see_each_other():
    env = marft_envs.make("arith-trio-v0")
    env.reset(seed=0)
    env.step("FROM-A")
    assert env.agent_selection == "solver_b"
    assert "FROM-A" not in env.observe("solver_b")["prompt"]
    env.step("FROM-B")
    agg = env.observe("aggregator")["prompt"]
    assert "[solver_a]: FROM-A" in agg and "[solver_b]: FROM-B" in agg
    assert agg.index("FROM-A") < agg.index("FROM-B")


def test_independent_team_sees_no_actions():
    team = Team.from_profiles(
        [AgentProfile("a", "first", with_answer=False), AgentProfile("b", "second", with_answer=True)],
        Independent(["a", "b"]),
    )
    env = TextTeamEnv("arith", team)
    env.reset(seed=1)
    env.step("A-WAS-HERE")
    assert env.agent_selection == "b" and "A-WAS-HERE" not in env.observe("b")["prompt"]
    assert env.team.topology.parents("b", env.executed) == []


def test_routed_sends_the_turn_to_the_named_specialist():
    env = marft_envs.make("arith-routed-v0")
    env.reset(seed=0)
    assert env.agent_selection == "orchestrator"
    env.step("This is about geometry.\nROUTE: Geometry")
    assert env.agent_selection == "geometry"
    obs = env.observe("geometry")["prompt"]
    assert "[orchestrator]: This is about geometry." in obs and env.task.instructions in obs
    env.step(right(env, "geometry"))
    info = env.infos["geometry"]
    assert info["executed"] == ["orchestrator", "geometry"] and info["answer_agent"] == "geometry"
    assert info["attribution"] == {"orchestrator": 0.5, "algebra": 0.0, "number_theory": 0.0, "geometry": 0.5}
    assert all(env.terminations.values()) and env.rewards == dict.fromkeys(env.possible_agents, 1.0)
    # every agent, routed or not, takes its dead step
    dead = []
    while env.agents:
        dead.append(env.agent_selection)
        env.step(None)
    assert sorted(dead) == sorted(env.possible_agents)


def test_routed_unparsed_route_is_flagged_counted_and_logged(caplog):
    env = marft_envs.make("arith-routed-v0")
    env.reset(seed=0)
    with caplog.at_level(logging.INFO, logger="marft_envs"):
        env.step("I cannot decide.")
    assert env.agent_selection == "algebra"  # the documented default
    env.step("no idea")
    assert "route_unparsed" in env.infos["orchestrator"]["flags"]
    assert "route_unparsed" in env.infos["algebra"]["flags"]
    assert env.stats["route_unparsed"] == 1
    assert any("route_unparsed" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------- rewards
def test_shared_team_reward_pettingzoo_semantics():
    env = marft_envs.make("arith-duo-v0")
    log = play(env, right)
    agents = [a for a, *_ in log]
    assert agents == ["reasoner", "actor", "reasoner", "actor"]  # two live steps, two dead steps
    # live steps see 0; after the graded turn every agent's last() shows the team reward
    assert [r for _, _, r, *_ in log] == [0.0, 0.0, 1.0, 1.0]
    assert all(term and not trunc for _, _, _, term, trunc, _ in log[2:])
    info = log[-1][-1]
    assert info["team_reward"] == 1.0 and info["grade"]["correct"] and info["grade"]["extracted"] == env.problem.answer
    assert info["attribution"] == {"reasoner": 0.5, "actor": 0.5}
    assert info["reward_components"]["outcome"] == 1.0 and info["flags"] == []


def test_rewards_dict_after_each_step():
    env = marft_envs.make("arith-duo-v0")
    env.reset(seed=0)
    env.step("thinking")
    assert env.rewards == {"reasoner": 0.0, "actor": 0.0}  # not graded yet
    env.step(wrong(env, "actor"))
    assert env.rewards == {"reasoner": 0.0, "actor": 0.0}
    assert all(env.truncations.values()) and not any(env.terminations.values())  # horizon reached
    assert env.infos["actor"]["grade"]["correct"] is False


def test_reward_components_compose():
    cfg = {"outcome": 1.0, "format": 0.25, "partial": 0.5, "cost_per_char": 0.001, "cost_per_token": 0.01, "cost_per_turn": 0.1}
    env = marft_envs.make("arith-duo-v0", reward=cfg)
    env.reset(seed=0)
    env.step("abcd")  # 4 chars, 1 token
    answer = f"\\boxed{{{env.problem.answer}}}"
    env.step(answer)
    comps = env.infos["actor"]["reward_components"]
    chars = 4 + len(answer)
    tokens = 1 + marft_envs.rewards.approx_tokens(answer)
    assert comps == pytest.approx(
        {"outcome": 1.0, "format": 0.25, "partial": 0.5, "chars": -0.001 * chars, "tokens": -0.01 * tokens, "turn": -0.1}
    )
    assert env.rewards["reasoner"] == pytest.approx(sum(comps.values()))


def test_format_reward_without_correctness():
    env = marft_envs.make("arith-solo-v0", reward={"outcome": 1.0, "format": 0.1})
    env.reset(seed=0)
    env.step(wrong(env, "actor"))
    assert env.rewards["actor"] == pytest.approx(0.1)


# -------------------------------------------------------------------------- multi-turn
def test_multi_turn_with_feedback_then_success():
    env = marft_envs.make("arith-duo-v0", horizon=3, feedback=True)
    env.reset(seed=5)
    env.step("first thoughts")
    env.step(wrong(env, "actor"))
    assert env.agents == ["reasoner", "actor"] and env.agent_selection == "reasoner" and env.turn == 1
    assert not any(env.terminations.values()) and not any(env.truncations.values())
    obs = env.observe("reasoner")
    assert obs["turn"] == 1
    text = obs["prompt"]
    assert "Turn 1:" in text and "[reasoner]: first thoughts" in text
    assert "[actor]:" not in text  # the reasoner does not depend on the actor
    assert "Feedback: the team's answer" in text and "incorrect" in text
    env.step("second thoughts")
    actor_text = env.observe("actor")["prompt"]
    assert "[actor]: actor: \\boxed" in actor_text  # its own earlier answer
    assert actor_text.index("Turn 1:") < actor_text.index("second thoughts")
    env.step(right(env, "actor"))
    assert all(env.terminations.values()) and env.infos["actor"]["turn"] == 1
    assert env.stats["turns"] == 2


def test_multi_turn_without_feedback_truncates_at_horizon():
    env = marft_envs.make("arith-solo-v0", horizon=3)
    log = play(env, wrong)
    assert [a for a, *_ in log] == ["actor"] * 4
    assert [o["turn"] for _, o, *_ in log] == [0, 1, 2, 2]
    assert "Feedback" not in log[2][1]["prompt"] and "Turn 2:" in log[2][1]["prompt"]
    assert log[-1][4] is True and log[-1][3] is False  # truncated, not terminated


def test_multi_turn_cumulative_rewards_with_partial_credit():
    env = marft_envs.make("arith-solo-v0", horizon=2, reward={"outcome": 1.0, "format": 0.5})
    log = play(env, wrong)
    assert [r for _, _, r, *_ in log] == [0.0, 0.5, 0.5]  # each turn's format credit, seen at the next last()


# ----------------------------------------------------------------- seeding and pickling
def test_seed_fixes_problem_and_problem_index():
    env = marft_envs.make("arith-duo-v0")
    problems = []
    for seed in (1, 2, 1):
        env.reset(seed=seed)
        problems.append(env.problem)
    assert problems[0] == problems[2]
    env.reset(options={"problem_index": 7})
    assert env.problem == env.task.get(7)
    with pytest.raises(ValueError, match="problem_index"):
        env.reset(options={"problem_index": env.num_problems})
    env.reset(seed=0, options={"unrelated": 1})  # unknown options are ignored (api_test passes some)


def test_pickle_and_deepcopy_mid_episode():
    env = marft_envs.make("arith-duo-v0", horizon=2, feedback=True)
    env.reset(seed=4)
    env.step("partial thoughts")
    for clone in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        assert clone.observe("actor") == env.observe("actor") and clone.executed == env.executed
        clone.step(right(clone, "actor"))
        assert all(clone.terminations.values())
    assert env.agent_selection == "actor" and not any(env.terminations.values())


# ------------------------------------------------------------------------- bad actions
@pytest.mark.parametrize(
    "action, flags",
    [
        (None, {"none_action", "empty_action"}),
        ("", {"empty_action"}),
        ("x" * 1_000_000, {"action_truncated"}),
        (b"\x00\xffbytes", {"not_a_string", "binary_action"}),
        (42, {"not_a_string"}),
        ("bell\x07 and nul\x00", {"binary_action"}),
        ("\ud800", {"invalid_unicode"}),
    ],
)
def test_bad_actions_are_flagged_not_raised(action, flags):
    env = marft_envs.make("arith-solo-v0", max_action_chars=1000)
    env.reset(seed=0)
    env.step(action)
    info = env.infos["actor"]
    assert flags <= set(info["flags"]) and info["action_flags"]["actor"] == info["flags"]
    assert env.rewards["actor"] == 0.0 and env.stats["bad_actions"] == 1
    text = env.history[-1][-1][1] if env.history else env.executed[-1][1]
    assert len(text) <= 1000 and "\x00" not in text
    text.encode("utf-8")


def test_route_line_unparsed_then_mention_is_flagged():
    env = marft_envs.make("arith-routed-v0")
    env.reset(seed=0)
    env.step("ROUTE: nonsense ... but this is really geometry")
    assert env.agent_selection == "geometry"
    env.step("42")
    flags = env.infos["orchestrator"]["flags"]
    assert "route_unparsed" in flags and "route_by_mention" in flags
    assert env.stats["route_unparsed"] == 1 and env.stats["route_by_mention"] == 1


@pytest.mark.parametrize("call", ["step", "last", "observe", "agent_iter", "messages"])
def test_calls_before_reset_say_so(call):
    env = marft_envs.make("arith-duo-v0")
    args = {"step": ("an action",), "observe": ("actor",), "messages": ("actor",)}.get(call, ())
    with pytest.raises(ResetNeededError, match=r"call reset\(\) before"):
        getattr(env, call)(*args)
    assert issubclass(ResetNeededError, AssertionError)  # as PettingZoo's order wrapper raises
    env.reset(seed=0)  # attribute access and the episode work as usual afterwards
    assert env.team.agents == ["reasoner", "actor"] and env.messages("actor")[-1]["role"] == "user"
    env.step("x")


def test_dead_agents_must_step_none():
    env = marft_envs.make("arith-solo-v0")
    env.reset(seed=0)
    env.step("anything")
    with pytest.raises(ValueError, match="dead"):
        env.step("an action after the end")


class _Boom(Task):
    name = "boom"

    def __init__(self, mode="raise"):
        self.mode = mode

    def __len__(self):
        return 3

    def get(self, index):
        return Problem(id=f"boom/{index}", question="?", answer="1")

    def grade(self, response, problem):
        if self.mode == "raise":
            raise RuntimeError("grader bug")
        if self.mode == "timeout":
            return GradeResult(correct=False, timed_out=True, details={"seconds": 5.0})
        return GradeResult(correct=True, score=1.0, details={"seconds": 0.25, "method": "x"})


@pytest.mark.parametrize("mode, flag", [("raise", "grade_error"), ("timeout", "grade_timeout")])
def test_grader_failures_are_wrong_and_flagged(mode, flag):
    env = TextTeamEnv(_Boom(mode), "solo")
    env.reset(seed=0)
    env.step("1")
    assert env.rewards["actor"] == 0.0 and flag in env.infos["actor"]["flags"]
    assert env.stats["grade_errors" if mode == "raise" else "grade_timeouts"] == 1


def test_timing_kept_out_of_infos():
    env = TextTeamEnv(_Boom("ok"), "solo")
    env.reset(seed=0)
    env.step("1")
    assert env.infos["actor"]["grade"]["details"] == {"method": "x"}
    assert env.last_grade_timing == {"seconds": 0.25} and env.max_grade_seconds == 0.25


# --------------------------------------------------------------------- echo and config
@pytest.mark.parametrize(
    "speaker, listener, reward",
    [("Blue.", "blue", 1.0), ("green", "  GREEN\n", 1.0), ("blue", "red", 0.0), ("purple", "purple", 0.0), ("", "", 0.0)],
)
def test_echo_rewards_repeating_the_speaker(speaker, listener, reward):
    env = marft_envs.make("echo-duo-v0")
    env.reset(seed=0)
    env.step(speaker)
    assert "[speaker]: " + speaker.strip() in env.observe("listener")["prompt"] or not speaker.strip()
    env.step(listener)
    assert env.rewards["listener"] == reward


def test_render_modes(capsys):
    env = marft_envs.make("arith-duo-v0", render_mode="ansi")
    env.reset(seed=0)
    env.step("RENDER-ME")
    text = env.render()
    assert env.problem.question in text and "[reasoner]: RENDER-ME" in text
    human = marft_envs.make("arith-solo-v0", render_mode="human")
    human.reset(seed=0)
    assert "What is" in capsys.readouterr().out
    with pytest.warns(UserWarning):
        assert marft_envs.make("arith-solo-v0").render() is None
    with pytest.raises(ValueError, match="render_mode"):
        marft_envs.make("arith-solo-v0", render_mode="rgb_array")


def test_constructor_validation():
    with pytest.raises(ValueError, match="horizon"):
        TextTeamEnv("arith", "solo", horizon=0)
    with pytest.raises(ValueError, match="not both"):
        TextTeamEnv("arith", "solo", profiles="duo")
    with pytest.raises(TypeError, match="Task instance"):
        TextTeamEnv(marft_envs.tasks.arith.ArithTask(), "solo", digits=2)
    with pytest.raises(ValueError, match="unknown task"):
        TextTeamEnv("chess", "solo")
    env = TextTeamEnv("arith", profiles="trio", task_kwargs={"digits": 2}, split="test")
    assert env.task.digits == 2 and env.task.split == "test" and env.num_problems > 0
    assert str(env) == "arith_trio_v0"


# -------------------------------------------------------------- the Task contract
class _Returns(Task):
    """A third-party task whose grader returns ``self.result`` as is."""

    name = "returns"

    def __init__(self, result):
        self.result = result

    def __len__(self):
        return 1

    def get(self, index):
        return Problem(id="returns/0", question="?", answer="1")

    def grade(self, response, problem):
        return self.result


def _grade_once(result):
    env = TextTeamEnv(_Returns(result), "solo")
    env.reset(seed=0)
    env.step("1")
    return env


@pytest.mark.parametrize("result, message", [
    (GradeResult(correct="yes"), r"GradeResult.correct='yes' \(str\); it must be True or False"),
    (GradeResult(correct=1), r"GradeResult.correct=1 \(int\)"),
    (GradeResult(correct=True, format_ok="no"), r"GradeResult.format_ok='no'"),
    (GradeResult(correct=False, timed_out=None), r"GradeResult.timed_out=None"),
    (GradeResult(correct=True, score="1"), r"GradeResult.score='1' \(str\)"),
    (GradeResult(correct=True, score=float("nan")), r"GradeResult.score=nan; it must be a finite number"),
    (GradeResult(correct=True, score=float("inf")), r"GradeResult.score=inf"),
    (GradeResult(correct=True, score=2.0), r"GradeResult.score=2.0"),
    (GradeResult(correct=False, error=ValueError("x")), r"GradeResult.error=ValueError\('x'\)"),
    (GradeResult(correct=False, details=["flags"]), r"GradeResult.details of type list"),
    ({"correct": True}, r"returned dict, not a GradeResult"),
    (True, r"returned bool, not a GradeResult"),
])
def test_task_returning_a_broken_grade_raises_naming_the_task(result, message):
    with pytest.raises((TypeError, ValueError), match=message) as err:
        _grade_once(result)
    assert "test_text_env._Returns.grade returned" in str(err.value)


@given(correct=st.one_of(st.text(), st.integers(), st.floats(), st.none(), st.lists(st.booleans())))
@settings(max_examples=40, deadline=None)
def test_any_non_bool_correct_is_refused(correct):
    with pytest.raises(TypeError, match="GradeResult.correct="):
        _grade_once(GradeResult(correct=correct))


@given(score=st.floats(allow_nan=True, allow_infinity=True))
@settings(max_examples=60, deadline=None)
def test_score_outside_unit_interval_is_refused_inside_is_rewarded(score):
    result = GradeResult(correct=False, score=score)
    if math.isfinite(score) and 0.0 <= score <= 1.0:
        env = TextTeamEnv(_Returns(result), "solo", reward={"outcome": 0.0, "partial": 1.0})
        env.reset(seed=0)
        env.step("1")
        assert env.rewards["actor"] == score
    else:
        with pytest.raises(ValueError, match="GradeResult.score="):
            _grade_once(result)


def test_numpy_bools_and_numbers_keep_the_contract():
    import numpy as np

    env = _grade_once(GradeResult(correct=np.bool_(True), score=np.float32(1.0)))
    assert env.rewards["actor"] == 1.0 and env.terminations["actor"]
