"""A real LangGraph graph (``examples/program_langgraph``) through ``langchain-openai``.

The graph's ``ChatOpenAI`` nodes, with a parallel fan-out (solver and verifier after the
planner, joined by the planner), run (1) against ``TeamServer`` on the tiny model, with
``ainvoke`` and with streaming, and (2) as a program env trained for 2 GRPO steps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers.restricted import TWO_TOKEN_PROBLEMS as PROBLEMS
from helpers.restricted import TWO_TOKENS as ALLOWED
from helpers.restricted import two_token_policy
from helpers.training import grpo_two_steps

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from marft_algos.serve import TeamServer  # noqa: E402
from marft_envs.program_env import ProgramEnv  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "program_langgraph"


@pytest.fixture
def team_graph(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import team_graph

    return team_graph


def test_the_graph_runs_against_the_endpoint_and_its_fan_out_is_one_engine_batch(team_graph) -> None:
    policy = two_token_policy(team_graph.ROLES, max_context=1024)
    calls: list = []
    with TeamServer(policy, window_s=2.0, role_defaults={r: {"max_new_tokens": 1} for r in team_graph.ROLES},
                    record=lambda *a: calls.append(a)) as srv:
        async def both() -> tuple[dict, dict]:  # one loop: langchain-openai caches its async client per process
            plain = await team_graph.build_graph(srv.url + "/v1").ainvoke({"question": "What is 1 + 1?"})
            streamed = await team_graph.build_graph(srv.url + "/v1", streaming=True).ainvoke({"question": "What is 0 + 1?"})
            return plain, streamed

        out, streamed = asyncio.run(both())
        assert out["answer"] in ALLOWED and out["solution"] in ALLOWED and out["estimate"] in ALLOWED
        assert [c[1].role for c in calls][0] == "planner" and [c[1].role for c in calls][-1] == "planner"
        assert sorted(c[1].role for c in calls[1:3]) == ["solver", "verifier"]
        assert srv.batcher.stats["largest_batch"] == 2  # solver and verifier generated together
        assert streamed["answer"] in ALLOWED and len(calls) == 8


def test_grpo_trains_every_role_of_the_langgraph_program_for_two_steps(team_graph) -> None:
    roles = team_graph.ROLES
    env_fn = lambda: ProgramEnv(team_graph.program, roles, PROBLEMS, program_timeout_s=300)  # noqa: E731
    _, history, changed = grpo_two_steps("marft_envs.program_env:program-v0", env_fn, roles, num_envs=4, max_context=1024)
    assert len(history) == 2
    assert changed == dict.fromkeys(roles, True)
    assert 0.0 < max(h["team/reward"] for h in history) < 1.0  # graded answers, a real signal


def test_consecutive_episodes_of_an_async_langgraph_program_end_cleanly(team_graph) -> None:
    """Episodes one after another on one env, each a full graph run with no flag or error."""
    env = ProgramEnv(team_graph.program, team_graph.ROLES, PROBLEMS)
    for seed in range(3):
        env.reset(seed=seed)
        while env.agents:
            agent = env.agent_selection
            done = env.terminations[agent] or env.truncations[agent]
            if done:
                assert env.infos[agent]["flags"] == [] and env.infos[agent]["error"] is None, env.infos[agent]["error"]
            env.step(None if done else "1")
