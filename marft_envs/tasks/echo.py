"""Echo: a two-agent toy task with a known optimum, for learning tests.

``echo-duo-v0``

| Property        | Value                                                        |
|-----------------|--------------------------------------------------------------|
| Task            | :class:`EchoTask`                                            |
| Agents          | ``speaker`` -> ``listener`` (a chain)                        |
| Action space    | ``UnicodeText(max_action_chars)``                            |
| Observation     | ``Dict(prompt=UnicodeText, turn=Discrete(horizon + 1))``     |
| Reward          | 1 when the listener repeats the speaker's vocabulary word    |
| Data            | none                                                         |

The speaker says one word from a tiny vocabulary (default ``red green blue
yellow``); the team is rewarded when the listener's reply is exactly that word.
Replies are compared after stripping whitespace, surrounding quotes and
punctuation and lower-casing. Problem ``i`` lists the vocabulary in the
``i``-th permutation (``len`` = ``|V|!``), so prompts vary but the task does not.

Known values (for learning tests): the optimum is reward 1 on every episode
(any vocabulary word, copied). If both agents pick a vocabulary word uniformly
at random, the expected reward is ``1/|V|`` (0.25 by default); a listener that
copies reaches the optimum whatever the speaker says, provided the speaker
says a vocabulary word. Random text scores ~0.

Grading uses the optional team hook ``grade_turn(executed, answer_agent,
problem)`` (the environment passes the whole turn); ``grade(response,
problem)`` alone only checks that ``response`` is a vocabulary word.

Arguments: ``vocabulary`` (tuple of words), ``split`` (ignored: one problem set).

Version history: v0: initial release.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

from marft_envs.tasks.base import GradeResult, Problem, Task

__all__ = ["EchoTask"]

_STRIP = " \t\r\n\"'`.,;:!?*()[]{}<>"


def _word(text: str) -> str:
    if not isinstance(text, str):
        return ""
    return text[:200].strip(_STRIP).lower()


class EchoTask(Task):
    """Speaker names a vocabulary word, listener repeats it (see module docstring)."""

    name = "echo"
    instructions = "Reply with one word only."

    def __init__(self, split: str = "train", *, vocabulary: Sequence[str] = ("red", "green", "blue", "yellow")):
        vocab = tuple(str(w).lower() for w in vocabulary)
        if len(vocab) < 2 or len(set(vocab)) != len(vocab):
            raise ValueError(f"vocabulary needs at least 2 distinct words, got {vocabulary!r}")
        if any(not re.fullmatch(r"[a-z]+", w) for w in vocab):
            raise ValueError(f"vocabulary words must be plain lowercase letters, got {vocab!r}")
        if len(vocab) > 8:
            raise ValueError("vocabulary is capped at 8 words (|V|! problems)")
        self.split = split
        self.vocabulary = vocab

    @property
    def chance_level(self) -> float:
        """Expected reward when both agents pick a vocabulary word uniformly at random."""
        return 1.0 / len(self.vocabulary)

    def __len__(self) -> int:
        return math.factorial(len(self.vocabulary))

    def get(self, index: int) -> Problem:
        """Problem ``index``: one ordering of the vocabulary (any word is a valid answer)."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"problem index {index} out of range for {len(self)} problems")
        order = next(itertools.islice(itertools.permutations(self.vocabulary), index, None))
        return Problem(
            id=f"echo/{index}",
            question=(
                f"Vocabulary: {', '.join(order)}.\n"
                "The speaker says one word from the vocabulary; the listener must repeat it exactly."
            ),
            answer="",  # any vocabulary word the speaker picks
            meta={"vocabulary": list(self.vocabulary)},
        )

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Single-response form: correct when the reply is a vocabulary word
        (the env uses :meth:`grade_turn`, which also checks the speaker)."""
        word = _word(response)
        ok = word in self.vocabulary
        return GradeResult(correct=ok, score=float(ok), extracted=word or None, format_ok=ok)

    def grade_turn(self, executed: Sequence[tuple[str, str]], answer_agent: str, problem: Problem) -> GradeResult:
        """Correct when the answer agent's word equals the first agent's vocabulary word."""
        if not executed:
            return GradeResult(correct=False, error="no actions")
        said = _word(executed[0][1])
        heard = _word(dict(executed).get(answer_agent, ""))
        in_vocab = heard in self.vocabulary
        correct = in_vocab and said == heard
        return GradeResult(
            correct=correct,
            score=float(correct),
            extracted=heard or None,
            format_ok=in_vocab,
            details={"speaker_word": said or None, "speaker_in_vocabulary": said in self.vocabulary},
        )
