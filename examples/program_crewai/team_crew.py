"""A CrewAI crew (researcher -> writer) trained by marft through the OpenAI-compatible endpoint.

Nothing here knows about marft: each agent's ``LLM`` points at the ``base_url`` it is
given, and the ``model`` is the role (CrewAI calls models through LiteLLM, where the
``openai/`` prefix means "an OpenAI-compatible server"). Examples only, not run in CI:
needs ``pip install 'marft[examples]'`` (crewai).

Train it (run from this folder)::

    export PYTHONPATH=$PWD:$PYTHONPATH
    marft train --program team_crew:program --roles researcher,writer --problems arith \
        --algo grpo --model tiny-random --steps 2 --set num_envs=2 --set group_size=2

Or serve the (trained) team and run the crew against it::

    marft serve --model smollm2-135m --roles researcher,writer --port 8000 &
    python team_crew.py http://127.0.0.1:8000/v1 "What is 12 * 7?"
"""

from __future__ import annotations

import sys
from typing import Any


def build_crew(base_url: str, question: str) -> Any:
    """The crew as a CrewAI user writes it; only ``base_url`` comes from outside."""
    from crewai import LLM, Agent, Crew, Task

    def llm(role: str) -> Any:
        return LLM(model=f"openai/{role}", base_url=base_url, api_key="unused", temperature=1.0)

    researcher = Agent(role="researcher", goal="Work out the problem step by step.",
                       backstory="A careful mathematician.", llm=llm("researcher"), allow_delegation=False)
    writer = Agent(role="writer", goal="State the final answer inside \\boxed{}.",
                   backstory="A concise editor.", llm=llm("writer"), allow_delegation=False)
    work = Task(description=f"Solve: {question}", expected_output="a worked solution", agent=researcher)
    answer = Task(description="Give the final answer of the solution inside \\boxed{}.",
                  expected_output="\\boxed{answer}", agent=writer, context=[work])
    return Crew(agents=[researcher, writer], tasks=[work, answer], verbose=False)


def program(base_url: str, problem: Any) -> str:
    """marft's program: run the crew on the problem; the final text is graded by the task."""
    return str(build_crew(base_url, problem.question).kickoff().raw)


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1"
    question = sys.argv[2] if len(sys.argv) > 2 else "What is 12 * 7?"
    print(build_crew(url, question).kickoff().raw)
