"""Options shared by the leaderboard and the regression view (:mod:`.compare`).

Only the standard library at import time: ``marft --help`` builds both parsers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import marft_envs
from marft_algos.evaluation.errors import LeaderboardError

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_MAX_CONTEXT",
    "GAME_MAX_NEW_TOKENS",
    "eval_kwargs",
    "parse_env_kwargs",
    "problem_indices",
    "sampling_temperature",
]

#: Sampling temperature of the leaderboard when ``--temperature`` is not given
#: (the regression view decodes greedily instead).
DEFAULT_TEMPERATURE = 0.7
#: Context limit of the untrained systems when ``--max-context`` is not given (a
#: checkpoint keeps its run's ``max_context``).
DEFAULT_MAX_CONTEXT = 2048
#: New tokens per move in game suites when ``--max-new-tokens`` is not given (game envs
#: have no per-role eval limit; text envs use each profile's own).
GAME_MAX_NEW_TOKENS = 256
#: Base model of the untrained systems when ``--model`` is not given.
DEFAULT_MODEL = "smollm2-135m"


def problem_indices(env_id: str, split: str, kwargs: dict[str, Any], limit: int, start: int, env: Any = None) -> list[int]:
    """Indices ``start .. start + limit - 1`` of the split, cut at its size (read from ``env``,
    else from the env built once to read it)."""
    if env is None:
        env = marft_envs.make(env_id, **{**kwargs, "split": split})
    total = int(getattr(env, "num_problems", limit))
    return list(range(start, min(total, start + limit)))


def sampling_temperature(args: argparse.Namespace, default: float) -> float | None:
    """``--temperature`` if given (< 0: None = the profiles' own settings), else ``default``."""
    if args.temperature is None:
        return default
    return None if args.temperature < 0 else args.temperature


def eval_kwargs(args: argparse.Namespace, default_temperature: float = DEFAULT_TEMPERATURE) -> dict[str, Any]:
    """The sampling options of :func:`~marft_algos.evaluation.samples.play` from the parsed options."""
    temp = sampling_temperature(args, default_temperature)
    max_context = args.max_context if args.max_context is not None else DEFAULT_MAX_CONTEXT
    return dict(temperature=temp, max_new_tokens=args.max_new_tokens, num_envs=args.num_envs, max_context=max_context)


def parse_env_kwargs(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``--env-kwargs ID=JSON`` items as ``{id: kwargs}``; a :class:`LeaderboardError` for malformed ones."""
    env_kwargs: dict[str, dict[str, Any]] = {}
    for item in items or []:
        eid, sep, js = item.partition("=")
        try:
            value = json.loads(js) if sep else None
        except json.JSONDecodeError as e:
            raise LeaderboardError(f"--env-kwargs {item!r}: the part after '=' is not JSON ({e})") from None
        if not isinstance(value, dict):
            raise LeaderboardError(f"--env-kwargs {item!r}: expected ID={{JSON object}}")
        env_kwargs[eid] = value
    return env_kwargs
