"""Public graders for MATH and GSM8K: bounded in time, never raising.

Every call runs in a persistent worker process with a hard wall-clock kill
(:mod:`marft_envs.verifiers.worker`). A timeout or a worker failure yields a
wrong answer with ``timed_out=True`` or ``error=...``, is counted in
:data:`marft_envs.verifiers.stats` and logged: never a hang, never a silent zero.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..tasks.base import GradeResult
from .extract import (
    MAX_RESPONSE_CHARS,
    extract_gsm8k_answer,
    extract_math_answer,
    truncate_response,
)
from .worker import get_pool, stats

__all__ = [
    "DEFAULT_TIMEOUT",
    "grade_gsm8k",
    "grade_gsm8k_result",
    "grade_many",
    "grade_math",
    "grade_math_result",
]

logger = logging.getLogger("marft_envs.verifiers")

#: Default wall-clock budget of one grading call, in seconds.
DEFAULT_TIMEOUT = 5.0
_MAX_GOLD_CHARS = 10_000


def _as_text(value: Any) -> str:
    """Any input as a string: LLM envs may hand us None, bytes or numbers."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a hostile __str__
        return ""


def _finish(
    kind: str, status: str, payload: Any, seconds: float, timeout: float, text: str, **known: Any
) -> GradeResult:
    """Turn a worker reply into a GradeResult, counting and logging failures."""
    if status == "ok" and isinstance(payload, dict):
        stats.record(seconds)
        details = dict(payload.get("details") or {})
        details["seconds"] = seconds
        details["truncated"] = bool(known.get("truncated")) or bool(details.get("truncated"))
        correct = bool(payload.get("correct"))
        return GradeResult(
            correct=correct,
            score=float(correct),
            extracted=payload.get("extracted"),
            format_ok=bool(payload.get("format_ok")),
            details=details,
        )
    # Failed calls still report what the (cheap, safe) extraction saw.
    extracted = known.get("extracted")
    details = {"seconds": seconds, "truncated": bool(known.get("truncated")), "grader": kind}
    common = {
        "correct": False,
        "score": 0.0,
        "extracted": extracted,
        "format_ok": extracted is not None,
    }
    if status == "timeout":
        stats.record(seconds, timed_out=True)
        logger.warning(
            "%s grading timed out after %.2fs (%s deadline, limit %.2fs); response starts %r",
            kind,
            seconds,
            payload,
            timeout,
            text[:80],
        )
        details["deadline"] = payload
        return GradeResult(timed_out=True, details=details, **common)
    stats.record(seconds, crashed=True)
    logger.warning("%s grading failed: %s; response starts %r", kind, payload, text[:80])
    return GradeResult(error=str(payload) or "unknown error", details=details, **common)


def _run(kind: str, response: Any, gold: Any, timeout: float, max_chars: int) -> GradeResult:
    text, truncated = truncate_response(_as_text(response), max_chars)
    gold_text = _as_text(gold)[:_MAX_GOLD_CHARS]
    status, payload, seconds = get_pool().call(kind, (text, gold_text, max_chars), timeout)
    extracted = None
    if status != "ok":
        # Report what the reply claimed; the tail suffices and keeps this cheap.
        tail = text[-4_000:]
        extracted = extract_math_answer(tail) if kind == "math" else extract_gsm8k_answer(tail)[0]
    return _finish(
        kind, status, payload, seconds, timeout, text, truncated=truncated, extracted=extracted
    )


def grade_math_result(
    response: Any,
    gold: Any,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_chars: int = MAX_RESPONSE_CHARS,
) -> GradeResult:
    """Grade a MATH-style ``response`` against the ``gold`` final answer (LaTeX).

    The response's answer is its last ``\\boxed{}`` (else "answer is X"); it is
    compared with ``gold`` by math-verify with a sympy fallback, both sides
    normalized. Responses longer than ``max_chars`` are cut to their tail
    (``details["truncated"]``). ``details["method"]`` tells which check matched.
    """
    return _run("math", response, gold, timeout, max_chars)


def grade_gsm8k_result(
    response: Any,
    gold: Any,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_chars: int = MAX_RESPONSE_CHARS,
) -> GradeResult:
    """Grade a GSM8K ``response`` against ``gold`` (a number, or a full ``... #### X`` field).

    The response's number is taken from ``\\boxed{}``, else ``#### X``, else
    "answer is X", else the last number; it must equal the gold value exactly
    (commas, ``$``, ``.00`` and signs handled). ``format_ok`` is False for the
    last-number fallback.
    """
    return _run("gsm8k", response, gold, timeout, max_chars)


def grade_math(response: Any, gold: Any, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """``True`` iff ``response``'s final answer equals ``gold`` (see :func:`grade_math_result`)."""
    return grade_math_result(response, gold, timeout=timeout).correct


def grade_gsm8k(response: Any, gold: Any, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """``True`` iff ``response``'s final number equals ``gold`` (see :func:`grade_gsm8k_result`)."""
    return grade_gsm8k_result(response, gold, timeout=timeout).correct


def grade_many(
    pairs: Iterable[tuple[Any, Any]],
    *,
    task: str = "math",
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
) -> list[GradeResult]:
    """Grade ``(response, gold)`` pairs in parallel over the worker pool, in input order.

    ``task`` is ``"math"`` or ``"gsm8k"``. Each pair gets its own ``timeout``.
    """
    if task not in ("math", "gsm8k"):
        raise ValueError(f"task must be 'math' or 'gsm8k', not {task!r}")
    items = list(pairs)
    if not items:
        return []
    workers = max_workers or get_pool().size
    if workers <= 1 or len(items) == 1:
        return [_run(task, r, g, timeout, MAX_RESPONSE_CHARS) for r, g in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as ex:
        return list(ex.map(lambda p: _run(task, p[0], p[1], timeout, MAX_RESPONSE_CHARS), items))


def _run_hook(name: str, *args: Any, timeout: float = DEFAULT_TIMEOUT) -> GradeResult:
    """Test hook: run a private worker job (``_sleep``, ``_block``, ``_segfault``,
    ``_raise``) through exactly the machinery and accounting that graders use."""
    status, payload, seconds = get_pool().call(name, args, timeout)
    return _finish(name, status, payload, seconds, timeout, repr(args))
