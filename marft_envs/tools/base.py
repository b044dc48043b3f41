"""Tools: a frozen surface of name, JSON-schema parameters, description and a Python callable.

A :class:`Tool` is what a team profile gives an agent. Its :meth:`Tool.schema`
is the transformers function-calling form (``{"type": "function", "function":
{"name", "description", "parameters"}}``) that ``apply_chat_template(tools=...)``
takes. Tools are named in profiles by a registered name (:data:`TOOLS`:
``calculator``, ``python``, ``search``), by ``"module:attr"`` (a Tool, or a
function returning one), or given as Tool objects in Python.

:func:`run_tool` executes one call with every failure turned into a
:class:`ToolOutcome` (never an exception): arguments checked against the
schema, a wall-clock timeout, a cap on the result's size. A tool with
``pass_context=True`` receives a :class:`ToolContext` (the env's task and
current problem, the calling agent) as its first argument; the ``search``
tool uses it to reach the task's corpus.

Timeouts: a tool runs in a daemon thread and the env stops waiting after
``timeout`` seconds (the call is reported as timed out). Python cannot kill a
thread, so a tool that ignores time keeps its thread until it returns: tools
that run untrusted or unbounded work must do it in a process with a hard kill,
as the ``python`` tool does through :mod:`marft_envs.sandbox`; the built-in
calculator bounds its own work.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from marft_envs.tools.schema import check_schema, validate

__all__ = [
    "BUILTIN_TOOLS",
    "TOOLS",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "ToolTimeoutError",
    "register_tool",
    "resolve_tool",
    "resolve_tools",
    "run_tool",
]

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class ToolError(Exception):
    """Raised by a tool for a bad request; its message goes back to the agent as is."""


class ToolTimeoutError(ToolError):
    """Raised by a tool whose own work ran out of time (e.g. a sandboxed program was killed)."""


@dataclass(frozen=True)
class ToolContext:
    """What a ``pass_context`` tool may read about the episode.

    Attributes:
        task: the env's task.
        problem: the current problem.
        agent: the calling agent.
    """

    task: Any
    problem: Any
    agent: str


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Tool:
    """One callable tool.

    Attributes:
        name: what the model writes in a call (letters, digits, ``_``, ``-``).
        description: one or two sentences for the model.
        parameters: JSON schema of the arguments object (``type: object``; the
            subset in :mod:`marft_envs.tools.schema`).
        fn: the callable, called as ``fn(**arguments)`` (or ``fn(context, **arguments)``
            with ``pass_context``); returns anything ``str()`` can show.
        pass_context: give ``fn`` a :class:`ToolContext` first.
        timeout: seconds to wait for a result (``None``: the env's default).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any] = field(compare=False)
    pass_context: bool = False
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not set(self.name) <= _NAME_CHARS or len(self.name) > 64:
            raise ValueError(f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-'")
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError(f"tool {self.name!r} needs a description (the model reads it)")
        if not callable(self.fn):
            raise TypeError(f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        check_schema(self.parameters, f"tool {self.name!r} parameters")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema with type 'object'")
        if self.timeout is not None and not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise ValueError(f"tool {self.name!r}: timeout must be a positive number of seconds")
        object.__setattr__(self, "parameters", _freeze(self.parameters))

    def schema(self) -> dict[str, Any]:
        """The transformers function-calling schema (a fresh, JSON-safe dict)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": _thaw(self.parameters)},
        }

    def __reduce__(self) -> tuple[Any, ...]:
        # MappingProxyType does not pickle: rebuild from plain data.
        return (Tool, (self.name, self.description, _thaw(self.parameters), self.fn, self.pass_context, self.timeout))

    def __deepcopy__(self, memo: dict[int, Any]) -> Tool:
        return self  # frozen: a copy is the same tool


#: The built-in tools by name, as lazy ``"module:attr"`` factories (the algorithm registry's
#: style): naming one imports :mod:`marft_envs.tools.builtin` only then, and this module
#: imports no tool module, so it sits in no import circle.
BUILTIN_TOOLS: dict[str, str] = {
    "calculator": "marft_envs.tools.builtin:calculator_tool",
    "python": "marft_envs.tools.builtin:python_tool",
    "search": "marft_envs.tools.builtin:search_tool",
}

#: Registered tools by name: a Tool, a zero-argument factory returning one, or the
#: ``"module:attr"`` path of either (the built-ins start here as such paths).
TOOLS: dict[str, Tool | Callable[[], Tool] | str] = dict(BUILTIN_TOOLS)


def _load(path: str) -> Any:
    """The object a ``"module:attr"`` path names (its module imported on demand)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def register_tool(tool: Tool | Callable[[], Tool], name: str | None = None) -> None:
    """Make ``tool`` nameable in profiles (a factory is called when an env is made)."""
    key = name or getattr(tool, "name", None)
    if not isinstance(key, str) or not key:
        raise ValueError("give name= when registering a tool factory")
    TOOLS[key] = tool


def resolve_tool(spec: Tool | str) -> Tool:
    """A Tool from a Tool, a registered name or ``"module:attr"`` (a Tool or a factory)."""
    if isinstance(spec, Tool):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a tool is given by name, 'module:attr' or as a Tool, got {type(spec).__name__}")
    if spec in TOOLS:
        obj: Any = TOOLS[spec]
        if isinstance(obj, str):
            obj = _load(obj)
    elif ":" in spec:
        obj = _load(spec)
    else:
        raise ValueError(f"unknown tool {spec!r}; registered tools: {sorted(TOOLS)}, or give 'module:attr'")
    tool = obj if isinstance(obj, Tool) else obj()
    if not isinstance(tool, Tool):
        raise TypeError(f"tool {spec!r} resolved to {type(tool).__name__}, not a Tool")
    return tool


def resolve_tools(specs: Sequence[Tool | str]) -> tuple[Tool, ...]:
    """Tools from their specs; two tools with one name are refused."""
    tools = tuple(resolve_tool(s) for s in specs)
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tool names must be unique per agent, repeated: {dup}")
    return tools


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one call as the agent will see it.

    ``error`` is one of ``None`` (success), ``"malformed_tool_call"``,
    ``"unknown_tool"``, ``"bad_tool_arguments"``, ``"tool_raised"``,
    ``"tool_timeout"``, ``"tool_budget_exhausted"``; ``truncated`` says the
    content was cut to the size cap.
    """

    name: str
    arguments: dict[str, Any]
    content: str
    error: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """The tool ran and returned."""
        return self.error is None

    def to_info(self) -> dict[str, Any]:
        """JSON-safe summary for ``info`` (arguments shortened)."""
        args = repr(self.arguments)
        return {"name": self.name, "arguments": args if len(args) <= 200 else args[:197] + "...",
                "ok": self.ok, "error": self.error, "truncated": self.truncated}


def _cap(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    note = f"\n[output truncated: {len(text)} characters, showing the first {max_chars}]"
    return text[:max_chars] + note, True


def run_tool(
    tool: Tool,
    arguments: Mapping[str, Any],
    *,
    context: ToolContext | None = None,
    timeout: float = 10.0,
    max_output_chars: int = 2000,
) -> ToolOutcome:
    """Validate ``arguments``, call ``tool`` under a timeout, cap the output; never raises."""
    args = dict(arguments)
    errors = validate(args, tool.parameters)
    if errors:
        msg = f"Error: bad arguments for {tool.name}: " + "; ".join(errors[:5])
        return ToolOutcome(tool.name, args, _cap(msg, max_output_chars)[0], "bad_tool_arguments")
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            call_args = (context,) if tool.pass_context else ()
            box["value"] = tool.fn(*call_args, **args)
        except BaseException as e:  # noqa: BLE001 - a tool's failure is a message to the agent
            box["error"] = e

    limit = float(tool.timeout if tool.timeout is not None else timeout)
    worker = threading.Thread(target=target, name=f"marft-tool-{tool.name}", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        return ToolOutcome(tool.name, args, f"Error: {tool.name} did not finish within {limit:g} s", "tool_timeout")
    if "error" in box:
        e = box["error"]
        detail = str(e) if isinstance(e, ToolError) else f"{type(e).__name__}: {e}"
        content, truncated = _cap(f"Error: {tool.name} failed: {detail}", max_output_chars)
        kind = "tool_timeout" if isinstance(e, ToolTimeoutError) else "tool_raised"
        return ToolOutcome(tool.name, args, content, kind, truncated)
    try:
        text = box.get("value")
        text = text if isinstance(text, str) else str(text)
    except Exception as e:  # noqa: BLE001 - an unprintable result
        return ToolOutcome(tool.name, args, f"Error: {tool.name} returned an unprintable result ({type(e).__name__})", "tool_raised")
    text = text.encode("utf-8", errors="replace").decode("utf-8")
    content, truncated = _cap(text, max_output_chars)
    return ToolOutcome(tool.name, args, content, None, truncated)
