"""Hostile tool calls: random text, malformed JSON, huge arguments, nested calls, unknown
tools, wrong types. Every step returns promptly, observations stay in their spaces,
rewards are finite, and each bad call is a message, a flag and a count."""

from __future__ import annotations

import json

import pytest
from helpers.fuzz import fuzz_steps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marft_envs
from marft_envs.tools import TOOL_ERRORS

TOOL_ENV_IDS = ["arith-calc-duo-v0", "rag-solo-v0", "rag-quartet-v0"]
_ENVS = {e: marft_envs.make(e, horizon=2, max_action_chars=2048) for e in TOOL_ENV_IDS}

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20,
)
names = st.one_of(st.sampled_from(["calculator", "search", "python", "", "CALCULATOR", "calc"]), st.text(max_size=30))


def _block(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


tool_calls = st.one_of(
    st.builds(lambda n, a: _block(json.dumps({"name": n, "arguments": a})), names, json_values),
    st.builds(lambda e: _block(json.dumps({"name": "calculator", "arguments": {"expression": e}})),
              st.one_of(st.text(max_size=60), st.sampled_from(["9**9**9", "1/0", "(" * 300, "2**4096", "sqrt(-1)"]))),
    st.builds(lambda q, k: _block(json.dumps({"name": "search", "arguments": {"query": q, "k": k}})), st.text(max_size=80), json_values),
    st.builds(_block, st.text(max_size=200)),  # malformed JSON
    st.sampled_from([
        _block('{"name": "calculator", "arguments": {"expression": "' + "9" * 5000 + '"}}'),  # huge argument
        _block(_block('{"name": "calculator", "arguments": {"expression": "1"}}')),  # nested call
        _block("[" * 3000 + "]" * 3000),
        "<tool_call>" * 50,
        "</tool_call>" * 50,
        _block('{"name": "calculator", "arguments": "not json"}'),
        _block('{"name": "calculator"}') * 12,  # more calls than the budget
        "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Tovaris\"}}",  # unclosed
    ]),
)
segments = st.one_of(
    st.none(), st.text(max_size=300), st.binary(max_size=100), st.integers(),
    tool_calls, st.lists(tool_calls, min_size=2, max_size=4).map(" text ".join),
)

_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("env_id", TOOL_ENV_IDS)
@_FUZZ
@given(seed=st.integers(0, 2**16), episode=st.lists(segments, min_size=1, max_size=16))
def test_hostile_tool_calls_never_break_an_episode(env_id, seed, episode):
    env = _ENVS[env_id]
    env.reset(seed=seed)
    errors_before = {k: env.stats.get(k, 0) for k in TOOL_ERRORS}
    flagged: dict[str, int] = dict.fromkeys(TOOL_ERRORS, 0)
    steps = 0
    for agent, action in fuzz_steps(env, episode, 200):
        steps += 1
        if action is not None and agent in env.infos:
            info = env.infos[agent]
            if info.get("tool_turn"):
                assert env.agent_selection == agent  # the same agent continues
                for c in info["tool_calls"]:
                    assert set(c) == {"name", "arguments", "ok", "error", "truncated"}
                    if c["error"]:
                        flagged[c["error"]] += 1
                        assert c["error"] in info["flags"]
                for m in info["tool_messages"]:
                    assert m["role"] == "tool" and len(m["content"]) <= 2000 + 100
            elif "tool_budget_exhausted" in info.get("flags", []):
                flagged["tool_budget_exhausted"] += 1
    assert not env.agents, "episode did not end"
    # every agent acts at most budget + 1 times per turn
    budget = env.tool_loop.config.budget
    assert steps <= env.horizon * sum(budget + 1 for _ in env.possible_agents) + len(env.possible_agents)
    for k in TOOL_ERRORS:
        assert env.stats.get(k, 0) - errors_before[k] == flagged[k], k
