"""A third-party marft environment: a drafter and an editor reverse a word.

``thirdparty-pair-v0``

| Property   | Value                                                     |
|------------|-----------------------------------------------------------|
| Agents     | ``drafter`` -> ``editor`` (``DAG``; the editor is graded)  |
| Task       | :class:`ReverseTask`: "Reverse the word 'stone'."          |
| Reward     | 1 when the editor's last word is the reversed word        |

Arguments: ``n_words`` (problems per split, at most 8), ``split`` (``"train"``, or
``"test"``: eight other words, held out for evaluation), and any keyword of
:class:`~marft_envs.TextTeamEnv` (``horizon``, ``reward``, ``max_action_chars``, ...).

Registered on import; ``marft_envs.make("third_party_env:thirdparty-pair-v0")``
imports this package first.

Version history: v0: initial release.
"""

from __future__ import annotations

import marft_envs
from marft_envs import DAG, AgentProfile, GradeResult, Problem, Task, Team, TextTeamEnv

__all__ = ["ReverseTask", "make_env", "pair_team"]

WORDS = ("stone", "river", "maple", "cloud", "amber", "tiger", "lemon", "piano")
TEST_WORDS = ("grape", "candle", "forest", "silver", "planet", "window", "garden", "rocket")  # held out


class ReverseTask(Task):
    """Reverse one of a few words; graded on the reply's last word."""

    name = "reverse"
    instructions = "End your reply with the reversed word alone."

    def __init__(self, n_words: int = len(WORDS), split: str = "train"):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        words = WORDS if split == "train" else TEST_WORDS
        self.words = words[: max(1, min(n_words, len(words)))]

    def __len__(self) -> int:
        return len(self.words)

    def get(self, index: int) -> Problem:
        """Problem ``index`` (always the same word: evaluation relies on it)."""
        word = self.words[int(index)]
        return Problem(id=f"reverse/{index}", question=f"Reverse the word '{word}'.", answer=word[::-1])

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Correct when the reply's last word is the reversed word; never raises."""
        words = str(response)[-1000:].split()
        last = words[-1].strip(".,!?'\"").lower() if words else ""
        correct = last == problem.answer
        return GradeResult(correct=correct, score=float(correct), extracted=last or None, format_ok=bool(last))


def pair_team() -> Team:
    """The drafter -> editor team; the editor's answer is graded."""
    profiles = [
        AgentProfile("drafter", "You draft an answer: spell the word backwards, letter by letter."),
        AgentProfile("editor", "You check the draft and give the reversed word.", with_answer=True),
    ]
    return Team.from_profiles(profiles, DAG({"drafter": [], "editor": ["drafter"]}), name="pair")


def make_env(n_words: int = len(WORDS), split: str = "train", **kwargs) -> TextTeamEnv:
    """The registry's entry point: ``split`` picks the problems (evaluation passes
    ``split="test"``); the other kwargs go to :class:`~marft_envs.TextTeamEnv`."""
    return TextTeamEnv(ReverseTask(n_words, split), pair_team(), **kwargs)


if "thirdparty-pair-v0" not in marft_envs.registry:  # idempotent on re-import
    marft_envs.register(
        "thirdparty-pair-v0",
        "third_party_env:make_env",
        kwargs={"n_words": 8},
        description="third-party example: drafter -> editor reverse a word",
    )
