"""What the next agent sees of a teammate's action: pluggable per team edge (PACT-style hand-offs).

By default an agent sees its predecessors' actions as they were written (``"full"``).
A *hand-off* rewrites that text on the way, per edge ``source -> target`` of the team:

- ``"full"``: the text as written (today's behaviour, the default).
- ``"answer"``: the predecessor's final answer only (:func:`final_answer`: the last
  ``\\boxed{}``, else the rest of the sentence after the last ``Answer:``, else the last sentence).
- ``"record"``: a compact record of the claims and the answer (:func:`claims_record`: the
  lines that state something with a number or an ``=``, at most :data:`MAX_CLAIMS`, then the
  answer the text states, or none), the compact action-state record of PACT.
- ``"module:function"`` or a callable ``fn(text, *, source, target, problem) -> str``.

``handoff`` (an env keyword of :class:`~marft_envs.text_env.TextTeamEnv`) is one of those
for every edge, or a dict per edge: keys ``"source->target"``, ``"source"`` (any target)
or ``"*"`` (the rest); the most specific key wins. Keys naming agents that are not in the
team raise. Only views change: routing, grading and the tools read the action as written,
and an agent always sees its own actions in full. The prompt a collector records is the
rewritten one (what the agent saw), so training on it stays exact.

A callable must be picklable to copy an env across processes: use a module-level function
(or its ``"module:function"`` name, which also keeps registered kwargs JSON-safe). A
hand-off that raises, or returns something other than a string, shows the full text and
logs a warning: model text never breaks a view.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marft_envs.verifiers.extract import extract_boxed

__all__ = ["HANDOFFS", "MAX_CLAIMS", "Handoff", "claims_record", "final_answer", "resolve_handoff", "stated_answer"]

logger = logging.getLogger("marft_envs")

#: most claim lines kept by :func:`claims_record`
MAX_CLAIMS = 4
_TAIL = 20_000
_ANSWER_RE = re.compile(r"\banswer\s*(?:is\b\s*[:=]?|[:=])\s*(.+)", re.IGNORECASE)
_CLAIM_RE = re.compile(r"\d|=")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")  # a period inside "3.5" is no sentence end


def stated_answer(text: str) -> str | None:
    """The answer ``text`` states explicitly: the last ``\\boxed{}`` (kept boxed), else what
    follows the last ``Answer:`` / ``answer is`` to the end of that sentence; None when it
    states none (e.g. a reply cut off at the token limit before its answer)."""
    text = str(text)[-_TAIL:]
    boxed = extract_boxed(text)
    if boxed is not None:
        return f"\\boxed{{{boxed}}}"
    for line in reversed([ln.strip() for ln in text.splitlines() if ln.strip()]):
        found = list(_ANSWER_RE.finditer(line))  # the last "answer is / Answer:" of the line
        if found and found[-1].group(1).strip():
            # the rest of that sentence only: a one-line ramble goes on after "the answer is 29."
            return _SENTENCE_END.split(found[-1].group(1).strip(), maxsplit=1)[0]
    return None


def final_answer(text: str, **_: Any) -> str:
    """The final answer in ``text``: :func:`stated_answer`, else the last sentence ("" for an
    empty text)."""
    stated = stated_answer(text)
    if stated is not None:
        return stated
    lines = [ln.strip() for ln in str(text)[-_TAIL:].splitlines() if ln.strip()]
    sentences = _SENTENCE_END.split(lines[-1]) if lines else []
    return sentences[-1].strip() if sentences else ""


def claims_record(text: str, **_: Any) -> str:
    """A compact record: ``Claims:`` the last :data:`MAX_CLAIMS` sentences that state
    something with a number or ``=`` (one per line), then ``Answer: <stated answer>``, or
    ``Answer: (none)`` when the text states none: a last sentence is not passed off as an answer."""
    text = str(text)[-_TAIL:]
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    claims = [s for s in sentences if _CLAIM_RE.search(s)][-MAX_CLAIMS:]
    answer = stated_answer(text)
    lines = ["Claims:"] + [f"- {c}" for c in claims] if claims else []
    return "\n".join(lines + [f"Answer: {answer}" if answer else "Answer: (none)"])


def _full(text: str, **_: Any) -> str:
    return text


#: built-in hand-offs by name
HANDOFFS: dict[str, Callable[..., str]] = {"full": _full, "answer": final_answer, "record": claims_record}


def _resolve_one(spec: Any, where: str) -> Callable[..., str]:
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"{where}: a hand-off is 'full', 'answer', 'record', 'module:function' or a callable, "
                        f"got {type(spec).__name__}")
    if spec in HANDOFFS:
        return HANDOFFS[spec]
    if ":" not in spec:
        raise ValueError(f"{where}: unknown hand-off {spec!r}; choose from {sorted(HANDOFFS)} or give 'module:function'")
    module, attr = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}: hand-off {spec!r} does not load: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise TypeError(f"{where}: hand-off {spec!r} is not callable")
    return fn


class Handoff:
    """The hand-off of every edge of a team (see the module docstring).

    Args:
        spec: ``"full"`` (default), ``"answer"``, ``"record"``, ``"module:function"``, a
            callable, or a dict per edge (``"source->target"``, ``"source"``, ``"*"``).
        agents: the team's agents (edge keys are checked against them).
    """

    def __init__(self, spec: Any = "full", agents: Sequence[str] = ()) -> None:
        self.spec = spec
        agents = list(agents)
        if spec is None:
            spec = "full"
        table = dict(spec) if isinstance(spec, Mapping) else {"*": spec}
        self._edges: dict[str, Callable[..., str]] = {}
        for key, value in table.items():
            if not isinstance(key, str):
                raise TypeError(f"handoff keys are 'source->target', 'source' or '*', got {key!r}")
            names = [n.strip() for n in key.split("->")] if key != "*" else []
            if len(names) > 2 or (agents and any(n not in agents for n in names)):
                raise ValueError(f"handoff key {key!r}: use 'source->target', 'source' or '*' with agents of the team {agents}")
            self._edges["->".join(names) or "*"] = _resolve_one(value, f"handoff[{key!r}]")
        #: True when every edge shows the full text (the env then skips the rewrite)
        self.is_full = all(fn is _full for fn in self._edges.values())

    def function(self, source: str, target: str) -> Callable[..., str]:
        """The hand-off of edge ``source -> target`` (the most specific key wins)."""
        for key in (f"{source}->{target}", source, "*"):
            if key in self._edges:
                return self._edges[key]
        return _full

    def __call__(self, text: str, *, source: str, target: str, problem: Any = None) -> str:
        """What ``target`` sees of ``source``'s action ``text`` (its own actions: in full)."""
        if source == target:
            return text
        fn = self.function(source, target)
        if fn is _full:
            return text
        try:
            out = fn(text, source=source, target=target, problem=problem)
        except Exception as e:  # a user's function must not break a view: show the text as written
            logger.warning("hand-off %s->%s raised %s: %s; showing the full text", source, target, type(e).__name__, e)
            return text
        if not isinstance(out, str):
            logger.warning("hand-off %s->%s returned %s, not a string; showing the full text", source, target,
                           type(out).__name__)
            return text
        return out

    def __repr__(self) -> str:
        return f"Handoff({self.spec!r})"


def resolve_handoff(spec: Any, agents: Sequence[str]) -> Handoff:
    """``spec`` as a :class:`Handoff` for ``agents`` (a Handoff is returned as it is)."""
    return spec if isinstance(spec, Handoff) else Handoff(spec, agents)
