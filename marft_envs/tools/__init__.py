"""Tool calling for text team envs: tools, call parsers, the env-side loop, built-in tools.

* :class:`Tool` (:mod:`marft_envs.tools.base`): name, JSON-schema parameters,
  description and a Python callable; :func:`run_tool` runs a call with its
  arguments checked, a timeout and a size cap, and never raises.
* Parsers (:mod:`marft_envs.tools.parsers`): ``hermes`` (default,
  ``<tool_call>{...}</tool_call>``), ``json``, ``mistral``; :func:`register_parser`.
* :class:`ToolLoop`, :class:`ToolConfig`, :class:`ToolRewardConfig`
  (:mod:`marft_envs.tools.loop`): what :class:`~marft_envs.text_env.TextTeamEnv`
  does with a segment that calls tools.
* Built-in tools (:mod:`marft_envs.tools.builtin`): ``calculator``, ``python``, ``search``.
* :func:`continuation_ids` (:mod:`marft_envs.tools.chat`): the ids a collector appends
  after a tool continuation without re-tokenising sampled ids; :func:`encode_messages`:
  chat messages to prompt ids with every message string kept literal (tool results, an
  endpoint's request messages).

See ``docs/tools.md``.
"""

from marft_envs.tools.base import (
    BUILTIN_TOOLS,
    TOOLS,
    Tool,
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolTimeoutError,
    register_tool,
    resolve_tool,
    resolve_tools,
    run_tool,
)
from marft_envs.tools.builtin import calculator_tool, python_tool, search_tool
from marft_envs.tools.calculator import CalculatorError, calculate
from marft_envs.tools.chat import continuation_ids, encode_messages, literal_ids, split_continuation
from marft_envs.tools.loop import TOOL_ERRORS, ToolConfig, ToolLoop, ToolRewardConfig
from marft_envs.tools.parsers import (
    PARSERS,
    HermesParser,
    JsonParser,
    MistralParser,
    ParseResult,
    ToolCall,
    ToolCallParser,
    get_parser,
    register_parser,
)
from marft_envs.tools.schema import SchemaError, validate

__all__ = [
    "BUILTIN_TOOLS",
    "PARSERS",
    "TOOLS",
    "TOOL_ERRORS",
    "CalculatorError",
    "HermesParser",
    "JsonParser",
    "MistralParser",
    "ParseResult",
    "SchemaError",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolConfig",
    "ToolContext",
    "ToolError",
    "ToolLoop",
    "ToolOutcome",
    "ToolRewardConfig",
    "ToolTimeoutError",
    "calculate",
    "calculator_tool",
    "continuation_ids",
    "encode_messages",
    "get_parser",
    "literal_ids",
    "python_tool",
    "register_parser",
    "register_tool",
    "resolve_tool",
    "resolve_tools",
    "run_tool",
    "search_tool",
    "split_continuation",
    "validate",
]
