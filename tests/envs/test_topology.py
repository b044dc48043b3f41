"""Topologies (the dependency function D), profiles and teams."""

from __future__ import annotations

import json
import pickle

import pytest
from helpers.timing import MARGIN

from marft_envs import (
    DAG,
    AgentProfile,
    Chain,
    Independent,
    MultiHopRouted,
    Routed,
    Team,
    TopologyError,
)
from marft_envs.profiles import builtin_teams
from marft_envs.topology import topology_from_dict


def run_turn(topology, actions=None):
    """Drive next_agent to the end of a turn; returns the executed pairs."""
    actions = actions or {}
    executed = []
    while (agent := topology.next_agent(executed)) is not None:
        executed.append((agent, actions.get(agent, f"{agent} says hi")))
        assert len(executed) <= len(topology.agents)
    return executed


def test_chain_is_reference_order_and_full_visibility():
    chain = Chain(["planner", "reasoner", "actor"])
    assert [a for a, _ in run_turn(chain)] == ["planner", "reasoner", "actor"]
    assert chain.dependency("reasoner", "actor") and chain.dependency("planner", "actor")
    assert not chain.dependency("actor", "reasoner")
    assert chain.parents("actor") == ["planner", "reasoner"]
    assert chain.graph() == {"planner": ["reasoner", "actor"], "reasoner": ["actor"], "actor": []}
    assert chain.topological_order() == ["planner", "reasoner", "actor"]
    # full=False: each agent sees only its predecessor
    short = Chain(["planner", "reasoner", "actor"], full=False)
    assert short.parents("actor") == ["reasoner"] and not short.dependency("planner", "actor")


def test_dag_parallel_branches():
    dag = DAG({"solver_a": [], "solver_b": [], "aggregator": ["solver_a", "solver_b"]})
    executed = run_turn(dag)
    assert [a for a, _ in executed] == ["solver_a", "solver_b", "aggregator"]
    # parallel branches do not see each other
    assert not dag.dependency("solver_a", "solver_b") and not dag.dependency("solver_b", "solver_a")
    assert dag.parents("solver_b", executed[:1]) == []
    assert dag.parents("aggregator", executed[:2]) == ["solver_a", "solver_b"]
    assert dag.graph() == {"solver_a": ["aggregator"], "solver_b": ["aggregator"], "aggregator": []}


def test_dag_order_is_topological_not_declaration_order():
    dag = DAG({"actor": ["reasoner"], "reasoner": []})
    assert dag.topological_order() == ["reasoner", "actor"]
    assert dag.next_agent([]) == "reasoner"


def test_independent_is_dec_pomdp():
    ind = Independent(["a", "b", "c"])
    assert [a for a, _ in run_turn(ind)] == ["a", "b", "c"]
    assert all(not ind.dependency(x, y) for x in "abc" for y in "abc")
    assert ind.parents("c", run_turn(ind)) == []
    assert ind.graph() == {"a": [], "b": [], "c": []}


@pytest.mark.parametrize(
    "parents, match",
    [
        ({"a": ["c"], "b": ["a"], "c": ["b"]}, "cycle: .*a.*b.*c"),
        ({"a": ["a"]}, "itself"),
        ({"a": ["ghost"]}, "unknown agent 'ghost'"),
        ({}, "at least one agent"),
    ],
)
def test_invalid_dags_are_rejected(parents, match):
    with pytest.raises(TopologyError, match=match):
        DAG(parents)


def test_duplicate_names_rejected():
    with pytest.raises(TopologyError, match="duplicate"):
        Chain(["a", "a"])
    with pytest.raises(TopologyError, match="duplicate"):
        Routed("o", ["x", "o"])


ROUTED = Routed("orchestrator", ["algebra", "number_theory", "geometry"], finisher="checker")


@pytest.mark.parametrize(
    "text, target, status",
    [
        ("ROUTE: algebra", "algebra", "ok"),
        ("route: Number Theory.", "number_theory", "ok"),
        ("**Route**: `geometry`", "geometry", "ok"),
        ("I think this is counting.\nROUTE: number_theory", "number_theory", "ok"),
        ("route to Geometry please", "geometry", "ok"),
        ("ROUTE: algebra\n...actually ROUTE: geometry", "geometry", "ok"),  # the last route wins
        ("ROUTE: algebr", "algebra", "ok"),  # close spelling
        ("this is a geometry problem", "geometry", "mention"),
        ("no idea", "algebra", "unparsed"),
        ("ROUTE: chemistry", "algebra", "unparsed"),
        ("algebra or geometry?", "algebra", "unparsed"),  # ambiguous mention
        ("", "algebra", "unparsed"),
    ],
)
def test_routed_parsing(text, target, status):
    decision = ROUTED.route(text)
    assert (decision.target, decision.status) == (target, status)


@pytest.mark.parametrize(
    "text, target, flags",
    [
        ("ROUTE: geometry", "geometry", []),
        ("ROUTE: nonsense. Draw the triangle: geometry it is.", "geometry",
         ["route_unparsed", "route_by_mention"]),  # unreadable route line, mention decided
        ("this is a geometry problem", "geometry", ["route_by_mention"]),  # no route line
        ("ROUTE: chemistry", "algebra", ["route_unparsed"]),
        ("no idea", "algebra", ["route_unparsed"]),
    ],
)
def test_routed_fallbacks_are_flagged(text, target, flags):
    decision = ROUTED.route(text)
    assert decision.target == target and decision.flags == flags
    executed = run_turn(ROUTED, {"orchestrator": text})
    assert executed[1][0] == target and ROUTED.step_flags(executed[:1]) == flags


def test_routed_turn_and_dependencies():
    executed = run_turn(ROUTED, {"orchestrator": "ROUTE: geometry"})
    assert [a for a, _ in executed] == ["orchestrator", "geometry", "checker"]
    assert ROUTED.parents("geometry", executed) == ["orchestrator"]
    assert ROUTED.parents("checker", executed) == ["orchestrator", "geometry"]
    assert ROUTED.dependency("orchestrator", "algebra") and not ROUTED.dependency("algebra", "geometry")
    assert ROUTED.dependency("algebra", "checker") and not ROUTED.dependency("checker", "orchestrator")
    assert ROUTED.graph()["orchestrator"] == ["algebra", "number_theory", "geometry", "checker"]
    assert ROUTED.step_flags(executed[:1]) == []
    assert not ROUTED.is_static


def test_routed_unparsed_falls_back_to_default_and_flags():
    routed = Routed("o", ["a", "b"], default="b")
    executed = run_turn(routed, {"o": "???"})
    assert [a for a, _ in executed] == ["o", "b"]
    assert routed.step_flags(executed[:1]) == ["route_unparsed"]
    with pytest.raises(TopologyError):
        Routed("o", ["a"], default="zzz")


def test_routed_parsing_is_linear_on_adversarial_text():
    import time

    for text in ["route" + " " * 20_000, "ROUTE: " * 5000, "route to " * 3000, "(" * 20_000]:
        start = time.monotonic()
        ROUTED.route(text)
        assert time.monotonic() - start < MARGIN  # milliseconds when linear, minutes if quadratic


@pytest.mark.parametrize("topology", [Chain(["a", "b"]), Independent(["a", "b"]), DAG({"a": [], "b": ["a"]}), ROUTED])
def test_to_dict_round_trip_and_pickle(topology):
    d = topology.to_dict()
    json.dumps(d)
    assert topology_from_dict(d) == topology
    assert pickle.loads(pickle.dumps(topology)) == topology


def test_unknown_agent_in_queries():
    with pytest.raises(KeyError):
        Chain(["a", "b"]).dependency("a", "zzz")


# ----------------------------------------------------------------- profiles and teams
def test_builtin_teams():
    assert {"solo", "duo", "trio", "routed", "echo"} <= set(builtin_teams())
    duo = Team.load("duo")
    assert isinstance(duo.topology, Chain) and duo.agents == ["reasoner", "actor"]
    assert duo.answer_agents == ["actor"]
    trio = Team.load("trio")
    assert isinstance(trio.topology, DAG) and trio.topology.parents("aggregator") == ["solver_a", "solver_b"]
    routed = Team.load("routed")
    assert isinstance(routed.topology, Routed) and routed.topology.default == "algebra"
    for name in ("solo", "duo", "trio", "routed"):
        for p in Team.load(name).profiles.values():
            if p.with_answer:
                assert "\\boxed{}" in p.prompt


def test_reference_json_format_gives_chain(tmp_path):
    ref = [
        {"role": "reasoner", "prompt": "think", "with_answer": False},
        {"role": "actor", "prompt": "answer", "with_answer": True},
    ]
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(ref))
    team = Team.load(str(path))
    assert team.name == "ref" and team.topology == Chain(["reasoner", "actor"])
    assert Team.load(ref).topology == team.topology


def test_depends_on_gives_dag_and_extra_fields():
    team = Team.from_profiles(
        [
            {"role": "a", "prompt": "", "sampling": {"temperature": 0.7}, "adapter": "lora_a"},
            {"role": "b", "prompt": "", "depends_on": []},
            {"role": "c", "prompt": "", "with_answer": True, "depends_on": ["a", "b"], "model": "smollm2-135m"},
        ]
    )
    assert isinstance(team.topology, DAG) and team.topology.parents("c") == ["a", "b"]
    assert team.profiles["a"].sampling == {"temperature": 0.7} and team.profiles["a"].adapter == "lora_a"
    assert team.profiles["c"].model == "smollm2-135m"
    assert Team.load(team.to_dict()).to_dict() == team.to_dict()


def test_profile_validation():
    with pytest.raises(ValueError, match="unknown profile keys"):
        AgentProfile.from_dict({"role": "a", "prompt": "", "with_answers": True})
    with pytest.raises(ValueError, match="unknown sampling keys"):
        AgentProfile("a", "", sampling={"temprature": 1.0})
    with pytest.raises(ValueError, match="with_answer"):
        Team.from_profiles([{"role": "a", "prompt": ""}])
    with pytest.raises(ValueError, match="unknown built-in team"):
        Team.load("quartet")
    with pytest.raises(TopologyError, match="differ"):
        Team.from_profiles([{"role": "a", "prompt": "", "with_answer": True}], Chain(["a", "b"]))


BAD_PROFILE_FIELDS = [
    ({"with_answer": "false"}, "field 'with_answer' must be true or false"),
    ({"with_answer": 1}, "field 'with_answer' must be true or false"),
    ({"sampling": {"max_new_tokens": 0}}, "field 'sampling'.max_new_tokens must be an integer >= 1"),
    ({"sampling": {"max_new_tokens": 12.5}}, "max_new_tokens must be an integer >= 1"),
    ({"sampling": {"max_new_tokens": True}}, "max_new_tokens must be an integer >= 1"),
    ({"eval_sampling": {"temperature": "0.7"}}, "field 'eval_sampling'.temperature must be a number >= 0"),
    ({"sampling": {"temperature": -1}}, "temperature must be a number >= 0"),
    ({"sampling": {"temperature": float("nan")}}, "temperature must be a number >= 0"),
    ({"sampling": {"top_p": 0}}, "top_p must be a number in \\(0, 1\\]"),
    ({"sampling": {"top_p": 1.5}}, "top_p must be a number in \\(0, 1\\]"),
    ({"sampling": {"stop": ["ok", 3]}}, "stop must be a string or a list of strings"),
    ({"sampling": ["temperature", 1]}, "field 'sampling' must be an object"),
    ({"depends_on": [1]}, "field 'depends_on' must be a role name"),
    ({"model": 3}, "field 'model' must be a non-empty string"),
    ({"prompt": None}, "field 'prompt' must be a string"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_PROFILE_FIELDS)
def test_profile_file_with_bad_field_names_file_agent_and_field(tmp_path, fields, message):
    import json

    profiles = [{"role": "reasoner", "prompt": "think"},
                {"role": "actor", "prompt": "answer", "with_answer": True, **fields}]
    path = tmp_path / "team.json"
    path.write_text(json.dumps(profiles), encoding="utf-8")
    with pytest.raises(ValueError, match=message) as err:
        Team.load(str(path))
    assert str(err.value).startswith(f"{path}: agent 'actor': ")


def test_good_sampling_values_are_kept():
    p = AgentProfile("a", "", sampling={"temperature": 0, "top_p": 1, "max_new_tokens": 1, "stop": "\n"},
                     eval_sampling={"stop": ["a", "b"], "temperature": 0.5})
    assert p.sampling["max_new_tokens"] == 1 and p.eval_sampling["stop"] == ["a", "b"]


def test_profile_file_that_is_not_json_names_file_and_line(tmp_path):
    path = tmp_path / "team.json"
    path.write_text('[\n  {"role": "a", "prompt": ""},\n  oops\n]', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}:3: not valid JSON"):
        Team.load(str(path))
    path.write_bytes(b'[{"role": "a", "prompt": "caf\xe9"}]')
    with pytest.raises(ValueError, match=rf"{path}: not UTF-8"):
        Team.load(str(path))


# ------------------------------------------------------------ multi-hop routing
HOPS = MultiHopRouted("planner", ["solver", "checker"], max_hops=3)


def run_hops(topology, replies):
    """Drive next_agent with the orchestrator's replies in order (specialists say "work")."""
    replies, executed = iter(replies), []
    while (agent := topology.next_agent(executed)) is not None:
        executed.append((agent, next(replies) if agent == topology.orchestrator else f"{agent} work"))
        assert len(executed) <= topology.max_actions_per_turn
    return executed


@pytest.mark.parametrize(
    "text, target, flags",
    [
        ("ROUTE: solver", "solver", []),
        ("**Route to:** Checker.", "checker", []),
        ("ROUTE: checker\nthen ROUTE: solver", "solver", []),  # the last route line wins
        ("ROUTE: done \\boxed{4}", "done", []),
        ("The answer is \\boxed{4}", "done", []),  # no route line: the reply is the answer
        ("the solver says 4", "done", []),  # a mention never routes here
        ("ROUTE: chemistry", "done", ["route_unparsed"]),
        ("", "done", []),
    ],
)
def test_multihop_decisions(text, target, flags):
    assert HOPS.decide(text) == (target, flags)


def test_multihop_control_returns_to_the_orchestrator_until_it_finishes():
    executed = run_hops(HOPS, ["ROUTE: solver", "ROUTE: checker", "ROUTE: done \\boxed{1}"])
    assert [a for a, _ in executed] == ["planner", "solver", "planner", "checker", "planner"]
    info = HOPS.turn_info(executed)
    assert info == {"routes": ["solver", "checker", "done"], "hops": 2,
                    "route_counts": {"solver": 1, "checker": 1}, "handoff_loops": 0}
    # D per hop: the checker sees everything before it, the planner sees the whole turn
    assert HOPS.parents("checker", executed[:3]) == ["planner", "solver"]
    assert HOPS.visible_actions("planner", executed[:4]) == executed[:4]
    assert HOPS.view_note("planner", executed[:4]) == "Routing hops left: 1."
    assert HOPS.view_note("solver", executed[:1]) is None


def test_multihop_budget_ends_the_turn_and_flags_a_late_route():
    executed = run_hops(HOPS, ["ROUTE: solver"] * 4)
    assert [a for a, _ in executed] == ["planner", "solver"] * 3 + ["planner"]
    assert len(executed) == HOPS.max_actions_per_turn == 7
    assert HOPS.step_flags(executed) == ["hop_budget_exhausted"]
    assert HOPS.view_note("planner", executed[:6]).startswith("No routing hops are left")
    info = HOPS.turn_info(executed)
    # planner<->solver passed back and forth 6 times: hand-offs 3..6 are loops
    assert info["routes"] == ["solver", "solver", "solver", "done"] and info["handoff_loops"] == 4
    assert info["route_counts"] == {"solver": 3, "checker": 0}


def test_multihop_unparsed_route_ends_the_turn_flagged():
    executed = run_hops(HOPS, ["ROUTE: solver", "ROUTE: physics"])
    assert [a for a, _ in executed] == ["planner", "solver", "planner"]
    assert HOPS.step_flags(executed) == ["route_unparsed"]
    assert HOPS.step_flags(executed[:2]) == []  # a specialist's action raises no route flag


def test_multihop_validation_and_round_trip():
    with pytest.raises(TopologyError, match="max_hops"):
        MultiHopRouted("o", ["a"], max_hops=0)
    with pytest.raises(TopologyError, match="finish words"):
        MultiHopRouted("o", ["done"])
    with pytest.raises(TopologyError, match="at least one specialist"):
        MultiHopRouted("o", [])
    d = HOPS.to_dict()
    assert d == {"type": "multihop", "orchestrator": "planner", "specialists": ["solver", "checker"], "max_hops": 3}
    assert topology_from_dict(json.loads(json.dumps(d))) == HOPS
    assert pickle.loads(pickle.dumps(HOPS)) == HOPS
    assert HOPS.repeats and not HOPS.is_static
    assert HOPS.graph() == {"planner": ["solver", "checker"], "solver": ["planner", "checker"],
                           "checker": ["planner", "solver"]}
    # the one-hop topologies keep their defaults
    assert not ROUTED.repeats and ROUTED.max_actions_per_turn == len(ROUTED.agents)
    assert ROUTED.turn_info([("orchestrator", "ROUTE: algebra")]) == {}


def test_scripted_route_lines_follow_a_custom_route_pattern():
    assert ROUTED.route_line("algebra") == "ROUTE: algebra" and HOPS.route_line("done") == "ROUTE: done"
    pattern = r"next\s*->\s*(\w+)"
    for topology in (Routed("o", ["a", "b"], route_pattern=pattern), MultiHopRouted("o", ["a", "b"], route_pattern=pattern)):
        with pytest.raises(TopologyError, match="pass a route_format your pattern reads"):
            topology.route_line("b")  # "ROUTE: b" is not a route under this pattern
    routed = Routed("o", ["a", "b"], route_pattern=pattern, route_format="NEXT -> {}")
    hops = MultiHopRouted("o", ["a", "b"], route_pattern=pattern, route_format="NEXT -> {}")
    assert routed.route_line("b") == "NEXT -> b" and routed.route("NEXT -> b").target == "b"
    assert hops.route_line("b") == "NEXT -> b" and hops.route_line("done") == "NEXT -> done"
    for topology in (routed, hops):
        d = json.loads(json.dumps(topology.to_dict()))
        assert d["route_format"] == "NEXT -> {}" and topology_from_dict(d) == topology
    assert "route_format" not in ROUTED.to_dict()
    for bad in ("ROUTE", "ROUTE {} {}", "ROUTE {x}: {}", "ROUTE: {"):
        with pytest.raises(TopologyError, match="one '{}'"):
            Routed("o", ["a"], route_format=bad)
    assert Routed("o", ["a"], route_format="{{route}}: {}").route_format == "{{route}}: {}"


def test_seed_team_profiles():
    malt, rema, planner = Team.load("malt"), Team.load("rema"), Team.load("planner")
    assert malt.topology == Chain(["generator", "verifier", "refiner"]) and malt.answer_agents == ["refiner"]
    assert rema.topology == Chain(["meta_thinker", "reasoner"], shared_history=True) and rema.answer_agents == ["reasoner"]
    assert isinstance(planner.topology, MultiHopRouted) and planner.answer_agents == ["planner"]
    for team in (malt, rema, planner):
        for p in team.profiles.values():
            assert ("\\boxed{}" in p.prompt) == (p.with_answer or p.role in ("generator", "solver"))


def test_shared_history_chain_round_trips_and_shows_earlier_turns():
    chain = Chain(["m", "r"], shared_history=True)
    assert topology_from_dict(chain.to_dict()) == chain != Chain(["m", "r"])
    past = [("m", "plan"), ("r", "answer")]
    assert chain.visible_history("m", past) == past
    assert Chain(["m", "r"]).visible_history("m", past) == [("m", "plan")]  # default: own + parents
    assert Chain(["m", "r"]).to_dict() == {"type": "chain", "agents": ["m", "r"], "full": True}
