"""A scripted policy for collector tests: char-level ids, no model."""

from __future__ import annotations

from typing import Any

__all__ = ["CharPolicy"]


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
