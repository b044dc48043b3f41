"""Math answers that name something other than the value earn nothing (issue 20, Low).

Decisions (each tested): two alternatives for one gold are not credit (against a gold
list they are that list); an equation or an estimate (``7 = 5``, ``\\approx 5``) is not
the value, while ``x = 5`` is; a minus sign right before the box is part of the answer
(``-\\boxed{5}`` is -5) and an operator or a fraction around the box makes it no
answer; single letters match case-sensitively unless both are multiple-choice letters.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marft_envs.verifiers as V
from marft_envs.verifiers.extract import boxed_answer
from marft_envs.verifiers.mathcore import grade_math_local

CASES = [  # (response, gold, correct, method)
    (r"\boxed{x = 3 \text{ or } x = 5}", "5", False, "alternatives"),
    (r"\boxed{3 \lor 5}", "5", False, "alternatives"),
    (r"\boxed{5 \text{ or } 5}", "5", False, "alternatives"),
    (r"\boxed{x = 3 \text{ or } x = 5}", "3, 5", True, None),
    (r"\boxed{7 = 5}", "5", False, "relation"),
    (r"\boxed{\approx 5}", "5", False, "relation"),
    (r"\boxed{x \approx 5}", "5", False, "relation"),
    (r"\boxed{x = 5}", "5", True, None),
    (r"\boxed{y = 2x + 3}", "2x+3", True, None),
    (r"\boxed{x = 5}", "x = 5", True, None),
    (r"-\boxed{5}", "5", False, None),
    (r"-\boxed{5}", "-5", True, None),
    (r"The answer is $-\boxed{\frac{1}{2}}$.", r"-\frac12", True, None),
    (r"\boxed{5}/2", "5", False, None),
    (r"\frac{\boxed{5}}{2}", "5", False, None),
    (r"7 - \boxed{5}", "5", False, None),
    (r"\boxed{\boxed{7}}", "7", True, None),
    (r"\boxed{a}", "A", False, "letter"),
    (r"\boxed{b}", "B", False, "letter"),
    (r"\boxed{a}", "a", True, None),
    (r"\boxed{(c)}", "C", True, "choice"),
    (r"\boxed{\text{(B)}}", "B", True, "choice"),
    (r"\boxed{D}", "(D)", True, "choice"),
]


@pytest.mark.parametrize("response,gold,correct,method", CASES)
def test_decisions(response: str, gold: str, correct: bool, method: str | None) -> None:
    out = grade_math_local(response, gold)
    assert out["correct"] is correct, out
    if method is not None:
        assert out["details"]["method"] == method


def test_decisions_through_the_worker() -> None:
    """The same verdicts from the public, time-bounded grader."""
    results = V.grade_many([(r, g) for r, g, _, _ in CASES], task="math", timeout=20)
    assert [r.correct for r in results] == [c for _, _, c, _ in CASES]


def test_gsm8k_sign_outside_the_box() -> None:
    assert V.grade_gsm8k(r"so the answer is -\boxed{5}.", "#### -5")
    assert not V.grade_gsm8k(r"so the answer is -\boxed{5}.", "#### 5")
    assert not V.grade_gsm8k(r"\boxed{5}/2", "#### 5")


numbers = st.integers(min_value=-10**6, max_value=10**6)


@settings(max_examples=60, deadline=None)
@given(numbers, numbers)
def test_alternatives_never_earn_one_gold(a: int, b: int) -> None:
    for resp in (rf"\boxed{{x = {a} \text{{ or }} x = {b}}}", rf"\boxed{{{a} \lor {b}}}",
                 rf"\boxed{{x={a}\ \text{{and}}\ x={b}}}"):
        for gold in (str(a), str(b)):
            assert not grade_math_local(resp, gold)["correct"], (resp, gold)


@settings(max_examples=60, deadline=None)
@given(numbers, numbers)
def test_relations_are_not_values(a: int, b: int) -> None:
    for resp in (rf"\boxed{{{a} = {b}}}", rf"\boxed{{\approx {b}}}", rf"\boxed{{x \approx {b}}}",
                 rf"\boxed{{{a} \le {b}}}"):
        assert not grade_math_local(resp, str(b))["correct"], resp
    assert grade_math_local(rf"\boxed{{x = {b}}}", str(b))["correct"]


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=10**6))
def test_minus_before_the_box_is_the_sign(n: int) -> None:
    resp = rf"Therefore the answer is $-\boxed{{{n}}}$."
    assert boxed_answer(resp) == (f"-{n}", "negated")
    assert grade_math_local(resp, str(-n))["correct"]
    assert not grade_math_local(resp, str(n))["correct"]
    for wrapped in (rf"\boxed{{{n}}}/2", rf"\frac{{\boxed{{{n}}}}}{{3}}", rf"{n + 1} - \boxed{{{n}}}",
                    rf"\boxed{{{n}}}^2", rf"2\boxed{{{n}}}"):
        assert boxed_answer(wrapped) == (None, "in_expression")
        assert not grade_math_local(wrapped, str(n))["correct"], wrapped


@given(st.sampled_from("abcdefghijklmnopqrstuvwxyz"))
def test_letters_are_case_sensitive_unless_both_are_choices(letter: str) -> None:
    upper = letter.upper()
    assert not grade_math_local(rf"\boxed{{{letter}}}", upper)["correct"]
    assert grade_math_local(rf"\boxed{{{letter}}}", letter)["correct"]
    choice = grade_math_local(rf"\boxed{{({letter})}}", upper)["correct"]
    assert choice is (upper in "ABCDE")
