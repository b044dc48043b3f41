"""A safe calculator: arithmetic expressions evaluated by walking the ``ast``, never ``eval``.

Accepted: numbers, ``+ - * / // % **``, unary ``+``/``-``, parentheses, the
constants ``pi``, ``e`` and the functions ``abs, round, min, max, sqrt, floor,
ceil, log, log10, log2, exp, sin, cos, tan``. Everything else (names,
attributes, subscripts, strings, lambdas, comprehensions, comparisons, bit
operations) is refused with a message. Bounds keep every evaluation fast:
the expression has at most :data:`MAX_EXPRESSION_CHARS` characters and
:data:`MAX_NODES` syntax nodes, an exponent's magnitude is at most
:data:`MAX_EXPONENT`, and no integer may exceed :data:`MAX_INT_BITS` bits (so
``9**9**9`` or repeated squaring are refused, not computed).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

__all__ = ["CalculatorError", "MAX_EXPONENT", "MAX_EXPRESSION_CHARS", "MAX_INT_BITS", "MAX_NODES", "calculate", "format_number"]

MAX_EXPRESSION_CHARS = 500
MAX_NODES = 200
MAX_EXPONENT = 1000
MAX_INT_BITS = 4096


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def _sqrt(x: float) -> float:
    if x < 0:
        raise CalculatorError("sqrt of a negative number")
    return math.sqrt(x)


def _log(x: float, base: float | None = None) -> float:
    if x <= 0 or (base is not None and (base <= 0 or base == 1)):
        raise CalculatorError("log needs a positive argument (and a positive base other than 1)")
    return math.log(x) if base is None else math.log(x, base)


_FUNCS: dict[str, tuple[Callable[..., Any], int, int]] = {  # name -> (function, min args, max args)
    "abs": (abs, 1, 1),
    "round": (round, 1, 2),
    "min": (min, 1, 32),
    "max": (max, 1, 32),
    "sqrt": (_sqrt, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "log": (_log, 1, 2),
    "log10": (lambda x: _log(x, 10), 1, 1),
    "log2": (lambda x: _log(x, 2), 1, 1),
    "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
}


def _check_size(value: Any) -> Any:
    if isinstance(value, bool):
        raise CalculatorError("booleans are not numbers here")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"the result has more than {MAX_INT_BITS} bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number (overflow or nan)")
    if isinstance(value, complex):
        raise CalculatorError("the result is a complex number")
    return value


def _pow(base: Any, exp: Any) -> Any:
    if abs(exp) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exp!r} is too large (at most {MAX_EXPONENT} in magnitude)")
    if isinstance(base, int) and isinstance(exp, int) and exp > 0:
        # bits of the result are about exp * bits(base): refuse before computing it
        if base not in (0, 1, -1) and exp * max(1, abs(base).bit_length() - 1) > MAX_INT_BITS:
            raise CalculatorError(f"the result has more than {MAX_INT_BITS} bits")
    if base == 0 and exp < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    try:
        return base**exp
    except OverflowError:
        raise CalculatorError("overflow: the result is too large") from None


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, got {type(node.value).__name__} {node.value!r:.20}")
        return _check_size(node.value)
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}; constants: pi, e")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return _check_size(+value if isinstance(node.op, ast.UAdd) else -value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_pow(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
                raise CalculatorError(f"the result has more than {MAX_INT_BITS} bits")
        try:
            return _check_size(_BINOPS[type(node.op)](left, right))
        except OverflowError as e:
            raise CalculatorError(f"overflow: {e}") from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name = node.func.id
        if name not in _FUNCS:
            raise CalculatorError(f"unknown function {name!r}; allowed: {', '.join(sorted(_FUNCS))}")
        fn, lo, hi = _FUNCS[name]
        if not lo <= len(node.args) <= hi:
            raise CalculatorError(f"{name}() takes {lo}{'' if lo == hi else f' to {hi}'} argument(s), got {len(node.args)}")
        args = [_eval(a) for a in node.args]
        if name == "round" and len(args) == 2 and (not isinstance(args[1], int) or abs(args[1]) > 100):
            raise CalculatorError("round(x, n) needs an integer n with |n| <= 100")
        try:
            return _check_size(fn(*args))
        except (OverflowError, ValueError) as e:
            if isinstance(e, CalculatorError):
                raise
            raise CalculatorError(f"{name}(): {e}") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed; use numbers, + - * / // % ** and math functions")


def format_number(value: Any) -> str:
    """Integers as integers; integral floats without ``.0``; other floats with 12 significant digits."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate ``expression`` and return the result as text; raise :class:`CalculatorError`."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    expr = expression.strip().replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/").replace("\u2212", "-")
    if not expr:
        raise CalculatorError("empty expression")
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression has {len(expr)} characters (at most {MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"not a valid expression ({type(e).__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"the expression is too long (more than {MAX_NODES} syntax nodes)")
    try:
        return format_number(_eval(tree))
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
