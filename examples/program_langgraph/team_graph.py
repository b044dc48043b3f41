"""A real LangGraph team (planner, then solver and verifier in parallel, then the planner
decides), written as anyone writes one: ``ChatOpenAI`` nodes pointed at a ``base_url``.

marft trains it unmodified (``docs/programs.md``): ``program(base_url, problem)`` builds
the graph against the episode's ``base_url`` and returns the final answer, which the
task's grader grades. The same graph runs against ``marft serve`` (or any
OpenAI-compatible server) for evaluation and deployment::

    marft serve --model smollm2-135m --roles planner,solver,verifier --port 8000
    python team_graph.py http://127.0.0.1:8000/v1 "What is 12 * 7?"
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

ROLES = ["planner", "solver", "verifier"]


class State(TypedDict, total=False):
    """What the nodes read and write."""

    question: str
    plan: str
    solution: str
    estimate: str
    answer: str


def build_graph(base_url: str, *, api_key: str = "unused", streaming: bool = False) -> Any:
    """The compiled graph; every node is one chat call of its role (``model`` = role)."""

    def llm(role: str) -> ChatOpenAI:
        return ChatOpenAI(model=role, base_url=base_url, api_key=api_key, max_retries=0, timeout=600, streaming=streaming)

    async def plan(s: State) -> State:
        reply = await llm("planner").ainvoke(f"Write a one-line plan to solve: {s['question']}")
        return {"plan": reply.content}

    async def solve(s: State) -> State:
        reply = await llm("solver").ainvoke(
            f"{s['question']}\nPlan: {s['plan']}\nSolve it. Give the final answer inside \\boxed{{}}.")
        return {"solution": reply.content}

    async def estimate(s: State) -> State:  # runs in parallel with solve
        reply = await llm("verifier").ainvoke(f"{s['question']}\nEstimate the answer quickly, inside \\boxed{{}}.")
        return {"estimate": reply.content}

    async def decide(s: State) -> State:
        reply = await llm("planner").ainvoke(
            f"{s['question']}\nSolution: {s['solution']}\nEstimate: {s['estimate']}\n"
            "Give the final answer inside \\boxed{}.")
        return {"answer": reply.content}

    g = StateGraph(State)
    for name, fn in [("plan", plan), ("solve", solve), ("estimate", estimate), ("decide", decide)]:
        g.add_node(name, fn)
    g.add_edge(START, "plan")
    g.add_edge("plan", "solve")
    g.add_edge("plan", "estimate")  # the fan-out: solve and estimate run at once
    g.add_edge(["solve", "estimate"], "decide")  # the join
    g.add_edge("decide", END)
    return g.compile()


async def program(base_url: str, problem: Any) -> str:
    """marft's entry point: run the graph on the problem, return the final answer (graded)."""
    out = await build_graph(base_url).ainvoke({"question": problem.question})
    return out["answer"]


if __name__ == "__main__":
    url, question = sys.argv[1], sys.argv[2]
    print(asyncio.run(build_graph(url).ainvoke({"question": question}))["answer"])
