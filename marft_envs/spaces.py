"""Gymnasium spaces for LLM text.

``gymnasium.spaces.Text`` is built for short alphanumeric strings: its default
charset has 62 characters and ``min_length=1``, so ``"hi there"`` and ``""``
are not members. An LLM's prompt or reply can be any Unicode string, so
:class:`UnicodeText` accepts every ``str`` up to ``max_length`` characters and
samples varied text (words, whitespace, digits, LaTeX, non-Latin scripts) that
exercises parsers the way model output does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Dict, Discrete, Text

__all__ = ["UnicodeText", "observation_space", "action_space"]

# Pieces that random samples are assembled from: model-like text plus the
# characters that break naive parsers.
_WORDS = (
    "the", "answer", "is", "so", "we", "get", "therefore", "step", "Let", "x", "ROUTE:",
    "algebra", "geometry", "apple", "banana", "Final", "Answer:", "=", "+", "-", "*", "/",
)
_LATEX = (
    "\\boxed{", "}", "{", "\\frac{1}{2}", "$", "$$", "^", "_", "\\sqrt{", "\\left(",
    "\\right)", "\\pi", "\\cdot", "\\text{", "\\fbox{", "\\\\", "\\infty", "%", "&",
)
_CHARS = (
    " ", "  ", "\n", "\t", "\n\n", ".", ",", "!", "?", "(", ")", "\u2212", "\u00d7", "\u00f7",
    "\u03c0", "\u221a", "\u00e9", "\u00df", "\u4e2d", "\u6587", "\u0639", "\u0440",
    "\U0001f600", "\u200b", "\u00a0", "\x00", "\ufffd",
)
# The charset handed to ``Text`` (used only for masked sampling and ``characters``).
_CHARSET = "".join(
    dict.fromkeys("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n{}\\$^_+-*/=.,")
)


class UnicodeText(Text):
    """Any Python ``str`` of at most ``max_length`` characters (empty included).

    A subclass of :class:`gymnasium.spaces.Text` so that tools which dispatch on
    ``Text`` still recognise it, but membership is not restricted to a charset.
    :meth:`sample` draws varied text, seeded through :meth:`seed` like any space:
    mostly short strings, sometimes empty, sometimes exactly ``max_length`` long.

    Example:
        >>> space = UnicodeText(16, seed=0)
        >>> space.contains("h\\u00e9llo \\n\\\\boxed{1}")
        True
        >>> space.contains("x" * 17)
        False
    """

    def __init__(self, max_length: int, *, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=0, charset=_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        """Any ``str`` up to ``max_length`` characters (no charset, no minimum length)."""
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string; ``mask``/``probability`` follow ``Text.sample`` over the base charset."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        rng = self.np_random
        u = rng.random()
        if u < 0.05:
            return ""
        # Mostly short (like a model reply), occasionally filling the space.
        target = self.max_length if u > 0.97 else int(min(self.max_length, rng.geometric(1 / 40)))
        parts: list[str] = []
        size = 0
        while size < target:
            kind = rng.random()
            if kind < 0.35:
                piece = _WORDS[rng.integers(len(_WORDS))]
            elif kind < 0.55:
                piece = str(int(rng.integers(-20, 1000)))
            elif kind < 0.7:
                piece = _LATEX[rng.integers(len(_LATEX))]
            elif kind < 0.9:
                piece = _CHARS[rng.integers(len(_CHARS))]
            else:  # any code point outside the surrogate block
                cp = int(rng.integers(1, 0x2FFFF))
                piece = chr(cp) if not 0xD800 <= cp <= 0xDFFF else "?"
            sep = " " if rng.random() < 0.6 else ""
            parts += [piece, sep]
            size += len(piece) + len(sep)
        return "".join(parts)[:target]

    @property
    def is_np_flattenable(self) -> bool:
        """False: Text flattens via a charset index, and arbitrary Unicode has none."""
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and self.max_length == other.max_length

    def __hash__(self) -> int:
        return hash(("UnicodeText", self.max_length))


def observation_space(max_prompt_chars: int, horizon: int) -> Dict:
    """``{"prompt": UnicodeText, "turn": Discrete(horizon + 1)}``.

    There is deliberately no ``"observation"`` key: PettingZoo 1.27's
    ``api_test`` runs numeric dtype checks on that key and crashes on text.
    """
    return Dict({"prompt": UnicodeText(max_prompt_chars), "turn": Discrete(horizon + 1)})


def action_space(max_action_chars: int) -> UnicodeText:
    """An agent's reply: any string up to ``max_action_chars`` characters."""
    return UnicodeText(max_action_chars)
