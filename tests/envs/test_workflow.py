"""The workflow env: a user's multi-agent program run as an AEC env, step by step."""

from __future__ import annotations

import asyncio
import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marft_envs
from marft_envs import make_workflow_env
from marft_envs.tasks.base import GradeResult, Problem
from marft_envs.testing import PROGRAM_BUG_FLAGS, check_env

PROBLEMS = [Problem("p/0", "2+2?", "4"), Problem("p/1", "3+3?", "6")]


async def ask_and_grade(team, problem):
    """writer -> critic; reward 1 when the critic's text is the answer, plus a length term."""
    draft = await team.call("writer", [{"role": "system", "content": "Write."}, {"role": "user", "content": problem.question}])
    final = await team.call("critic", [{"role": "user", "content": f"Q: {problem.question}\nDraft: {draft}"}])
    return {"outcome": float(team.grade(final).correct), "brevity": -0.01 * len(final)}


async def raises_midway(team, problem):
    await team.call("writer", [{"role": "user", "content": "hi"}])
    raise KeyError("bug in the program")


async def unknown_role(team, problem):
    try:
        await team.call("ghost", [{"role": "user", "content": "hi"}])
    except ValueError as e:
        text = await team.call("writer", [{"role": "user", "content": f"recovered: {e}"}])
        return 1.0 if text == "ok" else 0.0
    return 0.0


async def unknown_role_uncaught(team, problem):
    await team.call("writer", [{"role": "user", "content": "hi"}])
    await team.call("ghost", [{"role": "user", "content": "hi"}])
    return 1.0


async def bad_messages(team, problem):
    await team.call("writer", "a bare string is one user message")
    await team.call("writer", [{"role": "user", "content": 5}])
    return 1.0


async def never_calls(team, problem):
    return 0.5


async def loops_forever(team, problem):
    while True:
        await team.call("writer", [{"role": "user", "content": "again"}])


async def foreign_await(team, problem):
    await team.call("writer", [{"role": "user", "content": "hi"}])
    await asyncio.sleep(0)
    return 1.0


async def returns_text(team, problem):
    await team.call("writer", [{"role": "user", "content": "hi"}])
    return "great"


async def returns_nan(team, problem):
    await team.call("writer", [{"role": "user", "content": "hi"}])
    return float("nan")


async def nondeterministic(team, problem):
    await team.call("writer", [{"role": "user", "content": str(np.random.random())}])
    await team.call("writer", [{"role": "user", "content": "again"}])
    return 0.0


def make(program, **kw):
    kw.setdefault("problems", PROBLEMS)
    return make_workflow_env(program, roles=["writer", "critic"], **kw)


def test_each_call_is_a_step_with_the_exact_messages_and_the_reply_returns_to_the_program():
    env = make(ask_and_grade)
    env.reset(options={"problem_index": 0})
    assert env.agent_selection == "writer"
    assert env.messages("writer") == [{"role": "system", "content": "Write."}, {"role": "user", "content": "2+2?"}]
    assert env.observe("writer") == {"prompt": "[system]: Write.\n\n[user]: 2+2?", "turn": 0}
    env.step("draft text")
    assert env.agent_selection == "critic" and env.infos["writer"] == {"turn": 0, "flags": [], "call": 0}
    assert env.messages("critic") == [{"role": "user", "content": "Q: 2+2?\nDraft: draft text"}]
    env.step("4")
    info = env.infos["critic"]
    assert info["reward_components"] == {"outcome": 1.0, "brevity": -0.01}
    assert info["team_reward"] == pytest.approx(0.99) and env.rewards == {"writer": 0.99, "critic": 0.99}
    assert info["call_order"] == ["writer", "critic"] and info["calls_per_role"] == {"writer": 1, "critic": 1}
    assert info["grade"]["correct"] is True and info["error"] is None and info["call"] == 1
    assert all(env.terminations.values())
    assert [(c.role, c.response) for c in env.calls] == [("writer", "draft text"), ("critic", "4")]
    # dead steps follow, as in any AEC env: last() returns the team reward
    for _agent in env.agent_iter():
        _, reward, term, _, _ = env.last()
        assert term and reward == pytest.approx(0.99)
        env.step(None)
    assert not env.agents


@pytest.mark.parametrize(
    "program, flag, reward",
    [
        (raises_midway, "program_error", 0.0),
        (unknown_role_uncaught, "program_error", 0.0),
        (bad_messages, "bad_messages", 0.0),
        (foreign_await, "foreign_await", 0.0),
        (returns_text, "bad_program_return", 0.0),
        (returns_nan, "bad_program_return", 0.0),
    ],
)
def test_a_misbehaving_program_ends_the_episode_with_reward_zero_and_a_flag(program, flag, reward):
    env = make(program)
    env.reset(seed=0)
    env.step("ok")
    assert all(env.terminations.values()) and env.rewards["writer"] == reward
    info = env.infos["writer"]
    assert flag in info["flags"] and info["team_reward"] == reward and info["grade"]["correct"] is False
    assert info["error"]
    if PROGRAM_BUG_FLAGS & set(info["flags"]):  # misuses team.call on every episode: a broken program
        with pytest.raises(AssertionError, match="misused team.call on every one of the 2 episodes"):
            check_env(env, n_episodes=2, pettingzoo_checks=False)  # (after the contract held throughout)
    else:
        check_env(env, n_episodes=2, pettingzoo_checks=False)  # the contract holds throughout


def test_unknown_role_is_raised_inside_the_program_at_its_call():
    env = make(unknown_role)
    env.reset(seed=0)
    assert env.agent_selection == "writer" and env.stats["bad_calls"] == 1
    assert env.infos["writer"]["flags"] == ["unknown_role"]  # flagged at reset, where it happened
    assert "unknown role 'ghost'; roles are ['writer', 'critic']" in env.messages("writer")[0]["content"]
    env.step("ok")
    assert env.infos["writer"]["team_reward"] == 1.0 and env.infos["writer"]["call_order"] == ["writer"]
    env = make(unknown_role_uncaught)
    env.reset(seed=0)
    env.step("x")
    assert {"unknown_role", "program_error"} <= set(env.infos["writer"]["flags"])
    assert "WorkflowError" in env.infos["writer"]["error"]


def test_a_program_that_never_calls_ends_at_reset():
    env = make(never_calls)
    env.reset(seed=0)
    assert all(env.terminations.values()) and env.infos["writer"]["flags"] == ["no_calls"]
    assert env._cumulative_rewards == {"writer": 0.5, "critic": 0.5}
    steps = 0
    for _ in env.agent_iter():
        env.step(None)
        steps += 1
    assert steps == 2 and not env.agents


def test_max_calls_budget_truncates_an_endless_program():
    env = make(loops_forever, max_calls=3)
    env.reset(seed=0)
    for _ in range(3):
        assert env.agent_selection == "writer" and not env.truncations["writer"]
        env.step("more")
    assert all(env.truncations.values()) and not any(env.terminations.values())
    info = env.infos["writer"]
    assert "max_calls_exceeded" in info["flags"] and info["team_reward"] == 0.0 and info["num_calls"] == 3


def test_pickle_and_deepcopy_replay_the_suspended_program():
    env = make(ask_and_grade)
    env.reset(options={"problem_index": 1})
    env.step("draft")
    for clone in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        assert clone.agent_selection == "critic" and clone.messages("critic") == env.messages("critic")
        clone.step("6")
        assert clone.infos["critic"]["team_reward"] == pytest.approx(0.99)
    env.step("wrong")  # the original is untouched by its clones
    assert env.infos["critic"]["reward_components"]["outcome"] == 0.0


def test_a_nondeterministic_program_cannot_be_restored_silently():
    env = make(nondeterministic)
    env.reset(seed=0)
    env.step("x")
    with pytest.raises(RuntimeError, match="not deterministic"):
        pickle.loads(pickle.dumps(env))


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="async def program"):
        make(lambda team, problem: 1.0)
    with pytest.raises(ValueError, match="max_calls"):
        make(ask_and_grade, max_calls=0)
    with pytest.raises(ValueError, match="unknown roles"):
        make(ask_and_grade, sampling={"ghost": {"temperature": 0.5}})
    with pytest.raises(TypeError, match="problem 0"):
        make(ask_and_grade, problems=[3])


def test_sampling_settings_reach_the_collector_through_profiles():
    env = make(ask_and_grade, sampling={"critic": {"max_new_tokens": 8}})
    assert env.team.profiles["critic"].sampling == {"max_new_tokens": 8}
    assert env.team.profiles["writer"].sampling == {}


def test_tools_are_exposed_as_schemas():
    async def with_tools(team, problem):
        await team.call("writer", [{"role": "user", "content": "hi"}], tools=["calculator"])
        return 0.0

    env = make(with_tools)
    env.reset(seed=0)
    assert env.tools("writer")[0]["function"]["name"] == "calculator" and env.tools("critic") == []


def test_a_custom_grader_and_question_strings():
    def grader(text, problem):
        return GradeResult(correct="yes" in text, score=1.0)

    async def one(team, problem):
        return float(team.grade(await team.call("writer", problem.question)).correct)

    env = make_workflow_env(one, ["writer"], problems=marft_envs.workflow.ProblemList(["Say yes."], grader))
    env.reset(seed=0)
    assert env.messages("writer") == [{"role": "user", "content": "Say yes."}]
    env.step("yes")
    assert env.infos["writer"]["team_reward"] == 1.0


def test_example_id_conforms_and_records_its_call_order():
    check_env("workflow-example-v0", n_episodes=3, seed=0)
    env = marft_envs.make("workflow-example-v0")
    env.reset(seed=4)
    env.step("\\boxed{1}")
    env.step("REVISE: wrong sign")
    env.step(f"\\boxed{{{env.problem.answer}}}")
    env.step(f"\\boxed{{{env.problem.answer}}}")
    info = env.infos["checker"]
    assert info["call_order"] == ["solver", "checker", "solver", "checker"] and info["team_reward"] == 1.0
    assert "Critique: REVISE: wrong sign" in env.calls[2].messages[-1]["content"]
    assert marft_envs.make("workflow-example-v0", split="test").task.split == "test"


_FUZZ_ENV = marft_envs.make("workflow-example-v0", max_action_chars=2048)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**16), episode=st.lists(st.one_of(
    st.none(), st.text(max_size=200), st.binary(max_size=100), st.integers(),
    st.sampled_from(["REVISE", "\\boxed{", "x" * 100_000, "\ud800"])), min_size=1, max_size=6))
def test_any_actions_are_handled(seed, episode):
    env = _FUZZ_ENV
    env.reset(seed=seed)
    moves = iter(episode)
    for agent in env.agent_iter(20):
        obs, reward, term, trunc, _ = env.last()
        assert env.observation_space(agent).contains(obs) and np.isfinite(reward)
        env.step(None if term or trunc else next(moves, ""))
    assert not env.agents


# ---------------------------------------------------------- a looping program (planner -> solver <-> critic)
# (it was the LangGraph-style example; the real LangGraph example is examples/program_langgraph,
# trained through the endpoint in tests/serve/test_program_env_langgraph.py)
LOOP_ROLES = ["planner", "solver", "critic"]


async def critic_loop(team, problem):
    """planner -> solver -> critic, back to the solver until the critic says APPROVE (at most
    two revisions); reward: the solver's last answer, graded, minus 0.05 per revision."""
    plan = await team.call("planner", [{"role": "system", "content": "Write a one-line plan for solving the problem."},
                                       {"role": "user", "content": problem.question}])
    critique, revisions = "", -1
    while True:
        note = f"\nCritique of your last answer: {critique}" if critique else ""
        answer = await team.call("solver", [
            {"role": "system", "content": "Follow the plan. Give the final answer inside \\boxed{}."},
            {"role": "user", "content": f"{problem.question}\nPlan: {plan}{note}"}])
        revisions += 1
        critique = await team.call("critic", [
            {"role": "system", "content": "Check the answer. Reply APPROVE if it is right, else say what is wrong."},
            {"role": "user", "content": f"{problem.question}\nAnswer: {answer}"}])
        if "APPROVE" in critique or revisions >= 2:
            return {"outcome": float(team.grade(answer).correct), "revisions": -0.05 * revisions}


def _critic_loop_env():
    return make_workflow_env(critic_loop, LOOP_ROLES, "arith", split="train", max_calls=8)


def test_a_looping_program_runs_as_an_env():
    check_env(_critic_loop_env(), n_episodes=2)
    env = _critic_loop_env()
    env.reset(seed=0)
    answer = env.problem.answer
    for text in ["plan: add", "\\boxed{0}", "wrong sign", f"\\boxed{{{answer}}}", "APPROVE"]:
        env.step(text)
    info = env.infos["critic"]
    assert info["call_order"] == ["planner", "solver", "critic", "solver", "critic"]  # the program's loop, recorded
    assert info["reward_components"] == {"outcome": 1.0, "revisions": -0.05}
    assert "Critique of your last answer: wrong sign" in env.calls[3].messages[-1]["content"]


def test_a_looping_program_stops_revising_after_two_tries():
    env = _critic_loop_env()
    env.reset(seed=1)
    order = []
    for agent in env.agent_iter(30):
        _, _, term, trunc, _ = env.last()
        order.append(agent)
        env.step(None if term or trunc else "no")
    assert order[:7] == ["planner", "solver", "critic", "solver", "critic", "solver", "critic"]
    assert len(order) == 7 + 3  # then the three roles' dead steps


def test_calls_before_reset_raise_like_the_other_envs():
    """The shared AEC base: ``agent_iter``/``last``/``step`` before ``reset`` raise a clear
    error (``agent_iter`` used to yield nothing here, silently)."""
    from marft_envs.text_env import ResetNeededError

    env = marft_envs.make("workflow-example-v0")
    for call in (env.agent_iter, env.last, lambda: env.step("x")):
        with pytest.raises(ResetNeededError, match="call reset"):
            call()


async def gathers_calls(team, problem):
    a, b = await asyncio.gather(team.call("writer", "draft"), team.call("critic", "review"))
    return 1.0


async def creates_tasks(team, problem):
    task = asyncio.create_task(team.call("writer", "draft"))
    return float(bool(await task))


@pytest.mark.parametrize("program", [gathers_calls, creates_tasks])
@pytest.mark.parametrize("in_thread", [False, True])
def test_concurrent_calls_are_a_clear_error_that_says_to_await_them_one_by_one(program, in_thread, caplog):
    # asyncio.gather / create_task need an event loop; the program is driven without one. In
    # the main thread gather makes a loop and returns a future (was: flag foreign_await), in a
    # worker thread (the collector's) it raises "no current event loop" (was: program_error):
    # both hid that the program's calls were the problem.
    import threading

    out = {}

    def run():
        env = make(program)
        env.reset(seed=0)
        out["env"] = env
    if in_thread:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    else:
        try:
            run()
        finally:  # gather in the main thread may have made (and set) an event loop
            asyncio.set_event_loop(None)
    env = out["env"]
    info = env.infos[env.agent_selection]
    assert info["flags"] == ["concurrent_calls", "no_calls"] and info["team_reward"] == 0.0
    assert "one after another" in info["error"] and "await team.call(...)" in info["error"]
    assert env.stats["concurrent_calls"] == 1 and env.stats["program_errors"] == 0
    assert "without awaiting each one" in caplog.text  # a warning, once per env
