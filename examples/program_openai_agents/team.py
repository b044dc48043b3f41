"""An OpenAI Agents SDK team (a solver hands its draft to a checker), trained by marft as is.

The SDK talks to any OpenAI-compatible server through the chat-completions model class;
``model`` is the role. ``program(base_url, problem)`` is marft's entry point
(``docs/programs.md``)::

    marft train --program team:program --roles solver,checker --problems arith --model smollm2-135m ...
    marft serve --model smollm2-135m --roles solver,checker --port 8000 &
    python team.py http://127.0.0.1:8000/v1 "What is 12 * 7?"

Needs ``pip install openai-agents`` (marft's ``examples`` extra). Not run in CI.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK's tracing uploads to OpenAI; marft records the calls itself


def build_team(base_url: str, api_key: str = "unused") -> tuple[Agent, Agent]:
    """The two agents, each one role of the team on the endpoint."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    solver = Agent(name="solver", instructions="Solve the problem. Give the final answer inside \\boxed{}.",
                   model=OpenAIChatCompletionsModel(model="solver", openai_client=client))
    checker = Agent(name="checker", instructions="Check the solution and give the final answer inside \\boxed{}.",
                    model=OpenAIChatCompletionsModel(model="checker", openai_client=client))
    return solver, checker


async def program(base_url: str, problem: Any) -> str:
    """Solver, then checker; the checker's final output is the answer the task grades."""
    solver, checker = build_team(base_url)
    draft = await Runner.run(solver, problem.question, max_turns=2)
    review = await Runner.run(checker, f"{problem.question}\nSolution: {draft.final_output}", max_turns=2)
    return str(review.final_output)


if __name__ == "__main__":
    url, question = sys.argv[1], sys.argv[2]

    class _Problem:
        pass

    p = _Problem()
    p.question = question
    print(asyncio.run(program(url, p)))
