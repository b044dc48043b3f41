"""In-process grading logic: LaTeX normalization and answer equivalence.

These functions are UNBOUNDED in time (sympy and math-verify can hang on
adversarial input): the public graders in :mod:`marft_envs.verifiers.graders`
run them inside a worker process with a hard wall-clock kill. Call them
directly only on trusted input (tests, debugging).

Refused before any check (``details["method"]`` names why): two alternatives for
one gold (``x = 3 \\text{ or } x = 5`` vs ``5``: ``"alternatives"``; against a gold
list ``3, 5`` they are compared as that list), and a relation where the gold has
none (``7 = 5``, ``\\approx 5``: ``"relation"``; a leading ``x =`` is fine).

Equivalence, in order (first success wins, reported in ``details["method"]``):
exact string match after normalizing both sides, exact numeric match,
multiple-choice letters (``A``-``E`` or ``(a)``-``(e)``, case-insensitive only
between two such letters; a bare ``a`` is a variable), math-verify (``parse`` + ``verify``) on the raw and the
normalized forms, a sympy fallback (``latex2sympy`` + ``simplify``) for pairs
math-verify cannot parse, and a plain-text match for word answers. Parses are
cached per worker: RL grades many samples against the same gold answer.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from .extract import (
    MAX_RESPONSE_CHARS,
    extract_gsm8k_answer,
    extract_math_answer,
    normalize_number,
    parse_number,
    truncate_response,
)

__all__ = ["METHODS", "grade_gsm8k_local", "grade_math_local", "math_equal", "normalize_latex"]

logger = logging.getLogger(__name__)

_MAX_ANSWER_CHARS = 1_000  # longer "answers" are not answers; keeps sympy bounded-ish

# Units and words that may trail a numeric answer ("5 cm", "12\text{ inches}").
_UNIT_WORDS = (
    "units?|square|sq|cubic|feet|foot|ft|inches|inch|in|cm|mm|km|meters?|metres?|m|miles?|"
    "yards?|yd|degrees?|deg|radians?|rad|seconds?|sec|s|minutes?|min|hours?|hr|h|days?|"
    "weeks?|years?|dollars?|cents?|percent|pounds?|lbs?|ounces?|oz|grams?|g|kg|liters?|"
    "litres?|l|ml|mph|people|students|ways|points?|cups?|gallons?|quarts?|pints?|"
    "cubes?|coins?|marbles?|books?|pages?|apples?|eggs?|times"
)
_TRAILING_UNITS_RE = re.compile(
    # A space is required: "4m" may be 4 times m, "4 m" is four metres.
    rf"(?<=[\d}}])\s+(?:(?:{_UNIT_WORDS})\b\s*(?:\^?\{{?[23]\}}?)?\s*)+$"
)
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}"
)
_VAR_ASSIGN_RE = re.compile(r"^\s*[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?!=)")


def _strip_text_blocks(s: str) -> str:
    """Drop a trailing ``\\text{...}`` unit after a value; otherwise unwrap text blocks."""
    blocks = list(_TEXT_CMD_RE.finditer(s))
    if not blocks:
        return s
    last = blocks[-1]
    before = s[: last.start()].strip()
    if (
        last.end() == len(s.rstrip())
        and before
        and not _TEXT_CMD_RE.search(before)
        and re.search(r"[\d})]$", before)
    ):
        return before  # "12\\text{ cm}" -> "12"
    return _TEXT_CMD_RE.sub(r"\1", s)


def _space_or_keep(m: re.Match[str]) -> str:
    return m.group(0) if m.group(0) == "\\\\" else " "


def normalize_latex(answer: str) -> str:
    """A canonical string form of a LaTeX answer, for string equality and parsing.

    Removes presentation-only markup (``$``, ``\\left``/``\\right``, spacing
    commands, ``\\!``, degrees, ``\\%``, ``\\$``, trailing dots, text units),
    rewrites ``\\dfrac``/``\\tfrac`` to ``\\frac``, fixes ``\\frac12``/``\\sqrt2``,
    drops thousands separators in plain numbers and leading ``x =``.
    """
    s = answer if isinstance(answer, str) else str(answer)
    s = s.replace("\x00", "").strip()
    if len(s) > _MAX_ANSWER_CHARS:
        s = s[:_MAX_ANSWER_CHARS]
    # Math delimiters around the whole answer.
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\displaystyle", "")
    s = re.sub(r"\\left\s*\.|\\right\s*\.", "", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])", "", s)
    # Spacing commands become spaces; "\\\\" (a matrix row break) is kept.
    s = re.sub(r"\\\\|\\[!,;: ]|~|\\q?quad(?![a-zA-Z])", _space_or_keep, s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "").replace("%", "")
    # Degrees only: a bare \circ is function composition.
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\u00b0|\\degree(?![a-zA-Z])", "", s)
    s = re.sub(r"\{\s*,\s*\}", ",", s)  # 10{,}000
    s = _strip_text_blocks(s)
    s = re.sub(r"\\(?:mathrm|mathbf|textbf|boldsymbol)\s*\{([^{}]*)\}", r"\1", s)
    s = _TRAILING_UNITS_RE.sub("", s)
    # \frac12 -> \frac{1}{2}; \frac{a}2 -> \frac{a}{2}; \sqrt2 -> \sqrt{2}
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*(\d)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\{)", r"\\frac{\1}\2", s)
    s = re.sub(r"\\sqrt\s*(\d+|[a-zA-Z])", r"\\sqrt{\1}", s)
    # Whitespace is insignificant except between a command and a letter (\pi r).
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\x01", s)
    s = re.sub(r"\s+", "", s).replace("\x01", " ")
    s = s.rstrip(".").rstrip("\\").strip()
    # Thousands separators in a plain number only (never inside tuples).
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if s.startswith("+") and len(s) > 1:
        s = s[1:]
    return s


def _strip_assignment(pred: str, gold: str) -> tuple[str, str]:
    """``x=5`` vs ``5``: drop a leading single-variable assignment on the side that has one."""
    if "=" in pred and "=" not in gold and _VAR_ASSIGN_RE.match(pred):
        pred = _VAR_ASSIGN_RE.sub("", pred, count=1)
    if "=" in gold and "=" not in pred and _VAR_ASSIGN_RE.match(gold):
        gold = _VAR_ASSIGN_RE.sub("", gold, count=1)
    return pred, gold


# A multiple-choice letter: an upper-case A-E, bare or in parentheses, or a lower-case
# one in parentheses. A bare "a" is a variable: "a" vs "A" is no match.
_CHOICE_RE = re.compile(r"^(?:\(?([A-E])\)?|\(([a-e])\))$")

# Relations: an answer that is an equation or an estimate ("7 = 5", "\approx 5") is not
# the value it mentions.
_RELATION_RE = re.compile(r"=|<|>|\\(?:approx|sim|simeq|cong|ne|neq|le|leq|ge|geq|lt|gt|equiv)"
                          r"(?![a-zA-Z])")
# Alternatives: "x = 3 or x = 5" names two answers.
_ALTERNATIVES_RE = re.compile(
    r"\s*(?:\\(?:text|textrm|mbox|mathrm)\s*\{\s*(?:or|and)\s*\}|\\(?:lor|vee|land|wedge)"
    r"(?![a-zA-Z])|\b(?:or|and)\b)\s*")


def _choice(s: str) -> str | None:
    m = _CHOICE_RE.match(s)
    return (m.group(1) or m.group(2)).upper() if m else None


def _split_alternatives(raw: str) -> list[str]:
    """``"x = 3 \\text{ or } x = 5"`` -> ``["x = 3", "x = 5"]``; one item if no "or"."""
    parts = [p for p in _ALTERNATIVES_RE.split(raw) if p.strip()]
    return parts if len(parts) > 1 else [raw]


def _quiet_math_verify() -> None:
    """Silence math-verify's one-time "timeout disabled" warning: our worker bounds it."""
    # deferred: math-verify and sympy are heavy: they load in the grading worker on first use
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


@functools.lru_cache(maxsize=4096)
def _mv_parse(text: str) -> tuple[Any, ...]:
    """math-verify's parse, cached: RL grades many samples against one gold answer."""
    # deferred: math-verify and sympy are heavy: they load in the grading worker on first use
    from math_verify import parse

    _quiet_math_verify()
    # Our own hard timeout bounds this call; math-verify's signal timeouts are off
    # because they would cancel the worker's own alarm.
    return tuple(parse(f"${text}$", parsing_timeout=None))  # type: ignore[arg-type]


def _mv_equal(pred: str, gold: str) -> bool | None:
    """math-verify's verdict, or None when it cannot parse one side."""
    # deferred: math-verify and sympy are heavy: they load in the grading worker on first use
    from math_verify import verify

    g = _mv_parse(gold)
    p = _mv_parse(pred)
    if not g or not p:
        return None
    return bool(verify(list(g), list(p), timeout_seconds=None))


def _sympy_equal(pred: str, gold: str) -> bool:
    # deferred: math-verify and sympy are heavy: they load in the grading worker on first use
    import sympy
    from latex2sympy2_extended import latex2sympy

    a = latex2sympy(pred)
    b = latex2sympy(gold)
    if a == b:
        return True
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        diff = sympy.simplify(a - b)
        if diff == 0:
            return True
        if diff.is_number and not diff.free_symbols:
            return bool(abs(complex(sympy.N(diff, 30))) < 1e-9 * max(1.0, abs(complex(sympy.N(b)))))
    return False


def _plain_words(s: str) -> str | None:
    """Lower-case letters of a word answer ("\\text{Sunday}", "Devon."), None if not words."""
    s = _TEXT_CMD_RE.sub(r"\1", s)
    s = re.sub(r"[\s{}().,;:!'\"]", "", s)
    return s.lower() if len(s) >= 2 and s.isascii() and s.isalpha() else None


#: The equivalence checks, in the order :func:`math_equal` tries them.
METHODS = ("string", "numeric", "choice", "math_verify", "sympy", "text")


def math_equal(pred: str, gold: str, *, methods: tuple[str, ...] = METHODS) -> tuple[bool, str]:
    """Whether two final answers are mathematically equivalent, and by which method.

    ``methods`` restricts the checks (tests use it to exercise math-verify alone).
    """
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False, "none"
    pred, gold = pred[:_MAX_ANSWER_CHARS], gold[:_MAX_ANSWER_CHARS]
    alternatives = _split_alternatives(pred)
    if len(alternatives) > 1 and len(_split_alternatives(gold)) == 1:
        if "," not in normalize_latex(gold):
            return False, "alternatives"  # two answers for one gold earn nothing
        # Several solutions ("x = 3 or x = 5") against a gold list ("3, 5").
        pred = ", ".join(_strip_assignment(normalize_latex(a), "")[0] for a in alternatives)
    npred, ngold = normalize_latex(pred), normalize_latex(gold)
    if not npred or not ngold:
        return False, "empty"
    npred, ngold = _strip_assignment(npred, ngold)
    if _RELATION_RE.search(npred) and not _RELATION_RE.search(ngold):
        return False, "relation"  # "7 = 5", "\\approx 5": not the value itself
    if "string" in methods and npred == ngold:
        return True, "string"
    if "numeric" in methods:
        vp, vg = parse_number(npred), parse_number(ngold)
        if vp is not None and vg is not None and vp == vg:
            return True, "numeric"
    cp, cg = _choice(npred), _choice(ngold)
    if "choice" in methods and cp and cg:
        return cp == cg, "choice"
    letter = re.compile(r"\(?([A-Za-z])\)?")
    lp, lg = letter.fullmatch(npred), letter.fullmatch(ngold)
    if lp and lg:  # single letters that are not both choices: case matters ("a" != "A")
        return lp.group(1) == lg.group(1), "letter"
    verdict_given = False
    if "math_verify" in methods:
        forms = [(pred, gold)] if (pred, gold) == (npred, ngold) else [(pred, gold), (npred, ngold)]
        for p, g in forms:
            try:
                verdict = _mv_equal(p, g)
            except Exception as exc:  # noqa: BLE001 - a parser bug is a non-match, logged
                logger.debug("math-verify failed on %r vs %r: %s", p[:80], g[:80], exc)
                continue
            if verdict:
                return True, "math_verify"
            verdict_given = verdict_given or verdict is not None
    # sympy is the fallback for what math-verify cannot parse; re-judging a pair
    # math-verify parsed and rejected would only cost time (most RL answers are wrong).
    if "sympy" in methods and not verdict_given:
        try:
            if _sympy_equal(npred, ngold):
                return True, "sympy"
        except Exception as exc:  # noqa: BLE001
            logger.debug("sympy fallback failed on %r vs %r: %s", npred[:80], ngold[:80], exc)
    if "text" in methods:
        wp, wg = _plain_words(npred), _plain_words(ngold)
        if wp is not None and wp == wg:
            return True, "text"
    return False, "none"


def grade_math_local(
    response: str,
    gold: str,
    max_chars: int | None = None,
    methods: tuple[str, ...] = METHODS,
) -> dict[str, Any]:
    """Grade a MATH-style response in this process; returns GradeResult fields as a dict."""
    text, truncated = truncate_response(response, max_chars or MAX_RESPONSE_CHARS)
    extracted = extract_math_answer(text)
    details: dict[str, Any] = {"truncated": truncated, "method": "none"}
    if extracted is None:
        return {"correct": False, "extracted": None, "format_ok": False, "details": details}
    ok, method = math_equal(extracted, gold, methods=tuple(methods))
    details["method"] = method
    return {"correct": ok, "extracted": extracted, "format_ok": True, "details": details}


def grade_gsm8k_local(response: str, gold: str, max_chars: int | None = None) -> dict[str, Any]:
    """Grade a GSM8K response in this process (numeric comparison with the gold number)."""
    text, truncated = truncate_response(response, max_chars or MAX_RESPONSE_CHARS)
    extracted, how = extract_gsm8k_answer(text)
    details: dict[str, Any] = {"truncated": truncated, "method": how}
    gold_text = gold.rsplit("####", 1)[1] if isinstance(gold, str) and "####" in gold else gold
    gold_value = parse_number(str(gold_text))
    if gold_value is None:
        details["gold_error"] = "gold answer is not a number"
    if extracted is None:
        return {"correct": False, "extracted": None, "format_ok": False, "details": details}
    value = parse_number(extracted)
    details["normalized"] = normalize_number(extracted)
    correct = value is not None and gold_value is not None and value == gold_value
    # format_ok: the reply marked its answer (boxed / #### / "answer is").
    return {
        "correct": correct,
        "extracted": extracted,
        "format_ok": how in ("boxed", "hashes", "answer_is"),
        "details": details,
    }
