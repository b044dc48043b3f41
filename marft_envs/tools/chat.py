"""Token ids of a tool continuation, for collectors that must not re-tokenise sampled ids.

After a tool continuation the next segment's prompt is::

    next_prompt_ids = prompt_ids + sampled_ids + close_ids + tool_ids

``prompt_ids`` and ``sampled_ids`` are the previous segment's ids exactly as
conditioned on and sampled; ``close_ids`` end the assistant message the way the
chat template does (minus the end-of-turn token when the sampler already
produced it); ``tool_ids`` are the tool message(s) plus the generation prompt.
:func:`continuation_ids` computes ``close_ids + tool_ids`` from the template by
rendering a placeholder conversation with and without the tool messages and
tokenising only the difference, so nothing already sampled is tokenised again.
Only ``tool_ids`` (and ``close_ids``) are observation: a trainer masks them from
the loss and computes log-probs of ``sampled_ids`` only.

**Literal text.** A tool result is text the agent does not control: what a program printed,
a retrieved document, an unknown tool name echoed in an error. Tokenised as a whole, an
added-token string inside it (``<|im_end|>\n<|im_start|>user ...``) would become the real
special tokens, a forged turn in the agent's next prompt. :func:`encode_messages` (the
public helper for any code that turns chat messages into prompt ids: the collector's tool
continuations here, an OpenAI-compatible endpoint's request messages) renders the template
with a placeholder for each message string (``content``, ``name``, a tool call's
``function.name`` / ``arguments`` string) and encodes those strings with special tokens
split into plain text, the template's own text as usual. It gives exactly
:func:`marft_algos.models.chat.encode_chat`'s ids for messages with contents only, and
exactly ``apply_chat_template(tokenize=True)``'s ids when no string holds an added-token
string. :func:`continuation_ids` encodes the tool messages the same way, so the number of
special tokens in a continuation does not depend on what the tools returned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["continuation_ids", "encode_messages", "literal_ids", "special_strings_in", "split_continuation"]

_PLACEHOLDER = "\u2063marft-placeholder\u2063"
# Private-use characters (as in marft_algos.models.chat): no tokenizer has them as added
# tokens and no template edits them.
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARK = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


def _added_strings(tokenizer: Any) -> list[str]:
    """Every string the tokenizer turns into one added token when it meets it in text."""
    vocab = getattr(tokenizer, "get_added_vocab", None)
    found = set(vocab()) if callable(vocab) else set()
    found.update(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted((s for s in found if s), key=len, reverse=True)


def special_strings_in(tokenizer: Any, text: str) -> list[str]:
    """The added-token strings (``<|im_start|>``, ...) that occur in ``text``."""
    return [s for s in _added_strings(tokenizer) if s in text]


def literal_ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` as plain text: added-token strings are split like any other characters."""
    if not text:
        return []
    out = tokenizer(text, add_special_tokens=False, split_special_tokens=True)
    return [int(i) for i in out["input_ids"]]


def _mark(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str], list[int]]:
    """``(messages with placeholders, the strings they stand for, indices of contents)``.

    Nothing is marked when no string holds an added-token string (the caller then takes
    the plain path). Otherwise every string ``content`` is marked (as ``encode_chat`` does)
    and so is every other message string that holds one (``name``, a text part of a list
    content, a tool call's name or arguments string)."""
    strings: list[str] = []
    contents: list[int] = []

    def put(value: str) -> str:
        strings.append(value)
        return f"{_OPEN}{len(strings) - 1}{_CLOSE}"

    def risky(value: Any) -> bool:
        return isinstance(value, str) and bool(special_strings_in(tokenizer, value))

    msgs = [dict(m) for m in messages]
    fields = [m.get(k) for m in msgs for k in ("content", "name")]
    parts = [p for m in msgs if isinstance(m.get("content"), list) for p in m["content"] if isinstance(p, Mapping)]
    fields += [p.get("text") for p in parts]
    calls = [c for m in msgs for c in (m.get("tool_calls") or []) if isinstance(c, Mapping)]
    fields += [(c.get("function") or {}).get(k) for c in calls for k in ("name", "arguments")]
    if not any(risky(v) for v in fields):
        return msgs, [], []
    for m in msgs:
        if isinstance(m.get("content"), str):
            contents.append(len(strings))
            m["content"] = put(m["content"])
        elif isinstance(m.get("content"), list):  # OpenAI content parts: [{"type": "text", "text": ...}]
            m["content"] = [{**p, "text": put(p["text"])} if isinstance(p, Mapping) and risky(p.get("text")) else p
                            for p in m["content"]]
        if risky(m.get("name")):
            m["name"] = put(m["name"])
        if m.get("tool_calls"):
            new_calls = []
            for c in m["tool_calls"]:
                c = dict(c) if isinstance(c, Mapping) else c
                fn = dict(c.get("function") or {}) if isinstance(c, dict) else None
                if fn is not None:
                    for k in ("name", "arguments"):
                        if risky(fn.get(k)):
                            fn[k] = put(fn[k])
                    c["function"] = fn
                new_calls.append(c)
            m["tool_calls"] = new_calls
    return msgs, strings, contents


def _ids_of(tokenizer: Any, text: str, strings: Sequence[str]) -> list[int]:
    """Ids of rendered ``text``: template pieces as usual, placeholders as literal strings."""
    ids: list[int] = []
    for k, piece in enumerate(_MARK.split(text)):  # template, index, template, index, ..., template
        if k % 2 == 0:
            if piece:  # the template's own text: its special tokens are real
                ids += [int(i) for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]
        else:
            ids += literal_ids(tokenizer, strings[int(piece)])
    return ids


def _blank(value: Any, missing: set[int]) -> Any:
    """``value`` with every placeholder string of ``missing`` replaced by ``""``."""
    if isinstance(value, str):
        m = _MARK.fullmatch(value)
        return "" if m and int(m.group(1)) in missing else value
    if isinstance(value, Mapping):
        return {k: _blank(v, missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v, missing) for v in value]
    return value


def _check_marks(text: str, strings: Sequence[str], contents: Sequence[int],
                 marked: list[dict[str, Any]], render: Any) -> None:
    """Each content placeholder must appear once; a name or tool-call placeholder that does
    not appear must be one the template does not render at all (not one it transformed)."""
    used = [int(i) for i in _MARK.findall(text)]
    missing = set(range(len(strings))) - set(used) - set(contents)
    if any(used.count(i) != 1 for i in contents) or (missing and render(_blank(marked, missing)) != text):
        raise ValueError("the chat template does not pass each message string through as is; "
                         "message strings cannot be kept literal with it")


def encode_messages(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of ``messages`` through ``tokenizer``'s chat template, every message string
    (contents, names, tool-call names and argument strings) encoded as literal text.

    The helper for any caller that turns untrusted chat messages into prompt ids (an
    OpenAI-compatible endpoint's request, a tool transcript). Identical to
    ``apply_chat_template(messages, tokenize=True)`` when no string holds an added-token
    string, and to :func:`marft_algos.models.chat.encode_chat` for messages with contents
    only.

    Raises ValueError when the tokenizer has no chat template, or when the template does
    not pass message strings through unchanged (then they cannot be kept literal).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template (set tokenizer.chat_template)")
    marked, strings, contents = _mark(tokenizer, messages)
    extra = {"tools": [dict(t) for t in tools]} if tools else {}
    if not strings:
        out = tokenizer.apply_chat_template(marked, add_generation_prompt=add_generation_prompt,
                                            tokenize=True, return_dict=True, **extra)
        return [int(i) for i in out["input_ids"]]

    def render(msgs: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=False, **extra)

    text = render(marked)
    _check_marks(text, strings, contents, marked, render)
    return _ids_of(tokenizer, text, strings)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None, gen: bool) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen}
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
    return tokenizer.apply_chat_template(messages, **kwargs)


def _split(
    tokenizer: Any, tool_messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> tuple[str, str]:
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    asst = [*base, {"role": "assistant", "content": _PLACEHOLDER}]
    with_prompt = _render(tokenizer, base, tools, True)
    after_asst = _render(tokenizer, asst, tools, False)
    full = _render(tokenizer, [*asst, *[dict(m) for m in tool_messages]], tools, True)
    if not after_asst.startswith(with_prompt) or not full.startswith(after_asst):
        raise ValueError(
            "this chat template does not render a conversation as a prefix of its continuation; "
            "tool continuations cannot reuse sampled ids with it (re-render the whole prompt instead)"
        )
    close = after_asst[len(with_prompt):].split(_PLACEHOLDER, 1)[1]
    return close, full[len(after_asst):]


def split_continuation(
    tokenizer: Any,
    tool_messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, str]:
    """``(close_text, tool_text)``: what the template writes after an assistant message's
    content, and the tool messages plus the generation prompt after that.

    Text only: tokenising ``tool_text`` whole turns added-token strings in a tool result into
    special tokens; :func:`continuation_ids` keeps them literal."""
    return _split(tokenizer, tool_messages, tools)


def continuation_ids(
    tokenizer: Any,
    sampled_ids: Sequence[int],
    tool_messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """``close_ids + tool_ids`` to append to ``prompt_ids + sampled_ids`` (see the module docstring).

    If ``sampled_ids`` already end with the ids the template closes an assistant message
    with (e.g. ``<|im_end|>``, the sampler stopped on EOS), only the rest of the closing
    text is added; if the sampler stopped on a stop string, the whole closing text is.
    The tool messages' strings are literal text (:func:`encode_messages`): a tool result
    holding ``<|im_end|>\\n<|im_start|>user`` cannot open a turn.
    """
    marked, strings, contents = _mark(tokenizer, tool_messages)
    close, tool_text = _split(tokenizer, marked, tools)
    close_ids = list(tokenizer.encode(close, add_special_tokens=False)) if close else []
    tail = [int(i) for i in sampled_ids[-len(close_ids):]] if close_ids else []
    k = 0  # longest prefix of close_ids that the sampled ids end with
    for n in range(len(close_ids), 0, -1):
        if tail[-n:] == close_ids[:n] and len(sampled_ids) >= n:
            k = n
            break
    if not strings:
        return close_ids[k:] + list(tokenizer.encode(tool_text, add_special_tokens=False))
    _check_marks(tool_text, strings, contents, marked, lambda msgs: _split(tokenizer, msgs, tools)[1])
    return close_ids[k:] + _ids_of(tokenizer, tool_text, strings)
