"""Nothing silent (issue 19): overflowing prompts, idle agents, wrong env options."""

from __future__ import annotations

import logging

import pytest

import marft_envs
from marft_algos.rollout import ContextOverflowError, RolloutCollector, overlong_summary
from marft_envs.registration import EnvArgumentError

models = pytest.importorskip("marft_algos.models")


class SayRed:
    """Every agent says "red" (char-level ids: prompt length = characters)."""

    def encode(self, role, messages):
        return [ord(c) for c in "\n".join(m["content"] for m in messages)]

    def generate(self, requests):
        return [models.GenResult(token_ids=[114, 0], text="r", logprobs=[-0.5, -0.5], finish_reason="eos")
                for r in requests for _ in range(r.n)]


def echo():
    return marft_envs.make("echo-duo-v0")


# ---- overflowing prompts ------------------------------------------------------------------
def test_overflow_is_counted_per_agent_and_warned_once_with_the_sizes(caplog):
    col = RolloutCollector(echo, SayRed(), num_envs=2, seed=0, max_context=50)
    with caplog.at_level(logging.WARNING, logger="marft"):
        batch = col.collect()
        col.collect()
    m = batch.metrics
    assert m["agent/speaker/overlong"] == 2 and m["agent/listener/overlong"] == 2
    warned = [r.getMessage() for r in caplog.records if "does not fit max_context" in r.getMessage()]
    assert len(warned) == 2  # once per agent, not once per action
    assert "agent 'speaker': prompt of" in warned[0] and "max_context=50" in warned[0]
    assert overlong_summary(m) == "speaker 2, listener 2"


def test_strict_context_stops_the_run_with_a_clear_error():
    col = RolloutCollector(echo, SayRed(), num_envs=2, seed=0, max_context=50, strict_context=True)
    with pytest.raises(ContextOverflowError, match=r"agent 'speaker': prompt of \d+ tokens does not fit max_context=50"):
        col.collect()


def test_eval_summary_says_how_many_episodes_overflowed():
    from marft_algos.evaluation import evaluate

    r = evaluate(SayRed(), "echo-duo-v0", n=4, num_envs=2, max_context=50)
    assert r.overlong_episodes == 4 and r.overlong_by_agent == {"speaker": 4, "listener": 4}
    assert "WARNING: 4 of 4 episodes overflowed max_context (speaker 4, listener 4)" in str(r)
    fine = evaluate(SayRed(), "echo-duo-v0", n=2, num_envs=2, max_context=4096)
    assert fine.overlong_episodes == 0 and "WARNING" not in str(fine)
    with pytest.raises(ContextOverflowError):
        evaluate(SayRed(), "echo-duo-v0", n=2, num_envs=2, max_context=50, strict_context=True)


class WithGhost:
    """The echo env, with a third agent in ``possible_agents`` that is never selected."""

    def __init__(self):
        self.__dict__["_env"] = echo()

    def __getattr__(self, name):
        return getattr(self._env, name)

    @property
    def possible_agents(self):
        return [*self._env.possible_agents, "ghost"]


def test_an_agent_that_never_acts_in_a_step_is_warned_about(caplog):
    col = RolloutCollector(WithGhost, SayRed(), num_envs=2, seed=0)
    with caplog.at_level(logging.WARNING, logger="marft"):
        batch = col.collect()
    assert batch.metrics["agent/ghost/actions"] == 0 and batch.metrics["agent/speaker/actions"] == 2
    assert any("agent 'ghost' never acted in 2 episodes" in r.getMessage() for r in caplog.records)


# ---- wrong env options ----------------------------------------------------------------------
def test_a_misspelt_task_option_is_one_clear_error_with_a_suggestion():
    with pytest.raises(EnvArgumentError, match=r"task 'arith' \(ArithTask\) has no option 'digit'; did you mean 'digits'\?"):
        marft_envs.make("arith-duo-v0", digit=2)
    with pytest.raises(TypeError, match="did you mean 'horizon'"):  # still a TypeError, as Python's own
        marft_envs.make("arith-duo-v0", horizn=2)


def test_a_misspelt_option_of_a_third_party_env_names_the_env():
    def make_env(size: int = 3, render_mode=None):
        return echo()

    marft_envs.register("ux-third-party-v0", make_env)
    try:
        with pytest.raises(EnvArgumentError, match=r"environment 'ux-third-party-v0' has no option 'sise'; did you mean 'size'"):
            marft_envs.make("ux-third-party-v0", sise=4)
    finally:
        marft_envs.registry.pop("ux-third-party-v0")


def test_options_for_a_task_instance_say_what_to_do():
    from marft_envs.tasks.arith import ArithTask

    with pytest.raises(EnvArgumentError, match=r"pass them to the task's constructor instead \(ArithTask\(\.\.\.\)\)"):
        marft_envs.TextTeamEnv(ArithTask(), "duo", digits=2)


def test_the_cli_gives_one_line_and_exit_2_for_a_wrong_env_option(capsys):
    from marft_algos.cli import main

    rc = main(["train", "--env", "arith-duo-v0", "--model", "tiny-random", "--steps", "1", "--set", "env_kwargs.digit=2",
               "--set", "progress=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "did you mean 'digits'" in err
