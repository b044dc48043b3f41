"""Chat encoding that keeps message contents literal: a teammate cannot forge turns.

``tokenizer.apply_chat_template(..., tokenize=True)`` renders the template to text and
tokenizes the whole of it, so an added-token string inside a message (an agent's reply
holding ``<|im_end|>\\n<|im_start|>system ...``) becomes the real special tokens: one
agent would write system turns into another agent's prompt. :func:`encode_chat` renders
the template with a placeholder per message content, tokenizes the template's own text
as usual (its special tokens stay special) and each content with special tokens split
into plain text. Messages without any added-token string take the plain
``apply_chat_template`` path: their ids are exactly what they were.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from marft_envs.tools.chat import _CLOSE, _OPEN, literal_ids, special_strings_in

__all__ = ["encode_chat", "special_strings_in", "template_uses_tools"]

# one implementation of literal encoding for both packages: the marker characters, the
# added-token strings and the literal encoder are marft_envs.tools.chat's
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


def _tool_kwargs(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {"tools": [dict(t) for t in tools]} if tools else {}


def template_uses_tools(tokenizer: Any, tools: Sequence[Mapping[str, Any]]) -> bool:
    """Does ``tokenizer``'s chat template render ``tools=`` (many, e.g. SmolLM2's, ignore it)?

    A collector passes the schemas through the template only when it does; otherwise the
    env describes the tools in the system message (``env.messages(agent)``'s default)."""
    if not tools or not getattr(tokenizer, "chat_template", None):
        return False
    probe = [{"role": "user", "content": "u"}]
    plain = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    with_tools = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False, **_tool_kwargs(tools))
    return plain != with_tools


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], *,
                add_generation_prompt: bool = True,
                tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Token ids of ``messages`` through ``tokenizer``'s chat template, every message
    content encoded as literal text (never as special tokens).

    ``tools``: function schemas passed to the template as ``tools=`` (the transformers
    function-calling convention; ``env.tools(agent)``). The template's rendering of them is
    template text (a schema is the env's, not an agent's, so it cannot forge turns).

    Raises ValueError when the tokenizer has no chat template, or when its template
    does not pass message contents through (then contents cannot be kept literal).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template (set tokenizer.chat_template)")
    msgs = [dict(m) for m in messages]
    extra = _tool_kwargs(tools)
    if not any(special_strings_in(tokenizer, str(m.get("content", ""))) for m in msgs):
        out = tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt,
                                            tokenize=True, return_dict=True, **extra)
        return [int(i) for i in out["input_ids"]]
    contents = [str(m.get("content", "")) for m in msgs]
    marked = [{**m, "content": f"{_OPEN}{i}{_CLOSE}"} for i, m in enumerate(msgs)]
    text = tokenizer.apply_chat_template(marked, add_generation_prompt=add_generation_prompt,
                                         tokenize=False, **extra)
    pieces = _PLACEHOLDER.split(text)  # template, index, template, index, ..., template
    used = [int(i) for i in pieces[1::2]]
    if sorted(used) != list(range(len(msgs))):
        raise ValueError("the chat template does not pass each message content through once; "
                         "message contents cannot be kept literal with it")
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        if k % 2 == 0:  # the template's own text: its special tokens are real
            if piece:
                ids += [int(i) for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]
        else:
            ids += literal_ids(tokenizer, contents[int(piece)])
    return ids
