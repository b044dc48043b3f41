"""Tool-call parsers: find the calls in a model's reply, per model family.

A parser turns one generated segment into a :class:`ParseResult`: the calls it
found (each with its arguments, or the reason it could not be read) and the
text around them. The default is the Hermes/Qwen syntax that Qwen2.5's and
many other chat templates teach::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 7"}}
    </tool_call>

Registered parsers (:data:`PARSERS`; add one with :func:`register_parser`):

``hermes``
    ``<tool_call>{json}</tool_call>`` blocks; an opening tag without a closing
    one runs to the end of the text (a model cut off by a stop string).
``json``
    A bare JSON object ``{"name": ..., "arguments"|"parameters": {...}}`` as the
    whole reply (Llama-3.x JSON tool calls).
``mistral``
    ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``.

Parsers never raise on model text: what cannot be read becomes a call with
``error`` set (``malformed_tool_call``), which the env reports back to the agent.
Names and arguments are valid Unicode: a lone surrogate written as a JSON escape
(``"\\ud800"``) becomes U+FFFD, so it cannot reach a chat message or a tokenizer.
Each parser also writes the instructions that describe the tools and the call
syntax in plain text (:meth:`ToolCallParser.instructions`), for chat templates
that do not render ``tools=`` themselves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_CALLS",
    "PARSERS",
    "HermesParser",
    "JsonParser",
    "MistralParser",
    "ParseResult",
    "ToolCall",
    "ToolCallParser",
    "get_parser",
    "register_parser",
]

_MAX_CALL_CHARS = 16_384  # a call's JSON longer than this is refused unread
#: Calls read from one segment at most (the env's tool budget is usually far smaller).
MAX_CALLS = 64


@dataclass(frozen=True)
class ToolCall:
    """One call found in a segment.

    Attributes:
        name: the tool name (``""`` when unreadable).
        arguments: the parsed arguments (``{}`` when unreadable).
        raw: the call's text as the model wrote it (at most 200 characters kept).
        error: why the call could not be read (``None``: it parsed).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    error: str | None = None


@dataclass(frozen=True)
class ParseResult:
    """The calls of a segment and its text outside them."""

    calls: tuple[ToolCall, ...]
    content: str

    @property
    def has_calls(self) -> bool:
        """Whether the segment holds at least one call (readable or not)."""
        return bool(self.calls)


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _valid_unicode(value: Any) -> Any:
    """``value`` with lone surrogates (JSON ``"\\ud800"`` escapes) replaced by U+FFFD, in
    every string, key and nested value: names and arguments must be valid UTF-8 downstream
    (chat messages, tokenizers, logs)."""
    if isinstance(value, str):
        return _SURROGATE_RE.sub("\ufffd", value)
    if isinstance(value, Mapping):
        return {_valid_unicode(k): _valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_unicode(v) for v in value]
    return value


def _call_from_obj(obj: Any, raw: str, args_keys: Sequence[str] = ("arguments", "parameters")) -> ToolCall:
    raw = _valid_unicode(raw[:200])
    try:
        obj = _valid_unicode(obj)
    except RecursionError:
        return ToolCall("", {}, raw, "the call's JSON is nested too deeply")
    if not isinstance(obj, Mapping):
        return ToolCall("", {}, raw, f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCall("", {}, raw, 'a tool call needs a "name" string')
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = _valid_unicode(json.loads(args))
        except (ValueError, RecursionError):
            return ToolCall(name.strip(), {}, raw, '"arguments" is a string that is not a JSON object')
    if not isinstance(args, Mapping):
        return ToolCall(name.strip(), {}, raw, f'"arguments" must be a JSON object, got {type(args).__name__}')
    return ToolCall(name.strip(), dict(args), raw)


def _loads(text: str) -> tuple[Any, str | None]:
    if len(text) > _MAX_CALL_CHARS:
        return None, f"the call is {len(text)} characters long (at most {_MAX_CALL_CHARS})"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "the call's JSON is nested too deeply"
    except ValueError as e:
        return None, f"the call is not valid JSON ({e})"


class ToolCallParser:
    """Base class: subclasses set ``name`` and implement :meth:`parse`."""

    name = "base"

    def parse(self, text: str) -> ParseResult:
        """The calls in ``text``; never raises."""
        raise NotImplementedError

    def example(self, name: str, arguments: Mapping[str, Any]) -> str:
        """How a call to ``name`` with ``arguments`` is written in this syntax."""
        raise NotImplementedError

    def instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        """Plain-text tool descriptions plus the call syntax (for templates without ``tools=``)."""
        lines = ["You can call these tools (JSON schemas):"]
        lines += [json.dumps(s, ensure_ascii=False) for s in schemas]
        first = schemas[0]["function"] if schemas else {"name": "tool"}
        props = (first.get("parameters") or {}).get("properties") or {}
        example = {k: "..." for k in list(props)[:2]}
        lines.append(
            "To call a tool, write exactly:\n"
            + self.example(first["name"], example)
            + "\nThe result comes back in a tool message; then continue. "
            "Write your final reply without a tool call."
        )
        return "\n".join(lines)


class HermesParser(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5, ...)."""

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)

    def parse(self, text: str) -> ParseResult:
        """Every ``<tool_call>`` block; the content is the text outside the blocks."""
        calls: list[ToolCall] = []
        for m in self._BLOCK.finditer(text):
            if len(calls) >= MAX_CALLS:
                break
            body = m.group(1).strip()
            if "<tool_call>" in body:
                calls.append(ToolCall("", {}, body[:200], "a <tool_call> inside another one: write one call per block"))
                continue
            obj, err = _loads(body)
            calls.append(ToolCall("", {}, body[:200], err) if err else _call_from_obj(obj, body))
        content = self._BLOCK.sub("", text).strip() if calls else text
        return ParseResult(tuple(calls), content)

    def example(self, name: str, arguments: Mapping[str, Any]) -> str:
        """``<tool_call>`` block with one JSON object."""
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(arguments)}) + "\n</tool_call>"


class JsonParser(ToolCallParser):
    """A reply that is one JSON object with ``name`` and ``arguments``/``parameters`` (Llama 3.x)."""

    name = "json"

    def parse(self, text: str) -> ParseResult:
        """A call only if the stripped reply starts with ``{"name"`` (other text is a reply)."""
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>"):].strip()
        if not re.match(r'\{\s*"name"\s*:', body):
            return ParseResult((), text)
        obj, err = _loads(body)
        call = ToolCall("", {}, body[:200], err) if err else _call_from_obj(obj, body)
        return ParseResult((call,), "")

    def example(self, name: str, arguments: Mapping[str, Any]) -> str:
        """One JSON object, nothing else."""
        return json.dumps({"name": name, "parameters": dict(arguments)})


class MistralParser(ToolCallParser):
    """``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (Mistral)."""

    name = "mistral"
    _TAG = "[TOOL_CALLS]"

    def parse(self, text: str) -> ParseResult:
        """The JSON list after ``[TOOL_CALLS]``; text before it is the content."""
        at = text.find(self._TAG)
        if at < 0:
            return ParseResult((), text)
        body = text[at + len(self._TAG):].strip()
        obj, err = _loads(body)
        if err:
            return ParseResult((ToolCall("", {}, body[:200], err),), text[:at].strip())
        items = obj if isinstance(obj, list) else [obj]
        calls = tuple(_call_from_obj(o, json.dumps(o)[:200] if not isinstance(o, str) else o) for o in items[:MAX_CALLS])
        if not calls:
            calls = (ToolCall("", {}, body[:200], "[TOOL_CALLS] with an empty list"),)
        return ParseResult(calls, text[:at].strip())

    def example(self, name: str, arguments: Mapping[str, Any]) -> str:
        """``[TOOL_CALLS]`` and a JSON list of calls."""
        return self._TAG + " " + json.dumps([{"name": name, "arguments": dict(arguments)}])


#: Parser name -> factory. ``hermes`` is the default.
PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "json": JsonParser,
    "mistral": MistralParser,
}


def register_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    """Add (or replace) a parser for a model family."""
    if not isinstance(name, str) or not name:
        raise ValueError("a parser needs a non-empty name")
    PARSERS[name] = factory


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """A parser by name (or the parser itself)."""
    if isinstance(name, ToolCallParser):
        return name
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {sorted(PARSERS)} (or register_parser())")
    return PARSERS[name]()
