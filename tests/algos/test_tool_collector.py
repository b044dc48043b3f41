"""Today's collector with a tool-using team: a tool continuation is one more transition of
the same agent, and the next prompt carries the tool result (see docs/tools.md, "Contract
for trainers", for what a collector still has to do to keep ids exact across segments)."""

from __future__ import annotations

import pytest
from helpers.scripted import CalculatorCaller

import marft_envs
from marft_algos.rollout import RolloutCollector

models = pytest.importorskip("marft_algos.models")


def test_tool_continuation_is_another_transition_of_the_same_agent():
    # the actor calls the calculator, then answers with its result
    col = RolloutCollector(lambda: marft_envs.make("arith-calc-duo-v0"), CalculatorCaller(), num_envs=4, group_size=2, seed=0)
    batch = col.collect()
    for ep in batch.episodes:
        agents = [t.agent for t in ep.transitions]
        assert agents == ["reasoner", "actor", "actor"]
        call, answer = ep.transitions[1], ep.transitions[2]
        assert call.info["tool_turn"] and call.info["tool_messages"][0]["role"] == "tool"
        assert "<tool>" in "".join(chr(i) for i in answer.prompt_ids)  # the result is in the next prompt
        assert ep.correct and answer.team_reward == 1.0
