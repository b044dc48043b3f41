"""Hostile and buggy workflow programs (issue 28): none of them may crash or hang the env.

Each attack program below is a regression test: it once escaped ``env.step`` / ``reset``,
hung ``reset()``, or passed ``check_env`` while broken.
"""

from __future__ import annotations

import pytest

import marft_envs
from marft_envs import make_workflow_env
from marft_envs.registration import EnvArgumentError
from marft_envs.tasks.base import Problem
from marft_envs.testing import check_env

PROBLEMS = [Problem("p/0", "2+2?", "4"), Problem("p/1", "3+3?", "6")]


def make(program, **kw):
    kw.setdefault("problems", PROBLEMS)
    return make_workflow_env(program, roles=["writer", "critic"], **kw)


# ------------------------------------------------------------------ the attack programs
async def distance_reward(team, problem):
    """The natural ``-|reply - answer|`` reward: a reply of 400 digits makes a huge int."""
    reply = await team.call("writer", [{"role": "user", "content": problem.question}])
    return -abs(int(reply) - int(problem.answer))


async def returns_huge_int(team, problem):
    await team.call("writer", "hi")
    return 10**400


async def returns_huge_int_component(team, problem):
    await team.call("writer", "hi")
    return {"outcome": 1.0, "size": 10**400}


async def returns_unprintable_huge_int(team, problem):
    await team.call("writer", "hi")
    return 10**5000  # repr() itself raises ValueError (int max str digits)


class _BadFloat(float):
    def __float__(self):
        raise RuntimeError("no float for you")

    def __repr__(self):
        raise RuntimeError("no repr either")


async def returns_bad_float(team, problem):
    await team.call("writer", "hi")
    return _BadFloat(1.0)


class _BadMapping(dict):
    def __len__(self):
        raise RuntimeError("no len")


async def returns_bad_mapping(team, problem):
    await team.call("writer", "hi")
    return _BadMapping(outcome=1.0)


async def raises_system_exit(team, problem):
    await team.call("writer", "hi")
    raise SystemExit(3)


async def raises_generator_exit(team, problem):
    await team.call("writer", "hi")
    raise GeneratorExit


async def system_exit_at_start(team, problem):
    raise SystemExit("before any call")


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("unprintable")


async def raises_unprintable(team, problem):
    await team.call("writer", "hi")
    raise _BadStr


async def retries_unknown_role_forever(team, problem):
    """Catches the rejection and retries: once a hang of ``reset()``."""
    while True:
        try:
            await team.call("ghost", "hi")
        except ValueError:
            pass


async def retries_bad_messages_forever(team, problem):
    while True:
        try:
            await team.call("writer", [{"role": "user", "content": 5}])
        except ValueError:
            pass


async def swallows_everything(team, problem):
    """A bare ``except:`` also swallows the GeneratorExit of ``close()``: it must not escape."""
    while True:
        try:
            await team.call("ghost", "hi")
        except BaseException:  # noqa: BLE001 - the attack
            pass


async def deep_recursion(team, problem):
    await team.call("writer", "hi")

    def down(n):
        return down(n + 1) + 1

    return down(0)


class _EvilRole(str):
    def __eq__(self, other):
        raise RuntimeError("no compare")

    __hash__ = str.__hash__

    def __repr__(self):
        raise RuntimeError("no repr")


class _EvilObject:
    def __eq__(self, other):
        raise RuntimeError("no compare")

    def __repr__(self):
        raise RuntimeError("no repr")


async def calls_evil_roles(team, problem):
    try:
        await team.call(_EvilObject(), "hi")
    except ValueError:
        pass
    reply = await team.call(_EvilRole("writer"), "hi")  # a str subclass naming a real role
    return float(reply == "ok")


async def calls_a_ghost_every_episode(team, problem):
    """Calls a role outside ``roles`` on every episode, catches the error and goes on."""
    try:
        await team.call("solver", "hi")  # a role the env was not given
    except ValueError:
        pass
    reply = await team.call("writer", problem.question)
    return float(team.grade(reply).correct)


async def huge_messages(team, problem):
    await team.call("writer", [{"role": "user", "content": "x" * 50_000_000}])
    return 1.0


async def huge_messages_caught(team, problem):
    try:
        await team.call("writer", [{"role": "user", "content": "y" * 50_000_000}])
    except ValueError:
        pass
    await team.call("writer", "short")
    return 1.0


async def many_empty_messages(team, problem):
    await team.call("writer", [{"role": "", "content": ""}] * 1_000_000)
    return 1.0


async def grades_then_regrades(team, problem):
    first = await team.call("writer", problem.question)
    team.grade(first)
    final = await team.call("critic", f"Check: {first}")
    team.grade(final)
    return 0.0


# ----------------------------------------------------------------------------- item 9
@pytest.mark.parametrize("reply", ["1" + "0" * 400, "-" + "9" * 400])
def test_a_huge_int_reward_is_a_bad_program_return_not_an_overflow(reply):
    env = make(distance_reward)
    env.reset(options={"problem_index": 0})
    env.step(reply)  # raised OverflowError out of step
    info = env.infos["writer"]
    assert all(env.terminations.values()) and env.rewards["writer"] == 0.0
    assert "bad_program_return" in info["flags"] and "overflow" in info["error"].lower()
    env.reset(options={"problem_index": 0})
    env.step("1")  # an honest near miss still scores
    assert env.rewards["writer"] == -3.0 and env.infos["writer"]["error"] is None


@pytest.mark.parametrize("program", [returns_huge_int, returns_huge_int_component,
                                     returns_unprintable_huge_int, returns_bad_float, returns_bad_mapping])
def test_returns_that_cannot_be_floats_are_bad_program_returns(program):
    env = make(program)
    env.reset(seed=0)
    env.step("ok")
    info = env.infos["writer"]
    assert env.rewards == {"writer": 0.0, "critic": 0.0}
    assert "bad_program_return" in info["flags"] and info["error"]


@pytest.mark.parametrize("program", [raises_system_exit, raises_generator_exit, raises_unprintable, deep_recursion])
def test_base_exceptions_of_the_program_are_program_errors(program):
    env = make(program)
    env.reset(seed=0)
    env.step("ok")  # SystemExit / GeneratorExit escaped step
    info = env.infos["writer"]
    assert all(env.terminations.values()) and env.rewards["writer"] == 0.0
    assert "program_error" in info["flags"] and info["error"]
    assert env.stats["program_errors"] == 1


def test_system_exit_before_the_first_call_ends_the_episode_at_reset():
    env = make(system_exit_at_start)
    env.reset(seed=0)
    assert all(env.terminations.values())
    assert "program_error" in env.infos["writer"]["flags"]
    assert "SystemExit" in env.infos["writer"]["error"]


def test_role_objects_with_hostile_dunders_never_escape_step():
    env = make(calls_evil_roles)
    env.reset(seed=0)  # the comparison and the repr of the role raised out of reset
    assert env.agent_selection == "writer" and type(env.agent_selection) is str
    assert env.infos["writer"]["flags"] == ["unknown_role"]
    env.step("ok")
    assert env.rewards["writer"] == 1.0 and env.infos["writer"]["call_order"] == ["writer"]


# ---------------------------------------------------------------------------- item 10
# A program that swallows the GeneratorExit of close() cannot be closed: the env drops it, and
# Python reports "Exception ignored" when the coroutine is collected (not an error of the env).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("program", [retries_unknown_role_forever, retries_bad_messages_forever,
                                     swallows_everything])
def test_rejected_calls_count_against_max_calls(program):
    env = make(program, max_calls=5)
    env.reset(seed=0)  # hung forever: rejected calls were free
    assert all(env.truncations.values())
    info = env.infos["writer"]
    assert "max_calls_exceeded" in info["flags"] and info["team_reward"] == 0.0
    assert env.stats["bad_calls"] == 5 and info["num_calls"] == 0


# ---------------------------------------------------------------------- item 12 (part)
def test_messages_over_the_prompt_cap_are_rejected_at_the_call():
    env = make(huge_messages)
    env.reset(seed=0)  # 50 MB of messages were accepted and returned by messages()
    assert all(env.terminations.values())
    info = env.infos["writer"]
    assert "messages_too_long" in info["flags"] and "max_prompt_chars" in info["error"]
    env = make(huge_messages_caught, max_prompt_chars=1000)
    env.reset(seed=0)
    assert env.infos["writer"]["flags"] == ["messages_too_long"]
    assert env.messages("writer") == [{"role": "user", "content": "short"}]
    env.step("ok")
    assert env.rewards["writer"] == 1.0


def test_messages_are_never_longer_than_the_prompt_cap():
    env = make(huge_messages_caught, max_prompt_chars=1000)
    env.reset(seed=0)
    for role in env.possible_agents:
        assert sum(len(m["content"]) for m in env.messages(role)) <= 1000
    env = make(many_empty_messages)
    env.reset(seed=0)  # a million empty messages passed as "0 characters"
    assert "messages_too_long" in env.infos["writer"]["flags"]


def test_a_call_within_the_cap_is_observed_whole():
    async def fits(team, problem):
        await team.call("writer", [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "u" * 580}])
        return 1.0

    env = make(fits, max_prompt_chars=1000)
    env.reset(seed=0)
    assert env.infos["writer"]["flags"] == [] and len(env.observe("writer")["prompt"]) == 1000
    assert env.observe("writer")["prompt"].endswith("u")


# ---------------------------------------------------------------------- item 16 (part)
async def _helper_that_fails(x):
    return {"a": 1}[x]


async def raises_in_a_helper(team, problem):
    reply = await team.call("writer", problem.question)
    return await _helper_that_fails(reply)


def test_the_traceback_of_a_failed_program_is_kept_in_info():
    env = make(raises_in_a_helper)
    env.reset(seed=0)
    env.step("zzz")
    for role in env.possible_agents:
        info = env.infos[role]
        assert "program_error" in info["flags"]
        tb = info["program_traceback"]
        assert tb.startswith("Traceback") and "_helper_that_fails" in tb and "KeyError: 'zzz'" in tb
    env.reset(seed=0)  # the next episode starts clean
    assert env.infos["writer"].get("program_traceback") is None


def test_the_traceback_is_bounded():
    env = make(deep_recursion)
    env.reset(seed=0)
    env.step("ok")
    tb = env.infos["writer"]["program_traceback"]
    assert "RecursionError" in tb and len(tb) <= 4096


def test_a_program_that_succeeds_has_no_traceback():
    env = make(grades_then_regrades)
    env.reset(options={"problem_index": 0})
    env.step("4")
    env.step("5")
    info = env.infos["critic"]
    assert info["program_traceback"] is None and info["error"] is None


def test_check_env_fails_a_program_that_calls_an_unknown_role_every_episode():
    env = make(calls_a_ghost_every_episode)
    with pytest.raises(AssertionError, match="every one of the 3 episodes") as e:
        check_env(env, n_episodes=3, pettingzoo_checks=False)
    assert "unknown role 'solver'" in str(e.value) and "['writer', 'critic']" in str(e.value)


# ---------------------------------------------------------------------- item 21 (part)
def test_a_misspelt_workflow_kwarg_names_itself_the_env_and_the_closest_names():
    with pytest.raises(EnvArgumentError) as e:
        marft_envs.make("workflow-example-v0", max_call=3)
    msg = str(e.value)
    assert "'max_call'" in msg and "workflow-example-v0" in msg and "'max_calls'" in msg
    assert "ArithTask" not in msg.split(";")[0]  # not blamed on the task
    with pytest.raises(TypeError, match=r"'max_action_char'.*did you mean 'max_action_chars'"):
        make(distance_reward, max_action_char=10)
    with pytest.raises(TypeError, match=r"'digit'.*did you mean 'digits'"):
        make_workflow_env(distance_reward, ["writer"], "arith", digit=2)
    env = make_workflow_env(distance_reward, ["writer"], "arith", digits=2)  # valid task options still pass
    assert env.task.digits == 2


def test_the_last_grade_decides_correct():
    """What "accuracy" means for a workflow env (docs/tutorial/existing-program.md)."""
    env = make(grades_then_regrades)
    env.reset(options={"problem_index": 0})
    env.step("4")  # graded correct
    env.step("5")  # graded wrong, last
    assert env.infos["critic"]["grade"]["correct"] is False
