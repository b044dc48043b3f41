"""The program env: unmodified programs (plain ``openai`` calls) run as a PettingZoo AEC env.

Every program here is a real client of the real loopback endpoint: the env answers its
HTTP requests one AEC step at a time. Programs are module-level functions so that the
env pickles (a copy replays the recorded replies into a fresh run of the program).
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import openai
import pytest

import marft_envs
from marft_envs.program_env import ProgramEnv
from marft_envs.tasks.base import Problem
from marft_envs.testing import check_env

PROBLEMS = [Problem("toy/0", "What is 0 + 1?", "1"), Problem("toy/1", "What is 1 + 1?", "2")]
ROLES = ["solver", "checker"]


def _ask(base_url: str, role: str, content: str) -> str:
    c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    return c.chat.completions.create(model=role, messages=[{"role": "user", "content": content}]).choices[0].message.content


def duo(base_url: str, problem: Problem) -> str:
    """solver -> checker; the checker's reply is the answer (graded by the task)."""
    draft = _ask(base_url, "solver", problem.question)
    return _ask(base_url, "checker", f"{problem.question}\nSolution: {draft}")


async def fan_out(base_url: str, problem: Problem) -> dict[str, float]:
    """Two solvers at once (asyncio.gather), then the checker sees both."""
    c = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)

    async def ask(role: str, content: str) -> str:
        r = await c.chat.completions.create(model=role, messages=[{"role": "user", "content": content}])
        return r.choices[0].message.content

    a, b = await asyncio.gather(ask("solver", problem.question + " (a)"), ask("solver", problem.question + " (b)"))
    final = await ask("checker", f"A: {a}\nB: {b}")
    return {"agree": float(a == b), "final": float(final.strip() == problem.answer)}


def raises(base_url: str, problem: Problem) -> float:
    _ask(base_url, "solver", problem.question)
    raise RuntimeError("boom")


def hangs(base_url: str, problem: Problem) -> float:
    _ask(base_url, "solver", problem.question)
    time.sleep(3600)
    return 1.0


def unknown_role(base_url: str, problem: Problem) -> float:
    return float(len(_ask(base_url, "critic", problem.question)))


def returns_nan(base_url: str, problem: Problem) -> float:
    _ask(base_url, "solver", problem.question)
    return math.nan


def never_stops(base_url: str, problem: Problem) -> float:
    while True:
        _ask(base_url, "solver", problem.question)


def never_calls(base_url: str, problem: Problem) -> float:
    return 0.5


def _finish(env: ProgramEnv, reply: str = "1") -> dict:
    """Answer every call with ``reply``; the final info."""
    info = {}
    while env.agents:
        agent = env.agent_selection
        done = env.terminations[agent] or env.truncations[agent]
        if done:
            info = env.infos[agent]
        env.step(None if done else reply)
    return info


def test_each_request_is_a_step_of_its_role_with_its_exact_messages() -> None:
    env = ProgramEnv(duo, ROLES, PROBLEMS)
    env.reset(options={"problem_index": 1})
    assert env.agent_selection == "solver" and env.messages("solver") == [{"role": "user", "content": "What is 1 + 1?"}]
    env.step("2")
    assert env.agent_selection == "checker"
    assert env.messages("checker") == [{"role": "user", "content": "What is 1 + 1?\nSolution: 2"}]
    env.step("2")
    info = _finish(env)
    assert info["team_reward"] == 1.0 and info["grade"]["correct"]  # the returned answer string, graded
    assert info["call_order"] == ["solver", "checker"] and info["call_edges"] == [(0, 1)]
    assert info["flags"] == []


def test_the_program_env_passes_pettingzoo_api_test_and_check_env() -> None:
    check_env(ProgramEnv(duo, ROLES, PROBLEMS), n_episodes=2)


def test_a_fan_out_is_pending_together_and_answered_one_at_a_time() -> None:
    """Both solver calls are answered (one step each) before the checker, which sees both
    replies; the edges come from the replies' text, so they are distinctive here."""
    env = ProgramEnv(fan_out, ROLES, PROBLEMS)
    env.reset(options={"problem_index": 0})
    assert env.agent_selection == "solver"
    first = env.messages("solver")[0]["content"]
    env.step("ALPHA")
    assert env.agent_selection == "solver"  # the other branch of the fan-out
    second = env.messages("solver")[0]["content"]
    assert {first[-3:], second[-3:]} == {"(a)", "(b)"}
    env.step("BETA")
    assert env.agent_selection == "checker"
    a, b = ("ALPHA", "BETA") if first.endswith("(a)") else ("BETA", "ALPHA")
    assert env.messages("checker")[0]["content"] == f"A: {a}\nB: {b}"
    env.step("1")
    info = _finish(env)
    assert info["reward_components"] == {"agree": 0.0, "final": 1.0} and info["team_reward"] == 1.0
    assert info["call_order"] == ["solver", "solver", "checker"]
    assert sorted(info["call_edges"]) == [(0, 2), (1, 2)]


@pytest.mark.parametrize(
    ("program", "flag", "truncated"),
    [(raises, "program_error", False), (unknown_role, "unknown_role", False), (returns_nan, "bad_program_return", False),
     (never_stops, "max_calls_exceeded", True)],
)
def test_a_misbehaving_program_ends_the_episode_with_reward_zero_and_a_flag(program, flag, truncated) -> None:
    env = ProgramEnv(program, ROLES, PROBLEMS, max_calls=3)
    env.reset(seed=0)
    while env.agents and not (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
        env.step("1")
    agent = env.agent_selection
    assert env.rewards[agent] == 0.0 and flag in env.infos[agent]["flags"]
    assert env.truncations[agent] == truncated
    assert env.infos[agent]["error"]
    _finish(env)
    env.reset(seed=1)  # the run goes on: the next episode starts normally
    assert env.agents == ROLES


def test_a_hanging_program_ends_at_its_deadline() -> None:
    env = ProgramEnv(hangs, ROLES, PROBLEMS, program_timeout_s=1.0)
    env.reset(seed=0)
    env.step("1")
    agent = env.agent_selection
    assert env.terminations[agent] and "program_timeout" in env.infos[agent]["flags"] and env.rewards[agent] == 0.0


def test_a_program_that_never_calls_ends_at_reset() -> None:
    env = ProgramEnv(never_calls, ROLES, PROBLEMS)
    env.reset(seed=0)
    info = env.infos[env.agent_selection]
    assert "no_calls" in info["flags"] and info["team_reward"] == 0.5


def test_episodes_are_isolated_and_ended_episodes_refuse_calls() -> None:
    """Another episode's id is not a way in; a call into an ended episode is a 409."""
    env = ProgramEnv(duo, ROLES, PROBLEMS)
    env.reset(seed=0)
    ep = env._ep
    url = f"{marft_envs.program_env._HUB.server.url}/episodes/{ep.id}/v1/chat/completions"
    body = {"model": "solver", "messages": [{"role": "user", "content": "x"}]}
    wrong = url.replace(ep.id, "0" * 32)
    assert httpx.post(wrong, json=body, timeout=60).status_code == 404
    _finish(env)
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 404 or r.status_code == 409  # ended: refused (and forgotten)
    assert r.json()["error"]["code"] in ("episode_ended", "episode_not_found")


def test_program_v0_is_registered_for_marft_envs_make() -> None:
    env = marft_envs.make("marft_envs.program_env:program-v0", program=f"{__name__}:duo", roles=ROLES, problems="arith")
    assert env.possible_agents == ROLES
    env.reset(seed=0)
    assert env.agent_selection == "solver"
    env.close()


# ---- the CLI: marft train --program, then marft serve --checkpoint of that run ---------------


def test_train_program_flags_are_checked() -> None:
    from marft_algos.serve.cli import expand_program_flags

    with pytest.raises(ValueError, match="MODULE:FUNCTION"):
        expand_program_flags(["train", "--program", "nocolon", "--roles", "a"])
    with pytest.raises(ValueError, match="--roles"):
        expand_program_flags(["train", "--program", "m:f"])
    with pytest.raises(ValueError, match="leave out --env"):
        expand_program_flags(["train", "--program", "m:f", "--roles", "a", "--env", "arith-duo-v0"])
    assert expand_program_flags(["eval", "--program", "m:f"]) == ["eval", "--program", "m:f"]


def test_marft_train_program_then_serve_its_checkpoint(tmp_path) -> None:
    """One GRPO step of a plain-openai program from the command line; the trained team is
    then served from its checkpoint with the run's per-role sampling as defaults."""
    import argparse

    from marft_algos.cli import build_parser, main
    from marft_algos.serve.cli import build_server

    out = tmp_path / "run"
    sampling = '{"solver": {"max_new_tokens": 3}, "checker": {"max_new_tokens": 2}}'
    status = main(["train", "--program", f"{__name__}:duo", "--roles", "solver,checker", "--problems", "arith",
                   "--algo", "grpo", "--model", "tiny-random", "--steps", "1", "--out", str(out),
                   "--set", "num_envs=2", "--set", "group_size=2", "--set", "progress=false",
                   "--set", f"sampling_overrides={sampling}"])
    assert status == 0
    args = build_parser().parse_args(["serve", "--checkpoint", str(out), "--port", "0"])
    assert isinstance(args, argparse.Namespace)
    with build_server(args) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in c.models.list()] == ROLES
        r = c.chat.completions.create(model="checker", messages=[{"role": "user", "content": "What is 1 + 1?"}])
        assert r.usage.completion_tokens <= 2  # the run's sampling for the checker


ADD = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]


def with_tools(base_url: str, problem: Problem) -> str:
    """The OpenAI tool convention: the framework runs the tool and sends a ``tool`` message."""
    c = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    msgs = [{"role": "user", "content": problem.question}]
    r = c.chat.completions.create(model="solver", messages=msgs, tools=ADD)
    msg = r.choices[0].message
    if not msg.tool_calls:
        return msg.content or ""
    args = json.loads(msg.tool_calls[0].function.arguments)
    msgs += [msg.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": str(args["a"] + args["b"])}]
    return c.chat.completions.create(model="solver", messages=msgs, tools=ADD).choices[0].message.content


def test_tool_calls_in_replies_reach_the_program_and_its_tool_messages_come_back_as_prompt() -> None:
    env = ProgramEnv(with_tools, ROLES, PROBLEMS)
    env.reset(options={"problem_index": 1})
    assert env.tools("solver") == ADD
    assert "<tool_call>" in env.messages("solver")[0]["content"]  # described inline for templates without tools=
    assert env.messages("solver", inline_tools=False) == [{"role": "user", "content": "What is 1 + 1?"}]
    env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>')
    second = env.messages("solver", inline_tools=False)
    assert second[-1] == {"role": "tool", "content": "2"} and '"name": "add"' in second[-2]["content"]
    env.step("2")
    info = _finish(env)
    assert info["team_reward"] == 1.0 and info["call_order"] == ["solver", "solver"]


def test_program_v0_by_itself_conforms() -> None:
    """The registered id works without arguments (its default program talks plain HTTP),
    so registry-wide conformance checks can include it."""
    check_env("marft_envs.program_env:program-v0", n_episodes=2)
    env = marft_envs.make("marft_envs.program_env:program-v0")
    env.reset(seed=0)
    assert env.agent_selection == "solver" and "boxed" in env.messages("solver")[0]["content"]
    env.close()


def sends_a_lone_surrogate(base_url: str, problem: Problem) -> float:
    """A program whose text is not encodable: refused at the server, never a step."""
    body = b'{"model": "solver", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = httpx.post(f"{base_url}/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=300)
    return float(r.status_code == 400 and "UTF-8" in r.json()["error"]["message"])


def test_text_the_collector_could_not_encode_never_becomes_a_step() -> None:
    env = ProgramEnv(sends_a_lone_surrogate, ROLES, PROBLEMS)
    env.reset(seed=0)
    info = env.infos[env.agent_selection]
    assert info["team_reward"] == 1.0 and info["num_calls"] == 0


def test_reset_mid_episode_fails_the_selected_call_instead_of_leaving_it_hanging() -> None:
    env = ProgramEnv(duo, ROLES, PROBLEMS)
    env.reset(seed=0)
    selected = env._pending
    assert selected is not None and not selected.future.done()
    env.reset(seed=1)
    assert selected.future.done() and selected.future.exception() is not None
    assert env.agent_selection == "solver" and env._pending is not selected


def posts_a_judge_score_later(base_url: str, problem: Problem) -> float:
    """Returns at once; a judge thread posts its component afterwards."""
    import threading

    answer = _ask(base_url, "solver", problem.question)

    def judge() -> None:
        time.sleep(0.5)
        httpx.post(f"{base_url}/reward", json={"components": {"judge": 0.25 if answer == "1" else 0.0}}, timeout=300)

    threading.Thread(target=judge, daemon=True).start()
    return 1.0


def test_reward_components_posted_after_the_program_returned_count_within_the_grace() -> None:
    env = ProgramEnv(posts_a_judge_score_later, ROLES, PROBLEMS, reward_grace_s=60)
    env.reset(seed=0)
    env.step("1")
    info = env.infos[env.agent_selection]
    assert info["reward_components"] == {"program": 1.0, "judge": 0.25} and info["team_reward"] == 1.25
    # without a grace the episode ends when the program returns; a later post is refused
    env = ProgramEnv(posts_a_judge_score_later, ROLES, PROBLEMS)
    env.reset(seed=0)
    url = env._ep and f"{marft_envs.program_env._HUB.server.url}/episodes/{env._ep.id}/v1/reward"
    env.step("1")
    assert env.infos[env.agent_selection]["reward_components"] == {"program": 1.0}
    r = httpx.post(url, json={"components": {"judge": 1.0}}, timeout=60)
    assert r.status_code in (404, 409)
    bad = ProgramEnv(duo, ROLES, PROBLEMS)
    bad.reset(seed=0)
    r = httpx.post(f"{marft_envs.program_env._HUB.server.url}/episodes/{bad._ep.id}/v1/reward",
                   content=b'{"components": {"judge": NaN}}', timeout=60)
    assert r.status_code == 400 and "finite number" in r.json()["error"]["message"]
    bad.close()
