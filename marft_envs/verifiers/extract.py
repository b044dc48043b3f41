"""Answer extraction and number normalization (pure, fast, never raising).

Everything here is plain string work with linear-time scans and regular
expressions free of nested quantifiers, so it is safe on arbitrary model output
(megabyte strings, NUL bytes, unbalanced braces). These functions run inside
the grading worker too, but they are cheap enough to call directly.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "MAX_RESPONSE_CHARS",
    "boxed_answer",
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_gsm8k_gold",
    "extract_last_number",
    "extract_math_answer",
    "normalize_number",
    "parse_number",
    "truncate_response",
]

#: Responses longer than this are cut to their tail before extraction: final
#: answers come last, and bounded input keeps regexes and pickling cheap.
MAX_RESPONSE_CHARS = 20_000

# A number as written in prose: optional sign, optional thousands groups, decimals.
_NUMBER = r"[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+\u2212]?\.\d+"
# Not glued to an ASCII identifier ("x2", "v1.5"); CJK text before a number is fine.
_NUMBER_RE = re.compile(rf"(?<![A-Za-z0-9_.])(?:{_NUMBER})(?![\d])")
_BOX_CMDS = ("\\boxed", "\\fbox")
# Bounds that keep exact arithmetic on adversarial numbers cheap.
_MAX_DIGITS = 400
_MAX_EXPONENT = 400


def truncate_response(text: str, max_chars: int = MAX_RESPONSE_CHARS) -> tuple[str, bool]:
    """Return ``(tail, truncated)``: the last ``max_chars`` characters of ``text``."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    if len(text) <= max_chars:
        return text, False
    return text[-max_chars:], True


def _match_braces(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx`` (escaped braces skipped)."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip \{ and \} (and any other escaped char)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _boxed_span(text: str, start: int, cmd: str) -> tuple[str, int] | None:
    """``(content, end)`` of the box command found at ``start`` (``end``: the index just
    past it), or None if malformed."""
    i = start + len(cmd)
    n = len(text)
    # \boxedfoo is another macro, not a box.
    if i < n and text[i].isalpha():
        return None
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        end = _match_braces(text, i)
        if end is None:
            return None
        return text[i + 1 : end].strip(), end + 1
    # "\boxed 5" form: up to the next "$" or whitespace.
    m = re.match(r"[^\s$]+", text[i : i + 200])
    return (m.group(0).strip(), i + m.end()) if m else None


def _last_box(text: str) -> tuple[str, int, int] | None:
    """``(content, start, end)`` of the LAST well-formed non-empty box in ``text``."""
    if not isinstance(text, str) or "\\" not in text:
        return None
    candidates: list[tuple[int, str]] = []
    for cmd in _BOX_CMDS:
        pos = text.rfind(cmd)
        while pos != -1:
            candidates.append((pos, cmd))
            pos = text.rfind(cmd, 0, pos)
            if len(candidates) > 64:  # bounded work on adversarial input
                break
    for pos, cmd in sorted(candidates, reverse=True):
        span = _boxed_span(text, pos, cmd)
        if span is not None and span[0]:
            return span[0], pos, span[1]
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the LAST well-formed ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Nested braces are matched; an unbalanced trailing box (a truncated reply)
    falls back to the previous well-formed one. Returns None when there is none.
    """
    box = _last_box(text)
    return box[0] if box is not None else None


# What may stand right before / after a box that is the whole answer; anything that
# makes the box one operand of an expression ("7-\boxed{5}", "\boxed{5}/2",
# "\frac{\boxed{1}}{2}") means the box is not the answer.
_BEFORE_OPERATOR = re.compile(r"(?:[*/^_{]|\\(?:cdot|times|div|frac|sqrt|pm|mp))\s*$")
_AFTER_OPERATOR = re.compile(r"^\s*(?:[*/^_]|\}\s*\{|\\(?:cdot|times|div|pm|mp)(?![a-zA-Z]))")
# A minus after a number, a closing bracket or a one-letter variable is a difference.
_BINARY_MINUS = re.compile(r"(?:[\d)}\]]|(?<![A-Za-z\\])[A-Za-z])\s*[-\u2212]\s*$")


def boxed_answer(text: str) -> tuple[str | None, str]:
    """The last box as a whole answer, with what stands around it: ``(answer, how)``.

    ``how`` is ``"boxed"`` (the box alone), ``"negated"`` (a minus sign right before
    it: ``-\\boxed{5}`` is the answer ``-5``), ``"in_expression"`` (an operator or a
    fraction outside the box makes it one operand: no answer, None) or ``"none"``.
    """
    box = _last_box(text)
    if box is None:
        return None, "none"
    content, start, end = box
    before = re.sub(r"(?:\$|\\\(|\\\[)+\s*$", "", text[max(0, start - 40) : start])
    after = text[end : end + 40]
    while re.search(r"\\(?:boxed|fbox)\s*\{\s*$", before) and after.lstrip().startswith("}"):
        # \boxed{\boxed{7}}: the outer box decides.
        before = re.sub(r"\\(?:boxed|fbox)\s*\{\s*$", "", before)
        after = after.lstrip()[1:]
    if (_BEFORE_OPERATOR.search(before) or _AFTER_OPERATOR.search(after)
            or re.search(r"\d$", before)):  # "2\boxed{3}" is a product
        return None, "in_expression"
    if re.search(r"[-\u2212]\s*$", before):
        if _BINARY_MINUS.search(before):
            return None, "in_expression"  # "7 - \boxed{5}": a difference, not a sign
        simple = r"[\w.]+|\\[dt]?frac\{[^{}]*\}\{[^{}]*\}"
        if re.fullmatch(r"[-\u2212]\s*(?:" + simple + ")", content):
            return content.lstrip("-\u2212 "), "negated"  # -\boxed{-5} is 5
        return ("-" + content if re.fullmatch(simple, content) else f"-({content})"), "negated"
    return content, "boxed"


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (``"1,234.5"``, ``"-3"``, ``".5"``), as written.

    Trailing sentence dots are not part of the number. Returns None if none.
    """
    if not isinstance(text, str):
        return None
    last = None
    for m in _NUMBER_RE.finditer(text):
        last = m.group(0)
    return last


def extract_gsm8k_gold(answer_field: str) -> str:
    """The final answer of a GSM8K ``answer`` field (the text after ``####``), normalized.

    ``"... #### 1,600"`` -> ``"1600"``. Falls back to the stripped text after ``####``
    when it is not a plain number, and to the last number when there is no ``####``.
    """
    text = answer_field if isinstance(answer_field, str) else str(answer_field)
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
    else:
        tail = extract_last_number(text) or text.strip()
    norm = normalize_number(tail)
    return norm if norm is not None else tail


_ANSWER_IS_RE = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is|:|=)\s*(?:[:=]\s*)?",
    re.IGNORECASE,
)


_DOLLAR_MATH_RE = re.compile(r"^\$\$?((?:\\.|[^$\\])*)\$")


def _answer_phrase(text: str) -> str | None:
    """Text following the last "answer is" / "Answer:" up to the end of its sentence."""
    last = None
    for m in _ANSWER_IS_RE.finditer(text):
        last = m
    if last is None:
        return None
    rest = text[last.end() : last.end() + 500]
    # Stop at a newline, or a sentence-ending dot not followed by a digit.
    stop = re.search(r"\n|\.(?!\d)(?=\s|$)", rest)
    if stop:
        rest = rest[: stop.start()]
    rest = rest.strip().strip("*").strip()
    m = _DOLLAR_MATH_RE.match(rest)
    if m:
        rest = m.group(1)
    elif rest.startswith("\\(") and "\\)" in rest:
        rest = rest[2 : rest.index("\\)")]
    elif rest.startswith("\\[") and "\\]" in rest:
        rest = rest[2 : rest.index("\\]")]
    rest = rest.strip().rstrip(".").strip()
    return rest or None


def extract_math_answer(text: str) -> str | None:
    """A MATH-style final answer: the last ``\\boxed{}``, else "answer is X" / "Answer: X".

    Returns the answer's LaTeX (unnormalized), or None when the reply states no
    final answer in a recognizable form.
    """
    if not isinstance(text, str):
        return None
    boxed, how = boxed_answer(text)
    if how == "in_expression":
        return None  # a box that is one operand of an expression is no final answer
    if boxed is not None:
        inner = extract_boxed(boxed)  # \boxed{\boxed{x}}
        return inner if inner is not None and how == "boxed" else boxed
    return _answer_phrase(text)


def _clean(number: str) -> str:
    """A parseable number as written, minus currency signs and LaTeX math delimiters."""
    return re.sub(r"^(?:\\?\$)+\s*|\s*\$+$", "", number.strip()) or number


def extract_gsm8k_answer(text: str) -> tuple[str | None, str]:
    """The model's final number for GSM8K and how it was found.

    Preference: ``\\boxed{}``, then ``#### X``, then "answer is X", then the last
    number anywhere. Returns ``(number_as_written or None, method)`` with method
    in ``{"boxed", "hashes", "answer_is", "last_number", "none"}``.
    """
    if not isinstance(text, str):
        return None, "none"
    boxed, how = boxed_answer(text)
    if how == "in_expression":
        return None, "none"  # "\boxed{5}/2": the box is not the answer
    if boxed is not None:
        num = _clean(boxed) if parse_number(boxed) is not None else extract_last_number(boxed)
        if num is not None:
            return num, "boxed"
    if "####" in text:
        num = extract_last_number(text.rsplit("####", 1)[1][:200].split("\n")[0])
        if num is None:
            num = extract_last_number(text.rsplit("####", 1)[1][:200])
        if num is not None:
            return num, "hashes"
    phrase = _answer_phrase(text)
    if phrase is not None:
        num = _clean(phrase) if parse_number(phrase) is not None else None
        if num is None:
            m = _NUMBER_RE.search(phrase)
            num = m.group(0) if m else None
        if num is not None:
            return num, "answer_is"
    num = extract_last_number(text)
    return (num, "last_number") if num is not None else (None, "none")


_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}$")
_SLASH_RE = re.compile(r"^(-?\d+)\s*/\s*(-?\d+)$")
_STRIP_RE = re.compile(
    r"\\\$|\$|\\!|\\,|\\;|\\ |\{,\}|\\%|%|\\text\{[^{}]*\}|\\mbox\{[^{}]*\}|\s+|"
    r"^\\\(|\\\)$|^\\\[|\\\]$"
)


def parse_number(text: str) -> Fraction | None:
    """Exact value of a number as written: ``"$1,234.50"``, ``"-3"``, ``"\\frac{3}{4}"``, ``"1e3"``.

    Currency signs, thousands separators, LaTeX spacing, ``%`` and trailing
    text units/dots are ignored. Returns None if ``text`` is not a single number
    (or is absurdly large, to keep exact arithmetic bounded).
    """
    if not isinstance(text, str) or len(text) > 200:
        return None
    s = text.strip()
    s = _STRIP_RE.sub("", s)
    s = s.replace("\u2212", "-").rstrip(".").lstrip("+")
    s = re.sub(r"^\{(.*)\}$", r"\1", s)
    if not s:
        return None
    m = _FRAC_RE.match(s) or None
    if m:
        sign, num, den = m.groups()
        if len(num) > _MAX_DIGITS or len(den) > _MAX_DIGITS or int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign else value
    m = _SLASH_RE.match(s)
    if m:
        num, den = m.groups()
        if len(num) > _MAX_DIGITS or len(den) > _MAX_DIGITS or int(den) == 0:
            return None
        return Fraction(int(num), int(den))
    if re.fullmatch(r"-?(?:\d{1,3}(?:,\d{3})+|\d*)(?:\.\d*)?(?:[eE][-+]?\d+)?", s) is None:
        return None
    s = s.replace(",", "")
    if len(s) > _MAX_DIGITS or not re.search(r"\d", s.split("e")[0].split("E")[0]):
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if not d.is_finite() or abs(d.as_tuple().exponent) > _MAX_EXPONENT:
        return None
    return Fraction(d)


def _format_fraction(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:  # not a terminating decimal
        return f"{value.numerator}/{value.denominator}"
    # Exact decimal: scale to an integer number of 10^-k units.
    k = max(twos, fives)
    units = abs(value.numerator) * (10**k // value.denominator)
    digits = str(units).rjust(k + 1, "0")
    text = f"{digits[:-k]}.{digits[-k:]}".rstrip("0").rstrip(".")
    return f"-{text}" if value < 0 else text


def normalize_number(text: str) -> str | None:
    """Canonical string of a number (``"$1,000.00"`` -> ``"1000"``, ``"-.50"`` -> ``"-0.5"``).

    Integers print without decimals, terminating decimals exactly, other
    rationals as ``p/q``. Idempotent: ``normalize_number(normalize_number(x)) ==
    normalize_number(x)``. Returns None when ``text`` is not a single number.
    """
    value = parse_number(text)
    return None if value is None else _format_fraction(value)
