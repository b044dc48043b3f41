"""Built-in tools: ``calculator``, ``python`` (the code sandbox) and ``search`` (the task's corpus).

=============  ==========================================  =====================================
name           arguments                                   runs
=============  ==========================================  =====================================
calculator     ``expression`` (string, <= 500 chars)       in process, bounded (no ``eval``)
python         ``code`` (string, <= 8000 chars)            :func:`marft_envs.sandbox.run_program`
search         ``query`` (string), ``k`` (1-10, default 3)  the task's retriever (BM25 by default)
=============  ==========================================  =====================================

``python`` prints what the program prints (stdout, then stderr if it failed);
the program gets :data:`PYTHON_TIMEOUT` seconds and :data:`PYTHON_MEMORY_MB` MB
in the strongest isolation the machine offers. A program that prints more than
1 MiB is stopped there and the first :data:`PYTHON_MAX_OUTPUT` bytes come back,
headed ``[output truncated: ...]``; one stopped at the timeout keeps what it printed.
``search`` needs a task with a ``search_documents(query, k, problem)`` method
(:class:`~marft_envs.tasks.rag.RAGTask`; one that also takes ``agent=`` gets the calling
agent); on other tasks it answers with an error message.

Profiles name them through :data:`marft_envs.tools.base.BUILTIN_TOOLS`, which points at the
factories below; this module registers nothing on import.
"""

from __future__ import annotations

import inspect
from typing import Any

from marft_envs.tools.base import Tool, ToolContext, ToolError, ToolTimeoutError
from marft_envs.tools.calculator import CalculatorError, calculate

__all__ = ["PYTHON_MAX_OUTPUT", "PYTHON_MEMORY_MB", "PYTHON_TIMEOUT", "calculator_tool", "python_tool", "search_tool"]

PYTHON_TIMEOUT = 5.0
PYTHON_MEMORY_MB = 512
PYTHON_MAX_OUTPUT = 16_384  # bytes of stdout (and of stderr) kept


def _calculator(expression: str) -> str:
    try:
        return calculate(expression)
    except CalculatorError as e:
        raise ToolError(str(e)) from None


def _printed(result: Any) -> str:
    """What a stopped program printed: its stdout head, then its stderr head (if any)."""
    text = result.stdout
    if result.stderr.strip():
        text += ("\n" if text and not text.endswith("\n") else "") + "[stderr]\n" + result.stderr
    return text


def _python(code: str) -> str:
    # deferred: the sandbox loads on the first python call, not at import marft_envs
    from marft_envs.sandbox import output_drain_bytes, run_program

    result = run_program(code, timeout=PYTHON_TIMEOUT, memory_mb=PYTHON_MEMORY_MB, max_output=PYTHON_MAX_OUTPUT)
    if result.output_overflow:  # killed at the drain cap: the head is the answer, flagged
        mib = output_drain_bytes(PYTHON_MAX_OUTPUT) / 2**20
        return (f"[output truncated: the program printed more than {mib:g} MiB and was stopped; "
                f"the first {PYTHON_MAX_OUTPUT} bytes of its output follow]\n{_printed(result)}")
    if result.timed_out:
        printed = _printed(result)
        raise ToolTimeoutError(f"the program ran longer than {PYTHON_TIMEOUT:g} s and was stopped"
                               + (f"; it printed:\n{printed}" if printed.strip() else ""))
    out = result.stdout
    if result.exit_code != 0:
        err = result.stderr.strip().splitlines()
        tail = "\n".join(err[-8:])
        raise ToolError(f"the program exited with status {result.exit_code}\n{out}{tail}".strip())
    return out if out.strip() else "(the program printed nothing; use print())"


def _search(context: ToolContext, query: str, k: int = 3) -> str:
    search = getattr(context.task, "search_documents", None)
    if not callable(search):
        raise ToolError("this task has no corpus to search")
    # The caller is passed on where the task takes it: the task records what each agent was shown
    # (RAGTask lets an agent name to its teammates only documents it was shown).
    takes_agent = "agent" in inspect.signature(search).parameters
    docs = search(query, int(k), context.problem, agent=context.agent) if takes_agent else search(query, int(k), context.problem)
    if not docs:
        return "No documents found."
    return "\n".join(f"[{d.id}] {d.title}: {d.text}" for d in docs)


def _arguments(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments: an object of ``properties``, no others allowed."""
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _text_tool(name: str, description: str, argument: tuple[str, int, str], **kwargs: Any) -> Tool:
    """A tool of one required string ``argument`` = ``(name, max length, description)``."""
    arg, max_length, arg_description = argument
    schema = {arg: {"type": "string", "maxLength": max_length, "description": arg_description}}
    return Tool(name=name, description=description, parameters=_arguments(schema, [arg]), **kwargs)


def calculator_tool() -> Tool:
    """The ``calculator`` tool (see :mod:`marft_envs.tools.calculator`)."""
    return _text_tool(
        "calculator",
        "Evaluate an arithmetic expression exactly, e.g. '(47 - 18) * 3' or 'sqrt(2) / 4'.",
        ("expression", 500, "the expression"),
        fn=_calculator,
    )


def python_tool() -> Tool:
    """The ``python`` tool: runs a program in the code sandbox and returns what it prints."""
    return _text_tool(
        "python",
        "Run a short Python program in a sandbox (no network, no files kept) and return what it prints.",
        ("code", 8000, "a complete Python program"),
        fn=_python,
        # the sandbox kills the program at PYTHON_TIMEOUT; the margin covers process start-up
        timeout=PYTHON_TIMEOUT + 25.0,
    )


def search_tool() -> Tool:
    """The ``search`` tool: the task's retriever over its local corpus."""
    return Tool(
        name="search",
        description="Search the document collection; returns the best-matching documents as '[id] title: text'.",
        parameters=_arguments(
            {
                "query": {"type": "string", "minLength": 1, "maxLength": 500, "description": "what to look for"},
                "k": {"type": "integer", "minimum": 1, "maximum": 10, "description": "how many documents (default 3)"},
            },
            ["query"],
        ),
        fn=_search,
        pass_context=True,
    )
