"""An existing multi-agent program, as a LangGraph-style graph, trained by marft.

planner -> solver -> critic -> (critic says APPROVE: END | else back to solver, at most
twice). Each node is what the team did before marft: it calls its model. The only change
for training is that the model call is ``await team.call(role, messages)``.

Importing this module registers ``langgraph-team-v0`` (a workflow env over arith
problems), so ``marft_envs.make("team_graph:langgraph-team-v0")`` and the CLI's
``--env team_graph:langgraph-team-v0`` work with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

from minigraph import END, START, StateGraph

import marft_envs

ROLES = ["planner", "solver", "critic"]
MAX_REVISIONS = 2


def build_graph(team: Any) -> Any:
    """The team's graph; every node asks one role through ``team.call``."""

    async def plan(state: dict[str, Any]) -> dict[str, Any]:
        text = await team.call("planner", [
            {"role": "system", "content": "Write a one-line plan for solving the problem."},
            {"role": "user", "content": state["question"]}])
        return {"plan": text}

    async def solve(state: dict[str, Any]) -> dict[str, Any]:
        note = f"\nCritique of your last answer: {state['critique']}" if state.get("critique") else ""
        text = await team.call("solver", [
            {"role": "system", "content": "Follow the plan. Give the final answer inside \\boxed{}."},
            {"role": "user", "content": f"{state['question']}\nPlan: {state['plan']}{note}"}])
        return {"answer": text, "revisions": state.get("revisions", -1) + 1}

    async def critique(state: dict[str, Any]) -> dict[str, Any]:
        text = await team.call("critic", [
            {"role": "system", "content": "Check the answer. Reply APPROVE if it is right, else say what is wrong."},
            {"role": "user", "content": f"{state['question']}\nAnswer: {state['answer']}"}])
        return {"critique": text}

    def route(state: dict[str, Any]) -> str:
        if "APPROVE" in state["critique"] or state["revisions"] >= MAX_REVISIONS:
            return END
        return "solve"

    graph = StateGraph()
    graph.add_node("plan", plan)
    graph.add_node("solve", solve)
    graph.add_node("critique", critique)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "solve")
    graph.add_edge("solve", "critique")
    graph.add_conditional_edges("critique", route)
    return graph.compile()


async def program(team: Any, problem: Any) -> dict[str, float]:
    """Run the graph on one problem; the reward is the solver's last answer, graded, minus
    a small cost per revision."""
    state = await build_graph(team).ainvoke({"question": problem.question})
    return {"outcome": float(team.grade(state["answer"]).correct), "revisions": -0.05 * state["revisions"]}


if "langgraph-team-v0" not in marft_envs.registry:
    marft_envs.register(
        "langgraph-team-v0",
        "marft_envs.workflow:make_workflow_env",
        kwargs={"program": "team_graph:program", "roles": ROLES, "problems": "arith",
                "split": "train", "max_calls": 8},
        description="a LangGraph-style planner -> solver <-> critic graph on arith (example)",
    )
