"""Arithmetic: procedural, offline, deterministic.

``arith-{solo,duo,trio,routed}-v0``

| Property        | Value                                                        |
|-----------------|--------------------------------------------------------------|
| Task            | :class:`ArithTask` (``"What is 47 - 18?"``)                  |
| Agents          | the team's roles (``solo``: actor; ``duo``: reasoner, actor; ``trio``: solver_a, solver_b, aggregator; ``routed``: orchestrator, algebra, number_theory, geometry) |
| Action space    | ``UnicodeText(max_action_chars)``                            |
| Observation     | ``Dict(prompt=UnicodeText, turn=Discrete(horizon + 1))``     |
| Reward          | team reward, 1 if the graded answer equals the result        |
| Data            | none (generated from the problem index)                      |

Expressions of ``n_ops + 1`` operands with ``digits`` digits each (0 included)
and operators drawn from ``ops``, evaluated with the usual precedence (``*``
before ``+``/``-``; results may be negative). Problem ``i`` of a split is a
pure function of ``(i, split, digits, n_ops, ops)``. Train and test are
disjoint by construction: a problem's split is fixed by a hash of its
expression (``test_fraction`` of all expressions go to test). Small problem
spaces (up to 20,000 expressions) are enumerated, shuffled with a fixed seed
and indexed, so the split holds every such problem exactly once; larger ones
are drawn from the index with rejection, so ``len`` is large and problems may
repeat.

Default level: 2-digit operands, one operator among ``+-`` (20,000
expressions, each in exactly one split: about 15,000 train and 5,000 test),
chosen to sit inside the 10-40% band where RL gains show within an hour of CPU:
the untrained SmolLM2-135M-Instruct solo and duo score about 20% on it, greedy
(``docs/results.md`` has the measured numbers and the command). One-digit
single operations are far easier for that model and two operations far harder;
``digits=1, ops="+-*"`` is the easy level (300 expressions).

Grading: the answer is the content of the last ``\\boxed{}`` if there is one,
else the last number in the reply; it must equal the result exactly
(``56``, ``+56``, ``56.0`` and ``\u221256`` forms are normalised).
``format_ok`` is true when an integer could be extracted.

Arguments: ``split`` ("train" | "test"), ``digits`` (2), ``n_ops`` (1),
``ops`` ("+-"), ``test_fraction`` (0.25).

Version history: v0: initial release (default level 2-digit ``+``/``-``).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

import numpy as np

from marft_envs.tasks.base import GradeResult, Problem, Task, demo_seat

__all__ = ["ArithTask", "extract_final_number"]

_ENUMERATE_LIMIT = 20_000
_GENERATED_LEN = 1_000_000_000
# The graded tail of a reply: final answers come last, and bounded input keeps regexes cheap.
_TAIL = 20_000
_NUMBER_RE = re.compile(r"(?<![\w.])[-+\u2212]?\d+(?:\.\d+)?(?!\d)")
_INT_RE = re.compile(r"[-+]?\d+(?:\.0+)?")


_BOX_RE = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, or None."""
    # One pass matching braces, so unbalanced adversarial input stays linear.
    closing: dict[int, int] = {}
    stack: list[int] = []
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            closing[stack.pop()] = i
    for m in reversed(list(_BOX_RE.finditer(text))):
        start = m.end() - 1
        if start in closing:
            return text[start + 1 : closing[start]]
    return None


def _normalize_int(s: str) -> str | None:
    s = s.strip().replace("\u2212", "-").replace(",", "").replace("$", "").replace(" ", "")
    s = re.sub(r"\\(?:text|mathrm|mathbf)\{([^{}]*)\}", r"\1", s)
    s = s.rstrip(".")
    if not _INT_RE.fullmatch(s):
        return None
    return str(int(float(s))) if "." in s else str(int(s))


def extract_final_number(text: str) -> tuple[str | None, bool]:
    """``(normalized integer or None, boxed)``: last ``\\boxed{}`` content, else the last number."""
    if not isinstance(text, str):
        return None, False
    text = text[-_TAIL:]
    boxed = _last_boxed(text)
    if boxed is not None:
        return _normalize_int(boxed), True
    nums = _NUMBER_RE.findall(text)
    return (_normalize_int(nums[-1]) if nums else None), False


def _evaluate(operands: tuple[int, ...], ops: tuple[str, ...]) -> int:
    # Precedence: fold products first, then add/subtract left to right.
    terms = [operands[0]]
    signs = [1]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def _reasoning(expr: str, result: str) -> str:
    """The short reasoning format of the scripted reasoner: tens first, then ones."""
    parts = expr.split()
    if len(parts) == 3 and parts[1] in "+-" and parts[2].isdigit() and int(parts[2]) >= 10 and int(parts[2]) % 10:
        a, op, b = int(parts[0]), parts[1], int(parts[2])
        tens, ones = b - b % 10, b % 10
        mid = a + tens if op == "+" else a - tens
        return f"{expr}: {a} {op} {tens} = {mid}, {mid} {op} {ones} = {result}. So {expr} = {result}."
    return f"Compute {expr} step by step. So {expr} = {result}."


class ArithTask(Task):
    """Procedural integer arithmetic (see the module docstring for the env family)."""

    name = "arith"
    instructions = "Give the final answer as a single number inside \\boxed{}."

    def __init__(
        self,
        split: str = "train",
        *,
        digits: int = 2,
        n_ops: int = 1,
        ops: str = "+-",
        test_fraction: float = 0.25,
    ):
        if split not in ("train", "test"):
            raise ValueError(f"ArithTask split must be 'train' or 'test', got {split!r}")
        if not (isinstance(digits, int) and 1 <= digits <= 9):
            raise ValueError(f"digits must be an int in 1..9, got {digits!r}")
        if not (isinstance(n_ops, int) and 1 <= n_ops <= 8):
            raise ValueError(f"n_ops must be an int in 1..8, got {n_ops!r}")
        if not ops or set(ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty string of '+', '-', '*', got {ops!r}")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.split = split
        self.digits = digits
        self.n_ops = n_ops
        self.ops = "".join(dict.fromkeys(ops))
        self.test_fraction = float(test_fraction)
        self._hi = 10**digits
        self._space = self._hi ** (n_ops + 1) * len(self.ops) ** n_ops
        self._salt = int(hashlib.sha256(self._config().encode()).hexdigest()[:8], 16)
        self._pool: list[tuple[tuple[int, ...], tuple[str, ...]]] | None = None

    def _config(self) -> str:
        return f"d{self.digits}-n{self.n_ops}-{self.ops}"

    def _split_of(self, expr: str) -> str:
        h = int(hashlib.sha256(expr.encode()).hexdigest()[:8], 16)
        return "test" if (h % 10_000) < self.test_fraction * 10_000 else "train"

    @staticmethod
    def _expr(operands: tuple[int, ...], ops: tuple[str, ...]) -> str:
        out = [str(operands[0])]
        for op, x in zip(ops, operands[1:], strict=True):
            out += [op, str(x)]
        return " ".join(out)

    def _enumerated(self) -> list[tuple[tuple[int, ...], tuple[str, ...]]]:
        if self._pool is None:
            pool = []
            for operands in itertools.product(range(self._hi), repeat=self.n_ops + 1):
                for ops in itertools.product(self.ops, repeat=self.n_ops):
                    if self._split_of(self._expr(operands, ops)) == self.split:
                        pool.append((operands, ops))
            order = np.random.default_rng(self._salt).permutation(len(pool))
            self._pool = [pool[i] for i in order]
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        # The enumerated pool is a cache: rebuilt on demand, not pickled.
        state = self.__dict__.copy()
        state["_pool"] = None
        return state

    def __len__(self) -> int:
        if self._space <= _ENUMERATE_LIMIT:
            return len(self._enumerated())
        return _GENERATED_LEN

    def _draw(self, index: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        split_code = 0 if self.split == "train" else 1
        for attempt in itertools.count():
            rng = np.random.default_rng([self._salt, split_code, index, attempt])
            operands = tuple(int(x) for x in rng.integers(0, self._hi, self.n_ops + 1))
            ops = tuple(self.ops[int(k)] for k in rng.integers(0, len(self.ops), self.n_ops))
            if self._split_of(self._expr(operands, ops)) == self.split:
                return operands, ops
        raise AssertionError("unreachable")

    def get(self, index: int) -> Problem:
        """Problem ``index``, built deterministically from the index (no stored data)."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"problem index {index} out of range for {len(self)} problems")
        if self._space <= _ENUMERATE_LIMIT:
            operands, ops = self._enumerated()[index]
        else:
            operands, ops = self._draw(index)
        expr = self._expr(operands, ops)
        return Problem(
            id=f"arith/{self._config()}/{self.split}/{index}",
            question=f"What is {expr}?",
            answer=str(_evaluate(operands, ops)),
            meta={"expression": expr, "digits": self.digits, "n_ops": self.n_ops},
        )

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Exact match of the last boxed (else last) number with the integer answer."""
        try:
            extracted, boxed = extract_final_number(response)
        except Exception as e:  # a grader never raises
            return GradeResult(correct=False, error=f"{type(e).__name__}: {e}")
        correct = extracted is not None and extracted == problem.answer
        return GradeResult(
            correct=correct,
            score=float(correct),
            extracted=extracted,
            format_ok=extracted is not None,
            details={"boxed": boxed},
        )

    def demo_action(self, env: Any, agent: str) -> str | None:
        """A scripted demonstration for ``agent`` of ``env`` (SFT warm starts, docs/sft.md).

        An agent with the ``calculator`` tool and no result yet this turn calls it on the
        expression; an answering agent that sees a teammate gives the boxed result, one that
        works alone states the sum first (``a - b = y. \\boxed{y}``: a bare boxed number
        teaches a solo agent to guess, and the reasoning format, ~50 tokens, would not fit
        the quickstart's 24 for an answering agent); any other agent writes the short
        reasoning format ``a - b: a - 10 = x, x - 8 = y. So a - b = y.`` (a routing
        orchestrator's route lines are the env's: :meth:`TextTeamEnv.demo_action`)."""
        problem = getattr(env, "problem", None)
        if problem is None:
            return None
        expr, result = problem.meta.get("expression", ""), problem.answer
        seat = demo_seat(env, agent)
        if "calculator" in seat.tools and not seat.calls:
            return env.tool_loop.parser.example("calculator", {"expression": expr})
        if seat.answers:
            return f"\\boxed{{{result}}}" if seat.sees_teammates or seat.calls else f"{expr} = {result}. \\boxed{{{result}}}"
        return _reasoning(expr, result)

    def __repr__(self) -> str:
        return f"ArithTask(split={self.split!r}, digits={self.digits}, n_ops={self.n_ops}, ops={self.ops!r})"
