"""A scripted policy for collector tests: char-level ids, no model."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["CalculatorCaller", "CharPolicy"]


class CharPolicy:
    """Char-level ids, no model: a subclass's ``say(role, prompt)`` gives each reply.

    A reply is sampled with log-prob -0.5 per token; with ``eos`` it ends with an EOS
    id (0), else it stops at its length."""

    eos = False

    def say(self, role: str, prompt: str) -> str:
        """The reply of ``role`` to the decoded ``prompt``."""
        raise NotImplementedError

    def encode(self, role: str, messages: list[dict[str, str]]) -> list[int]:
        """One id per character of ``<role>content`` lines."""
        return [ord(c) for c in "\n".join(f"<{m['role']}>{m['content']}" for m in messages)]

    def generate(self, requests: list[Any]) -> list[Any]:
        """``r.n`` replies per request, from :meth:`say`."""
        from marft_algos.models import GenResult

        out = []
        for r in requests:
            prompt = "".join(chr(i) for i in r.prompt_ids)
            for _ in range(r.n):
                text = self.say(r.role, prompt)
                ids = [ord(c) for c in text] + ([0] if self.eos else [])
                out.append(GenResult(token_ids=ids, text=text, logprobs=[-0.5] * len(ids),
                                     finish_reason="eos" if self.eos else "length"))
        return out


class CalculatorCaller(CharPolicy):
    """A reasoner says "Use the calculator."; any other role calls the calculator on the
    question, then answers with the tool's result (``<tool>`` in its next prompt)."""

    eos = True

    def say(self, role: str, prompt: str) -> str:
        if role == "reasoner":
            return "Use the calculator."
        result = re.search(r"<tool>(.*)$", prompt, re.S)
        if result:
            return f"\\boxed{{{result.group(1).strip()}}}"
        expr = re.search(r"What is (.+)\?", prompt).group(1)
        return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expr}}) + "</tool_call>"
