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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["continuation_ids", "split_continuation"]

_PLACEHOLDER = "\u2063marft-placeholder\u2063"


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None, gen: bool) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen}
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
    return tokenizer.apply_chat_template(messages, **kwargs)


def split_continuation(
    tokenizer: Any,
    tool_messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[str, str]:
    """``(close_text, tool_text)``: what the template writes after an assistant message's
    content, and the tool messages plus the generation prompt after that."""
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
    """
    close, tool_text = split_continuation(tokenizer, tool_messages, tools=tools)
    close_ids = list(tokenizer.encode(close, add_special_tokens=False)) if close else []
    tail = [int(i) for i in sampled_ids[-len(close_ids):]] if close_ids else []
    k = 0  # longest prefix of close_ids that the sampled ids end with
    for n in range(len(close_ids), 0, -1):
        if tail[-n:] == close_ids[:n] and len(sampled_ids) >= n:
            k = n
            break
    return close_ids[k:] + list(tokenizer.encode(tool_text, add_special_tokens=False))
