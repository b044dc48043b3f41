"""End to end on the tiny model: GRPO trains the roles of a workflow program and of the MALT team.

The tiny random model speaks bytes; like ``helpers.tiny_echo`` it gets a frozen output
prior (a head bias) that leaves only the tokens ``1`` and ``2`` possible, and the problems
are ones whose answer is ``1`` or ``2`` (and the two tokens' head rows are close): a one-token
reply is right about half the time,
so GRPO groups have reward variance and every role's adapter gets a gradient.
"""

from __future__ import annotations

import pytest
from helpers.restricted import TWO_TOKEN_PROBLEMS as PROBLEMS
from helpers.scripted import CharPolicy
from helpers.training import grpo_two_steps as train

import marft_envs
from marft_envs.workflow import ProblemList

pytest.importorskip("marft_algos.models")
from marft_algos.rollout import RolloutCollector  # noqa: E402


def test_grpo_trains_every_role_of_the_workflow_example():
    roles = ["solver", "checker"]
    trainer, history, changed = train(
        "workflow-example-v0", lambda: marft_envs.make("workflow-example-v0", problems=PROBLEMS), roles)
    assert trainer.agents == roles and len(history) == 2
    assert changed == {"solver": True, "checker": True}
    assert 0.0 < max(h["team/reward"] for h in history) < 1.0  # a real signal, not a saturated one


def test_grpo_trains_every_role_of_the_malt_team():
    roles = ["generator", "verifier", "refiner"]
    trainer, history, changed = train(
        "arith-malt-v0", lambda: marft_envs.make("arith-malt-v0", task=ProblemList(PROBLEMS)), roles)
    assert trainer.agents == roles
    assert changed == dict.fromkeys(roles, True)
    assert 0.0 < max(h["team/reward"] for h in history) < 1.0


class Scripted(CharPolicy):
    """The solver says 1, the checker repeats the problem's answer."""

    def say(self, role, prompt):
        if role == "solver":
            return "1"
        return "2" if "1 + 1" in prompt or "4 - 2" in prompt else "1"


def test_the_collector_sees_each_call_as_a_transition_with_its_exact_messages():
    env_fn = lambda: marft_envs.make("workflow-example-v0", problems=PROBLEMS)  # noqa: E731
    batch = RolloutCollector(env_fn, Scripted(), num_envs=4, group_size=2, seed=0).collect()
    for ep in batch.episodes:
        assert [t.agent for t in ep.transitions] == ["solver", "checker"]
        solver, checker = ep.transitions
        problem = next(p for p in PROBLEMS if p.id == ep.problem_id)
        assert solver.prompt_ids == Scripted().encode("solver", [
            {"role": "system", "content": marft_envs.workflow._SOLVE}, {"role": "user", "content": problem.question}])
        assert "Solution: 1" in "".join(chr(i) for i in checker.prompt_ids)
        assert ep.correct and solver.team_reward == checker.team_reward == 1.0  # the reward reaches every call
        assert checker.info["call_order"] == ["solver", "checker"]
