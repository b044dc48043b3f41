"""The OpenAI chat-completions wire format: requests in, engine requests out, replies back.

:func:`parse_chat_request` checks a request body and turns it into a :class:`ChatCall`
(the role, the exact prompt token ids, the sampling settings); :func:`completion_body`
and :func:`stream_chunks` write the engine's results in the OpenAI shape. Nothing here
touches the network or the engine, so every rule is testable on its own.

Encoding: message contents are encoded as literal text (special-token strings inside a
message stay plain text, :func:`~marft_algos.models.chat.encode_chat`), so a program's
user text cannot forge turns. Tool schemas go through the chat template's ``tools=`` when
the template renders them; otherwise the tool-call parser's plain-text instructions are
added to the system message, as :class:`~marft_envs.text_env.TextTeamEnv` does. An
assistant message that carried ``tool_calls`` is re-rendered in the model's own call
syntax (what it sampled), and ``tool`` messages keep their role: those tokens are prompt
of the next call.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marft_algos.models.chat import encode_chat, template_uses_tools
from marft_algos.models.sampling import GenRequest, GenResult, SamplingParams
from marft_envs.tools.parsers import ToolCallParser

__all__ = [
    "DEFAULT_LIMITS",
    "ChatCall",
    "Limits",
    "OpenAIError",
    "completion_body",
    "error_body",
    "parse_chat_request",
    "stream_chunks",
]

_ROLES = ("system", "developer", "user", "assistant", "tool")
#: request fields that would change what is sampled but are not implemented: refused, never ignored
_UNSUPPORTED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "top_logprobs": 0,
    "functions": None,
    "function_call": None,
}


class OpenAIError(Exception):
    """A request error with its HTTP status, in the OpenAI error shape (:func:`error_body`)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type_


def error_body(err: OpenAIError) -> dict[str, Any]:
    """``{"error": {message, type, param, code}}``, what OpenAI clients parse."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


@dataclass(frozen=True)
class Limits:
    """Caps on what one request may ask for (bad input is refused before any work).

    Attributes:
        max_body_bytes: request body size (HTTP 413 above it).
        max_messages: messages per request.
        max_n: completions per request (``n``).
        max_tools: tool schemas per request.
        default_max_tokens: new tokens when the request sets neither ``max_tokens`` nor
            ``max_completion_tokens`` (cut to what the context window leaves).
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 512
    max_n: int = 16
    max_tools: int = 128
    default_max_tokens: int = 512


#: the caps a server uses unless given others
DEFAULT_LIMITS = Limits()


@dataclass
class ChatCall:
    """One checked chat-completion request, ready for the engine.

    Attributes:
        role: the team role (the request's ``model``).
        messages: the messages as encoded (text contents, tool calls re-rendered).
        prompt_ids: the exact prompt token ids.
        sampling: the sampling settings (stop strings included).
        n: completions asked for.
        seed: the request's seed (None: unseeded).
        tools: the tool schemas in effect (empty with ``tool_choice="none"``).
        logprobs: return per-token log-probs.
        stream: answer as server-sent events.
        include_usage: a last stream chunk with ``usage`` (``stream_options``).
    """

    role: str
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    sampling: SamplingParams
    n: int = 1
    seed: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False

    def engine_request(self) -> GenRequest:
        """The engine request (``n`` samples share one prefill)."""
        return GenRequest(self.role, list(self.prompt_ids), self.sampling, n=self.n)


def _bad(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _utf8(text: str, where: str) -> str:
    """``text`` if it is encodable (JSON allows lone surrogates; no tokenizer does)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{where}: the content is not valid UTF-8 text (a lone surrogate such as \\ud800)", where) from None
    return text


def _text_of(content: Any, where: str) -> str:
    """A message content as text: a string, None, or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _utf8(content, where)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise _bad(f"{where}: only text content parts are supported, got {kind!r}", where)
        return _utf8("".join(parts), where)
    raise _bad(f"{where}: content must be a string, null or a list of text parts", where)


def _calls_as_text(calls: Any, parser: ToolCallParser, where: str) -> str:
    """An assistant message's ``tool_calls`` in the model's own call syntax."""
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be a list", where)
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.tool_calls[{k}] needs function.name", where)
        args: Any = fn.get("arguments") or "{}"
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise _bad(f"{where}.tool_calls[{k}].function.arguments is not JSON", where) from None
        if not isinstance(args, Mapping):
            raise _bad(f"{where}.tool_calls[{k}].function.arguments must be a JSON object", where)
        out.append(parser.example(fn["name"], args))
    return "\n".join(out)


def normalize_messages(raw: Any, parser: ToolCallParser, limits: Limits) -> list[dict[str, str]]:
    """OpenAI messages as ``[{"role", "content"}]`` text messages (see the module docstring)."""
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty list", "messages")
    if len(raw) > limits.max_messages:
        raise _bad(f"{len(raw)} messages; at most {limits.max_messages} per request", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise _bad(f"{where} must be an object", where)
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(f"{where}.role must be one of {list(_ROLES)}, got {role!r}", where)
        text = _text_of(m.get("content"), where)
        if role == "assistant" and m.get("tool_calls"):
            calls = _calls_as_text(m["tool_calls"], parser, where)
            text = f"{text}\n{calls}" if text else calls
        out.append({"role": "system" if role == "developer" else role, "content": text})
    return out


def _check_tools(raw: Any, limits: Limits) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("tools must be a list", "tools")
    if len(raw) > limits.max_tools:
        raise _bad(f"{len(raw)} tools; at most {limits.max_tools}", "tools")
    for k, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{k}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}", "tools")
    return [dict(t) for t in raw]


def _with_instructions(messages: list[dict[str, str]], text: str) -> list[dict[str, str]]:
    """The tool instructions in the system message (a new first one if there is none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{text}" if first else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(f"{key} must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise _bad(f"{key} must be an integer {span}, got {v!r}", key)
    return v


def parse_chat_request(
    body: Any,
    *,
    roles: Sequence[str],
    tokenizer_of: Any,
    max_context_of: Any,
    parser: ToolCallParser,
    limits: Limits = DEFAULT_LIMITS,
    role_defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> ChatCall:
    """Check a request body and encode its prompt; raises :class:`OpenAIError`.

    ``tokenizer_of(role)`` / ``max_context_of(role)`` give the role's tokenizer and
    context window (``tokenizer_of=None``: no prompt is encoded, ``prompt_ids`` stays
    empty, for a program env whose collector encodes ``env.messages()`` itself); ``role_defaults[role]`` sampling defaults (``temperature``,
    ``top_p``, ``max_new_tokens``, ``stop``) for what the request leaves unset.
    """
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    role = body.get("model")
    if not isinstance(role, str) or not role:
        raise _bad("model (the team role) is required", "model")
    if role not in roles:
        raise OpenAIError(404, f"the model {role!r} does not exist: the models here are the team's roles {list(roles)}",
                          code="model_not_found", param="model")
    for key, neutral in _UNSUPPORTED.items():
        if body.get(key) not in (None, neutral, {}, False):
            raise _bad(f"{key} is not supported by this server (leave it unset)", key)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise _bad("response_format other than {'type': 'text'} is not supported (no constrained decoding)", "response_format")
    defaults = dict((role_defaults or {}).get(role, {}))
    parser_msgs = normalize_messages(body.get("messages"), parser, limits)
    _utf8(json.dumps({k: body.get(k) for k in ("tools", "tool_choice", "stop")}, ensure_ascii=False), "tools/stop")
    tools = _check_tools(body.get("tools"), limits)
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto", "required") and not (
        isinstance(choice, Mapping) and isinstance((choice.get("function") or {}).get("name"), str)
    ):
        raise _bad("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    if choice == "none":
        tools = []
    messages = parser_msgs
    if tokenizer_of is None:  # a program env: the collector encodes env.messages() itself
        return _call_without_prompt(body, role, messages, tools, limits, defaults)
    tok = tokenizer_of(role)
    template_tools: list[dict[str, Any]] | None = None
    if tools:
        if template_uses_tools(tok, tools):
            template_tools = tools
        else:
            text = parser.instructions(tools)
            if isinstance(choice, Mapping):
                text += f"\nCall the tool {choice['function']['name']!r} now."
            elif choice == "required":
                text += "\nCall a tool now."
            messages = _with_instructions(parser_msgs, text)
    try:
        prompt_ids = encode_chat(tok, messages, add_generation_prompt=True, tools=template_tools)
    except Exception as e:  # a template that refuses these messages (e.g. roles out of order)
        raise _bad(f"the chat template of role {role!r} cannot render these messages: {e}", "messages") from None
    stop, n, seed, asked = _common(body, limits, defaults)
    window = int(max_context_of(role))
    room = window - len(prompt_ids)
    if asked is not None and len(prompt_ids) + asked > window or room < 1:
        want = asked if asked is not None else 1
        raise _bad(
            f"this model's context window is {window} tokens; the messages are {len(prompt_ids)} tokens and "
            f"{want} new tokens were asked for ({len(prompt_ids) + want} > {window}): shorten the messages "
            "or lower max_tokens", "messages", code="context_length_exceeded")
    max_new = asked if asked is not None else min(int(defaults.get("max_new_tokens", limits.default_max_tokens)), room)
    return _call(body, role, messages, prompt_ids, tools, max_new, stop, n, seed, defaults)


def _common(body: Mapping[str, Any], limits: Limits, defaults: Mapping[str, Any]) -> tuple[Any, int, int | None, int | None]:
    """``(stop, n, seed, max new tokens asked for)`` of a request, checked."""
    stop = body.get("stop", defaults.get("stop"))
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > 16 or not all(isinstance(s, str) for s in stop)):
        raise _bad("stop must be a string or a list of at most 16 strings", "stop")
    n = _int(body, "n", 1, limits.max_n) or 1
    seed = _int(body, "seed", -(2**63))
    asked = _int(body, "max_completion_tokens", 1)
    if asked is None:
        asked = _int(body, "max_tokens", 1)
    return stop, n, seed, asked


def _call(body: Mapping[str, Any], role: str, messages: list[dict[str, str]], prompt_ids: list[int],
          tools: list[dict[str, Any]], max_new: int, stop: Any, n: int, seed: int | None,
          defaults: Mapping[str, Any]) -> ChatCall:
    temperature = _number(body, "temperature", 0.0, 2.0, float(defaults.get("temperature", 1.0)))
    top_p = _number(body, "top_p", 1e-9, 1.0, float(defaults.get("top_p", 1.0)))
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new, stop=stop or None)
    if seed is not None:
        seed %= 2**63
    opts = body.get("stream_options") or {}
    return ChatCall(
        role=role, messages=messages, prompt_ids=prompt_ids, sampling=sampling, n=n, seed=seed, tools=tools,
        logprobs=bool(body.get("logprobs") or False), stream=bool(body.get("stream") or False),
        include_usage=bool(isinstance(opts, Mapping) and opts.get("include_usage")),
    )


def _call_without_prompt(body: Mapping[str, Any], role: str, messages: list[dict[str, str]], tools: list[dict[str, Any]],
                         limits: Limits, defaults: Mapping[str, Any]) -> ChatCall:
    """A checked call whose prompt is encoded by someone else (``prompt_ids`` empty)."""
    stop, n, seed, asked = _common(body, limits, defaults)
    if n != 1:
        raise _bad("n must be 1 in a training episode (each call is one transition)", "n")
    max_new = asked if asked is not None else int(defaults.get("max_new_tokens", limits.default_max_tokens))
    return _call(body, role, messages, [], tools, max_new, stop, n, seed, defaults)


# ---- replies -------------------------------------------------------------------------

_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


def _cut_at_stop(text: str, stops: Sequence[str] | None) -> str:
    """The text before the first stop string (OpenAI leaves the stop text out of content)."""
    hits = [text.find(s) for s in stops or () if s in text]
    return text[: min(hits)] if hits else text


def _choice(call: ChatCall, res: GenResult, index: int, parser: ToolCallParser, tokenizer: Any) -> dict[str, Any]:
    text = _cut_at_stop(res.text, call.sampling.stop) if res.finish_reason == "stop" else res.text
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = _FINISH.get(res.finish_reason, "stop")
    if call.tools:
        parsed = parser.parse(text)
        good = [c for c in parsed.calls if c.error is None]
        if good:
            message["content"] = parsed.content or None
            message["tool_calls"] = [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for c in good
            ]
            finish = "tool_calls"
    out: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish, "logprobs": None}
    if call.logprobs and tokenizer is not None:
        out["logprobs"] = {"content": [
            {"token": (piece := tokenizer.decode([t])), "logprob": float(lp),
             "bytes": list(piece.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(res.token_ids, res.logprobs, strict=True)
        ]}
    return out


def _usage(call: ChatCall, results: Sequence[GenResult]) -> dict[str, int]:
    done = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": len(call.prompt_ids), "completion_tokens": done, "total_tokens": len(call.prompt_ids) + done}


def completion_body(call: ChatCall, results: Sequence[GenResult], parser: ToolCallParser, tokenizer: Any) -> dict[str, Any]:
    """The ``chat.completion`` object for ``results`` (one per choice)."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.role,
        "choices": [_choice(call, r, i, parser, tokenizer) for i, r in enumerate(results)],
        "usage": _usage(call, results),
        "system_fingerprint": None,
    }


def stream_chunks(call: ChatCall, results: Sequence[GenResult], parser: ToolCallParser, tokenizer: Any) -> Iterator[str]:
    """The server-sent events of a streamed reply, ``data: [DONE]`` last.

    The engine returns whole completions, so each choice is sent as a role chunk, one
    content chunk (with its log-probs), its tool calls, and a chunk with ``finish_reason``.
    """
    full = completion_body(call, results, parser, tokenizer)
    head = {"id": full["id"], "object": "chat.completion.chunk", "created": full["created"], "model": call.role,
            "system_fingerprint": None}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return "data: " + json.dumps({**head, "choices": choices, **extra}, ensure_ascii=False) + "\n\n"

    for ch in full["choices"]:
        i, msg = ch["index"], ch["message"]
        yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        if msg.get("content"):
            yield event([{"index": i, "delta": {"content": msg["content"]}, "logprobs": ch["logprobs"], "finish_reason": None}])
        for k, tc in enumerate(msg.get("tool_calls") or []):
            yield event([{"index": i, "delta": {"tool_calls": [{"index": k, **tc}]}, "logprobs": None, "finish_reason": None}])
        yield event([{"index": i, "delta": {}, "logprobs": None, "finish_reason": ch["finish_reason"]}])
    if call.include_usage:
        yield event([], usage=full["usage"])
    yield "data: [DONE]\n\n"
