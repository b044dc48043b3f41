"""Majority vote of single-agent samples: the baseline at a team's sample budget.

``solo maj@b`` draws b solo answers per episode, b = the team's LLM calls per episode, and
votes on the extracted answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from marft_algos.evaluation.samples import SampleRecord, by_problem

__all__ = ["majority_vote", "norm_answer"]


def norm_answer(a: str | None) -> str | None:
    """An extracted answer for voting: no whitespace, lower case, no trailing period.

    >>> norm_answer(" 7. "), norm_answer("  ")
    ('7', None)
    """
    if a is None:
        return None
    s = "".join(str(a).split()).lower().rstrip(".")
    return s or None


def majority_vote(records: Sequence[SampleRecord], budget: int, k: int) -> list[SampleRecord]:
    """k voted episodes per problem, each from ``budget`` consecutive single-agent samples.

    The vote is over normalized extracted answers (ties: the first answer seen wins);
    the voted episode is correct when a sample with the winning answer was graded
    correct; its tokens and calls are the sum over the voters (the same sample budget).
    A vote has no reward of its own (``reward`` 0, no ``components``).
    """
    out = []
    for p, rs in by_problem(records).items():
        for j in range(k):
            voters = rs[j * budget : (j + 1) * budget]
            if len(voters) < budget:
                break
            votes = Counter(a for a in (norm_answer(r.answer) for r in voters) if a is not None)
            if votes:
                winner = votes.most_common(1)[0][0]
                correct = any(r.correct for r in voters if norm_answer(r.answer) == winner)
            else:
                winner, correct = None, False
            out.append(
                SampleRecord(
                    problem=p,
                    sample=j,
                    correct=correct,
                    tokens=sum(r.tokens for r in voters),
                    calls=sum(r.calls for r in voters),
                    timed_out=any(r.timed_out for r in voters),
                    answer=winner,
                    actions=[],
                )
            )
    return out
