"""Answer extraction and hardened graders for math word problems (GSM8K, MATH).

Extraction (pure, in-process, never raising)::

    extract_boxed(r"so \boxed{\frac{1}{2}}.")      # -> "\\frac{1}{2}"
    extract_gsm8k_gold("... #### 1,600")            # -> "1600"
    normalize_number("$1,000.00")                   # -> "1000"

Grading (each call in a worker process with a hard wall-clock kill)::

    grade_math(r"... \boxed{0.5}", r"\frac12")      # -> True
    grade_gsm8k("The answer is 18.", "#### 18")     # -> True
    grade_math_result(response, gold).timed_out     # detailed GradeResult
    grade_many([(resp, gold), ...], task="math")    # parallel over the pool
    stats.as_dict()   # calls, timeouts, crashes, restarts, max_seconds, total_seconds

A timed-out or crashed call is a wrong answer with ``timed_out=True`` or
``error=...``, counted in :data:`stats` and logged.
"""

from .extract import (
    MAX_RESPONSE_CHARS,
    extract_boxed,
    extract_gsm8k_answer,
    extract_gsm8k_gold,
    extract_last_number,
    extract_math_answer,
    normalize_number,
    parse_number,
    truncate_response,
)
from .graders import (
    DEFAULT_TIMEOUT,
    grade_gsm8k,
    grade_gsm8k_result,
    grade_many,
    grade_math,
    grade_math_result,
)
from .mathcore import math_equal, normalize_latex
from .worker import GradingStats, configure, shutdown_workers, stats

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_RESPONSE_CHARS",
    "GradingStats",
    "configure",
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_gsm8k_gold",
    "extract_last_number",
    "extract_math_answer",
    "grade_gsm8k",
    "grade_gsm8k_result",
    "grade_many",
    "grade_math",
    "grade_math_result",
    "math_equal",
    "normalize_latex",
    "normalize_number",
    "parse_number",
    "shutdown_workers",
    "stats",
    "truncate_response",
]
