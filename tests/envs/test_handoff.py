"""Pluggable hand-offs per team edge (PACT, issue 30 item 3): what the next agent sees of a
teammate's action is the full text (default), its final answer, a claims record or a user
function, and the collector records exactly that prompt."""

from __future__ import annotations

import pickle

import pytest
from helpers.scripted import CharPolicy
from hypothesis import given
from hypothesis import strategies as st

import marft_envs
from marft_envs.handoff import Handoff, claims_record, final_answer

REASONING = ("First I look at the two numbers. The tens digits differ, so I subtract them first. "
             "Then the ones. Then I combine both parts carefully. 47 - 18 = 29. The answer is 29.")


def upper_record(text: str, *, source: str, target: str, problem) -> str:
    """A user hand-off (module level: picklable)."""
    return f"{source}->{target} on {problem.id}: {final_answer(text)}"


class Talker(CharPolicy):
    """The reasoner writes a long explanation; the actor answers."""

    eos = True

    @staticmethod
    def say(role, prompt):
        return REASONING if role == "reasoner" else "\\boxed{29}"


def _actor_user(env) -> str:
    return env.messages("actor")[1]["content"]


def test_default_is_the_full_text_as_before():
    env = marft_envs.make("arith-duo-v0")
    env.reset(seed=0)
    env.step(REASONING)
    assert f"[reasoner]: {REASONING}" in _actor_user(env)
    assert Handoff().is_full


@pytest.mark.parametrize("spec, shown", [
    ("answer", "29."),
    ("record", claims_record(REASONING)),
    ({"reasoner->actor": "answer"}, "29."),
    ({"reasoner": "answer", "*": "full"}, "29."),
    ("tests.envs.test_handoff:upper_record", None),
    (upper_record, None),
])
def test_the_actor_sees_the_compact_message(spec, shown):
    env = marft_envs.make("arith-duo-v0", handoff=spec)
    env.reset(seed=0)
    env.step(REASONING)
    user = _actor_user(env)
    if shown is None:
        shown = f"reasoner->actor on {env.problem.id}: 29."
    assert f"[reasoner]: {shown}\n" in user
    assert REASONING not in user and REASONING not in env.observe("actor")["prompt"]


def test_only_views_change_grading_and_routing_read_the_text_as_written():
    env = marft_envs.make("arith-duo-v0", handoff="answer")
    env.reset(seed=0)
    answer = env.problem.answer
    env.step(f"Long text with \\boxed{{{answer}}} inside")
    env.step(f"The answer: \\boxed{{{answer}}} and more words after it")
    assert env.rewards["actor"] == 1.0
    assert env.executed == [] or env.executed[-1][1].startswith("The answer")


def test_an_edge_for_another_target_leaves_this_one_full_and_bad_keys_raise():
    env = marft_envs.make("arith-trio-v0", handoff={"solver_a->solver_b": "answer"})  # solvers don't see each other
    env.reset(seed=0)
    env.step(REASONING)
    env.step("other text")
    assert REASONING in env.messages("aggregator")[1]["content"]
    with pytest.raises(ValueError, match="agents of the team"):
        marft_envs.make("arith-duo-v0", handoff={"writer->actor": "answer"})
    with pytest.raises(ValueError, match="unknown hand-off"):
        marft_envs.make("arith-duo-v0", handoff="summary")
    with pytest.raises(TypeError, match="a hand-off is"):
        marft_envs.make("arith-duo-v0", handoff=3)


def test_a_failing_user_function_shows_the_full_text_never_crashes():
    def boom(text, **kw):
        raise RuntimeError("bug")

    env = marft_envs.make("arith-duo-v0", handoff={"*": boom})
    env.reset(seed=0)
    env.step(REASONING)
    assert REASONING in _actor_user(env)
    env = marft_envs.make("arith-duo-v0", handoff=lambda text, **kw: None)
    env.reset(seed=0)
    env.step(REASONING)
    assert REASONING in _actor_user(env)


def test_own_actions_and_history_use_the_same_rule():
    env = marft_envs.make("arith-duo-v0", horizon=2, handoff="answer")
    env.reset(seed=0)
    env.step(REASONING)
    env.step("I think it is 3. Some more words.")  # wrong (problem 5 - 39): a second turn
    assert env.turn == 1
    assert REASONING in env.messages("reasoner")[1]["content"]  # its own earlier action: in full
    env.step("short")
    user = _actor_user(env)
    assert "Turn 1:\n[reasoner]: 29.\n" in user and REASONING not in user  # history: compact too
    assert "[actor]: I think it is 3. Some more words." in user  # the actor's own action: in full


def test_env_with_a_named_handoff_pickles_and_copies():
    env = marft_envs.make("arith-duo-v0", handoff={"reasoner->actor": "record"})
    env.reset(seed=0)
    env.step(REASONING)
    clone = pickle.loads(pickle.dumps(env))
    assert _actor_user(clone) == _actor_user(env)


def test_recorded_prompt_is_the_compact_message_and_tokens_drop():
    from marft_algos.rollout import RolloutCollector

    def run(handoff):
        col = RolloutCollector(lambda: marft_envs.make("arith-duo-v0", handoff=handoff), Talker(), num_envs=2, seed=0)
        return col.collect()

    full, compact = run("full"), run("answer")
    for ep in compact.episodes:
        actor = [t for t in ep.transitions if t.agent == "actor"][0]
        seen = actor.extras["prompt"][1]["content"]
        assert "[reasoner]: 29.\n" in seen and REASONING not in seen
        # the ids trained on are those of the compact message
        assert "".join(chr(i) for i in actor.prompt_ids) == "\n".join(f"<{m['role']}>{m['content']}" for m in actor.extras["prompt"])

    def prompt_tokens(batch):
        return sum(len(t.prompt_ids) for ep in batch.episodes for t in ep.transitions)

    assert prompt_tokens(compact) < prompt_tokens(full) - 2 * (len(REASONING) - 10)


@pytest.mark.parametrize(("text", "answer"), [
    # a one-line ramble goes on after its answer: the answer is the rest of that sentence only
    ("So the answer is 29. Let me double check: 29 + 18 = 47. Yes, that is correct.", "29."),
    ("The answer is 3.5 dollars. Done", "3.5 dollars."),  # a decimal point ends no sentence
    ("Answer: -34", "-34"),
    ("I think 12. Then the answer: 7! Then more", "7!"),
    ("no marker here. Last words", "Last words"),
    ("x \\boxed{5} and the answer is 6.", "\\boxed{5}"),
])
def test_final_answer_stops_at_the_end_of_the_answers_sentence(text, answer):
    assert final_answer(text) == answer


@given(st.text(max_size=300))
def test_final_answer_is_never_longer_than_the_text(text):
    assert len(final_answer(text)) <= len(text)


def test_the_record_passes_off_no_last_sentence_as_an_answer():
    """A reply cut off before its answer: the claims, and ``Answer: (none)`` (the 'answer' view still shows the last sentence)."""
    cut = "First 65 + 13 = 78. We can do this by adding 65 and 13, which gives us"
    assert claims_record(cut) == "Claims:\n- First 65 + 13 = 78.\n- We can do this by adding 65 and 13, which gives us\nAnswer: (none)"
    assert final_answer(cut) == "We can do this by adding 65 and 13, which gives us"
    assert claims_record("So the answer is 29. Then 29 + 18 = 47.") == "Claims:\n- So the answer is 29.\n- Then 29 + 18 = 47.\nAnswer: 29."
