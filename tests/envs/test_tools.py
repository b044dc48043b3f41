"""Tool calling: calculator, schema validation, parsers, run_tool, the env's tool loop."""

from __future__ import annotations

import copy
import json
import pickle
import time

import pytest
from helpers.timing import MARGIN

import marft_envs
from marft_envs import TextTeamEnv
from marft_envs.tools import (
    PARSERS,
    CalculatorError,
    Tool,
    ToolError,
    ToolRewardConfig,
    calculate,
    continuation_ids,
    get_parser,
    register_parser,
    resolve_tool,
    run_tool,
    validate,
)
from marft_envs.tools.parsers import HermesParser


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


# ------------------------------------------------------------------------- calculator
@pytest.mark.parametrize(
    "expr, want",
    [("2 + 3 * 4", "14"), ("(47 - 18) * 3", "87"), ("7 / 2", "3.5"), ("7 // 2", "3"), ("-7 % 3", "2"),
     ("2 ** 10", "1024"), ("2^10", "1024"), ("sqrt(16)", "4"), ("max(3, 9, 4)", "9"), ("round(2.567, 2)", "2.57"),
     ("10 \u00d7 3 \u2212 4", "26"), ("1 / 3", "0.333333333333"), ("log(e)", "1"), ("abs(-5)", "5")],
)
def test_calculator_values(expr, want):
    assert calculate(expr) == want


@pytest.mark.parametrize(
    "expr, match",
    [("__import__('os')", "not allowed|unknown"), ("open('x')", "unknown function"), ("x + 1", "unknown name"),
     ("9 ** 9 ** 9", "too large|bits"), ("2 ** 5000", "too large|bits"), ("1 / 0", "division by zero"),
     ("'a' * 3", "only numbers"), ("(1).real", "not allowed"), ("[1, 2]", "not allowed"), ("1 < 2", "not allowed"),
     ("1 << 30", "not allowed"), ("sqrt(-1)", "negative"), ("", "empty"), ("1 +", "not a valid"),
     ("1" * 600, "characters"), ("+".join(["1"] * 150), "syntax nodes"), ("10.0 ** 400", "overflow|finite"),
     ("abs(" * 90 + "1" + ")" * 90, "syntax nodes"), ("lambda: 1", "not allowed"),
     ("(10 ** 600) * (10 ** 600) * (10 ** 600)", "bits")],
)
def test_calculator_refuses(expr, match):
    start = time.monotonic()
    with pytest.raises(CalculatorError, match=match):
        calculate(expr)
    assert time.monotonic() - start < MARGIN  # bounded work: milliseconds


# ------------------------------------------------------------------------- schema
SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string", "maxLength": 5}, "k": {"type": "integer", "minimum": 1, "maximum": 3},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                   "mode": {"enum": ["a", "b"]}},
    "required": ["q"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "args, errors",
    [({"q": "hi"}, []), ({"q": "hi", "k": 2, "tags": ["x"], "mode": "a"}, []), ({"q": "hi", "k": 2.0}, []),
     ({}, ["missing required argument 'q'"]), ({"q": 5}, ["expected string, got integer"]),
     ({"q": "hi", "k": True}, ["expected integer, got boolean"]), ({"q": "hi", "k": 9}, ["must be <= 3"]),
     ({"q": "toolong"}, ["at most 5 characters"]), ({"q": "a", "z": 1}, ["unexpected argument 'z'"]),
     ({"q": "a", "tags": [1]}, ["tags[0]: expected string"]), ({"q": "a", "tags": ["x"] * 3}, ["at most 2 items"]),
     ({"q": "a", "mode": "c"}, ["must be one of"]), ({"q": "a", "k": 1.5}, ["expected integer, got number"])],
)
def test_schema_validation(args, errors):
    got = validate(args, SCHEMA)
    assert len(got) == len(errors)
    for e, g in zip(errors, got, strict=True):
        assert e in g


def test_schema_depth_is_bounded():
    deep: dict = {"q": "a"}
    node = deep
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    schema: dict = {"type": "object"}
    schema["additionalProperties"] = schema  # a recursive schema: validation must still stop
    assert any("nested more than 32 levels" in e for e in validate(deep, schema))


def test_tool_rejects_unsupported_schema_keywords():
    with pytest.raises(ValueError, match="unsupported JSON-Schema keywords"):
        Tool("t", "d", {"type": "object", "oneOf": []}, fn=lambda: 1)
    with pytest.raises(ValueError, match="type 'object'"):
        Tool("t", "d", {"type": "string"}, fn=lambda: 1)
    with pytest.raises(ValueError, match="tool name"):
        Tool("bad name", "d", {"type": "object"}, fn=lambda: 1)


# ------------------------------------------------------------------------- parsers
def test_hermes_parser():
    p = HermesParser()
    r = p.parse('Let me check. <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>')
    assert r.content == "Let me check." and r.calls[0].name == "calculator" and r.calls[0].arguments == {"expression": "1+1"}
    assert not p.parse("no call here").has_calls
    unclosed = p.parse('<tool_call>{"name": "a", "arguments": {}}')  # cut off by a stop string
    assert unclosed.calls[0].name == "a" and unclosed.calls[0].error is None
    assert p.parse("<tool_call>{bad json</tool_call>").calls[0].error.startswith("the call is not valid JSON")
    assert "inside another" in p.parse("<tool_call><tool_call>{}</tool_call></tool_call>").calls[0].error
    assert p.parse('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>').calls[0].arguments == {"x": 1}
    assert "JSON object" in p.parse('<tool_call>{"name": "a", "arguments": [1]}</tool_call>').calls[0].error
    assert "name" in p.parse('<tool_call>{"arguments": {}}</tool_call>').calls[0].error
    assert "nested too deeply" in p.parse("<tool_call>" + "[" * 8000 + "]" * 8000 + "</tool_call>").calls[0].error
    assert "characters long" in p.parse("<tool_call>" + "[" * 100_000 + "</tool_call>").calls[0].error
    assert len(p.parse("<tool_call>{}</tool_call>" * 500).calls) == 64


def test_other_parsers_and_registry():
    j = get_parser("json")
    assert j.parse('{"name": "calculator", "parameters": {"expression": "2"}}').calls[0].arguments == {"expression": "2"}
    assert not j.parse("The answer is 4").has_calls
    m = get_parser("mistral")
    r = m.parse('ok [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]')
    assert [c.name for c in r.calls] == ["a", "b"] and r.content == "ok"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("nope")

    class Upper(HermesParser):
        name = "upper"

    register_parser("upper", Upper)
    try:
        assert isinstance(get_parser("upper"), Upper)
    finally:
        PARSERS.pop("upper")


# ------------------------------------------------------------------------- run_tool
def _raises(x: int) -> str:
    raise RuntimeError("boom")


def _slow(x: int) -> str:
    time.sleep(5)
    return "late"


def _big(x: int) -> str:
    return "y" * 10_000


def _tool_error(x: int) -> str:
    raise ToolError("x must be even")


_INT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


@pytest.mark.parametrize(
    "fn, args, error, text",
    [(_raises, {"x": 1}, "tool_raised", "RuntimeError: boom"), (_tool_error, {"x": 1}, "tool_raised", "x must be even"),
     (_slow, {"x": 1}, "tool_timeout", "did not finish within 0.2 s"), (_big, {"x": 1}, None, "output truncated"),
     (_big, {"x": "1"}, "bad_tool_arguments", "expected integer")],
)
def test_run_tool_never_raises(fn, args, error, text):
    start = time.monotonic()
    out = run_tool(Tool("t", "d", _INT, fn=fn), args, timeout=0.2, max_output_chars=100)
    assert time.monotonic() - start < 0.2 + MARGIN
    assert out.error == error and text in out.content
    assert len(out.content) <= 100 + 80


def test_resolve_tool_names_and_paths():
    assert resolve_tool("calculator").name == "calculator"
    assert resolve_tool("marft_envs.tools.builtin:search_tool").name == "search"
    with pytest.raises(ValueError, match="unknown tool 'nope'"):
        resolve_tool("nope")
    schema = resolve_tool("calculator").schema()
    assert schema["type"] == "function" and schema["function"]["parameters"]["required"] == ["expression"]
    schema["function"]["name"] = "mutated"  # the tool surface is frozen: a schema is a fresh copy
    assert resolve_tool("calculator").schema()["function"]["name"] == "calculator"


def test_builtin_tools_are_a_lazy_table_and_registered_tools_override_them():
    from marft_envs.tools import base, builtin

    # named by "module:attr" in base's table: base imports no tool module for its side effect
    assert base.BUILTIN_TOOLS == {name: f"marft_envs.tools.builtin:{name}_tool" for name in ("calculator", "python", "search")}
    assert all(base.TOOLS[name] == path for name, path in base.BUILTIN_TOOLS.items())
    for name, path in base.BUILTIN_TOOLS.items():
        tool = resolve_tool(name)
        assert tool.name == name and tool.schema() == getattr(builtin, path.split(":")[1])().schema()
    mine = Tool("calculator", "mine", _INT, fn=lambda x: str(x))
    base.register_tool(mine)
    try:
        assert resolve_tool("calculator") is mine
    finally:
        base.TOOLS["calculator"] = base.BUILTIN_TOOLS["calculator"]


@pytest.mark.slow
def test_python_tool_runs_in_the_sandbox():
    tool = resolve_tool("python")
    assert run_tool(tool, {"code": "print(6 * 7)"}).content.strip() == "42"
    failed = run_tool(tool, {"code": "raise SystemExit(3)"})
    assert failed.error == "tool_raised" and "status 3" in failed.content


# ------------------------------------------------------------------------- the env loop
def _calc_env(**kw) -> TextTeamEnv:
    return marft_envs.make("arith-calc-duo-v0", **kw)


def test_tool_continuation_keeps_the_same_agent():
    env = _calc_env()
    env.reset(seed=0)
    env.step("think")
    assert env.agent_selection == "actor" and env.tools("reasoner") == []
    assert env.tools("actor")[0]["function"]["name"] == "calculator"
    assert "<tool_call>" in env.messages("actor")[0]["content"]  # inline schemas by default
    assert "<tool_call>" not in env.messages("actor", inline_tools=False)[0]["content"]
    expr = env.problem.meta["expression"]
    seg = "Let me compute. " + call("calculator", expression=expr)
    env.step(seg)
    info = env.infos["actor"]
    assert env.agent_selection == "actor" and info["tool_turn"] and info["segment"] == 0
    assert info["tool_messages"] == [{"role": "tool", "name": "calculator", "content": env.problem.answer}]
    msgs = env.messages("actor")
    assert msgs[-2] == {"role": "assistant", "content": seg} and msgs[-1]["role"] == "tool"
    assert env.problem.answer in env.observe("actor")["prompt"].split("Tool result (calculator)")[-1]
    assert "team_reward" not in info and env.rewards["actor"] == 0.0
    env.step(f"\\boxed{{{env.problem.answer}}}")
    info = env.infos["actor"]
    assert info["team_reward"] == 1.0 and info["tool_selection_accuracy"] == 1.0
    assert info["agent_metrics"]["actor"] == {"steps": 2, "tool_calls": 1, "tool_errors": 0, "tool_error_rate": 0.0,
                                              "tokens": info["agent_metrics"]["actor"]["tokens"]}
    assert info["agent_metrics"]["reasoner"]["steps"] == 1
    assert not env.agents or all(env.terminations.values())


@pytest.mark.parametrize(
    "segment, flag",
    [("<tool_call>{oops</tool_call>", "malformed_tool_call"), (call("python", code="1"), "unknown_tool"),
     (call("calculator", expression=5), "bad_tool_arguments"), (call("calculator"), "bad_tool_arguments"),
     (call("calculator", expression="1/0"), "tool_raised"), (call("calculator", expression="9**9**9"), "tool_raised")],
)
def test_bad_calls_are_messages_flags_and_counts(segment, flag):
    env = _calc_env(tool_config={"reward": {"cost_per_tool_error": 0.25, "cost_tool_error_rate": 0.5}})
    env.reset(seed=0)
    env.step("think")
    env.step(segment)
    info = env.infos["actor"]
    assert info["tool_turn"] and flag in info["flags"] and env.stats[flag] == 1 and env.stats["tool_errors"] == 1
    assert info["tool_messages"][0]["content"].startswith("Error:")
    env.step(f"\\boxed{{{env.problem.answer}}}")
    comps = env.infos["actor"]["reward_components"]
    assert comps["tool_errors"] == -0.25 and comps["tool_error_rate"] == -0.5
    assert env.infos["actor"]["team_reward"] == pytest.approx(1.0 - 0.25 - 0.5)


def test_budget_bounds_the_agent_and_ends_its_turn():
    env = _calc_env(tool_config={"budget": 2, "reward": {"cost_per_tool_call": 0.1, "cost_per_step": 0.01}})
    env.reset(seed=0)
    env.step("think")
    env.step(call("calculator", expression="1+1") + call("calculator", expression="2+2") + call("calculator", expression="3"))
    info = env.infos["actor"]
    assert [c["error"] for c in info["tool_calls"]] == [None, None, "tool_budget_exhausted"]
    env.step(call("calculator", expression="4"))  # budget spent: this segment is the action
    info = env.infos["actor"]
    assert "tool_budget_exhausted" in info["flags"] and "team_reward" in info
    assert info["reward_components"]["tool_calls"] == pytest.approx(-0.3)
    assert info["reward_components"]["steps"] == pytest.approx(-0.03)  # reasoner 1 + actor 2
    assert env.stats["tool_budget_exhausted"] == 2


def test_tool_selection_accuracy_and_agents_override():
    env = TextTeamEnv("arith", "calc_duo", tool_config={"agents": {"actor": ["calculator", "python"]},
                                                       "expected_tools": ["calculator"], "reward": {"tool_selection": 2.0}})
    env.reset(seed=0)
    env.step("think")
    env.step(call("calculator", expression="1") + call("search", query="x"))
    env.step("no answer")
    info = env.infos["actor"]
    assert info["tool_selection_accuracy"] == 0.5 and info["reward_components"]["tool_selection"] == 1.0
    with pytest.raises(ValueError, match="not roles of team"):
        TextTeamEnv("arith", "calc_duo", tool_config={"agents": {"ghost": ["calculator"]}})
    with pytest.raises(ValueError, match="unknown tool_config keys"):
        TextTeamEnv("arith", "calc_duo", tool_config={"budgett": 1})
    with pytest.raises(ValueError, match="cost"):
        ToolRewardConfig(cost_per_tool_call=-1)


def test_handoff_loops_are_counted_over_turns():
    # R A | R A | R A: hand-offs R>A, A>R, R>A, A>R, R>A; the 3rd, 4th and 5th pass within
    # the pair are loops: 0 in turn 1, 1 in turn 2 (R>A), 2 in turn 3 (A>R, R>A)
    env = _calc_env(horizon=3, tool_config={"reward": {"cost_per_handoff_loop": 1.0}})
    env.reset(seed=0)
    per_turn = []
    for _ in range(3):
        env.step("x")
        env.step(call("calculator", expression="1") if not per_turn else "no answer")  # a continuation is no hand-off
        if env.infos["actor"].get("tool_turn"):
            env.step("no answer")
        per_turn.append(env.infos["actor"]["handoff_loops"])
    assert per_turn == [0, 1, 2] and env.infos["actor"]["reward_components"]["handoff_loops"] == -2.0
    assert env.stats["handoff_loops"] == 3


def test_envs_without_tools_are_unchanged():
    env = marft_envs.make("arith-duo-v0")
    env.reset(seed=0)
    env.step(call("calculator", expression="1+1"))
    assert env.agent_selection == "actor" and "tool_turn" not in env.infos["reasoner"]
    env.step("x")
    assert set(env.infos["actor"]["reward_components"]) == {"outcome", "format", "partial", "chars", "tokens", "turn"}
    assert "agent_metrics" not in env.infos["actor"]


def test_tool_state_pickles_mid_continuation():
    env = _calc_env()
    env.reset(seed=3)
    env.step("think")
    env.step(call("calculator", expression="2*21"))
    for clone in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        assert clone.messages("actor") == env.messages("actor")
        clone.step("\\boxed{42}")
        assert "team_reward" in clone.infos["actor"]


def test_profile_tools_field_round_trips():
    team = marft_envs.Team.load("calc_duo")
    assert team.profiles["actor"].tools == ("calculator",)
    d = team.to_dict()
    assert d["profiles"][1]["tools"] == ["calculator"] and marft_envs.Team.load(d).profiles["actor"].tools == ("calculator",)
    with pytest.raises(ValueError, match="a tool is a name"):
        marft_envs.AgentProfile("a", "p", tools=(5,))
    with pytest.raises(ValueError, match="unknown tool"):
        TextTeamEnv("arith", [{"role": "a", "prompt": "p", "with_answer": True, "tools": ["nope"]}])


# ------------------------------------------------------------------------- collector contract
def test_continuation_ids_match_a_full_render():
    """prompt_ids + sampled_ids + continuation_ids == the template's render of the longer
    conversation, for both ways a sampler stops (EOS, or a stop string)."""
    from marft_algos.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    env = _calc_env()
    env.reset(seed=0)
    env.step("think")
    prompt_ids = tok.apply_chat_template(env.messages("actor"), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    seg = call("calculator", expression="6*7")
    env.step(seg)
    want = tok.apply_chat_template(env.messages("actor"), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    tool_msgs = env.infos["actor"]["tool_messages"]
    for sampled in (tok.encode(seg, add_special_tokens=False) + [tok.eos_token_id], tok.encode(seg, add_special_tokens=False)):
        got = list(prompt_ids) + sampled + continuation_ids(tok, sampled, tool_msgs)
        assert got == list(want)


# ------------------------------------------------------------------------- invalid Unicode (issue 28, item 12)
@pytest.mark.parametrize("seg", [
    '<tool_call>{"name": "calc\\ud800", "arguments": {"expression\\udfff": "1+\\ud83d"}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1+\\udc00"}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"\\\\ud800\\"}"}</tool_call>',
    '[TOOL_CALLS] [{"name": "\\udbff", "arguments": {}}]',
])
def test_lone_surrogates_in_a_call_stay_out_of_messages(seg):
    """JSON escapes of lone surrogates decode to strings that are not valid UTF-8; they must
    not reach the tool message, env.messages(), the info or a tokenizer."""
    from marft_algos.models.tiny import build_tiny_tokenizer
    from marft_envs.tools import get_parser

    parser = "mistral" if seg.startswith("[") else "hermes"
    for c in get_parser(parser).parse(seg).calls:  # what a tool receives is valid UTF-8 too
        (c.name + json.dumps(c.arguments, ensure_ascii=False) + c.raw + (c.error or "")).encode("utf-8")
    env = _calc_env(tool_config={"parser": parser})
    env.reset(seed=0)
    env.step("think")
    env.step(seg)
    info = env.infos["actor"]
    assert info["tool_turn"] and {"unknown_tool", "bad_tool_arguments", "tool_raised"} & set(info["flags"])
    for m in env.messages("actor"):
        for v in m.values():
            v.encode("utf-8")  # before the fix: UnicodeEncodeError (surrogates not allowed)
    json.dumps(info, ensure_ascii=False).encode("utf-8")
    tok = build_tiny_tokenizer()
    tok.apply_chat_template(env.messages("actor"), tokenize=True)
    env.step("\\boxed{1}")
    assert "team_reward" in env.infos["actor"]
